//! The outbox relay (feature `relay`): a DynamoDB Streams consumer that publishes every
//! committed outbox event at least once under its event id, in batches.
//!
//! [`relay`] takes the stream's batch as Lambda delivers it. It reads the marks of the batch's
//! events (one `BatchGetItem`), so that a batch delivered again republishes nothing already
//! published; publishes the rest with as few requests as the destinations take
//! ([`Publisher::publish_batch`]: `PutEvents`, `PublishBatch`, `SendMessageBatch`, 10 entries
//! each); and marks each event published ([`OutboxMarks::published`]: out of the pending index,
//! with its TTL) or, when its destination refuses it ([`PublishError::Refused`]), parks it
//! ([`OutboxMarks::park`]) so that it never blocks the events behind it. Each record whose event
//! failed (its entry, its request, or its mark) is reported in the partial-batch response: the
//! stream retries from the first of them, and never skips an event. One the stream gave up on,
//! or lost past its 24 hours, stays pending for the [`sweeper`]. The marks are the relay's only
//! record: it needs no idempotency table of its own.
//!
//! **Order.** Within one batch and one destination, one ordering key's events are published in
//! the order the stream gives them, none overtaking one that failed
//! ([`Publisher::publish_batch`]). That is all the relay can keep: the stream keeps commit
//! order per item only, and each event is its own item, so one aggregate's events may sit on
//! two shards, which Lambda relays at once; the sweeper's republications and a parked event's
//! gap reorder too. A consumer that cares reads the `ordering_key` and `sequence` in the
//! envelope (from [`OutboxEvent::ordered_by`](crate::effects::OutboxEvent::ordered_by)) and
//! applies an aggregate's events in sequence, holding one that arrives early.
//!
//! | destination | request | the event id travels as |
//! |---|---|---|
//! | EventBridge | `PutEvents` (`Source`, `DetailType`, the bus) | `detail.event_id` |
//! | SNS | `PublishBatch` (`MessageGroupId`: the ordering key, else the id; `MessageDeduplicationId`: the id; on a `.fifo` topic) | `event_id` in the body; the `idempotency-key` message attribute (an SQS subscriber's message attribute with raw message delivery, else in the notification its body holds, which the SQS door reads too) |
//! | SQS | `SendMessageBatch` (the same on a `.fifo` queue) | the same |
//!
//! A consumer behind the crate's SQS door keys by the `idempotency-key` attribute with
//! [`sources::sqs_across_senders`](crate::lambda::sources::sqs_across_senders)`(None)`: the
//! relay, the sweeper and an operator's `idemctl outbox sweep` publish under three roles, and
//! [`sources::sqs`](crate::lambda::sources::sqs) keys each sender's messages apart, so the
//! sweeper's republication of an event the relay published would take effect again (let only
//! those roles send to the queue, by its queue policy); a Lambda subscribed to the topic by
//! [`sources::sns_by_key_attribute`](crate::lambda::sources::sns_by_key_attribute); an
//! EventBridge consumer by
//! [`sources::eventbridge_detail`](crate::lambda::sources::eventbridge_detail)`("/event_id")`,
//! which fingerprints the event's source, detail type, resources and envelope, none of which a
//! republication changes: the same event published again is a replay.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use lambda_idempotency::lambda::relay::{Publisher, relay};
//! use lambda_idempotency::effects::{Destinations, Outbox, OutboxMarks};
//!
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let marks = OutboxMarks::new(aws_sdk_dynamodb::Client::new(&config), &Outbox::new("outbox"));
//! // Only where the deployer's OUTBOX_DESTINATIONS says, never where an item says.
//! let publisher = Publisher::from_conf(&config).with_destinations(Destinations::from_env()?);
//! lambda_runtime::run(relay(publisher, marks)).await?;
//! # Ok(()) }
//! ```

mod batches;
mod publisher;
mod sdk;
pub mod sweeper;
mod transport;

use std::collections::HashSet;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::dynamodb::{Event as DynamoDbEvent, EventRecord as DynamoDbRecord};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, join_all};
use lambda_runtime::LambdaEvent;
use serde::{Deserialize, Serialize};
use tracing::{error, warn};

