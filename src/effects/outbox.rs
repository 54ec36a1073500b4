//! A transactional outbox: follow-on events written as items in the same transaction as a
//! step's record and the handler's own writes, for a relay to publish at least once.
//!
//! Each event's id is derived from the operation key, the execution (when it was first
//! claimed), the step and the event's name: the same on every attempt, so a republished event (the relay crashed after publishing, before its
//! ledger recorded it) reaches consumers under the same id, and they deduplicate on it.
//!
//! | outbox item attribute | meaning |
//! |---|---|
//! | `pk` (S) | the event id (64 hex characters) |
//! | `event` (S) | the event's name, e.g. `order-placed` |
//! | `operation` (S) | the operation that wrote it (its scope, no key material) |
//! | `destination` (S) | `eventbridge`, `sns` or `sqs` |
//! | `target` (S) | the event bus name or ARN, the topic ARN, the queue URL |
//! | `source`, `detail_type` (S) | EventBridge's `Source` and `DetailType` |
//! | `payload` (S) | the event's JSON, as serialized |
//! | `created_at` (N) | epoch milliseconds |
//! | `expires_at` (N) | epoch seconds: the table's TTL, [`OUTBOX_RETENTION`] after creation |
//!
//! What a consumer receives is the [envelope](OutboxRecord::envelope)
//! `{"event_id": …, "event": …, "payload": …}`; with the crate's doors, key it by `/event_id`
//! (`/detail/event_id` for an EventBridge event).

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::Error;
use crate::key::OperationKey;
use crate::record::{epoch_millis, epoch_secs};

/// How long an outbox item is kept (DynamoDB TTL): well past the 24 hours a stream keeps its
/// records, so that the relay reads every event before TTL deletes it.
pub const OUTBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where an outbox event is published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Destination {
    /// An EventBridge bus (`PutEvents`): the bus name or ARN, the event's `Source` and
    /// `DetailType`; the envelope is the `Detail`.
    EventBridge {
        /// The event bus name or ARN.
        bus: String,
        /// The event's `Source`.
        source: String,
        /// The event's `DetailType`.
        detail_type: String,
    },
    /// An SNS topic (`Publish`); a FIFO topic (`.fifo`) deduplicates on the event id.
    Sns {
        /// The topic ARN.
        topic_arn: String,
    },
    /// An SQS queue (`SendMessage`); a FIFO queue (`.fifo`) deduplicates on the event id.
    Sqs {
        /// The queue URL.
        queue_url: String,
    },
}

impl Destination {
    fn kind(&self) -> &'static str {
        match self {
            Self::EventBridge { .. } => "eventbridge",
            Self::Sns { .. } => "sns",
            Self::Sqs { .. } => "sqs",
        }
    }

    fn target(&self) -> &str {
        match self {
            Self::EventBridge { bus, .. } => bus,
            Self::Sns { topic_arn } => topic_arn,
            Self::Sqs { queue_url } => queue_url,
        }
    }
}

/// A follow-on event a transactional step publishes ([`Transaction::publish`](super::Transaction::publish)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub(crate) name: String,
    pub(crate) destination: Destination,
    pub(crate) payload: String,
}

impl OutboxEvent {
    /// The event `name` (unique within its step: it names the event's id) carrying `payload`,
    /// for `destination`.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] for a blank name or a payload that does not serialize.
    ///
    /// ```
    /// use lambda_idempotency::effects::{Destination, OutboxEvent};
    ///
    /// let placed = OutboxEvent::new(
    ///     "order-placed",
    ///     Destination::Sqs { queue_url: "https://sqs.eu-west-1.amazonaws.com/1/orders".into() },
    ///     &serde_json::json!({"order": "o-418"}),
    /// )?;
    /// # let _ = placed;
    /// # Ok::<(), lambda_idempotency::Error>(())
    /// ```
    pub fn new(
        name: impl Into<String>,
        destination: Destination,
        payload: &impl Serialize,
    ) -> Result<Self, Error> {
        let name = name.into();
        if name.trim().is_empty() || name.len() > super::MAX_STEP_NAME_BYTES {
            return Err(Error::InvalidEvent {
                reason: "an outbox event's name is 1 to 255 bytes and not blank".into(),
            });
        }
        let payload = serde_json::to_string(payload).map_err(|err| Error::InvalidEvent {
            reason: format!("an outbox event's payload does not serialize to JSON: {err}"),
        })?;
        Ok(Self {
            name,
            destination,
            payload,
        })
    }

