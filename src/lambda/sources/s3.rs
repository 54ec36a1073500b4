//! S3: the key policy, and the event as Lambda delivers it (each record one operation; no
//! partial-batch response, so a record to deliver again fails the invocation).

use aws_lambda_events::event::s3::{S3Event, S3EventRecord};
use serde_json::{Value, json};

use crate::key::KeyPolicy;
use crate::lambda::batch::{BatchError, BatchRecord, BatchReport};

/// S3: bucket, key, version and sequencer; fingerprint adds size and ETag.
pub fn s3() -> KeyPolicy<S3EventRecord> {
    KeyPolicy::from_fns(
        |record: &S3EventRecord| {
            let object = &record.s3.object;
            let parts = [
                &record.s3.bucket.name,
                &object.key,
                &object.version_id,
                &object.sequencer,
            ];
            Some(Value::Array(
                parts.into_iter().map(|part| part.clone().into()).collect(),
            ))
        },
        |record: &S3EventRecord| {
            let object = &record.s3.object;
            let names = [
                &record.s3.bucket.name,
                &object.key,
                &object.version_id,
                &object.e_tag,
            ];
            let mut parts: Vec<Value> = names.into_iter().map(|part| part.clone().into()).collect();
            parts.push(object.size.into());
            Some(Value::Array(parts))
        },
    )
}

/// An S3 event notification's record (one per invocation in practice): its own operation.
/// Records of one object run in order, one at a time. S3 invokes asynchronously and reads no
/// partial-batch response: a record to deliver again fails the invocation
/// ([`BatchError::RecordsFailed`]), Lambda
/// retries the event twice, then hands it to the function's on-failure destination or
/// dead-letter queue; a record that succeeded replays. A record that can never succeed is
/// retried by default too, so that it reaches the dead-letter queue.
impl BatchRecord for S3EventRecord {
    type Event = S3Event;
    type Response = ();
    type Error = BatchError;

    fn records(event: S3Event) -> Vec<Self> {
        event.records
    }

    fn response(_report: &BatchReport) {}

    fn answer(report: &BatchReport) -> Result<(), BatchError> {
        report.records_failed()
    }

    /// The object's sequencer (an opaque hex string): object keys may name people, and the
    /// identifier goes into logs.
    fn item_identifier(&self) -> Option<String> {
        self.s3.object.sequencer.clone()
    }

    fn ordering_group(&self) -> Option<String> {
        Some(json!([self.s3.bucket.name, self.s3.object.key]).to_string())
    }
}
