//! A queue's message whose body another service wrapped: an SNS notification (a topic's SQS
//! subscription without raw message delivery) or an EventBridge event (a rule's SQS target).
//! Each delivery of one published message wraps it anew (a new `MessageId`, `Timestamp` and
//! `Signature`; a new event `id` and `time`), so the SQS door keys and fingerprints what was
//! published, not the wrapping.

use serde_json::{Value, json};

use super::body_json;
use crate::effects::ID_ATTRIBUTE;
use crate::key::is_empty_material;

/// What a wrapped body carries.
pub(super) struct Wrapped {
    /// The SNS notification's `idempotency-key` message attribute (what the outbox relay sets
    /// to the event id), when it has one that is not blank.
    pub(super) key_attribute: Option<Value>,
    /// What was published, where a body pointer looks for the key when the body as delivered
    /// has none there: the SNS message (as JSON when it is JSON) or the EventBridge event's
    /// `detail`.
    pub(super) published: Value,
    /// The intent, without what each delivery renews: the SNS topic, subject and message; the
    /// EventBridge event's source, detail type, resources and detail.
    pub(super) intent: Value,
    /// Who published it, as the wrapping says (SQS's `SenderId` is then the delivering
    /// service's, the same for every topic and rule): the SNS topic's ARN; the EventBridge
    /// event's source and account.
    pub(super) origin: Value,
}

/// What `body` wraps, when it is an SNS notification or an EventBridge event; `None` for any
/// other body.
pub(super) fn unwrap(body: &Value) -> Option<Wrapped> {
    let wrapping = body.as_object()?;
    let field = |name: &str| wrapping.get(name).cloned().unwrap_or(Value::Null);
    let text = |name: &str| wrapping.get(name).and_then(Value::as_str);
    if text("Type") == Some("Notification")
        && text("TopicArn").is_some()
        && text("MessageId").is_some()
    {
        let key_attribute = wrapping
            .get("MessageAttributes")
            .and_then(|attributes| attributes.get(ID_ATTRIBUTE))
            .and_then(|attribute| attribute.get("Value"))
            .and_then(Value::as_str)
            .map(|key| Value::String(key.to_owned()))
            .filter(|key| !is_empty_material(key));
        let message = body_json(Some(text("Message")?));
        return Some(Wrapped {
            key_attribute,
            intent: json!({"topic": field("TopicArn"), "subject": field("Subject"), "message": message}),
            published: message,
            origin: field("TopicArn"),
        });
    }
    if text("detail-type").is_some() && text("source").is_some() && text("id").is_some() {
        let detail = wrapping.get("detail")?.clone();
        return Some(Wrapped {
            key_attribute: None,
            intent: json!({"source": field("source"), "detail-type": field("detail-type"),
                "resources": field("resources"), "detail": detail}),
            published: detail,
            origin: json!({"source": field("source"), "account": field("account")}),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notification(message_id: &str, key: Option<&str>) -> Value {
        let mut body = json!({
            "Type": "Notification", "MessageId": message_id,
            "TopicArn": "arn:aws:sns:us-east-1:1:orders",
            "Message": r#"{"event_id":"shop#1","payload":{"order":"o-1"}}"#,
            "Timestamp": "2026-12-06T10:00:00.000Z", "SignatureVersion": "1", "Signature": "x"
        });
        if let Some(key) = key {
            body["MessageAttributes"] =
                json!({"idempotency-key": {"Type": "String", "Value": key}});
        }
        body
    }

    #[test]
    fn an_sns_notification_gives_its_message_and_key_attribute() {
        let wrapped = unwrap(&notification("m-1", Some("shop#1"))).expect("a notification");
        assert_eq!(wrapped.key_attribute, Some(json!("shop#1")));
        assert_eq!(wrapped.published["payload"]["order"], "o-1");
        assert_eq!(wrapped.intent["topic"], "arn:aws:sns:us-east-1:1:orders");
        assert_eq!(wrapped.intent["message"], wrapped.published);
        let blank = unwrap(&notification("m-1", Some(" "))).expect("a notification");
        assert_eq!(blank.key_attribute, None, "a blank key is none");
    }

    #[test]
    fn an_eventbridge_event_gives_its_detail() {
        let event = json!({"version": "0", "id": "e-1", "detail-type": "OrderPlaced",
            "source": "shop.orders", "time": "2026-12-06T10:00:00Z", "detail": {"event_id": "shop#1"}});
        let wrapped = unwrap(&event).expect("an event");
        assert_eq!(wrapped.published, json!({"event_id": "shop#1"}));
        assert_eq!(
            wrapped.intent,
            json!({"source": "shop.orders", "detail-type": "OrderPlaced", "resources": null,
                "detail": {"event_id": "shop#1"}})
        );
        assert_eq!(wrapped.key_attribute, None);
    }

    #[test]
    fn any_other_body_is_not_wrapped() {
        for body in [
            json!({"order_id": "o-1"}),
            json!({"Type": "Notification", "Message": "no topic"}),
            json!("text"),
            json!({"detail-type": "x", "source": "y"}),
        ] {
            assert!(unwrap(&body).is_none(), "{body}");
        }
    }
}
