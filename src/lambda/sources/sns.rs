//! SNS: the key policies, and the event as Lambda delivers it (each record one operation;
//! no partial-batch response, so a record to deliver again fails the invocation).

use aws_lambda_events::event::sns::{SnsEvent, SnsRecord};
use serde_json::json;

use super::body_json;
use crate::effects::ID_ATTRIBUTE;
use crate::error::Error;
use crate::key::KeyPolicy;
use crate::lambda::batch::{BatchRecord, BatchReport};

/// SNS: `MessageId`; fingerprint over the message. A message published again (an outbox event
/// the sweeper republished) gets a new `MessageId`: for those, [`sns_by_key_attribute`].
pub fn sns() -> KeyPolicy<SnsRecord> {
    KeyPolicy::from_fns(
        |record: &SnsRecord| Some(record.sns.message_id.clone()),
        |record: &SnsRecord| Some(body_json(Some(&record.sns.message))),
    )
}

/// SNS keyed by the `idempotency-key` message attribute (what the outbox relay sets to the
/// event id), **scoped to the topic** that delivered it, else by `MessageId`; fingerprint over
/// the message. An outbox event published again (a new `MessageId`, the same envelope) is a
/// replay; two topics' same key are two operations.
///
/// ```
/// use aws_lambda_events::event::sns::{MessageAttribute, SnsRecord};
/// use lambda_idempotency::lambda::sources;
///
/// let delivered = |message_id: &str| {
///     let mut record = SnsRecord::default();
///     record.sns.message_id = message_id.into();
///     record.sns.topic_arn = "arn:aws:sns:eu-west-1:1:orders".into();
///     record.sns.message = r#"{"event_id":"shop#7f3a","event":"order-placed","payload":{}}"#.into();
///     let mut attribute = MessageAttribute::default();
///     attribute.data_type = "String".into();
///     attribute.value = "shop#7f3a".into();
///     record.sns.message_attributes.insert("idempotency-key".into(), attribute);
///     record
/// };
/// let scope = lambda_idempotency::OperationScope::new("shop", "orders")?;
/// let policy = sources::sns_by_key_attribute();
/// let (first, _) = policy.derive(&scope, &delivered("m-1"))?;
/// let (again, _) = policy.derive(&scope, &delivered("m-2-republished"))?;
/// assert_eq!(first, again);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sns_by_key_attribute() -> KeyPolicy<SnsRecord> {
    KeyPolicy::from_fns(
        |record: &SnsRecord| {
            let attribute = record.sns.message_attributes.get(ID_ATTRIBUTE);
            match attribute {
                // A blank key names no operation: the record has none (`MissingKey`).
                Some(key) if key.value.trim().is_empty() => None,
                Some(key) => Some(json!({"topic": record.sns.topic_arn, "key": key.value})),
                None => Some(json!(record.sns.message_id)),
            }
        },
        |record: &SnsRecord| Some(body_json(Some(&record.sns.message))),
    )
}

/// An SNS record of the event Lambda delivers (one per invocation in practice): its own
/// operation. SNS invokes asynchronously and reads no partial-batch response: a record to
/// deliver again fails the invocation
/// ([`Error::RecordsFailed`]), Lambda
/// retries the event twice, then hands it to the function's on-failure destination or
/// dead-letter queue; a record that succeeded replays. A record that can never succeed is
/// retried by default too, so that it reaches the dead-letter queue.
impl BatchRecord for SnsRecord {
    type Event = SnsEvent;
    type Response = ();
    type Error = Error;

    fn records(event: SnsEvent) -> Vec<Self> {
        event.records
    }

    fn response(_report: &BatchReport) {}

    fn answer(report: &BatchReport) -> Result<(), Error> {
        report.records_failed()
    }

    fn item_identifier(&self) -> Option<String> {
        Some(self.sns.message_id.clone())
    }

    fn ordering_group(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use aws_lambda_events::event::sns::{MessageAttribute, SnsRecord};

    use super::sns_by_key_attribute;
    use crate::{Error, OperationScope};

    #[test]
    fn a_blank_key_attribute_is_no_key() {
        let mut record = SnsRecord::default();
        record.sns.message_id = "m-1".into();
        let mut attribute = MessageAttribute::default();
        attribute.data_type = "String".into();
        attribute.value = "  ".into();
        record
            .sns
            .message_attributes
            .insert(crate::effects::ID_ATTRIBUTE.into(), attribute);
        let scope = OperationScope::new("shop", "orders");
        let derived = scope.map(|scope| sns_by_key_attribute().derive(&scope, &record));
        assert!(matches!(derived, Ok(Err(Error::MissingKey { .. }))));
    }
}