pub use self::batches::{MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, REQUESTS_IN_FLIGHT};
pub use self::publisher::{PUBLISH_ATTEMPT_TIMEOUT, PUBLISH_OPERATION_TIMEOUT, Publisher};
pub use self::transport::{Answers, Channel, Message, PublishError, Transport};
use crate::clock::{Clock, SystemClock};
use crate::effects::outbox::OutboxRecord;
use crate::effects::outbox_marks::{OutboxMarks, PublishedBy};
use crate::error::BoxError;
use crate::key::KeyPolicy;

/// How many marks the relay and the sweeper write at once.
const MARKS_IN_FLIGHT: usize = 16;

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

/// A key policy for relaying through the crate's batch door, one operation per event (what
/// 0.4's relay did; [`relay`] needs none): a stream record that inserts an outbox item is keyed
/// (and fingerprinted) by its event id; any other record by the stream's own `eventID`.
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
    OutboxRecord::from_fields(|name, kind| image_field(record, name, kind).map(str::to_owned))
}

/// Field `name` of the item a record writes, when it has type `kind` (`"S"` or `"N"`).
fn image_field<'a>(record: &'a DynamoDbRecord, name: &str, kind: &str) -> Option<&'a str> {
    match (record.change.new_image.get(name)?, kind) {
        (serde_dynamo::AttributeValue::S(text), "S")
        | (serde_dynamo::AttributeValue::N(text), "N") => Some(text),
        _ => None,
    }
}

/// Relays one stream record at `now`, alone: publishes the outbox event it inserts and marks
/// it published, or parks it when its destination refuses it. [`relay`] does this for a whole
/// batch in fewer requests.
///
/// # Errors
/// The publisher's failure, or the mark's: report the record failed so that the stream
/// retries it.
pub async fn relay_record(
    publisher: &Publisher,
    marks: &OutboxMarks,
    record: &DynamoDbRecord,
    now: SystemTime,
) -> Result<Relayed, BoxError> {
    let Some(event) = inserted(record) else {
        if record.event_name == "INSERT" {
            return Err(unreadable_insert());
        }
        return Ok(Relayed::Skipped);
    };
    if written_by_0_4(record) {
        adopt(marks, &event.id).await;
    }
    deliver_all(
        publisher,
        marks,
        std::slice::from_ref(&event),
        PublishedBy::Relay,
        now,
        &failed_alone,
    )
    .await
    .pop()
    .unwrap_or_else(|| Err("the event was not published".into()))
}

/// Whether `record` inserts an item 0.4 wrote: no `pending` (so out of the sweeper's sight)
/// and a TTL from its commit.
fn written_by_0_4(record: &DynamoDbRecord) -> bool {
    record.change.new_image.get("pending").is_none()
}

/// Adopts event `id`, which 0.4 wrote, into the pending index ([`OutboxMarks::adopt`]) before
/// the relay publishes it: should the publish fail, or the relay be cut off before it is
/// answered (its timeout, its memory), the sweeper publishes it once the stream gives up on
/// its record, where 0.4's TTL would have deleted it unpublished. A failed adoption is tried
/// again with the stream's next delivery of the record.
async fn adopt(marks: &OutboxMarks, id: &str) {
    if let Err(err) = marks.adopt(id).await {
        warn!(error = %err, "an outbox event 0.4 wrote could not be put in the pending index: the stream's retry tries again");
    }
}

/// The error of an inserted item that is no outbox event: never acknowledged unpublished, it
/// is reported, retried, and (in the example stack) sent to the dead-letter queue after its
/// retries.
fn unreadable_insert() -> BoxError {
    error!(
        "a stream record inserts an item that is not an outbox event (or a stream without new images): not published"
    );
    "an inserted outbox item could not be read: check the table's stream (NEW_IMAGE) and the item"
        .into()
}

