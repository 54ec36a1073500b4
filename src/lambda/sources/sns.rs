//! SNS: the key policy.

use aws_lambda_events::event::sns::SnsRecord;

use super::body_json;
use crate::key::KeyPolicy;

/// SNS: `MessageId`; fingerprint over the message.
pub fn sns() -> KeyPolicy<SnsRecord> {
    KeyPolicy::from_fns(
        |record: &SnsRecord| Some(record.sns.message_id.clone()),
        |record: &SnsRecord| Some(body_json(Some(&record.sns.message))),
    )
}
