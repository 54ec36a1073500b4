//! The HTTP contract for API Gateway (HTTP API, payload v2), after the IETF
//! `Idempotency-Key` header draft.
//!
//! | situation | answer |
//! |---|---|
//! | first request | the handler's response (2xx and definitive 4xx stored for replay; 408, 409, 425, 429 and 5xx not stored: the retry runs) |
//! | repeated request, same payload | the original status, headers and body, plus `Idempotent-Replayed: true` |
//! | no `Idempotency-Key` header | 400 |
//! | no caller principal ([`CallerScope::Principal`], the default) | 401 `caller_unidentified` |
//! | the original is still running | 409, `Retry-After` |
//! | same key, different payload | 422 |
//! | the operation took effect but its record expired, or awaits an operator | 409 |
//! | the operation failed terminally before (retained) | 409 `operation_previously_failed` |
//! | the handler failed | 500 `operation_failed` |
//! | the store is unavailable or the lease was lost | 503, `Retry-After` |
//!
//! Every answer comes from [`Error::kind`]: one taxonomy, no fallback. Error bodies carry a
//! stable code and a message written for the client, never a stored handler error or a store
//! message; `Retry-After` is the lease's remaining time, at most 905 s.
//!
//! Error bodies are JSON, `{"error": "<code>", "message": "<what to do>"}`. A request refused
//! before the claim (no key, unreadable body) writes nothing.
//!
//! ```no_run
//! use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
//! use lambda_idempotency::lambda::http::HttpIdempotency;
//! use lambda_idempotency::store::DynamoDbStore;
//! use lambda_idempotency::{Config, ExecutionContext, Idempotency, OperationScope};
//! use lambda_runtime::{LambdaEvent, service_fn};
//!
//! async fn pay(request: ApiGatewayV2httpRequest, ctx: ExecutionContext) -> Result<ApiGatewayV2httpResponse, lambda_runtime::Error> {
//!     let mut response = ApiGatewayV2httpResponse::default();
//!     response.status_code = 201;
//!     Ok(response)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::new(DynamoDbStore::from_env().await?, Config::default());
//!     let http = HttpIdempotency::new(idem, OperationScope::for_function("pay")?);
//!     lambda_runtime::run(service_fn(|event: LambdaEvent<ApiGatewayV2httpRequest>| {
//!         let http = http.clone();
//!         async move { Ok::<_, lambda_runtime::Error>(http.handle(event, pay).await) }
//!     }))
//!     .await
//! }
//! ```

use std::fmt;
use std::future::Future;

use aws_lambda_events::encodings::Body;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use http::{HeaderValue, header};
use lambda_runtime::LambdaEvent;

use super::http_layer::CallerScope;
use super::http_layer::answer::ErrorAnswer;
use super::http_layer::caller::principal_v2;
use super::http_layer::stored::is_definitive;
use super::operation::Operation;
use super::sources;
use crate::engine::Idempotency;
use crate::error::{BoxError, Error};
use crate::execution::ExecutionContext;
use crate::failure::Release;
use crate::key::{KeyPolicy, OperationScope};
use crate::store::{AnyStore, Store};

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Idempotent POST/PATCH endpoints behind API Gateway; cheap to clone.
pub struct HttpIdempotency<S = AnyStore> {
    operation: Operation<ApiGatewayV2httpRequest, S>,
    callers: CallerScope,
}

impl<S> Clone for HttpIdempotency<S> {
    fn clone(&self) -> Self {
        Self {
            operation: self.operation.clone(),
            callers: self.callers,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for HttpIdempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpIdempotency")
            .field("scope", &self.operation.scope)
            .finish_non_exhaustive()
    }
}

/// A response that is not stored (408, 409, 425, 429, 5xx), so that the client's retry executes
/// again: released whatever the engine's classifier says ([`Release`]).
#[derive(Debug)]
struct ServerError(ApiGatewayV2httpResponse);

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the handler answered {}", self.0.status_code)
    }
}

