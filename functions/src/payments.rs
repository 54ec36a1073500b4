//! An idempotent payment endpoint behind API Gateway (HTTP API): `POST /payments` with an
//! `Idempotency-Key` header (binary `api_payments`), an axum router behind the HTTP layer.
//!
//! A retried request gets the original response, marked `Idempotent-Replayed: true`; the same
//! key with another body is 422; a request without a key is 400; one still running is 409.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lambda_idempotency::lambda::http::HttpIdempotencyService;
use lambda_idempotency::{
    CallerScope, ExecutionContext, HttpKeys, Idempotency, Operation, OperationScope,
};
use lambda_runtime::tower::Layer;
use serde_json::{Value, json};

use crate::ledger::Ledger;

/// The payment endpoint: the router, made idempotent.
pub type Payments = HttpIdempotencyService<Router>;

/// The endpoint for payments in `scope`, each caller's keys apart as `callers` says.
pub fn payments(
    idem: Idempotency,
    ledger: Ledger,
    scope: OperationScope,
    callers: CallerScope,
) -> Payments {
    let keys = HttpKeys::new().with_callers(callers).policy();
    let once = Operation::new(idem, scope, keys).http_layer();
    let router = Router::new()
        .route("/payments", post(pay))
        .with_state(ledger);
    once.layer(router)
}

/// The business operation: charge once, answer 201 with the payment.
async fn pay(
    State(ledger): State<Ledger>,
    Extension(ctx): Extension<ExecutionContext>,
    body: Bytes,
) -> Result<Response, PaymentError> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(amount) = body["amount"].as_u64().filter(|amount| *amount > 0) else {
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid_amount", "message": "send a positive whole amount"}),
        ));
    };
    // The provider sees the same idempotency key on every attempt of this operation.
    let key = ctx.downstream_key("charge");
    let payment_id = format!("pay_{}", key.get(..16).unwrap_or(&key));
    ledger
        .apply(&format!("payment#{payment_id}"), &body.to_string())
        .await
        .map_err(|err| {
            tracing::warn!(error = %err, "the ledger did not record the payment: answered 503");
            PaymentError
        })?;
    Ok(json_response(
        StatusCode::CREATED,
        json!({"payment_id": payment_id, "amount": amount, "status": "captured"}),
    ))
}

/// The ledger could not record the payment: 503, not stored, so that the client's retry runs.
#[derive(Debug)]
struct PaymentError;

impl IntoResponse for PaymentError {
    fn into_response(self) -> Response {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": "ledger_unavailable", "message": "retry with the same Idempotency-Key"}),
        )
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