    /// The event's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The outbox table events are written to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbox {
    table: String,
}

impl Outbox {
    /// The outbox in `table` (`pk` string key, TTL on `expires_at`, a stream of new images).
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The `Put` of `event`, the event `id` of operation `key`, written at `now`.
    pub(crate) fn put(
        &self,
        key: &OperationKey,
        id: &str,
        event: &OutboxEvent,
        now: SystemTime,
    ) -> Result<Put, Error> {
        let s = |value: &str| AttributeValue::S(value.to_owned());
        let mut put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(id))
            .item("event", s(&event.name))
            .item("operation", s(key.operation()))
            .item("destination", s(event.destination.kind()))
            .item("target", s(event.destination.target()))
            .item("payload", s(&event.payload))
            .item(
                "created_at",
                AttributeValue::N(epoch_millis(now).to_string()),
            )
            .item(
                "expires_at",
                AttributeValue::N(epoch_secs(now + OUTBOX_RETENTION).to_string()),
            );
        if let Destination::EventBridge {
            source,
            detail_type,
            ..
        } = &event.destination
        {
            put = put
                .item("source", s(source))
                .item("detail_type", s(detail_type));
        }
        put.build().map_err(|err| Error::InvalidEvent {
            reason: format!("the outbox item could not be built: {err}"),
        })
    }
}

/// The id of event `name` of step `step` of the execution of operation `key` first claimed at
/// `created_at` ([`Record::created_at`](crate::record::Record::created_at), kept by every
/// takeover): the same on every attempt of that execution, another for a later execution of
/// the same key (after its record expired, or an operator released it), so that a new
/// execution's event is never taken for the old one.
pub fn event_id(key: &OperationKey, created_at: SystemTime, step: &str, name: &str) -> String {
    key.downstream(&format!(
        "{step}#event={name}#execution={}",
        epoch_millis(created_at)
    ))
}

/// An outbox event as its item stands, read from the outbox table's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// The event id.
    pub id: String,
    /// The event's name.
    pub name: String,
    /// Where it goes.
    pub destination: Destination,
    /// The event's JSON, as serialized.
    pub payload: String,
}

impl OutboxRecord {
    /// The outbox item in a stream record's new image, as DynamoDB JSON
    /// (`{"pk": {"S": …}, …}`); `None` when the image is not an outbox item.
    pub fn from_image(image: &Value) -> Option<Self> {
        let text = |name: &str| image.get(name)?.get("S")?.as_str().map(str::to_owned);
        let target = text("target")?;
        let destination = match text("destination")?.as_str() {
            "eventbridge" => Destination::EventBridge {
                bus: target,
                source: text("source")?,
                detail_type: text("detail_type")?,
            },
            "sns" => Destination::Sns { topic_arn: target },
            "sqs" => Destination::Sqs { queue_url: target },
            _ => return None,
        };
        Some(Self {
            id: text("pk")?,
            name: text("event")?,
            destination,
            payload: text("payload")?,
        })
    }

    /// What consumers receive: `{"event_id": …, "event": …, "payload": …}`, the payload's
    /// bytes as written.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] when the stored payload is not JSON (an item not written by
    /// this crate).
    pub fn envelope(&self) -> Result<String, Error> {
        #[derive(Serialize)]
        struct Envelope<'a> {
            event_id: &'a str,
            event: &'a str,
            payload: &'a RawValue,
        }
        let invalid = |err: serde_json::Error| Error::InvalidEvent {
            reason: format!("the outbox item's payload is not JSON: {err}"),
        };
        let payload = RawValue::from_string(self.payload.clone()).map_err(invalid)?;
        serde_json::to_string(&Envelope {
            event_id: &self.id,
            event: &self.name,
            payload: &payload,
        })
        .map_err(invalid)
    }
}
