//! S3: the key policy.

use aws_lambda_events::event::s3::S3EventRecord;
use serde_json::Value;

use crate::key::KeyPolicy;

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
