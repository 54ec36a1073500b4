//! An SQS order consumer with partial batch failures (binary `sqs_orders`).
//!
//! Each message places one order: an effect in the ledger table. Redelivered messages (even
//! republished with a new message id) are acknowledged from the stored outcome; only failed or
//! in-progress messages come back in `batchItemFailures`.

use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_idempotency::lambda::batch::BatchProcessor;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::{Config, ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::LambdaEvent;
use serde_json::{Value, json};

use crate::ledger::Ledger;

/// The order consumer.
pub struct Orders {
    processor: BatchProcessor<SqsMessage, DynamoDbStore>,
    ledger: Ledger,
}

impl Orders {
    /// Orders keyed by the body's `order_id`, in `scope`.
    ///
    /// # Errors
    /// Never with these constants; the builders check their input.
    pub fn new(
        store: DynamoDbStore,
        ledger: Ledger,
        scope: OperationScope,
    ) -> Result<Self, lambda_runtime::Error> {
        // Outlive the queue's 4-day retention (template.yaml), so a late redelivery still replays.
        let config = Config::builder()
            .retention(Duration::from_secs(5 * 24 * 3600))
            .build()?;
        let idem = Idempotency::new(store, config);
        let processor = BatchProcessor::new(idem, scope, sources::sqs(Some("/order_id"))?);
        Ok(Self { processor, ledger })
    }

    /// The handler: one operation per message, a partial-batch response.
    ///
    /// # Errors
    /// Never: a message that fails comes back in `batchItemFailures`.
    pub async fn handle(
        &self,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, lambda_runtime::Error> {
        let (batch, context) = event.into_parts();
        let report = self
            .processor
            .process(batch.records, &context, |message, ctx| {
                self.place_order(message, ctx)
            })
            .await;
        Ok(report.sqs_response())
    }

    /// The business operation: place the order (an effect in the ledger).
    async fn place_order(
        &self,
        message: SqsMessage,
        ctx: ExecutionContext,
    ) -> Result<Value, lambda_runtime::Error> {
        let order: Value = serde_json::from_str(message.body.as_deref().unwrap_or_default())?;
        let id = order["order_id"]
            .as_str()
            .ok_or("the order has no order_id")?;
        let applied = self
            .ledger
            .apply(&format!("order#{id}"), &order.to_string())
            .await?;
        Ok(json!({"order_id": id, "attempt": ctx.attempt(), "applied": applied}))
    }
}
