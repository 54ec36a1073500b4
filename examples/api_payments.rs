//! An idempotent payment endpoint behind API Gateway (HTTP API): `POST /payments` with an
//! `Idempotency-Key` header.
//!
//! A retried request gets the original response, marked `Idempotent-Replayed: true`; the same
//! key with another body is 422; a request without a key is 400; one still running is 409.
//!
//! - Locally (`cargo run --example api_payments`): an embedded DynamoDB-compatible server (or
//!   `DYNAMODB_ENDPOINT`) and a few requests.
//! - In Lambda (`cargo lambda build --release --arm64 --example api_payments`, see
//!   template.yaml): tables from `IDEMPOTENCY_TABLE` and `LEDGER_TABLE`.

#[path = "support/ledger.rs"]
mod ledger;
#[path = "../src/testing/local.rs"]
mod local_dynamodb;

use aws_lambda_events::encodings::Body;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use lambda_idempotency::lambda::http::HttpIdempotency;
use lambda_idempotency::lambda::http_layer::CallerScope;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::{Config, ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};

use ledger::Ledger;

struct App {
    http: HttpIdempotency<DynamoDbStore>,
    ledger: Ledger,
}

impl App {
    async fn handle(
        &self,
        event: LambdaEvent<ApiGatewayV2httpRequest>,
    ) -> Result<ApiGatewayV2httpResponse, lambda_runtime::Error> {
        Ok(self
            .http
            .handle(event, |request, ctx| self.pay(request, ctx))
            .await)
    }

    /// The business operation: charge once, answer 201 with the payment.
    async fn pay(
        &self,
        request: ApiGatewayV2httpRequest,
        ctx: ExecutionContext,
    ) -> Result<ApiGatewayV2httpResponse, lambda_runtime::Error> {
        let body: Value = serde_json::from_str(request.body.as_deref().unwrap_or("{}"))?;
        let Some(amount) = body["amount"].as_u64() else {
            return Ok(json_response(
                400,
                json!({"error": "invalid_amount", "message": "send a positive whole amount"}),
            ));
        };
        // The provider sees the same idempotency key on every attempt of this operation.
        let payment_id = format!("pay_{}", &ctx.downstream_key("charge")[..16]);
        self.ledger
            .apply(&format!("payment#{payment_id}"), &body.to_string())
            .await?;
        Ok(json_response(
            201,
            json!({"payment_id": payment_id, "amount": amount, "status": "captured"}),
        ))
    }
}

fn json_response(status: i64, body: Value) -> ApiGatewayV2httpResponse {
    let mut response = ApiGatewayV2httpResponse::default();
    response.status_code = status;
    response.headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response.body = Some(Body::Text(body.to_string()));
    response
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
        // template.yaml's demo API has no authorizer: anonymous callers share one scope. Behind
        // a JWT or Lambda authorizer, keep the default (CallerScope::Principal).
        let http = HttpIdempotency::new(
            Idempotency::new(store, Config::default()),
            OperationScope::for_function("pay")?,
        )
        .with_callers(CallerScope::PrincipalOrAnonymous);
        let app = App { http, ledger };
        return lambda_runtime::run(service_fn(|event| app.handle(event))).await;
    }
    run_locally().await
}

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

async fn run_locally() -> Result<(), lambda_runtime::Error> {
    let store = local_dynamodb::local_store("payments").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local_dynamodb::unique_table_name("payments-ledger"),
    );
    ledger.create().await?;
    let http = HttpIdempotency::new(
        Idempotency::new(store, Config::default()),
        OperationScope::new("examples", "pay")?,
    );
    let app = App { http, ledger };

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
