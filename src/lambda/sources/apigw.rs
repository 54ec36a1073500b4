//! API Gateway REST (v1) and HTTP (v2) APIs: the key policies (the caller and the
//! `Idempotency-Key` header).

use aws_lambda_events::event::apigw::{ApiGatewayProxyRequest, ApiGatewayV2httpRequest};
use serde_json::Value;

use super::{body_json, object, to_json};
use crate::key::KeyPolicy;
use crate::lambda::http_layer::MAX_KEY_BYTES;
use crate::lambda::http_layer::caller::{principal_v1, principal_v2};

/// The HTTP header that carries the idempotency key (IETF draft).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// API Gateway HTTP API (v2): the `Idempotency-Key` header (trimmed, 1 to 255 bytes), scoped
/// to the caller (the authorizer's principal; requests without one share an anonymous scope:
/// the doors refuse them unless told otherwise); fingerprint over method, path, query string,
/// content type and body.
pub fn http_api() -> KeyPolicy<ApiGatewayV2httpRequest> {
    v2_policy(true)
}

/// [`http_api`] without the caller in the key: every caller's requests with one key are one
/// operation (`CallerScope::Shared`).
pub(crate) fn http_api_shared() -> KeyPolicy<ApiGatewayV2httpRequest> {
    v2_policy(false)
}

fn v2_policy(scoped: bool) -> KeyPolicy<ApiGatewayV2httpRequest> {
    KeyPolicy::from_fns(
        move |request: &ApiGatewayV2httpRequest| {
            let caller = principal_v2(&request.request_context).filter(|_| scoped);
            caller_key(caller, &request.headers)
        },
        |request: &ApiGatewayV2httpRequest| {
            Some(object([
                (
                    "method",
                    request.request_context.http.method.as_str().into(),
                ),
                ("path", request.raw_path.clone().into()),
                ("query", request.raw_query_string.clone().into()),
                ("content_type", content_type(&request.headers)),
                ("body", body_json(request.body.as_deref())),
            ]))
        },
    )
}

/// API Gateway REST API (v1): the `Idempotency-Key` header (trimmed, 1 to 255 bytes), scoped
/// to the caller (the authorizer's principal, when there is one); fingerprint over method, path, query string,
/// content type and body.
pub fn rest_api() -> KeyPolicy<ApiGatewayProxyRequest> {
    KeyPolicy::from_fns(
        |request: &ApiGatewayProxyRequest| {
            caller_key(principal_v1(&request.request_context), &request.headers)
        },
        |request: &ApiGatewayProxyRequest| {
            Some(object([
                ("method", request.http_method.as_str().into()),
                ("path", request.path.clone().into()),
                (
                    "query",
                    to_json(&request.multi_value_query_string_parameters)?,
                ),
                ("content_type", content_type(&request.headers)),
                ("body", body_json(request.body.as_deref())),
            ]))
        },
    )
}

/// The key material of a request: its caller (or null) and its `Idempotency-Key` header
/// (trimmed; a blank or over-long header is no key).
fn caller_key(caller: Option<String>, headers: &http::HeaderMap) -> Option<Value> {
    let key = header(headers)?;
    Some(object([("caller", caller.into()), ("key", key.into())]))
}

fn content_type(headers: &http::HeaderMap) -> Value {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map_or(Value::Null, Value::from)
}

fn header(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|key| !key.is_empty() && key.len() <= MAX_KEY_BYTES)
        .map(str::to_owned)
}
