//! An SQS order consumer with partial batch failures.
//!
//! Each message places one order: an effect in the ledger table. Redelivered messages (even
//! republished with a new message id) are acknowledged from the stored outcome; only failed or
//! in-progress messages come back in `batchItemFailures`.
//!
//! - Locally (`cargo run --example sqs_orders`): an embedded DynamoDB-compatible server (or
//!   `DYNAMODB_ENDPOINT`), the same batch delivered twice, then a conflicting payload.
//! - In Lambda (`cargo lambda build --release --arm64 --example sqs_orders`, see template.yaml):
//!   tables from `IDEMPOTENCY_TABLE` and `LEDGER_TABLE`.

#[path = "support/ledger.rs"]
mod ledger;
#[path = "../src/testing/local.rs"]
mod local_dynamodb;

use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_idempotency::lambda::batch::BatchProcessor;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::{Config, ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};

use ledger::Ledger;

struct App {
    processor: BatchProcessor<SqsMessage, DynamoDbStore>,
    ledger: Ledger,
}

impl App {
    fn new(
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
    async fn handle(
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

#[tokio::main]
pub async fn main() -> Result<(), lambda_runtime::Error> {
    if std::env::var("AWS_LAMBDA_RUNTIME_API").is_ok() {
        // JSON logs: each line carries the idempotency span (operation, key hash, attempt,
        // request id, message id), never a payload.
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .without_time()
            .init();
        let store = DynamoDbStore::from_env().await?;
        let ledger = Ledger::from_env(store.client().clone())?;
        let app = App::new(store, ledger, OperationScope::for_function("place-order")?)?;
        return lambda_runtime::run(service_fn(|event| app.handle(event))).await;
    }
    run_locally().await
}

fn message(id: &str, body: Value) -> Value {
    json!({"messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(), "attributes": {},
        "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:orders"})
}

async fn run_locally() -> Result<(), lambda_runtime::Error> {
    let store = local_dynamodb::local_store("orders").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local_dynamodb::unique_table_name("orders-ledger"),
    );
    ledger.create().await?;
    let app = App::new(
        store,
        ledger.clone(),
        OperationScope::new("examples", "place-order")?,
    )?;

    let batch: SqsEvent = serde_json::from_value(json!({"Records": [
        message("m-1", json!({"order_id": "o-1", "amount": 100})),
        message("m-2", json!({"order_id": "o-2", "amount": 250})),
        message("m-3", json!({"order_id": "o-3", "amount": 40})),
        message("m-4-republished", json!({"order_id": "o-1", "amount": 100})),
    ]}))?;
    let conflict: SqsEvent = serde_json::from_value(
        json!({"Records": [message("m-5", json!({"order_id": "o-2", "amount": 999}))]}),
    )?;

    for (label, event) in [
        ("batch", batch.clone()),
        ("same batch again", batch),
        ("o-2 with another amount", conflict),
    ] {
        let response = app
            .handle(LambdaEvent::new(event, Context::default()))
            .await?;
        println!(
            "{label:<24} -> batchItemFailures {}",
            serde_json::to_string(&response.batch_item_failures)?
        );
    }
    for order in ["o-1", "o-2", "o-3"] {
        println!(
            "order {order}: placed {} time(s)",
            ledger.count(&format!("order#{order}")).await?
        );
    }
    Ok(())
}
