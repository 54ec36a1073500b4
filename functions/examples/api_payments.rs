//! The payment endpoint (`src/payments.rs`) run locally: an embedded DynamoDB-compatible
//! server (or `DYNAMODB_ENDPOINT`) and a few requests: a first one, a client retry, the same
//! key with another amount, no key.
//!
//! `cargo run -p lambda-idempotency-functions --example api_payments`; the deployable binary is
//! `src/bin/api_payments.rs`.

use aws_lambda_events::encodings::Body;
use aws_lambda_events::event::apigw::ApiGatewayV2httpRequest;
use lambda_idempotency::OperationScope;
use lambda_idempotency::lambda::http_layer::CallerScope;
use lambda_idempotency::testing::local;
use lambda_idempotency_functions::ledger::Ledger;
use lambda_idempotency_functions::payments::Payments;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

fn request(
    key: Option<&str>,
    body: Value,
) -> Result<LambdaEvent<ApiGatewayV2httpRequest>, serde_json::Error> {
    let mut headers = json!({"content-type": "application/json"});
    if let Some(key) = key {
        headers["idempotency-key"] = json!(key);
    }
    let request = serde_json::from_value(
        json!({"version": "2.0", "routeKey": "POST /payments", "rawPath": "/payments",
        "rawQueryString": "", "headers": headers, "requestContext": {"accountId": "000000000000", "apiId": "local",
        "domainName": "localhost", "domainPrefix": "localhost", "http": {"method": "POST", "path": "/payments",
        "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": "example"}, "requestId": "local",
        "routeKey": "POST /payments", "stage": "$default", "time": "", "timeEpoch": 0,
        "authorizer": {"jwt": {"claims": {"sub": "customer-1"}, "scopes": null}}},
        "body": body.to_string(), "isBase64Encoded": false}),
    )?;
    Ok(LambdaEvent::new(request, Context::default()))
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let store = local::local_store("payments").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local::unique_table_name("payments-ledger"),
    );
    ledger.create().await?;
    let app = Payments::new(
        store,
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
        let response = app.handle(request(key, body)?).await?;
        let replayed = response
            .headers
            .get("idempotent-replayed")
            .map_or("", |_| " (Idempotent-Replayed: true)");
        let body = match &response.body {
            Some(Body::Text(text)) => text.as_str(),
            _ => "",
        };
        println!("{label:<26} -> {}{replayed} {body}", response.status_code);
    }
    Ok(())
}
