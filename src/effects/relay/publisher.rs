//! The publisher of outbox events: what it may publish, an event checked
//! before it is sent, and a refusal (the destination will never take this event: park it) told
//! from a failure (retry it). Its batches are in [`super::batches`].

use std::fmt;
use std::sync::Arc;

use aws_sdk_sqs::error::ProvideErrorMetadata;

use super::sdk::SdkTransport;
use super::transport::Transport;
use crate::effects::destinations::{DESTINATIONS_VAR, Destinations};
use crate::effects::outbox::{MAX_EVENT_BYTES, OutboxRecord};
use crate::error::BoxError;

/// Error codes that refuse the event itself (its size, its content): the same request would be
/// refused again, so the event is parked instead of retried.
pub(super) const REFUSALS: [&str; 7] = [
    "InvalidParameterValue",
    "InvalidParameter",
    "InvalidMessageContents",
    "InvalidAttributeValue",
    "ValidationException",
    "ValidationError",
    "InvalidArgument",
];

/// Why an event was not published.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The destination refuses this event (too large, malformed for it): publishing it again
    /// would be refused again. The relay and the sweeper park it.
    #[error("the destination refuses the event: {reason}")]
    Refused {
        /// The destination's answer (an error code), or the crate's own check.
        reason: String,
    },
    /// The request failed (throttled, unavailable, access denied, a destination not found):
    /// publish again later.
    #[error("publishing failed; it is retried: {source}")]
    Failed {
        /// The SDK's error.
        #[source]
        source: BoxError,
    },
}

impl PublishError {
    /// A failure to retry, caused by `source` (for a [`Transport`] of one's own).
    pub fn failed(source: impl Into<BoxError>) -> Self {
        Self::Failed {
            source: source.into(),
        }
    }

    /// Refused when the error's code is one of [`REFUSALS`], failed otherwise (the SDKs share
    /// one `SdkError` type).
    pub(super) fn from_sdk<E>(err: aws_sdk_sqs::error::SdkError<E>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match err.code() {
            Some(code) if REFUSALS.contains(&code) => Self::Refused {
                reason: code.to_owned(),
            },
            _ => Self::failed(err),
        }
    }
}

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
    /// A publisher over these clients.
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

    /// A publisher that sends its requests through `transport`, to any destination (narrow it
    /// with [`Publisher::with_destinations`]).
    pub fn over(transport: impl Transport) -> Self {
        Self {
            transport: Arc::new(transport),
            destinations: Destinations::any(),
        }
    }

    /// Publishes only to `destinations` (the list the producers commit against); an event
    /// naming another is refused ([`PublishError::Refused`]), so the relay and the sweeper park
    /// it.
    #[must_use]
    pub fn with_destinations(mut self, destinations: Destinations) -> Self {
        self.destinations = destinations;
        self
    }

    /// A publisher configured from the environment (the SDK's default chain: in Lambda, the
    /// function's region and role).
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_conf(&config)
    }

    /// A publisher whose three clients share `config` (region, credentials, endpoint).
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
    /// [`PublishError::Refused`] when the destination is not allowed
    /// ([`Publisher::with_destinations`]) or refuses the event itself (larger than
    /// [`MAX_EVENT_BYTES`], an entry refused as malformed or invalid), [`PublishError::Failed`]
    /// otherwise.
    pub async fn publish(&self, event: &OutboxRecord) -> Result<(), PublishError> {
        self.publish_batch(std::slice::from_ref(event))
            .await
            .pop()
            .unwrap_or_else(|| Err(PublishError::failed("the batch answered nothing")))
    }

    /// The event ready to send: allowed, its envelope built, its size within
    /// [`MAX_EVENT_BYTES`].
    pub(super) fn prepare(&self, event: &OutboxRecord) -> Result<Prepared, PublishError> {
        if !self.destinations.allows(&event.destination) {
            return Err(PublishError::Refused {
                reason: format!(
                    "its destination is not among the relay's {DESTINATIONS_VAR}: not published"
                ),
            });
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

/// An EventBridge entry's failure: a malformed or invalid entry refuses the event; anything
/// else (throttling, an internal error, access denied, a code this build does not know) is
/// retried, never parked: a grant or a bus policy can be fixed.
pub(super) fn entry_failure(code: &str) -> PublishError {
    if code == "MalformedDetail" || REFUSALS.contains(&code) {
        PublishError::Refused {
            reason: format!("EventBridge refused the entry: {code}"),
        }
    } else {
        PublishError::failed(format!("EventBridge failed the entry: {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::{PublishError, entry_failure};

    #[test]
    fn only_a_malformed_entry_is_refused_and_everything_else_retried() {
        for retried in [
            "ThrottlingException",
            "InternalFailure",
            "AccessDeniedException",
            "NotAuthorizedForSourceException",
            "InvalidAccountIdException",
            "no error code",
        ] {
            assert!(
                matches!(entry_failure(retried), PublishError::Failed { .. }),
                "{retried}"
            );
        }
        for refused in ["MalformedDetail", "ValidationException", "InvalidArgument"] {
            assert!(
                matches!(entry_failure(refused), PublishError::Refused { .. }),
                "{refused}"
            );
        }
    }
}
