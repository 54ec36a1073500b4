//! S3: the key policy, and the event as Lambda delivers it (each record one operation; no
//! partial-batch response, so a record to deliver again fails the invocation).

use aws_lambda_events::event::s3::{S3Event, S3EventRecord};
use serde_json::{Value, json};

use crate::error::Error;
use crate::key::KeyPolicy;
use crate::lambda::batch::{BatchRecord, BatchReport};

/// S3: bucket, key, version and sequencer; fingerprint adds size and ETag.
///
/// An object's creation and removal (`ObjectCreated:*`, `ObjectRemoved:*`) each get a
/// sequencer of their own: those four name the event. Every other event (a restore's start and
/// end, a lifecycle transition or expiry, replication, tagging, an ACL) carries the object
/// version's sequencer (its upload's), or none: it is told apart from the object's other events
/// by its name, its time (in milliseconds since the epoch) and its request id as well, which
/// S3's duplicates and Lambda's retries keep. So is a creation or removal that comes without a
/// sequencer. (0.4 keyed those by the object, version and sequencer alone, so that a restore was
/// answered as a replay of the upload and a restore's completion as a replay of its start. No
/// 0.4 key rule reads those records: it could not tell a redelivery from the object's next
/// event.)
pub fn s3() -> KeyPolicy<S3EventRecord> {
    KeyPolicy::from_fns(
        |record: &S3EventRecord| {
            let mut parts = object_version(record);
            if !(creates_or_removes(record) && sequencer(record).is_some()) {
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

/// Bucket, key, version and sequencer: the key of an object's creation or removal.
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

/// Whether the event is an object's creation or removal (`ObjectCreated:*`, `ObjectRemoved:*`,
/// with or without the `s3:` prefix of a notification configuration's names), whose
/// sequencer is its own.
fn creates_or_removes(record: &S3EventRecord) -> bool {
    record.event_name.as_deref().is_some_and(|name| {
        let name = name.strip_prefix("s3:").unwrap_or(name);
        name.starts_with("ObjectCreated:") || name.starts_with("ObjectRemoved:")
    })
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
