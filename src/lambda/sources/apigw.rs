//! API Gateway REST (v1) and HTTP (v2) APIs: the key policies (the caller and the
//! `Idempotency-Key` header).

use aws_lambda_events::event::apigw::{ApiGatewayProxyRequest, ApiGatewayV2httpRequest};
use serde_json::Value;

use super::{body_json, object, to_json};
use crate::key::KeyPolicy;
use crate::lambda::http_layer::caller::{principal_v1, principal_v2};

/// The HTTP header that carries the idempotency key (IETF draft).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// API Gateway HTTP API (v2): the `Idempotency-Key` header, scoped to the caller (the
/// authorizer's principal, when there is one); fingerprint over method, path, query string,
/// content type and body.
pub fn http_api() -> KeyPolicy<ApiGatewayV2httpRequest> {
    KeyPolicy::from_fns(
        |request: &ApiGatewayV2httpRequest| {
            caller_key(principal_v2(&request.request_context), &request.headers)
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

/// API Gateway REST API (v1): the `Idempotency-Key` header, scoped to the caller (the
/// authorizer's principal, when there is one); fingerprint over method, path, query string,
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

/// The key material of a request: its caller (or null) and its `Idempotency-Key` header.
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
        .map(str::to_owned)
}
