//! SQS: the key policies, the batch record (a FIFO message group orders its messages) and the
//! partial-batch response.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use std::sync::Arc;

use serde_json::{Value, json};

use super::{body_json, wrapped};
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy, is_empty_material};
use crate::lambda::batch::{BatchRecord, BatchReport};

/// The SQS message attribute that carries an explicit idempotency key.
pub const SQS_KEY_ATTRIBUTE: &str = crate::effects::ID_ATTRIBUTE;

/// SQS: the `idempotency-key` message attribute, else the body field at `body_pointer`,
/// **scoped to the producer** that sent the message: two producers that send the same key
/// are two operations, so that one cannot suppress (or read the result of) another's.
///
/// The producer is the role part of the message's `SenderId` attribute, which SQS sets from
/// the sender's credentials (a producer cannot choose it): the IAM role's unique id of an
/// assumed role (`AROA…`, without its `:session` part, so that a retry from another
/// instance or session of the same producer is the same producer), else the IAM user's
/// (`AIDA…`). A message without `SenderId` is keyed without a producer. A message sent again
/// by hand (from the console, a redrive script under another role) is another producer's:
/// keep the original's key and producer by redriving with SQS's own DLQ redrive, which
/// keeps the message's attributes, or key with [`sqs_across_senders`].
///
/// A body that SNS or EventBridge wrapped (a topic's subscription without raw message
/// delivery, a rule's target) is read for what was published, since each delivery wraps it
/// anew: where the body as delivered has no key (no field at `body_pointer`), the key is the
/// notification's `idempotency-key` attribute, else the field at `body_pointer` in the SNS
/// message or the event's `detail`; the fingerprint is over the topic, subject and message, or
/// the event's source, detail type, resources and detail. A key read from a wrapped body (as
/// delivered or as published) is scoped to the publisher the wrapping names too, the SNS topic
/// or the event's source and account, since `SenderId` is then the delivering service's, the
/// same for every topic and rule: a topic or source that shares the queue cannot suppress
/// another's message by publishing its key first, and a sender that writes a wrapping of its
/// own into a body stays scoped to its own `SenderId`. With raw message delivery nothing says
/// which topic published a body: give each publisher's topic its own queue.
///
/// ```
/// use aws_lambda_events::event::sqs::SqsMessage;
/// use lambda_idempotency::lambda::sources;
/// use serde_json::json;
///
/// // An outbox event the relay published to a topic, delivered twice to a subscribed queue.
/// let delivered = |message_id: &str, timestamp: &str| {
///     let mut message = SqsMessage::default();
///     message.body = Some(json!({
///         "Type": "Notification", "MessageId": message_id,
///         "TopicArn": "arn:aws:sns:eu-west-1:1:orders", "Timestamp": timestamp,
///         "Message": r#"{"event_id":"shop#7f3a","payload":{"order":"o-1"}}"#,
///         "MessageAttributes": {"idempotency-key": {"Type": "String", "Value": "shop#7f3a"}},
///     }).to_string());
///     message
/// };
/// let scope = lambda_idempotency::OperationScope::new("shop", "orders")?;
/// let policy = sources::sqs(None)?;
/// let first = policy.derive(&scope, &delivered("m-1", "2026-12-06T10:00:00Z"))?;
/// let again = policy.derive(&scope, &delivered("m-2", "2026-12-06T10:05:00Z"))?;
/// assert_eq!(first, again);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sqs(body_pointer: Option<&str>) -> Result<KeyPolicy<SqsMessage>, ConfigError> {
    let material = key_material(body_pointer)?;
    let by_0_4 = Arc::clone(&material);
    Ok(KeyPolicy::from_fns(
        move |message: &SqsMessage| {
            let Found { key, wrapped_by } = material(message)?;
            Some(match (sender_role(message), wrapped_by) {
                // The sender SQS vouches for, and (a service's SenderId being the same for
                // every topic and rule) the publisher the wrapping names.
                (Some(producer), Some(origin)) => {
                    json!({"producer": producer, "wrapped_by": origin, "key": key})
                }
                (Some(producer), None) => json!({"producer": producer, "key": key}),
                (None, Some(origin)) => json!({"wrapped_by": origin, "key": key}),
                (None, None) => key,
            })
        },
        published_body,
    )
    .with_key_as_0_4(move |message: &SqsMessage| by_0_4(message).map(|found| found.key))
    .with_intent_as_0_4(whole_body))
}

/// [`sqs`] without the producer in the key: every producer's same key names one operation.
/// For queues whose producers share one key space on purpose (one business id, whoever
/// sends it), such as the outbox's events, which the relay and the sweeper publish under
/// roles of their own; any producer can then suppress another's message by sending its key
/// first, so let only those producers send to the queue.
pub fn sqs_across_senders(
    body_pointer: Option<&str>,
) -> Result<KeyPolicy<SqsMessage>, ConfigError> {
    let material = key_material(body_pointer)?;
    Ok(KeyPolicy::from_fns(
        move |message: &SqsMessage| material(message).map(|found| found.key),
        published_body,
    )
    .with_intent_as_0_4(whole_body))
}

