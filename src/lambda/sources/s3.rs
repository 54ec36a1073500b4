//! S3: the key policy, and the event as Lambda delivers it (each record one operation; no
//! partial-batch response, so a record to deliver again fails the invocation).

use aws_lambda_events::event::s3::{S3Event, S3EventRecord};
use serde_json::{Value, json};

use crate::error::Error;
use crate::key::KeyPolicy;
use crate::lambda::batch::{BatchRecord, BatchReport};

/// S3: bucket, key, version and sequencer; fingerprint adds size and ETag.
///
/// S3 gives a sequencer to the events of PUTs and DELETEs only: an event without one (a
/// restore's start and end, a lifecycle transition or expiry, replication, tagging, an ACL)
/// is told apart from the object's other events by its name, its time (in milliseconds since
/// the epoch) and its request id as well, which S3's duplicates and Lambda's retries keep.
/// (0.4 keyed those by the object and version alone, so that a restore's completion replayed
/// its start. No 0.4 key rule reads those records: it could not tell a redelivery from the
/// object's next event.)
pub fn s3() -> KeyPolicy<S3EventRecord> {
    KeyPolicy::from_fns(
        |record: &S3EventRecord| {
            let mut parts = object_version(record);
            if sequencer(record).is_none() {
                parts.extend([
                    record.event_name.clone().into(),
                    record.event_time.timestamp_millis().into(),
                    record.response_elements.get(REQUEST_ID).cloned().into(),
                ]);
            }
            Some(Value::Array(parts))
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

/// The response element naming the request that caused an event.
const REQUEST_ID: &str = "x-amz-request-id";

/// Bucket, key, version and sequencer: the key of a PUT's or a DELETE's event.
fn object_version(record: &S3EventRecord) -> Vec<Value> {
    let object = &record.s3.object;
    let parts = [
        &record.s3.bucket.name,
        &object.key,
        &object.version_id,
        &object.sequencer,
    ];
    parts.into_iter().map(|part| part.clone().into()).collect()
}

/// The event's sequencer, unless S3 gave it none (or a blank one).
fn sequencer(record: &S3EventRecord) -> Option<&str> {
    record
        .s3
        .object
        .sequencer
        .as_deref()
        .filter(|sequencer| !sequencer.trim().is_empty())
}

/// An S3 event notification's record (one per invocation in practice): its own operation.
/// Records of one object run in order, one at a time. S3 invokes asynchronously and reads no
/// partial-batch response: a record to deliver again fails the invocation
/// ([`Error::RecordsFailed`]), Lambda
/// retries the event twice, then hands it to the function's on-failure destination or
/// dead-letter queue; a record that succeeded replays. A record that can never succeed is
/// retried by default too, so that it reaches the dead-letter queue.
impl BatchRecord for S3EventRecord {
    type Event = S3Event;
    type Response = ();
    type Error = Error;

    fn records(event: S3Event) -> Vec<Self> {
        event.records
    }

    fn response(_report: &BatchReport) {}

    fn answer(report: &BatchReport) -> Result<(), Error> {
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
