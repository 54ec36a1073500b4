//! The event sources that deliver at least once, one module each: its key policy and, for
//! batch sources, its batch record (identifier, ordering group, poison policy) and its
//! partial-batch response.
//!
//! Each chooses a key that names the *operation* (stable across redeliveries) and a fingerprint
//! over the business part of the event (body, detail, image), never over transport fields that
//! change on redelivery (receipt handles, receive counts, timestamps). Each is a [`KeyPolicy`](crate::KeyPolicy):
//! override any part with its builder methods.
//!
//! | source | key | fingerprint |
//! |---|---|---|
//! | SQS ([`sqs`]) | the producer (`SenderId`'s role part; of a wrapped body, also the topic or the source and account) + the `idempotency-key` message attribute, else the body field you name, else (in a body SNS or EventBridge wrapped) the notification's `idempotency-key` attribute, else the field in the message or `detail` | body (of a wrapped one: the topic, subject and message; the source, detail type, resources and detail) |
//! | SQS ([`sqs_across_senders`]) | as [`sqs`], without the producer: every producer shares one key space | as [`sqs`] |
//! | SQS ([`sqs_message_id`]) | `messageId` (opt in: a republish, and a redrive from a dead-letter queue, get a new id) | body |
//! | SNS ([`sns`]) | `MessageId` (a republish gets a new id) | message |
//! | SNS ([`sns_by_key_attribute`]) | the topic + the `idempotency-key` message attribute (an outbox event's id), else `MessageId` | message |
//! | EventBridge ([`eventbridge`], [`eventbridge_detail`]) | `id`, or a `detail` field with the event's source and account | detail; with a `detail` field, the source, detail type and resources too |
//! | HTTP: API Gateway REST/HTTP, Function URLs, ALB ([`http()`]) | caller + `Idempotency-Key` header (a Structured Field String when quoted) | method, path, decoded query sorted by name, content type, body bytes |
//! | DynamoDB Streams ([`dynamodb_stream`]) | `eventID` | keys and new image |
//! | Kinesis ([`kinesis`], [`kinesis_data`]) | shard sequence number within its stream (`eventID` and `eventSourceARN`: one stored record, which a producer's retry stores again), or a field of the data | data |
//! | S3 ([`s3`]) | bucket, key, version, sequencer; for an event other than `ObjectCreated:*` and `ObjectRemoved:*`, or one without a sequencer, also its name, time and `x-amz-request-id` | bucket, key, version, ETag and size |
//!
//! ```
//! use lambda_idempotency::lambda::sources;
//! use aws_lambda_events::event::sqs::SqsMessage;
//!
//! let policy = sources::sqs(Some("/order_id"))?;
//! let mut message = SqsMessage::default();
//! message.body = Some(r#"{"order_id": "o-1", "amount": 10}"#.into());
//! let scope = lambda_idempotency::OperationScope::new("shop", "orders")?;
//! let (key, _) = policy.derive(&scope, &message)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "eventbridge")]
mod eventbridge;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "kinesis")]
mod kinesis;
#[cfg(feature = "s3")]
mod s3;
#[cfg(feature = "sns")]
mod sns;
#[cfg(feature = "sqs")]
mod sqs;
#[cfg(feature = "sqs")]
mod wrapped;

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use dynamodb::dynamodb_stream;
#[cfg(feature = "eventbridge")]
#[cfg_attr(docsrs, doc(cfg(feature = "eventbridge")))]
pub use eventbridge::{eventbridge, eventbridge_detail};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use http::http;
#[cfg(feature = "kinesis")]
#[cfg_attr(docsrs, doc(cfg(feature = "kinesis")))]
pub use kinesis::{kinesis, kinesis_data};
#[cfg(feature = "s3")]
#[cfg_attr(docsrs, doc(cfg(feature = "s3")))]
pub use s3::s3;
#[cfg(feature = "sns")]
#[cfg_attr(docsrs, doc(cfg(feature = "sns")))]
pub use sns::{sns, sns_by_key_attribute};
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub use sqs::{SQS_KEY_ATTRIBUTE, sqs, sqs_across_senders, sqs_message_id};

/// A message body as JSON: parsed when it is JSON, else the string itself.
#[cfg(any(feature = "sns", feature = "sqs"))]
pub(crate) fn body_json(body: Option<&str>) -> serde_json::Value {
    match body {
        Some(body) => serde_json::from_str(body)
            .unwrap_or_else(|_| serde_json::Value::String(body.to_owned())),
        None => serde_json::Value::Null,
    }
}

#[cfg(any(feature = "dynamodb", feature = "eventbridge", feature = "kinesis"))]
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Option<serde_json::Value> {
    serde_json::to_value(value).ok()
}

#[cfg(feature = "dynamodb")]
pub(crate) fn object<const N: usize>(fields: [(&str, serde_json::Value); N]) -> serde_json::Value {
    serde_json::Value::Object(
        fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
    )
}

/// Asserts that `fingerprint`, of another projection than 0.4's (`by_0_4`), names a record
/// 0.4 wrote with `by_0_4` (no key rule stated) and never one a later version wrote with it.
#[cfg(all(test, any(feature = "sqs", feature = "eventbridge")))]
pub(crate) fn assert_reads_0_4s_record_only(
    fingerprint: &crate::key::Fingerprint,
    by_0_4: &crate::key::Fingerprint,
) {
    use crate::key::{Fingerprint, KeyRule};
    let now = std::time::SystemTime::now();
    assert!(!fingerprint.matches(by_0_4), "another projection");
    let unstated = Fingerprint::from_stored(by_0_4.as_str());
    assert!(fingerprint.names(&unstated, now), "0.4's record");
    let stated = Fingerprint::from_stored_under(by_0_4.as_str(), KeyRule::CURRENT);
    assert!(!fingerprint.names(&stated, now), "0.5's never");
}