/// A message's key material, and who published it when it was read from a wrapping.
struct Found {
    key: Value,
    /// The wrapping's origin ([`wrapped::Wrapped::origin`]) when the key came from it.
    wrapped_by: Option<Value>,
}

/// Reads a message's key material.
type Material = Arc<dyn Fn(&SqsMessage) -> Option<Found> + Send + Sync>;

/// The key material: the `idempotency-key` attribute, else the body field at `body_pointer`
/// (every key 0.4 derived); else, in a body SNS or EventBridge wrapped, the notification's
/// `idempotency-key` attribute, else the field at `body_pointer` in what was published (the
/// message, the detail). A key read from a wrapped body comes with the wrapping's origin.
fn key_material(body_pointer: Option<&str>) -> Result<Material, ConfigError> {
    let pointer = body_pointer.map(JsonPointer::new).transpose()?;
    Ok(Arc::new(move |message: &SqsMessage| {
        let find = |document: &Value| {
            pointer
                .as_ref()
                .and_then(|p| p.find(document).cloned())
                .filter(|key| !is_empty_material(key))
        };
        let as_delivered = |key| Found {
            key,
            wrapped_by: None,
        };
        if let Some(key) = key_attribute(message) {
            return Some(as_delivered(key));
        }
        let body = body_json(message.body.as_deref());
        let Some(wrapped) = wrapped::unwrap(&body) else {
            return find(&body).map(as_delivered);
        };
        let key = find(&body)
            .or(wrapped.key_attribute)
            .or_else(|| find(&wrapped.published))?;
        Some(Found {
            key,
            wrapped_by: Some(wrapped.origin),
        })
    }))
}

/// The message's `idempotency-key` attribute, when it is not blank. Each material is checked
/// before the producer wraps it (`{"producer": …, "key": null}` is not empty): a blank
/// attribute falls back to the body, a blank body key is none.
fn key_attribute(message: &SqsMessage) -> Option<Value> {
    message
        .message_attributes
        .get(SQS_KEY_ATTRIBUTE)
        .and_then(|attribute| attribute.string_value.clone())
        .map(Value::String)
        .filter(|key| !is_empty_material(key))
}

/// The intent: of a body SNS or EventBridge wrapped (a new wrapping per delivery), what was
/// published and where; else the body.
fn published_body(message: &SqsMessage) -> Option<Value> {
    let body = body_json(message.body.as_deref());
    Some(match wrapped::unwrap(&body) {
        Some(wrapped) => wrapped.intent,
        None => body,
    })
}

/// The body as 0.4 fingerprinted it: whole.
fn whole_body(message: &SqsMessage) -> Option<Value> {
    Some(body_json(message.body.as_deref()))
}

/// The producer of `message`: the role part of its `SenderId` (`AROA…:session` → `AROA…`).
fn sender_role(message: &SqsMessage) -> Option<&str> {
    let sender = message.attributes.get("SenderId")?;
    let role = sender
        .split_once(':')
        .map_or(sender.as_str(), |(role, _)| role);
    (!role.trim().is_empty()).then_some(role)
}

/// SQS keyed by `messageId`: right only when producers never republish a message and nothing
/// is redriven from a dead-letter queue. SQS gives a redriven message a new `messageId` (the
/// console's redrive and `StartMessageMoveTask` alike), so a message that reached its
/// dead-letter queue after its effect (a crash before the completion, a batch that kept
/// timing out) runs again when redriven: on a queue with a redrive policy, key on what the
/// producer sets ([`sqs`]).
pub fn sqs_message_id() -> KeyPolicy<SqsMessage> {
    KeyPolicy::from_fns(
        |message: &SqsMessage| message.message_id.clone(),
        whole_body,
    )
}

impl BatchRecord for SqsMessage {
    type Event = SqsEvent;
    type Response = SqsBatchResponse;
    type Error = std::convert::Infallible;

    fn records(event: SqsEvent) -> Vec<Self> {
        event.records
    }

    fn response(report: &BatchReport) -> SqsBatchResponse {
        report.sqs_response()
    }

    fn answer(report: &BatchReport) -> Result<SqsBatchResponse, std::convert::Infallible> {
        Ok(Self::response(report))
    }

    fn item_identifier(&self) -> Option<String> {
        self.message_id.clone()
    }

    fn ordering_group(&self) -> Option<String> {
        let fifo = self
            .event_source_arn
            .as_deref()
            .is_some_and(|arn| arn.ends_with(".fifo"));
        fifo.then(|| {
            self.attributes
                .get("MessageGroupId")
                .cloned()
                .unwrap_or_default()
        })
    }
}

