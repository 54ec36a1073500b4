//! EventBridge: the key policies.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::to_json;
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy, is_empty_material};

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

/// EventBridge: a field of `detail` (a business id that survives re-publishing), scoped to the
/// event's `source` and `account` (the account EventBridge vouches for: another account, or
/// another source, that sends the same id on a bus it may put events on names another
/// operation, never one that blocks or answers this one's); fingerprint over the event's source,
/// detail type, resources and detail, so that another kind of event with the same detail (an
/// `OrderCancelled` after an `OrderPlaced`) is refused as a changed payload, never answered
/// with the first one's outcome. 0.4 keyed by the field alone: with
/// [`ConfigBuilder::keyed_by_0_4_before`](crate::config::ConfigBuilder::keyed_by_0_4_before)
/// a redelivery 0.4 recorded is answered by its record's state; a record 0.4 wrote
/// (fingerprinted over `detail` alone) is read as 0.4 fingerprinted it.
///
/// ```
/// use aws_lambda_events::event::eventbridge::EventBridgeEvent;
/// use lambda_idempotency::OperationScope;
/// use lambda_idempotency::lambda::sources;
/// use serde_json::{Value, json};
///
/// let placed = |account: &str| -> EventBridgeEvent<Value> {
///     serde_json::from_value(json!({"version": "0", "id": "e-1", "detail-type": "OrderPlaced",
///         "source": "shop.orders", "account": account, "time": "2026-12-07T10:00:00Z",
///         "region": "eu-west-1", "resources": [], "detail": {"order_id": "o-1"}}))
///     .expect("an EventBridge event")
/// };
/// let scope = OperationScope::new("shipments", "notify")?;
/// let policy = sources::eventbridge_detail::<Value>("/order_id")?;
/// let (ours, _) = policy.derive(&scope, &placed("111111111111"))?;
/// let (theirs, _) = policy.derive(&scope, &placed("222222222222"))?;
/// assert_ne!(ours, theirs, "another account's order o-1 is another operation");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn eventbridge_detail<T: Serialize + DeserializeOwned + 'static>(
    detail_pointer: &str,
) -> Result<KeyPolicy<EventBridgeEvent<T>>, ConfigError> {
    let pointer = JsonPointer::new(detail_pointer)?;
    let by_0_4 = pointer.clone();
    Ok(KeyPolicy::from_fns(
        move |event: &EventBridgeEvent<T>| {
            // An absent or empty business id is no key, though the wrapper around it is not
            // empty: refused as missing, never one key for every such event.
            let key = pointer
                .find(&to_json(&event.detail)?)
                .filter(|key| !is_empty_material(key))?
                .clone();
            Some(json!({"source": event.source, "account": event.account, "key": key}))
        },
        |event: &EventBridgeEvent<T>| {
            Some(json!({
                "source": event.source,
                "detail-type": event.detail_type,
                "resources": event.resources,
                "detail": to_json(&event.detail)?,
            }))
        },
    )
    .with_key_as_0_4(move |event: &EventBridgeEvent<T>| {
        by_0_4.find(&to_json(&event.detail)?).cloned()
    })
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
    fn an_empty_business_id_is_a_missing_key() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let policy = eventbridge_detail::<Value>("/order_id").expect("policy");
        for empty in [json!(null), json!(""), json!({}), json!([])] {
            let mut placed = event("OrderPlaced");
            placed.detail = json!({"order_id": empty, "customer": "c-9"});
            assert!(
                matches!(
                    policy.derive(&scope, &placed),
                    Err(crate::Error::MissingKey { .. })
                ),
                "{empty}"
            );
        }
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
    fn another_account_or_source_with_the_same_id_is_another_operation() {
        let scope = OperationScope::new("shop", "orders").expect("scope");
        let policy = eventbridge_detail::<Value>("/order_id").expect("policy");
        let ours = event("OrderPlaced");
        let (key, _) = policy.derive(&scope, &ours).expect("derived");
        let mut other_account = ours.clone();
        other_account.account = Some("222222222222".into());
        let mut other_source = ours.clone();
        other_source.source = "another.shop".into();
        for other in [other_account, other_source] {
            let (theirs, _) = policy.derive(&scope, &other).expect("derived");
            assert_ne!(key, theirs, "{other:?}");
        }
        let by_0_4 = crate::key::OperationKey::derive(&scope, None, &json!("o-1")).expect("key");
        let derived = policy
            .derive_for_tenant(&scope, &ours, None)
            .expect("derived");
        assert_eq!(derived.key_by_0_4, Some(by_0_4), "0.4's key");
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
