//! The seam between the relay's batching and the services it publishes to: a [`Transport`]
//! sends one request of up to [`MAX_BATCH_ENTRIES`](super::MAX_BATCH_ENTRIES) events to one
//! [`Channel`] and answers per event. [`Publisher::new`](super::Publisher::new) sends through
//! the AWS SDK; [`Publisher::over`](super::Publisher::over) through any other transport (an
//! in-process destination under a test's scheduler, a service the crate does not know). A
//! refusal (the destination will never take this event: park it) is told from a failure
//! (retry it) by [`PublishError`].

use futures_util::future::BoxFuture;

use crate::effects::destinations::Destination;
use crate::effects::outbox::OutboxRecord;
use crate::error::BoxError;

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
    /// Not sent: an earlier event of its ordering key failed, and it waits behind it (it is
    /// published again with it, later). Its own destination was not asked.
    #[error("held behind an earlier event of its ordering key that failed; it is retried")]
    Held,
}

impl PublishError {
    /// A failure to retry, caused by `source` (for a [`Transport`] of one's own).
    pub fn failed(source: impl Into<BoxError>) -> Self {
        Self::Failed {
            source: source.into(),
        }
    }
}

/// Where one request goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Channel {
    /// EventBridge: one `PutEvents` carries entries for any bus (each entry names its own).
    EventBridge,
    /// One SNS topic, by ARN.
    Topic(String),
    /// One SQS queue, by URL.
    Queue(String),
}

impl Channel {
    /// The channel an event's destination is published on.
    pub fn of(destination: &Destination) -> Self {
        match destination {
            Destination::EventBridge { .. } => Self::EventBridge,
            Destination::Sns { topic_arn } => Self::Topic(topic_arn.clone()),
            Destination::Sqs { queue_url } => Self::Queue(queue_url.clone()),
        }
    }
}

/// One event of a request, checked and ready to send.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Message<'a> {
    /// The outbox event (its id, its destination, its ordering key).
    pub event: &'a OutboxRecord,
    /// What the destination receives: the envelope `{"event_id", "event", "payload", …}`.
    pub envelope: &'a str,
}

/// A request's answer: `Err` when the request failed as a whole (every event in it is
/// answered with that error, or, for a [`PublishError::Refused`] request of several events,
/// sent again one at a time), else one answer per message, in the request's order.
pub type Answers = Result<Vec<Result<(), PublishError>>, PublishError>;

/// Sends publish requests. The relay's batching (a window of requests, order per ordering
/// key, a refused request split) stays in [`Publisher`](super::Publisher); a transport only
/// sends.
///
/// ```
/// use futures_util::future::BoxFuture;
/// use lambda_idempotency::lambda::relay::{Answers, Channel, Message, Publisher, Transport};
///
/// /// Accepts everything and forgets it.
/// struct Nowhere;
///
/// impl Transport for Nowhere {
///     fn send<'a>(&'a self, _: &'a Channel, messages: &'a [Message<'a>]) -> BoxFuture<'a, Answers> {
///         Box::pin(async move { Ok(messages.iter().map(|_| Ok(())).collect()) })
///     }
/// }
///
/// let publisher = Publisher::over(Nowhere);
/// # let _ = publisher;
/// ```
pub trait Transport: Send + Sync + 'static {
    /// Sends `messages` (one to [`MAX_BATCH_ENTRIES`](super::MAX_BATCH_ENTRIES), together
    /// within [`MAX_BATCH_BYTES`](super::MAX_BATCH_BYTES)) to `channel` in one request.
    fn send<'a>(
        &'a self,
        channel: &'a Channel,
        messages: &'a [Message<'a>],
    ) -> BoxFuture<'a, Answers>;
}
