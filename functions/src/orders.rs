//! An SQS order consumer with partial batch failures (binary `sqs_orders`).
//!
//! Each message places one order: an effect in the ledger table. Redelivered messages (even
//! republished with a new message id) are acknowledged from the stored outcome; only failed or
//! in-progress messages come back in `batchItemFailures`.

use std::convert::Infallible;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{ExecutionContext, Idempotency, Operation, OperationScope};
use lambda_runtime::LambdaEvent;
use lambda_runtime::tower::Service;
use serde_json::{Value, json};

use crate::ledger::Ledger;

/// The order consumer: a service over the SQS event, one operation per message keyed by the
/// body's `order_id` in `scope`, answering the partial-batch response.
///
/// # Errors
/// Never with these constants; the builders check their input.
pub fn orders(
    idem: Idempotency,
    ledger: Ledger,
    scope: OperationScope,
) -> Result<
    impl Service<LambdaEvent<SqsEvent>, Response = SqsBatchResponse, Error = Infallible, Future: Send>
    + Clone
    + Send,
    lambda_runtime::Error,
> {
    // Outlive the longest a message can live, so that a late redelivery still replays: 14 days
    // from its first enqueue (the dead-letter queue's retention, which counts from it; the
    // queue's own, template.yaml's QueueRetentionSeconds, is at most 10), then up to 14 more
    // once a redrive sends it back as a new message.
    let orders = Operation::new(idem, scope, sources::sqs(Some("/order_id"))?)
        .with_retention(Duration::from_secs(28 * 24 * 3600))?;
    Ok(orders
        .batch()
        .service(move |message, ctx| place_order(ledger.clone(), message, ctx)))
}

/// The business operation: place the order (an effect in the ledger).
async fn place_order(
    ledger: Ledger,
    message: SqsMessage,
    ctx: ExecutionContext,
) -> Result<Value, lambda_runtime::Error> {
    let order: Value = serde_json::from_str(message.body.as_deref().unwrap_or_default())?;
    let id = order["order_id"]
        .as_str()
        .ok_or("the order has no order_id")?;
    let applied = ledger
        .apply(&format!("order#{id}"), &order.to_string())
        .await?;
    Ok(json!({"order_id": id, "attempt": ctx.attempt(), "applied": applied}))
}
