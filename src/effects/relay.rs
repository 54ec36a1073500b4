//! The outbox relay (feature `relay`): a DynamoDB Streams consumer, on the crate's own batch
//! door, that publishes every committed outbox event at least once under its event id.
//!
//! The relay is itself idempotent: each stream record of an outbox item is one operation keyed
//! by the event id, so a redelivered batch replays instead of publishing again. Publishing is
//! safe to repeat (consumers deduplicate on the event id), so the relay's engine re-runs a
//! crashed attempt ([`Recovery::Rerun`]): an event published whose relay record was never
//! settled is published again under the same id. Once published, the event's outbox item is
//! marked ([`OutboxMarks::published`]): out of the pending index, with its TTL. A record whose
//! publish (or mark) fails is reported in the batch's partial response, so the stream retries
//! it and never skips an event; one the stream gave up on, or lost past its 24 hours, stays
//! pending for the [`sweeper`]. An event its destination refuses
//! ([`PublishError::Refused`]) is parked ([`OutboxMarks::park`]) and acknowledged, so that it
//! never blocks the events behind it on its shard.
//!
//! | destination | request | the event id travels as |
//! |---|---|---|
//! | EventBridge | `PutEvents` (`Source`, `DetailType`, the bus) | `detail.event_id` |
//! | SNS | `Publish` (`MessageGroupId` and `MessageDeduplicationId` on a `.fifo` topic) | `event_id` in the body; the `idempotency-key` message attribute (an SQS subscriber sees it with raw message delivery) |
//! | SQS | `SendMessage` (the same on a `.fifo` queue) | the same |
//!
//! A consumer behind the crate's SQS door keys by the `idempotency-key` attribute by default
//! ([`sources::sqs`](crate::lambda::sources::sqs), which keys each producer apart:
//! [`sources::sqs_across_senders`](crate::lambda::sources::sqs_across_senders) when more than one
//! role publishes the events); an EventBridge consumer by
//! [`sources::eventbridge_detail`](crate::lambda::sources::eventbridge_detail)`("/event_id")`,
//! which fingerprints the envelope alone: the same event published again is a replay.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use lambda_idempotency::effects::relay::{Publisher, RELAY_OPERATION, relay};
//! use lambda_idempotency::effects::{Outbox, OutboxMarks};
//! use lambda_idempotency::{Idempotency, OperationScope};
//!
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let marks = OutboxMarks::new(aws_sdk_dynamodb::Client::new(&config), &Outbox::new("outbox"));
//! let scope = OperationScope::for_function(RELAY_OPERATION)?;
//! let relay = relay(
//!     Idempotency::from_env().await?,
//!     scope,
//!     Publisher::from_conf(&config),
//!     marks,
//! );
//! lambda_runtime::run(relay).await?;
//! # Ok(()) }
//! ```

mod publisher;
pub mod sweeper;

use std::time::SystemTime;

use aws_lambda_events::event::dynamodb::EventRecord as DynamoDbRecord;
use serde::{Deserialize, Serialize};
use tracing::{error, warn};

pub use self::publisher::{PublishError, Publisher};
use super::outbox::OutboxRecord;
use super::outbox_marks::{OutboxMarks, PublishedBy};
use crate::error::BoxError;
use crate::key::KeyPolicy;
use crate::lambda::batch::BatchService;
use crate::reconcile::Recovery;
use crate::{ExecutionContext, Idempotency, Operation, OperationScope};

/// The relay's operation name, for its scope (`OperationScope::for_function(RELAY_OPERATION)`).
pub const RELAY_OPERATION: &str = "outbox-relay";

/// What the relay did with one stream record (an inserted item that is no outbox event is an
/// error, never skipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "relayed", rename_all = "snake_case")]
pub enum Relayed {
    /// The outbox event with this id was published, and marked so.
    Published {
        /// The event id.
        event_id: String,
    },
    /// The outbox event's destination refused it: it is parked, with the refusal.
    Parked {
        /// The event id.
        event_id: String,
        /// The destination's refusal.
        reason: String,
    },
    /// The record is no insertion (a TTL deletion, a modification): nothing to publish.
    Skipped,
}

