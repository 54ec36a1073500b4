//! An idempotent payment endpoint behind API Gateway (HTTP API): `POST /payments` with an
//! `Idempotency-Key` header (binary `api_payments`).
//!
//! A retried request gets the original response, marked `Idempotent-Replayed: true`; the same
//! key with another body is 422; a request without a key is 400; one still running is 409.

use aws_lambda_events::encodings::Body;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use lambda_idempotency::lambda::http::HttpIdempotency;
use lambda_idempotency::lambda::http_layer::CallerScope;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::{Config, ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::LambdaEvent;
use serde_json::{Value, json};

use crate::ledger::Ledger;

/// The payment endpoint.
pub struct Payments {
    http: HttpIdempotency<DynamoDbStore>,
    ledger: Ledger,
}

impl Payments {
    /// Payments in `scope`, each caller's keys apart as `callers` says.
    pub fn new(
        store: DynamoDbStore,
        ledger: Ledger,
        scope: OperationScope,
        callers: CallerScope,
    ) -> Self {
        let http = HttpIdempotency::new(Idempotency::new(store, Config::default()), scope)
            .with_callers(callers);
        Self { http, ledger }
    }

    /// The handler: the HTTP idempotency contract around the payment.
    ///
    /// # Errors
    /// Never: every outcome is an HTTP response.
    pub async fn handle(
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
        let key = ctx.downstream_key("charge");
        let payment_id = format!("pay_{}", key.get(..16).unwrap_or(&key));
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