impl std::error::Error for ServerError {}

impl<S: Store> HttpIdempotency<S> {
    /// Requests keyed by their caller and `Idempotency-Key` header, fingerprinted by method,
    /// path, query string, content type and body ([`sources::http_api`]).
    pub fn new(idem: Idempotency<S>, scope: OperationScope) -> Self {
        Self::from_operation(Operation::new(idem, scope, sources::http_api()))
    }

    /// A door running `operation` (its key policy, lease policy and result reference).
    pub fn from_operation(operation: Operation<ApiGatewayV2httpRequest, S>) -> Self {
        Self {
            operation,
            callers: CallerScope::default(),
        }
    }

    /// Whose operations a key names ([`CallerScope`]; by default the authorizer's principal,
    /// and a request without one is refused with 401).
    pub fn with_callers(mut self, callers: CallerScope) -> Self {
        self.callers = callers;
        self.operation.policy = match callers {
            CallerScope::Shared => sources::apigw_shared_policy(),
            _ => sources::http_api(),
        };
        self
    }

    /// Derives operations with another policy (e.g. a key from the path). The policy decides the
    /// key alone: put the caller in it (see [`sources::http_api`]), and call this after
    /// [`HttpIdempotency::with_callers`], which sets the default policy for its scope.
    pub fn with_policy(mut self, policy: KeyPolicy<ApiGatewayV2httpRequest>) -> Self {
        self.operation.policy = policy;
        self
    }

    /// Answers `event` under the contract above, running `handler` at most once per key.
    pub async fn handle<F, Fut, E>(
        &self,
        event: LambdaEvent<ApiGatewayV2httpRequest>,
        handler: F,
    ) -> ApiGatewayV2httpResponse
    where
        F: FnOnce(ApiGatewayV2httpRequest, ExecutionContext) -> Fut,
        Fut: Future<Output = Result<ApiGatewayV2httpResponse, E>>,
        E: Into<BoxError>,
    {
        let (request, context) = event.into_parts();
        if self.callers == CallerScope::Principal
            && principal_v2(&request.request_context).is_none()
        {
            return answer_response(&ErrorAnswer::caller_unidentified());
        }
        let invocation = match self.operation.invocation(&request, &context) {
            Ok(invocation) => invocation,
            Err(err) => return error_response(&err),
        };
        let result = self
            .operation
            .idem
            .execute(&invocation, |ctx| async move {
                match handler(request, ctx).await {
                    Ok(response) if !is_definitive_status(response.status_code) => {
                        Err(BoxError::from(Release::new(ServerError(response))))
                    }
                    Ok(response) => Ok(response),
                    Err(err) => Err(err.into()),
                }
            })
            .await;
        match result {
            Ok(done) if done.is_replay() => {
                let mut response = done.into_value();
                response
                    .headers
                    .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
                response
            }
            Ok(done) => done.into_value(),
            Err(Error::Handler { source }) => match Release::take::<ServerError>(source) {
                Ok(server_error) => server_error.0,
                Err(source) => error_response(&Error::Handler { source }),
            },
            Err(err) => error_response(&err),
        }
    }
}

/// Whether a handler's status is stored for replay ([`is_definitive`]).
fn is_definitive_status(status: i64) -> bool {
    u16::try_from(status)
        .ok()
        .and_then(|status| http::StatusCode::from_u16(status).ok())
        .is_some_and(is_definitive)
}

/// The JSON error response for `err` ([`ErrorAnswer`]).
fn error_response(err: &Error) -> ApiGatewayV2httpResponse {
    answer_response(&ErrorAnswer::for_error(err))
}

fn answer_response(answer: &ErrorAnswer) -> ApiGatewayV2httpResponse {
    let mut response = ApiGatewayV2httpResponse::default();
    response.status_code = i64::from(answer.status);
    response.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = answer.retry_after_secs()
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers.insert(header::RETRY_AFTER, value);
    }
    response.body = Some(Body::Text(answer.body()));
    response
}
