//! Who is calling: the authorizer's principal, read from the request context, so that one
//! caller's `Idempotency-Key` can never replay another caller's stored response.

use aws_lambda_events::event::apigw::{
    ApiGatewayProxyRequestContext, ApiGatewayV2httpRequestContext,
};
use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};
use serde_json::Value;

/// Whose operations an `Idempotency-Key` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CallerScope {
    /// Each caller's keys are their own: the authorizer's principal (JWT `iss` and `sub`, a
    /// Lambda authorizer's `principalId`, the IAM caller, the API key id) is part of the
    /// operation key. A request with no principal is refused with 401 `caller_unidentified`,
    /// since two anonymous callers could otherwise read each other's responses. The default.
    #[default]
    Principal,
    /// As [`CallerScope::Principal`], but requests without a principal share one anonymous
    /// scope: for public endpoints whose responses are not private to the caller.
    PrincipalOrAnonymous,
    /// The key alone names the operation, whoever sends it (an explicit opt-out, e.g. behind a
    /// gateway that already makes keys unique per caller).
    Shared,
}

/// The caller part of an operation key, or `None` when the request has no principal.
pub(crate) fn principal(request: &Request) -> Option<String> {
    match request.request_context_ref()? {
        RequestContext::ApiGatewayV2(context) => principal_v2(context),
        RequestContext::ApiGatewayV1(context) => principal_v1(context),
        // An ALB passes no authorizer; its OIDC headers can be forged unless authentication is
        // configured on the listener, so they are not trusted here.
        _ => None,
    }
}

/// An HTTP API's (and a Function URL's) caller: JWT `iss` and `sub`, the IAM caller (with its
/// Cognito identity, when it signs in through an identity pool), or a Lambda authorizer's
/// `principalId`.
fn principal_v2(context: &ApiGatewayV2httpRequestContext) -> Option<String> {
    let authorizer = context.authorizer.as_ref()?;
    if let Some(jwt) = &authorizer.jwt
        && let Some(sub) = jwt.claims.get("sub").and_then(|sub| present(sub))
    {
        let issuer = jwt.claims.get("iss").map_or("", String::as_str);
        return Some(name(&["jwt", issuer, sub]));
    }
    if let Some(iam) = &authorizer.iam {
        let caller = [&iam.user_arn, &iam.caller_id]
            .into_iter()
            .find_map(|id| id.as_deref().and_then(present))?;
        let cognito = iam
            .cognito_identity
            .as_ref()
            .and_then(|cognito| cognito.identity_id.as_deref())
            .unwrap_or("");
        return Some(name(&["iam", caller, cognito]));
    }
    lambda_authorizer(&authorizer.fields)
}

/// A REST API's caller: Cognito claims, a Lambda authorizer's `principalId`, the IAM caller
/// (with its Cognito identity), or the API key id.
fn principal_v1(context: &ApiGatewayProxyRequestContext) -> Option<String> {
    let fields = &context.authorizer.fields;
    if let Some(claims) = fields.get("claims")
        && let Some(sub) = claims.get("sub").and_then(text)
    {
        let issuer = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        return Some(name(&["jwt", issuer, &sub]));
    }
    if let Some(found) = lambda_authorizer(fields) {
        return Some(found);
    }
    let identity = &context.identity;
    if let Some(arn) = identity.user_arn.as_deref().and_then(present) {
        let cognito = identity.cognito_identity_id.as_deref().unwrap_or("");
        return Some(name(&["iam", arn, cognito]));
    }
    identity
        .api_key_id
        .as_deref()
        .and_then(present)
        .map(|id| name(&["api-key", id]))
}

/// A Lambda authorizer's principal: its `principalId`, else a `sub` it put in the context.
fn lambda_authorizer(fields: &std::collections::HashMap<String, Value>) -> Option<String> {
    let principal = ["principalId", "sub"]
        .into_iter()
        .find_map(|field| fields.get(field).and_then(text))?;
    Some(name(&["authorizer", &principal]))
}

/// A principal's text, or `None` when it names nobody: blank (`""`, spaces), or absent.
pub(crate) fn present(text: &str) -> Option<&str> {
    (!text.trim().is_empty()).then_some(text)
}

/// Whether a principal's name ([`name`]) holds a control character in one of its parts.
pub(crate) fn has_control(name: &str) -> bool {
    serde_json::from_str::<Vec<Value>>(name).is_ok_and(|parts| {
        parts
            .iter()
            .filter_map(Value::as_str)
            .any(|part| part.chars().any(char::is_control))
    })
}

/// A principal's unambiguous name: its kind and parts as a JSON array (a `:` inside a part
/// cannot make two principals one).
pub(crate) fn name(parts: &[&str]) -> String {
    Value::from(
        parts
            .iter()
            .map(|part| Value::from(*part))
            .collect::<Vec<_>>(),
    )
    .to_string()
}

/// A principal given as JSON: a string that is not blank, or a number; `null` (which an
/// authorizer's `principalId: null` becomes), a blank string or a structure names nobody.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => present(text).map(str::to_owned),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}