/// The relay's key policy: a stream record that inserts an outbox item is keyed (and
/// fingerprinted) by its event id; any other record by the stream's own `eventID`.
pub fn outbox_stream() -> KeyPolicy<DynamoDbRecord> {
    fn key(record: &DynamoDbRecord) -> Option<serde_json::Value> {
        let inserted = inserted(record).map(|event| event.id);
        let id = inserted.or_else(|| Some(record.event_id.clone()).filter(|id| !id.is_empty()))?;
        Some(serde_json::Value::String(id))
    }
    KeyPolicy::from_fns(key, key)
}

/// The outbox event a stream record inserts, if it inserts one.
pub fn inserted(record: &DynamoDbRecord) -> Option<OutboxRecord> {
    if record.event_name != "INSERT" {
        return None;
    }
    let image = serde_json::to_value(&record.change.new_image).ok()?;
    OutboxRecord::from_image(&image)
}

/// Relays one stream record at `now`: publishes the outbox event it inserts and marks it
/// published, or parks it when its destination refuses it.
///
/// # Errors
/// The publisher's failure, or the mark's: the record is reported failed and the stream
/// retries it.
pub async fn relay_record(
    publisher: &Publisher,
    marks: &OutboxMarks,
    record: &DynamoDbRecord,
    now: SystemTime,
) -> Result<Relayed, BoxError> {
    let Some(event) = inserted(record) else {
        if record.event_name == "INSERT" {
            // Never acknowledged unpublished: it is reported, retried, and (in the example
            // stack) sent to the dead-letter queue after its retries.
            error!(
                "a stream record inserts an item that is not an outbox event (or a stream without new images): not published"
            );
            return Err("an inserted outbox item could not be read: check the table's stream (NEW_IMAGE) and the item".into());
        }
        return Ok(Relayed::Skipped);
    };
    deliver(publisher, marks, event, PublishedBy::Relay, now).await
}

/// Publishes `event` and marks it published by `by`, or parks it when its destination refuses
/// it; what the relay and the sweeper both do with one event.
pub(crate) async fn deliver(
    publisher: &Publisher,
    marks: &OutboxMarks,
    event: OutboxRecord,
    by: PublishedBy,
    now: SystemTime,
) -> Result<Relayed, BoxError> {
    match publisher.publish(&event).await {
        Ok(()) => {
            marks.published(&event.id, by, now).await?;
            Ok(Relayed::Published { event_id: event.id })
        }
        Err(PublishError::Refused { reason }) => {
            warn!(event = %event.name, %reason, "the destination refuses an outbox event: parked");
            marks.park(&event.id, &reason, now).await?;
            Ok(Relayed::Parked {
                event_id: event.id,
                reason,
            })
        }
        Err(err) => Err(err.into()),
    }
}

/// The relay function's service: `idem` (declared safe to re-run: publishing repeats under
/// the same event id) over the outbox table's stream, one operation of `scope` per event,
/// marking each event published in `marks` (the same outbox table), answering the stream's
/// partial-batch response. Run it with `lambda_runtime::run`.
pub fn relay(
    idem: Idempotency,
    scope: OperationScope,
    publisher: Publisher,
    marks: OutboxMarks,
) -> BatchService<
    DynamoDbRecord,
    impl Fn(
        DynamoDbRecord,
        ExecutionContext,
    ) -> futures_util::future::BoxFuture<'static, Result<Relayed, BoxError>>
    + Clone
    + Send
    + Sync
    + 'static,
> {
    let idem = idem.with_recovery(Recovery::Rerun);
    let operation = Operation::new(idem.clone(), scope, outbox_stream());
    operation.batch().service(move |record: DynamoDbRecord, _| {
        let (publisher, marks, now) = (publisher.clone(), marks.clone(), idem.now());
        let relayed: futures_util::future::BoxFuture<'static, _> =
            Box::pin(async move { relay_record(&publisher, &marks, &record, now).await });
        relayed
    })
}
