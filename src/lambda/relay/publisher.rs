//! The publisher of outbox events: what it may publish, and an event checked before it is
//! sent. Its batches are in [`super::batches`], its requests go through a
//! [`Transport`](super::Transport).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::sdk::SdkTransport;
use super::transport::{PublishError, Transport};
use crate::effects::destinations::{DESTINATIONS_VAR, Destinations};
use crate::effects::outbox::{MAX_EVENT_BYTES, OutboxRecord};

/// The longest one publish request may take, the SDK's own retries included
/// ([`Publisher::from_conf`]): EventBridge, SNS and SQS answer in milliseconds.
pub const PUBLISH_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest one try of a publish request may take ([`Publisher::from_conf`]).
pub const PUBLISH_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

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

    /// A publisher configured from the environment: the SDK's default chain (in Lambda, the
    /// function's region and role) and, when [`DESTINATIONS_VAR`] is set, the destinations it
    /// names ([`Destinations::from_env`]; a value it refuses allows none, so that every event
    /// fails and is parked rather than published where the deployer did not say). Unset, any
    /// destination, as in 0.4: prefer
    /// `.with_destinations(Destinations::from_env()?)`, which refuses to start without it.
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_conf(&config).with_destinations(allowed_by(std::env::var(DESTINATIONS_VAR)))
    }

    /// A publisher whose three clients share `config` (region, credentials, endpoint), to any
    /// destination until [`Publisher::with_destinations`] names the deployer's list.
    ///
    /// Each request is bounded by [`PUBLISH_OPERATION_TIMEOUT`] (its tries by
    /// [`PUBLISH_ATTEMPT_TIMEOUT`]) where `config` sets no such timeout: an AWS client has none
    /// by default, and a destination that stopped answering would hold a relay's or a sweep's
    /// batch until the function timed out, its failures never recorded, so that no event ever
    /// backed off or was parked. A timed-out request is a failed publish, tried again later.
    pub fn from_conf(config: &aws_config::SdkConfig) -> Self {
        let bounded = bounded(config);
        let config = bounded.as_ref().unwrap_or(config);
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

/// `config` with [`PUBLISH_OPERATION_TIMEOUT`] and [`PUBLISH_ATTEMPT_TIMEOUT`] where it sets
/// none; `None` when it sets both.
fn bounded(config: &aws_config::SdkConfig) -> Option<aws_config::SdkConfig> {
    let timeouts = crate::store::bounded_timeouts(
        config.timeout_config(),
        PUBLISH_OPERATION_TIMEOUT,
        PUBLISH_ATTEMPT_TIMEOUT,
    )?;
    Some(config.to_builder().timeout_config(timeouts).build())
}

/// The destinations [`Publisher::from_env`] allows by [`DESTINATIONS_VAR`]'s value: any when
/// it is unset; none when it names none or is malformed (every event fails, and is parked).
fn allowed_by(value: Result<String, std::env::VarError>) -> Destinations {
    match value {
        Err(std::env::VarError::NotPresent) => Destinations::any(),
        Ok(list) => Destinations::parse(&list).unwrap_or_else(allowing_none),
        Err(std::env::VarError::NotUnicode(_)) => allowing_none(),
    }
}

/// No destination: what a malformed [`DESTINATIONS_VAR`] allows.
fn allowing_none() -> Destinations {
    tracing::error!(
        "{DESTINATIONS_VAR} names no destination, or `*` beside others: none is allowed, and every event fails"
    );
    Destinations::only(Vec::<String>::new())
}

#[cfg(test)]
mod tests {
    use aws_config::timeout::TimeoutConfig;

    use super::*;

    #[test]
    fn a_publish_request_is_bounded_unless_the_config_bounds_it() {
        let bare = aws_config::SdkConfig::builder().build();
        let added = bounded(&bare).expect("timeouts added");
        let timeouts = added.timeout_config().expect("timeouts");
        assert_eq!(
            timeouts.operation_timeout(),
            Some(PUBLISH_OPERATION_TIMEOUT)
        );
        assert_eq!(
            timeouts.operation_attempt_timeout(),
            Some(PUBLISH_ATTEMPT_TIMEOUT)
        );
        assert!(timeouts.connect_timeout().is_some());

        let own = aws_config::SdkConfig::builder()
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build();
        let kept = bounded(&own).expect("the attempt bound added");
        let timeouts = kept.timeout_config().expect("timeouts");
        assert_eq!(timeouts.operation_timeout(), Some(Duration::from_secs(60)));
        assert_eq!(
            timeouts.operation_attempt_timeout(),
            Some(PUBLISH_ATTEMPT_TIMEOUT)
        );
        assert!(bounded(&kept).is_none(), "set once");
    }
}

#[cfg(test)]
mod from_env {
    use std::env::VarError;

    use super::allowed_by;
    use crate::effects::destinations::Destinations;

    /// The deployer's list is honoured when set; unset allows any (as 0.4); a value naming
    /// none, or `*` beside destinations, allows none rather than any.
    #[test]
    fn the_variable_names_what_the_publisher_may_publish_to() {
        assert_eq!(allowed_by(Err(VarError::NotPresent)), Destinations::any());
        assert_eq!(
            allowed_by(Ok("orders-bus".into())),
            Destinations::only(["orders-bus"])
        );
        assert_eq!(allowed_by(Ok("*".into())), Destinations::any());
        for refused in ["", " , ", "orders-bus, *"] {
            assert_eq!(
                allowed_by(Ok(refused.into())),
                Destinations::only(Vec::<String>::new()),
                "{refused:?}"
            );
        }
    }
}
