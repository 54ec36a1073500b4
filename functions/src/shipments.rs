//! An EventBridge handler made idempotent with the tower layer (binary `eventbridge_handler`):
//! `OrderShipped` events, keyed by the order in `detail` (so a re-published event with a new
//! `id` is still a duplicate), with a business identity whose evidence is permanent: a replay
//! from an EventBridge archive after the record's retention is refused, not sent again.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_idempotency::key::JsonPointer;
use lambda_idempotency::lambda::{IdempotencyLayer, current, sources};
use lambda_idempotency::{Idempotency, Operation, OperationScope};
use lambda_runtime::LambdaEvent;
use serde_json::{Value, json};

use crate::ledger::Ledger;

/// The event this function handles.
pub type ShipmentEvent = EventBridgeEvent<Value>;

/// The business operation: notify the customer that the order shipped, once.
///
/// # Errors
/// When the event has no `detail.order_id` or the ledger cannot be written.
pub async fn notify_shipped(
    ledger: Ledger,
    event: LambdaEvent<ShipmentEvent>,
) -> Result<Value, lambda_runtime::Error> {
    let detail = &event.payload.detail;
    let order = detail["order_id"]
        .as_str()
        .ok_or("the event has no detail.order_id")?;
    let attempt = current().map_or(1, |ctx| ctx.attempt());
    let sent = ledger
        .apply(&format!("shipment-notice#{order}"), &detail.to_string())
        .await?;
    Ok(json!({"order_id": order, "notified": true, "attempt": attempt, "sent": sent}))
}

/// The idempotency layer: the key is `detail.order_id`, the business identity
/// `shipment-notice:<order>` (permanent evidence in the store's uniqueness table).
///
/// # Errors
/// Never with these constants; the builders check their input.
pub fn layer(
    idem: Idempotency,
    scope: OperationScope,
) -> Result<IdempotencyLayer<ShipmentEvent>, lambda_runtime::Error> {
    let policy =
        sources::eventbridge_detail("/order_id")?.with_identity(|event: &ShipmentEvent| {
            let order = event.detail["order_id"].as_str()?;
            Some(format!("shipment-notice:{order}"))
        });
    Ok(Operation::new(idem, scope, policy)
        .with_result_ref(JsonPointer::new("/order_id")?)
        .layer())
}
