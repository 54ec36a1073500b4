//! The README's first function (binary `quickstart`): a charge made idempotent by the tower
//! layer, keyed by the event's `order_id`. Its handler sends no request of its own, so a first
//! execution costs the two idempotency requests (claim, complete) and a duplicate one; the
//! cold-start benchmark runs it.

use lambda_idempotency::lambda::{IdempotencyLayer, current};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::{Idempotency, KeyPolicy, Operation, OperationScope};
use lambda_runtime::LambdaEvent;
use serde_json::{Value, json};

/// The business operation: the charge, with the key a payment provider would deduplicate on.
///
/// # Errors
/// When it runs outside an idempotent handler.
pub async fn charge(event: LambdaEvent<Value>) -> Result<Value, lambda_runtime::Error> {
    // current(): the attempt (2+ after a crashed attempt was taken over) and the operation key;
    // downstream_key("charge") is the same on every attempt: pass it to the payment provider.
    let ctx = current().ok_or("not inside an idempotent handler")?;
    Ok(json!({"charged": event.payload["order_id"], "provider_key": ctx.downstream_key("charge")}))
}

/// The idempotency layer: one operation per `order_id`, declared safe to re-run after a crash
/// (the charge passes its downstream key to the provider, which deduplicates on it).
///
/// # Errors
/// Never with these constants; the key policy checks its pointer.
pub fn layer(
    idem: Idempotency,
    scope: OperationScope,
) -> Result<IdempotencyLayer<Value>, lambda_runtime::Error> {
    Ok(
        Operation::new(idem, scope, KeyPolicy::pointer("/order_id")?)
            .with_recovery(Recovery::Rerun)
            .layer(),
    )
}