/// Publishes `events` in batches and marks each published by `by`, or parks the ones their
/// destination refuses, or answers a failed one as `after_failure` does (the sweeper records
/// the failure as it comes, so that a batch cut short by the function's timeout keeps what it
/// learnt); what the relay and the sweeper both do. Each request's events are marked while the
/// next request is on its way. One answer per event, in order.
pub(crate) async fn deliver_all<'e>(
    publisher: &Publisher,
    marks: &OutboxMarks,
    events: &'e [OutboxRecord],
    by: PublishedBy,
    now: SystemTime,
    after_failure: &'e AfterFailure<'e>,
) -> Vec<Result<Relayed, BoxError>> {
    let (sink, answered) = tokio::sync::mpsc::unbounded_channel();
    let publishing = async {
        publisher.publish_each(events, &sink).await;
        drop(sink);
    };
    let answers = futures_util::stream::unfold(answered, |mut answered| async move {
        answered.recv().await.map(|answer| (answer, answered))
    });
    let marking = answers
        .map(|(index, published)| {
            let event = events.get(index);
            async move {
                let Some(event) = event else {
                    return (index, Err(BoxError::from("an answer for no event")));
                };
                let answer = match published {
                    Err(err @ (PublishError::Failed { .. } | PublishError::Held)) => {
                        after_failure(event, err).await
                    }
                    published => settle(marks, event, published, by, now).await,
                };
                (index, answer)
            }
        })
        .buffer_unordered(MARKS_IN_FLIGHT);
    // A loop, not `collect`: collecting `BoxError`s here trips a higher-ranked lifetime error
    // where the relay's future must be `Send`.
    let marking = async {
        let mut marking = std::pin::pin!(marking);
        let mut settled = Vec::with_capacity(events.len());
        while let Some(answer) = marking.next().await {
            settled.push(answer);
        }
        settled
    };
    let ((), mut settled) = futures_util::join!(publishing, marking);
    settled.sort_by_key(|(index, _)| *index);
    let mut settled = settled.into_iter().peekable();
    (0..events.len())
        .map(|index| match settled.next_if(|(at, _)| *at == index) {
            Some((_, answer)) => answer,
            None => Err("the event was not published".into()),
        })
        .collect()
}

/// What a delivery answers for an event whose publish failed ([`deliver_all`]).
pub(crate) type AfterFailure<'e> = dyn Fn(&'e OutboxRecord, PublishError) -> BoxFuture<'e, Result<Relayed, BoxError>>
    + Send
    + Sync
    + 'e;

/// The answer to an event whose publish failed, as it is: the stream delivers its record again.
fn failed_alone<'e>(
    _event: &'e OutboxRecord,
    err: PublishError,
) -> BoxFuture<'e, Result<Relayed, BoxError>> {
    Box::pin(std::future::ready(Err(err.into())))
}

/// Marks `event` published (or parks it) after its publication's answer `published`.
async fn settle(
    marks: &OutboxMarks,
    event: &OutboxRecord,
    published: Result<(), PublishError>,
    by: PublishedBy,
    now: SystemTime,
) -> Result<Relayed, BoxError> {
    match published {
        Ok(()) => {
            marks.published(&event.id, by, now).await?;
            Ok(Relayed::Published {
                event_id: event.id.clone(),
            })
        }
        Err(PublishError::Refused { reason }) => {
            warn!(event = %event.name, %reason, "the destination refuses an outbox event: parked");
            marks.park(&event.id, &reason, now).await?;
            Ok(Relayed::Parked {
                event_id: event.id.clone(),
                reason,
            })
        }
        Err(err) => Err(err.into()),
    }
}

/// The relay function's service over the outbox table's stream: see the [module](self).
/// Run it with `lambda_runtime::run`; it answers the stream's partial-batch response.
#[derive(Clone)]
pub struct Relay {
    publisher: Publisher,
    marks: OutboxMarks,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("marks", &self.marks)
            .finish_non_exhaustive()
    }
}

/// The relay of the outbox whose `marks` it writes, publishing with `publisher`.
pub fn relay(publisher: Publisher, marks: OutboxMarks) -> Relay {
    Relay {
        publisher,
        marks,
        clock: Arc::new(SystemClock),
    }
}

/// What the relay did with one batch of stream records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Events published and marked now.
    pub published: u64,
    /// Events marked published (or parked) before this batch: a batch delivered again.
    pub already: u64,
    /// Events their destination refused, parked.
    pub parked: u64,
    /// Records that insert no outbox event (modifications, TTL deletions).
    pub skipped: u64,
    /// The sequence numbers of the records to retry (their event's publish or mark failed, or
    /// the inserted item is no outbox event).
    pub failed: Vec<String>,
    /// The longest time from an event's commit to its publication in this batch.
    pub max_lag: Option<Duration>,
}

