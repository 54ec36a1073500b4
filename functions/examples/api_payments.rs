//! The payment endpoint (`src/payments.rs`) run locally: an embedded DynamoDB-compatible
//! server (or `DYNAMODB_ENDPOINT`) and a few requests, each an API Gateway HTTP API event as
//! `lambda_http` reads it: a first one, a client retry, the same key with another amount, no
//! key.
//!
//! `cargo run -p lambda-idempotency-functions --example api_payments`; the deployable binary is
//! `src/bin/api_payments.rs`.

use http_body_util::BodyExt;
use lambda_idempotency::testing::local;
use lambda_idempotency::{CallerScope, Idempotency, OperationScope};
use lambda_idempotency_functions::ledger::Ledger;
use lambda_idempotency_functions::payments::payments;
use lambda_runtime::tower::ServiceExt;
use serde_json::{Value, json};

fn request(key: Option<&str>, body: Value) -> Result<lambda_http::Request, serde_json::Error> {
    let mut headers = json!({"content-type": "application/json"});
    if let Some(key) = key {
        headers["idempotency-key"] = json!(key);
    }
    let event = json!({"version": "2.0", "routeKey": "POST /payments", "rawPath": "/payments",
        "rawQueryString": "", "headers": headers, "requestContext": {"accountId": "000000000000", "apiId": "local",
        "domainName": "localhost", "domainPrefix": "localhost", "http": {"method": "POST", "path": "/payments",
        "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "example"}, "requestId": "local",
        "routeKey": "POST /payments", "stage": "$default", "time": "", "timeEpoch": 0,
        "authorizer": {"jwt": {"claims": {"sub": "customer-1"}, "scopes": null}}},
        "body": body.to_string(), "isBase64Encoded": false});
    lambda_http::request::from_str(&event.to_string())
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let store = local::local_store("payments").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local::unique_table_name("payments-ledger"),
    );
    ledger.create().await?;
    let app = payments(
        Idempotency::new(store),
        ledger,
        OperationScope::new("examples", "pay")?,
        CallerScope::Principal,
    );

    let requests = [
        (
            "first request, key k-1",
            Some("k-1"),
            json!({"amount": 1200}),
        ),
        (
            "client retry, key k-1",
            Some("k-1"),
            json!({"amount": 1200}),
        ),
        (
            "key k-1, another amount",
            Some("k-1"),
            json!({"amount": 9999}),
        ),
        ("no Idempotency-Key", None, json!({"amount": 1200})),
    ];
    for (label, key, body) in requests {
        let response = app.clone().oneshot(request(key, body)?).await?;
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .map_or("", |_| " (Idempotent-Replayed: true)");
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        println!(
            "{label:<26} -> {status}{replayed} {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(())
}
