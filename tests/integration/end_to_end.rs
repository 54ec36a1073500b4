//! The SQS example binary under the Lambda Runtime API protocol: a local Runtime API, the
//! embedded DynamoDB server, the same batch delivered twice plus a conflicting payload.

use std::path::PathBuf;
use std::process::Stdio;

use lambda_idempotency::store::DynamoDbStore;
use serde_json::{Value, json};

use crate::support::ledger::Ledger;
use crate::support::runtime_api::RuntimeApi;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::local::unique_table_name;

/// The example binary that `cargo test` built beside this test binary (building it if not).
fn example_binary(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("test binary path");
    let profile_dir = deps
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let binary = profile_dir.join("examples").join(name);
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--example", name])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build --example {name}");
    }
    binary
}

fn message(id: &str, body: Value) -> Value {
    json!({"messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(), "attributes": {},
        "messageAttributes": {}, "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:orders"})
}

fn failures(answer: &Value) -> Vec<&str> {
    answer["batchItemFailures"]
        .as_array()
        .expect("a partial-batch response")
        .iter()
        .filter_map(|failure| failure["itemIdentifier"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_example_under_the_runtime_api() {
    let db = dynamo::start().await;
    let store = DynamoDbStore::new(db.client.clone(), unique_table_name("e2e-idempotency"));
    store.create_table().await.expect("idempotency table");
    let ledger = Ledger::new(db.client.clone(), unique_table_name("e2e-ledger"));
    ledger.create().await.expect("ledger table");
    let api = RuntimeApi::start().await;

    let mut function = tokio::process::Command::new(example_binary("sqs_orders"))
        .env("AWS_LAMBDA_RUNTIME_API", &api.address)
        .env("AWS_LAMBDA_FUNCTION_NAME", "sqs-orders-e2e")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("IDEMPOTENCY_TABLE", store.table())
        .env("LEDGER_TABLE", ledger.table())
        .env("DYNAMODB_ENDPOINT", &db.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env(
            "AWS_ACCESS_KEY_ID",
            std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "test".into()),
        )
        .env(
            "AWS_SECRET_ACCESS_KEY",
            std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".into()),
        )
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the example binary");

    let batch = json!({"Records": [
        message("m-1", json!({"order_id": "o-1", "amount": 100})),
        message("m-2", json!({"order_id": "o-2", "amount": 250})),
        message("m-3-republished", json!({"order_id": "o-1", "amount": 100})),
    ]});
    let conflict = json!({"Records": [message("m-4", json!({"order_id": "o-2", "amount": 999}))]});

    let first = api
        .invoke(batch.clone())
        .await
        .expect("first delivery answered");
    let second = api.invoke(batch).await.expect("second delivery answered");
    let third = api.invoke(conflict).await.expect("conflict answered");
    function.kill().await.expect("stop the function");

    assert_eq!(failures(&first), Vec::<&str>::new());
    assert_eq!(
        failures(&second),
        Vec::<&str>::new(),
        "the redelivered batch is acknowledged"
    );
    assert_eq!(
        failures(&third),
        ["m-4"],
        "the conflicting payload comes back"
    );
    for order in ["order#o-1", "order#o-2"] {
        assert_eq!(
            ledger.count(order).await.expect("ledger"),
            1,
            "{order} placed once over 7 deliveries"
        );
    }
}
