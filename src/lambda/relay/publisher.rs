//! The publisher of outbox events: what it may publish, and an event checked before it is
//! sent. Its batches are in [`super::batches`], its requests go through a
//! [`Transport`](super::Transport).

use std::fmt;
use std::sync::Arc;

use super::sdk::SdkTransport;
use super::transport::{PublishError, Transport};
use crate::effects::destinations::{DESTINATIONS_VAR, Destinations};
use crate::effects::outbox::{MAX_EVENT_BYTES, OutboxRecord};

/// Publishes outbox events, in batches, to the destinations it is allowed: through the AWS SDK
/// ([`Publisher::new`]) or another [`Transport`] ([`Publisher::over`]).
#[derive(Clone)]
pub struct Publisher {
    pub(super) transport: Arc<dyn Transport>,
    destinations: Destinations,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher over these clients, to any destination until
    /// [`Publisher::with_destinations`] names the deployer's list: a relay deployed without it
    /// publishes wherever an outbox item says.
    pub fn new(
        eventbridge: aws_sdk_eventbridge::Client,
        sns: aws_sdk_sns::Client,
        sqs: aws_sdk_sqs::Client,
    ) -> Self {
        Self::over(SdkTransport {
            eventbridge,
            sns,
            sqs,
        })
    }

    /// A publisher that sends its requests through `transport`, to any destination until
    /// [`Publisher::with_destinations`] names the deployer's list.
    pub fn over(transport: impl Transport) -> Self {
        Self {
            transport: Arc::new(transport),
            destinations: Destinations::any(),
        }
    }

    /// Publishes only to `destinations` (the list the producers commit against); an event
    /// naming another fails ([`PublishError::Failed`]): the stream retries it, then the
    /// sweeper, whose last try parks it. (A deploy that adds a destination updates producers
    /// and relay in no order: the relay may meet the new destination's events first.)
    #[must_use]
    pub fn with_destinations(mut self, destinations: Destinations) -> Self {
        self.destinations = destinations;
        self
    }

    /// A publisher configured from the environment (the SDK's default chain: in Lambda, the
    /// function's region and role), to any destination until
    /// [`Publisher::with_destinations`] names the deployer's list
    /// ([`Destinations::from_env`]).
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_conf(&config)
    }

    /// A publisher whose three clients share `config` (region, credentials, endpoint), to any
    /// destination until [`Publisher::with_destinations`] names the deployer's list.
    pub fn from_conf(config: &aws_config::SdkConfig) -> Self {
        Self::new(
            aws_sdk_eventbridge::Client::new(config),
            aws_sdk_sns::Client::new(config),
            aws_sdk_sqs::Client::new(config),
        )
    }

    /// Publishes `event` to its destination once (the caller retries): a batch of one
    /// ([`Publisher::publish_batch`]).
    ///
    /// # Errors
    /// [`PublishError::Refused`] when the destination refuses the event itself (larger than
    /// [`MAX_EVENT_BYTES`], an entry refused as malformed or invalid), [`PublishError::Failed`]
    /// otherwise, a destination not allowed ([`Publisher::with_destinations`]) included.
    pub async fn publish(&self, event: &OutboxRecord) -> Result<(), PublishError> {
        self.publish_batch(std::slice::from_ref(event))
            .await
            .pop()
            .unwrap_or_else(|| Err(PublishError::failed("the batch answered nothing")))
    }

    /// The event ready to send: allowed, its envelope built, its size within
    /// [`MAX_EVENT_BYTES`].
    pub(super) fn prepare(&self, event: &OutboxRecord) -> Result<Prepared, PublishError> {
        // Failed, not refused: in a deploy that adds a destination, producers may run with the
        // new list while this function still runs with the old one. The stream retries it, the
        // sweeper after it, and only the sweeper's last try parks it.
        if !self.destinations.allows(&event.destination) {
            return Err(PublishError::failed(format!(
                "its destination is not among the relay's {DESTINATIONS_VAR} (yet): not published, retried"
            )));
        }
        let (envelope, bytes) = event.published().map_err(|err| PublishError::Refused {
            reason: err.to_string(),
        })?;
        if bytes > MAX_EVENT_BYTES {
            return Err(PublishError::Refused {
                reason: format!(
                    "the event is {bytes} bytes as published, past the destination's {MAX_EVENT_BYTES}"
                ),
            });
        }
        Ok(Prepared { envelope, bytes })
    }
}

/// An event checked and ready to send.
#[derive(Debug, Clone)]
pub(super) struct Prepared {
    /// What the destination receives.
    pub(super) envelope: String,
    /// What the destination counts: the envelope, EventBridge's `Source` and `DetailType`, or
    /// the id's message attribute.
    pub(super) bytes: usize,
}
