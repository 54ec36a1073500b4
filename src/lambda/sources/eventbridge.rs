//! EventBridge: the key policies.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::to_json;
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy};

/// EventBridge: the event `id`; fingerprint over `detail`.
///
/// The `id` is EventBridge's, one per `PutEvents` entry it accepted: its retries of a delivery
/// keep it, but a producer that publishes the same event again (its `PutEvents` answer lost,
/// an outbox republishing) makes a new one, which runs again. Key such events by a business
/// field ([`eventbridge_detail`]), or declare a business identity.
pub fn eventbridge<T: Serialize + DeserializeOwned + 'static>() -> KeyPolicy<EventBridgeEvent<T>> {
    KeyPolicy::from_fns(
        |event: &EventBridgeEvent<T>| event.id.clone(),
        |event: &EventBridgeEvent<T>| to_json(&event.detail),
    )
}

/// EventBridge: a field of `detail` (a business id that survives re-publishing); fingerprint
/// over the event's source, detail type, resources and detail, so that another kind of event
/// with the same detail (an `OrderCancelled` after an `OrderPlaced`) is refused as a changed
/// payload, never answered with the first one's outcome. A record 0.4 wrote (fingerprinted
/// over `detail` alone) is read as 0.4 fingerprinted it.
pub fn eventbridge_detail<T: Serialize + DeserializeOwned + 'static>(
    detail_pointer: &str,
) -> Result<KeyPolicy<EventBridgeEvent<T>>, ConfigError> {
    let pointer = JsonPointer::new(detail_pointer)?;
    Ok(KeyPolicy::from_fns(
        move |event: &EventBridgeEvent<T>| pointer.find(&to_json(&event.detail)?).cloned(),
        |event: &EventBridgeEvent<T>| {
            Some(json!({
                "source": event.source,
                "detail-type": event.detail_type,
                "resources": event.resources,
                "detail": to_json(&event.detail)?,
            }))
        },
    )
    .with_intent_as_0_4(|event: &EventBridgeEvent<T>| to_json(&event.detail)))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::key::{Fingerprint, OperationScope};

    fn event(detail_type: &str) -> EventBridgeEvent<Value> {
        let mut event = EventBridgeEvent::default();
        event.source = "shop.orders".into();
        event.detail_type = detail_type.into();
        event.detail = json!({"order_id": "o-1", "customer": "c-9"});
        event
    }

    #[test]
    fn another_kind_of_event_with_the_same_detail_is_another_intent() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let policy = eventbridge_detail::<Value>("/order_id").expect("policy");
        let (key, placed) = policy
            .derive(&scope, &event("OrderPlaced"))
            .expect("derived");
        let (same_key, cancelled) = policy
            .derive(&scope, &event("OrderCancelled"))
            .expect("derived");
        assert_eq!(key, same_key, "keyed by the detail's field");
        assert!(!cancelled.matches(&placed), "another kind of event");
        let mut again = event("OrderPlaced");
        again.id = Some("another-delivery".into());
        let (_, redelivered) = policy.derive(&scope, &again).expect("derived");
        assert!(redelivered.matches(&placed), "the same event again");
    }

    #[test]
    fn a_record_0_4_wrote_is_read_as_of_the_same_intent() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let placed = event("OrderPlaced");
        let by_0_4 = Fingerprint::of_value(&placed.detail).expect("0.4's fingerprint");
        let policy = eventbridge_detail::<Value>("/order_id").expect("policy");
        let (_, fingerprint) = policy.derive(&scope, &placed).expect("derived");
        super::super::assert_reads_0_4s_record_only(&fingerprint, &by_0_4);
    }
}