impl RelayReport {
    /// The stream's partial-batch response: the records to retry.
    pub fn response(&self) -> DynamoDbEventResponse {
        let mut response = DynamoDbEventResponse::default();
        response.batch_item_failures = self
            .failed
            .iter()
            .map(|sequence| {
                let mut failure = DynamoDbBatchItemFailure::default();
                failure.item_identifier = Some(sequence.clone());
                failure
            })
            .collect();
        response
    }
}

impl Relay {
    /// Reads the time from `clock` (the marks' `published_at`, the TTL after it).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Relays one batch of stream records: see the [module](self).
    pub async fn relay_batch(&self, records: &[DynamoDbRecord]) -> RelayReport {
        let now = self.clock.now();
        let mut report = RelayReport::default();
        let mut events = Vec::new();
        for record in records {
            match inserted(record) {
                Some(event) => events.push((record, event)),
                None if record.event_name == "INSERT" => {
                    let _ = unreadable_insert();
                    report.failed.push(sequence_number(record));
                }
                None => report.skipped += 1,
            }
        }
        let ids: Vec<&str> = events.iter().map(|(_, event)| event.id.as_str()).collect();
        let settled = self.marks.settled(&ids).await.unwrap_or_else(|err| {
            warn!(error = %err, "the outbox's marks could not be read: the batch is published as if none were");
            HashSet::new()
        });
        let (done, due): (Vec<_>, Vec<_>) = events
            .into_iter()
            .partition(|(_, event)| settled.contains(&event.id));
        report.already = done.len() as u64;
        let (records, due): (Vec<&DynamoDbRecord>, Vec<OutboxRecord>) = due.into_iter().unzip();
        let committed: Vec<Option<SystemTime>> = due.iter().map(|event| event.created_at).collect();
        // 0.4's items are put in the pending index before they are published.
        join_all(
            records
                .iter()
                .zip(&due)
                .filter(|(record, _)| written_by_0_4(record))
                .map(|(_, event)| adopt(&self.marks, &event.id)),
        )
        .await;
        let answers = deliver_all(
            &self.publisher,
            &self.marks,
            &due,
            PublishedBy::Relay,
            now,
            &failed_alone,
        )
        .await;
        let published_by = self.clock.now();
        for ((record, committed_at), answer) in records.into_iter().zip(committed).zip(answers) {
            match answer {
                Ok(Relayed::Published { .. }) => {
                    report.published += 1;
                    let lag = committed_at.and_then(|at| published_by.duration_since(at).ok());
                    report.max_lag = report.max_lag.max(lag);
                }
                Ok(Relayed::Parked { .. }) => report.parked += 1,
                Ok(Relayed::Skipped) => report.skipped += 1,
                Err(err) => {
                    warn!(error = %err, "an outbox event was not published or not marked: the stream retries it");
                    report.failed.push(sequence_number(record));
                }
            }
        }
        report
    }
}

/// A record's name in the partial-batch response: its sequence number (an empty one makes
/// Lambda retry the whole batch, never skip it).
fn sequence_number(record: &DynamoDbRecord) -> String {
    record.change.sequence_number.clone().unwrap_or_default()
}

impl lambda_runtime::tower::Service<LambdaEvent<DynamoDbEvent>> for Relay {
    type Response = DynamoDbEventResponse;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<DynamoDbEventResponse, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: LambdaEvent<DynamoDbEvent>) -> Self::Future {
        let relay = self.clone();
        Box::pin(async move { Ok(relay.relay_batch(&event.payload.records).await.response()) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use serde_json::json;

    use crate::effects::OutboxRecord;
    use crate::record::epoch_millis;

    /// What the relay measures its lag from and the sweeper orders by, read with the item.
    #[test]
    fn a_commit_time_a_parking_and_a_redrive_read_back_from_the_image() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let millis = json!({"N": epoch_millis(at).to_string()});
        let image = json!({
            "pk": {"S": "e-1"},
            "event": {"S": "placed"},
            "destination": {"S": "sqs"},
            "target": {"S": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"},
            "payload": {"S": "{}"},
            "created_at": millis,
            "parked_at": millis,
            "parked_reason": {"S": "refused"},
            "redriven_at": millis,
            "redrives": {"N": "3"},
        });
        let record = OutboxRecord::from_image(&image).expect("an outbox item");
        assert_eq!(record.created_at, Some(at));
        assert_eq!(record.parked, Some((at, "refused".to_owned())));
        assert_eq!(record.redriven, Some((3, at)));
    }
}
