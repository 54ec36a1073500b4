//! The SQS order consumer (`src/orders.rs`) run locally: an embedded DynamoDB-compatible
//! server (or `DYNAMODB_ENDPOINT`), the same batch delivered twice, then a conflicting payload.
//!
//! `cargo run -p lambda-idempotency-functions --example sqs_orders`; the deployable binary is
//! `src/bin/sqs_orders.rs`.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::testing::local;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::ledger::Ledger;
use lambda_idempotency_functions::orders::orders;
use lambda_runtime::tower::ServiceExt;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

fn message(id: &str, body: Value) -> Value {
    json!({"messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(), "attributes": {},
        "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:orders"})
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let store = local::local_store("orders").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local::unique_table_name("orders-ledger"),
    );
    ledger.create().await?;
    let app = orders(
        Idempotency::new(store),
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
            .clone()
            .oneshot(LambdaEvent::new(event, Context::default()))
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
