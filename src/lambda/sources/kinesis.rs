//! Kinesis: the key policy, the batch record (a partition key orders its records) and the
//! partial-batch response.

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};

use serde_json::{Value, json};

use super::to_json;
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy};
use crate::lambda::batch::{BatchRecord, BatchReport, PoisonPolicy};

/// Kinesis: `eventID` (shard and sequence number) within its stream (`eventSourceARN`);
/// fingerprint over the data.
///
/// A sequence number is unique within its shard, and every stream numbers its shards from
/// `shardId-000000000000`: a function reading two streams keys their records apart by the
/// stream (0.4 keyed by `eventID` alone; a redelivery 0.4 recorded is answered under
/// [`ConfigBuilder::keyed_by_0_4_before`](crate::config::ConfigBuilder::keyed_by_0_4_before)).
///
/// The sequence number is one record the stream stored, not one operation: it keeps Lambda's
/// redeliveries of that record to one effect, but a producer's `PutRecord` retried after a
/// lost answer stores the same data again under a new sequence number, which runs again. Key
/// such streams by an event id in the data ([`kinesis_data`]).
pub fn kinesis() -> KeyPolicy<KinesisEventRecord> {
    KeyPolicy::from_fns(
        |record: &KinesisEventRecord| {
            let id = stored_id(record)?;
            Some(match record.event_source_arn.as_deref() {
                Some(stream) if !stream.is_empty() => json!({"stream": stream, "id": id}),
                _ => Value::String(id),
            })
        },
        |record: &KinesisEventRecord| to_json(&record.kinesis.data),
    )
    .with_key_as_0_4(stored_id)
}

/// The record's id in its stream: `eventID`, else its sequence number.
fn stored_id(record: &KinesisEventRecord) -> Option<String> {
    record
        .event_id
        .clone()
        .or_else(|| Some(record.kinesis.sequence_number.clone()))
}

/// Kinesis: a field of the record's data read as JSON, at `data_pointer`, that names one event:
/// an id the producer writes once per event and its retries keep (an outbox's `event_id`, a
/// UUID made before the first `PutRecord`); fingerprint over the data. Not an entity's id (an
/// order's, which many events share): the order's next event would be another intent under the
/// same key, a payload conflict, which a stream acknowledges as poison under the default
/// policy. A record whose data is no JSON, or has no such field (a mistyped pointer, a KPL
/// aggregate, compressed data), has no key ([`Error::MissingKey`](crate::Error::MissingKey)):
/// acknowledged as poison too, and logged at error level; set
/// [`PoisonPolicy::Retry`] ([`BatchProcessor::with_poison_policy`](crate::BatchProcessor::with_poison_policy)) with an on-failure destination to keep them
/// instead. As with any key read from a field a producer sets, every producer that can write to
/// the stream names one operation by the same id.
///
/// ```
/// use aws_lambda_events::event::kinesis::KinesisEventRecord;
/// use lambda_idempotency::lambda::sources;
/// use lambda_idempotency::OperationScope;
///
/// let stored = |sequence_number: &str| {
///     let mut record = KinesisEventRecord::default();
///     record.kinesis.sequence_number = sequence_number.into();
///     record.kinesis.data.0 = br#"{"event_id":"7f3a","order_id":"o-1","amount":5}"#.to_vec();
///     record
/// };
/// let scope = OperationScope::new("shop", "orders")?;
/// let policy = sources::kinesis_data("/event_id")?;
/// // A producer's retry stored the same data under another sequence number: one operation.
/// let (first, _) = policy.derive(&scope, &stored("4954"))?;
/// let (retried, _) = policy.derive(&scope, &stored("4955"))?;
/// assert_eq!(first, retried);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`ConfigError`] for a `data_pointer` that is no JSON pointer.
pub fn kinesis_data(data_pointer: &str) -> Result<KeyPolicy<KinesisEventRecord>, ConfigError> {
    let pointer = JsonPointer::new(data_pointer)?;
    Ok(KeyPolicy::from_fns(
        move |record: &KinesisEventRecord| {
            let data: serde_json::Value = serde_json::from_slice(&record.kinesis.data.0).ok()?;
            pointer.find(&data).cloned()
        },
        |record: &KinesisEventRecord| to_json(&record.kinesis.data),
    ))
}

impl BatchRecord for KinesisEventRecord {
    type Event = KinesisEvent;
    type Response = KinesisEventResponse;
    type Error = std::convert::Infallible;

    fn records(event: KinesisEvent) -> Vec<Self> {
        event.records
    }

    fn response(report: &BatchReport) -> KinesisEventResponse {
        report.kinesis_response()
    }

    fn answer(report: &BatchReport) -> Result<KinesisEventResponse, std::convert::Infallible> {
        Ok(Self::response(report))
    }

    fn item_identifier(&self) -> Option<String> {
        Some(self.kinesis.sequence_number.clone())
    }

    fn ordering_group(&self) -> Option<String> {
        Some(self.kinesis.partition_key.clone())
    }

    fn default_poison_policy() -> PoisonPolicy {
        PoisonPolicy::Acknowledge
    }
}

impl BatchReport {
    /// The Kinesis partial-batch response.
    pub fn kinesis_response(&self) -> KinesisEventResponse {
        let mut response = KinesisEventResponse::default();
        response.batch_item_failures = self.failures(|id| {
            let mut failure = KinesisBatchItemFailure::default();
            failure.item_identifier = Some(id);
            failure
        });
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::key::OperationScope;

    fn stored(sequence_number: &str, data: &[u8]) -> KinesisEventRecord {
        let mut record = KinesisEventRecord::default();
        record.kinesis.sequence_number = sequence_number.into();
        record.event_id = Some(format!("shardId-000:{sequence_number}"));
        record.kinesis.data.0 = data.to_vec();
        record
    }

    /// A producer's retry (the same data, a new sequence number) is one operation by the data's
    /// field, two by `eventID`; other data under the same id is another intent; data that is no
    /// JSON, or lacks the field, has no key.
    #[test]
    fn a_retried_put_is_one_operation_by_the_datas_field() -> Result<(), Box<dyn std::error::Error>>
    {
        let scope = OperationScope::new("shop", "orders")?;
        let by_field = kinesis_data("/event_id")?;
        let data = br#"{"event_id":"e-1","amount":5}"#;
        let (first, intent) = by_field.derive(&scope, &stored("1", data))?;
        let (retried, same_intent) = by_field.derive(&scope, &stored("2", data))?;
        assert_eq!((first, intent.clone()), (retried, same_intent));
        let changed = br#"{"event_id":"e-1","amount":6}"#;
        let (_, other_intent) = by_field.derive(&scope, &stored("3", changed))?;
        assert_ne!(intent, other_intent);
        let (by_id, _) = kinesis().derive(&scope, &stored("1", data))?;
        let (retried_by_id, _) = kinesis().derive(&scope, &stored("2", data))?;
        assert_ne!(by_id, retried_by_id);
        for keyless in [&b"not json"[..], br#"{"amount":5}"#, br#"{"event_id":" "}"#] {
            let derived = by_field.derive(&scope, &stored("4", keyless));
            assert!(
                matches!(derived, Err(Error::MissingKey { .. })),
                "{derived:?}"
            );
        }
        Ok(())
    }
}