impl BatchReport {
    /// The SQS partial-batch response.
    pub fn sqs_response(&self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = self.failures(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        });
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Fingerprint, OperationScope};

    fn notification(message_id: &str, message: &str) -> SqsMessage {
        let mut delivered = SqsMessage::default();
        delivered.body = Some(
            json!({"Type": "Notification", "MessageId": message_id, "Message": message,
                "TopicArn": "arn:aws:sns:us-east-1:1:orders", "Signature": message_id,
                "MessageAttributes": {"idempotency-key": {"Type": "String", "Value": "shop#1"}}})
            .to_string(),
        );
        delivered
    }

    #[test]
    fn a_changed_message_under_the_same_key_is_another_intent() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let policy = sqs_across_senders(None).expect("policy");
        let (key, placed) = policy
            .derive(&scope, &notification("m-1", r#"{"order":"o-1"}"#))
            .expect("derived");
        let (again, changed) = policy
            .derive(&scope, &notification("m-2", r#"{"order":"o-2"}"#))
            .expect("derived");
        assert_eq!(key, again, "keyed by the notification's attribute");
        assert!(!changed.matches(&placed), "fingerprinted by its message");
    }

    /// `delivered` as SNS or EventBridge delivers to a queue: `SenderId` the service's own.
    fn from_the_service(mut delivered: SqsMessage) -> SqsMessage {
        delivered
            .attributes
            .insert("SenderId".into(), "AIDAIT2UOQQY3AUEKVGXU".into());
        delivered
    }

    /// `delivered` with its wrapping's `field` set to `value`.
    fn rewrapped(delivered: &SqsMessage, field: &str, value: &str) -> SqsMessage {
        let mut body: Value =
            serde_json::from_str(delivered.body.as_deref().expect("a body")).expect("JSON");
        body[field] = json!(value);
        let mut again = delivered.clone();
        again.body = Some(body.to_string());
        again
    }

    #[test]
    fn a_wrapped_key_is_scoped_to_its_topic_or_source_not_the_delivering_service() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let policy = sqs(Some("/detail/order_id")).expect("policy");
        let key = |message: &SqsMessage| policy.derive(&scope, message).expect("derived").0;
        let placed = from_the_service(notification("m-1", r#"{"order":"o-1"}"#));
        assert_eq!(
            key(&placed),
            key(&from_the_service(notification("m-2", r#"{"order":"o-1"}"#))),
            "the same topic's message delivered again"
        );
        let partners = rewrapped(&placed, "TopicArn", "arn:aws:sns:us-east-1:2:partner");
        assert_ne!(key(&placed), key(&partners), "another topic's same key");
        let mut forged = notification("m-9", r#"{"order":"o-1"}"#);
        forged
            .attributes
            .insert("SenderId".into(), "AROAPARTNER:session-1".into());
        assert_ne!(
            key(&placed),
            key(&forged),
            "a wrapping a sender wrote itself stays its own"
        );

        let event = from_the_service(rule_target("e-1", "OrderPlaced"));
        assert_eq!(
            key(&event),
            key(&from_the_service(rule_target("e-2", "OrderPlaced"))),
            "the same source's event delivered again"
        );
        assert_ne!(
            key(&event),
            key(&rewrapped(&event, "source", "partner.orders")),
            "another source"
        );
        assert_ne!(
            key(&event),
            key(&rewrapped(&event, "account", "222222222222")),
            "another account"
        );
    }

    fn rule_target(id: &str, detail_type: &str) -> SqsMessage {
        let mut delivered = SqsMessage::default();
        delivered.body = Some(
            json!({"version": "0", "id": id, "detail-type": detail_type, "source": "shop.orders",
                "time": id, "resources": [], "detail": {"id": "finding-1", "order_id": "o-1"}})
            .to_string(),
        );
        delivered
    }

    #[test]
    fn a_key_0_4_found_in_the_body_as_delivered_is_kept() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let by_id = sqs_across_senders(Some("/id")).expect("policy");
        let (first, _) = by_id
            .derive(&scope, &rule_target("e-1", "OrderPlaced"))
            .expect("derived");
        let (second, _) = by_id
            .derive(&scope, &rule_target("e-2", "OrderPlaced"))
            .expect("derived");
        assert_ne!(first, second, "the event's own id, not the detail's");
    }

    #[test]
    fn two_kinds_of_event_with_one_detail_are_two_intents() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let policy = sqs_across_senders(Some("/detail/order_id")).expect("policy");
        let (key, placed) = policy
            .derive(&scope, &rule_target("e-1", "OrderPlaced"))
            .expect("derived");
        let (_, again) = policy
            .derive(&scope, &rule_target("e-2", "OrderPlaced"))
            .expect("derived");
        let (same_key, cancelled) = policy
            .derive(&scope, &rule_target("e-3", "OrderCancelled"))
            .expect("derived");
        assert_eq!(key, same_key);
        assert!(again.matches(&placed), "delivered again: a replay");
        assert!(!cancelled.matches(&placed), "another detail type: refused");
    }

    #[test]
    fn a_record_0_4_wrote_for_a_wrapped_body_is_read_as_of_the_same_intent() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let delivered = notification("m-1", r#"{"order":"o-1"}"#);
        let whole = body_json(delivered.body.as_deref());
        let by_0_4 = Fingerprint::of_value(&whole).expect("0.4's fingerprint");
        for policy in [sqs(None), sqs_across_senders(None)] {
            let (_, fingerprint) = policy
                .expect("policy")
                .derive(&scope, &delivered)
                .expect("derived");
            super::super::assert_reads_0_4s_record_only(&fingerprint, &by_0_4);
        }
    }
}
