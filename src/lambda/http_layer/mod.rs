//! Idempotent HTTP endpoints as a tower layer over `lambda_http` requests: it composes with
//! `lambda_http::run` and with an axum `Router` served by `lambda_http`, so it covers API
//! Gateway REST (v1) and HTTP (v2) APIs, Function URLs and ALB alike.
//!
//! `POST` and `PATCH` requests are keyed by their `Idempotency-Key` header (the IETF draft),
//! **scoped to the caller** ([`CallerScope`]); other methods pass through untouched.
//!
//! | situation | answer |
//! |---|---|
//! | first request | the handler's response; 2xx, 3xx and definitive 4xx are stored for replay |
//! | 408, 409, 425, 429 or 5xx from the handler | passed through, not stored: the retry runs |
//! | repeated request, same caller and payload | the first status, every header value (cookies, multi-value headers) and the exact body bytes, plus `Idempotent-Replayed: true` |
//! | no `Idempotency-Key` header | 400 `missing_idempotency_key` |
//! | no caller principal ([`CallerScope::Principal`]) | 401 `caller_unidentified` |
//! | the original is still running | 409 `request_in_progress`, `Retry-After` |
//! | same key, another method, path, query, content type or body | 422 `idempotency_key_reused` |
//! | the operation failed terminally before | 409 `operation_previously_failed` |
//! | the operation was applied but its response is too large to keep | the response, to this caller; 409 `operation_already_applied` to retries |
//! | the store is unavailable | 503, `Retry-After` |
//!
//! The handler can read its [`ExecutionContext`](crate::ExecutionContext) from the request's extensions (axum:
//! `Extension<ExecutionContext>`), or from [`current`](super::current).
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use lambda_idempotency::lambda::http_layer::HttpIdempotencyLayer;
//! use lambda_idempotency::store::DynamoDbStore;
//! use lambda_idempotency::{Config, Idempotency, OperationScope};
//! use lambda_runtime::tower::ServiceBuilder;
//!
//! async fn pay() -> (http::StatusCode, &'static str) {
//!     (http::StatusCode::CREATED, r#"{"payment":"p-1"}"#)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_http::Error> {
//!     let idem = Idempotency::new(DynamoDbStore::from_env().await?, Config::default());
//!     let layer = HttpIdempotencyLayer::new(idem, OperationScope::for_function("payments")?);
//!     let app = Router::new().route("/payments", post(pay));
//!     lambda_http::run(ServiceBuilder::new().layer(layer).service(app)).await
//! }
//! ```

pub(crate) mod answer;
pub(crate) mod caller;
pub(crate) mod stored;

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::BodyExt;
use lambda_http::{Body, Request, RequestExt};
use lambda_runtime::tower::{Layer, Service};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::warn;

pub use caller::CallerScope;

use self::answer::ErrorAnswer;
use self::stored::{StoredResponse, body_of, is_definitive};
use super::LeasePolicy;
use super::context;
use super::operation::deadline_of;
use super::sources::IDEMPOTENCY_KEY_HEADER;
use crate::engine::Idempotency;
use crate::error::{BoxError, Error};
use crate::execution::Invocation;
use crate::failure::Release;
use crate::key::{Fingerprint, OperationKey, OperationScope};
use crate::reconcile::BoxFuture;
use crate::store::{AnyStore, Store};

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The longest `Idempotency-Key` accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// Makes the wrapped HTTP service idempotent for `POST` and `PATCH`; configuration only.
pub struct HttpIdempotencyLayer<S = AnyStore> {
    shared: Arc<Shared<S>>,
}

struct Shared<S> {
    idem: Idempotency<S>,
    scope: OperationScope,
    lease: LeasePolicy,
    callers: CallerScope,
    principal: Option<Arc<PrincipalFn>>,
}

/// Reads the caller's principal from a request.
type PrincipalFn = dyn Fn(&Request) -> Option<String> + Send + Sync;

impl<S> Clone for HttpIdempotencyLayer<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S> fmt::Debug for HttpIdempotencyLayer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpIdempotencyLayer")
            .field("scope", &self.shared.scope)
            .field("callers", &self.shared.callers)
            .finish_non_exhaustive()
    }
}

impl<S: Store> HttpIdempotencyLayer<S> {
    /// Operations in `scope`, executed by `idem`, keyed per caller ([`CallerScope::Principal`]).
    pub fn new(idem: Idempotency<S>, scope: OperationScope) -> Self {
        Self {
            shared: Arc::new(Shared {
                idem,
                scope,
                lease: LeasePolicy::default(),
                callers: CallerScope::default(),
                principal: None,
            }),
        }
    }

    /// Whose operations a key names ([`CallerScope`]).
    pub fn with_callers(self, callers: CallerScope) -> Self {
        self.with(|shared| shared.callers = callers)
    }

    /// Overrides the lease policy.
    pub fn with_lease_policy(self, lease: LeasePolicy) -> Self {
        self.with(|shared| shared.lease = lease)
    }

    /// Reads the caller's principal with `principal` instead of from the authorizer context:
    /// for what the built-in reading cannot see (an HTTP API Lambda authorizer's simple
    /// response, an ALB listener that authenticates with OIDC). Read only what the gateway
    /// vouches for, never a header the client can set.
    ///
    /// ```
    /// # fn demo(layer: lambda_idempotency::HttpIdempotencyLayer) -> lambda_idempotency::HttpIdempotencyLayer {
    /// // ALB with OIDC authentication on the listener: it sets this header itself.
    /// layer.with_principal(|request| {
    ///     request.headers().get("x-amzn-oidc-identity")?.to_str().ok().map(str::to_owned)
    /// })
    /// # }
    /// ```
    pub fn with_principal(
        self,
        principal: impl Fn(&Request) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.with(|shared| shared.principal = Some(Arc::new(principal)))
    }

    fn with(self, change: impl FnOnce(&mut Shared<S>)) -> Self {
        let mut shared = match Arc::try_unwrap(self.shared) {
            Ok(shared) => shared,
            Err(shared) => Shared {
                idem: shared.idem.clone(),
                scope: shared.scope.clone(),
                lease: shared.lease,
                callers: shared.callers,
                principal: shared.principal.clone(),
            },
        };
        change(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }
}

impl<S, Svc> Layer<Svc> for HttpIdempotencyLayer<S> {
    type Service = HttpIdempotent<Svc, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        HttpIdempotent {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// An HTTP service made idempotent by [`HttpIdempotencyLayer`].
pub struct HttpIdempotent<Svc, S = AnyStore> {
    inner: Svc,
    shared: Arc<Shared<S>>,
}

impl<Svc: Clone, S> Clone for HttpIdempotent<Svc, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc, S> fmt::Debug for HttpIdempotent<Svc, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpIdempotent")
            .field("scope", &self.shared.scope)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, B> Service<Request> for HttpIdempotent<Svc, S>
where
    Svc: Service<Request, Response = Response<B>> + Clone + Send + 'static,
    Svc::Error: Into<BoxError> + Send,
    Svc::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    S: Store,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The ready service answers this call; a fresh clone waits for the next one.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { shared.handle(inner, request).await })
    }
}

impl<S: Store> Shared<S> {
    async fn handle<Svc, B>(
        &self,
        mut inner: Svc,
        request: Request,
    ) -> Result<Response<Body>, BoxError>
    where
        Svc: Service<Request, Response = Response<B>> + Send,
        Svc::Error: Into<BoxError>,
        Svc::Future: Send,
        B: http_body::Body + Send,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        if !matches!(*request.method(), Method::POST | Method::PATCH) {
            let response = inner.call(request).await.map_err(Into::into)?;
            return collect(response)
                .await
                .map(|(parts, bytes)| Response::from_parts(parts, body_of(bytes)));
        }
        let invocation = match self.invocation(&request) {
            Ok(invocation) => invocation,
            Err(answer) => return Ok(error_response(&answer)),
        };
        let applied = Arc::new(std::sync::Mutex::new(None));
        let result = self
            .idem
            .execute(&invocation, |ctx| {
                let mut request = request;
                request.extensions_mut().insert(ctx.clone());
                let applied = Arc::clone(&applied);
                context::scope(ctx, async move {
                    let response = inner.call(request).await.map_err(Into::into)?;
                    let (parts, bytes) = collect(response).await?;
                    if is_definitive(parts.status) {
                        let stored = StoredResponse::new(&parts, &bytes);
                        // Kept in case the store cannot take it: the client still gets it.
                        *applied.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some(stored.clone());
                        Ok(stored)
                    } else {
                        Err(BoxError::from(Release::new(NotStored(
                            Response::from_parts(parts, body_of(bytes)),
                        ))))
                    }
                })
            })
            .await;
        Ok(match result {
            Ok(done) => match done.value().response() {
                Ok(mut response) => {
                    if done.is_replay() {
                        response
                            .headers_mut()
                            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
                    }
                    response
                }
                Err(reason) => {
                    let unreadable = Error::StoredOutcomeUnreadable {
                        key: invocation.key().clone(),
                        reason,
                    };
                    warn!(
                        key = invocation.key().short(),
                        "the stored response does not decode: answered 500, not replayed"
                    );
                    error_response(&ErrorAnswer::for_error(&unreadable))
                }
            },
            Err(err @ Error::OutcomeTooLarge { .. }) => {
                // Applied, retained as failed so that it never runs again; this caller still
                // gets the response it produced, later ones a 409.
                let kept = applied
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                match kept.map(|stored| stored.response()) {
                    Some(Ok(response)) => response,
                    _ => error_response(&ErrorAnswer::for_error(&err)),
                }
            }
            Err(Error::Handler { source }) => match Release::take::<NotStored>(source) {
                Ok(not_stored) => not_stored.0,
                Err(source) => error_response(&ErrorAnswer::for_error(&Error::Handler { source })),
            },
            Err(err) => error_response(&ErrorAnswer::for_error(&err)),
        })
    }

    /// The request's operation: its key (the caller and the `Idempotency-Key`), its
    /// fingerprint (method, path, query, content type, body) and a lease from the deadline.
    fn invocation(&self, request: &Request) -> Result<Invocation, ErrorAnswer> {
        let key_value = request
            .headers()
            .get(IDEMPOTENCY_KEY_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty());
        let Some(key_value) = key_value else {
            return Err(ErrorAnswer::for_error(&Error::MissingKey {
                operation: self.scope.operation().to_owned(),
            }));
        };
        if key_value.len() > MAX_KEY_BYTES {
            return Err(ErrorAnswer::for_error(&Error::InvalidEvent {
                reason: format!("the Idempotency-Key is over {MAX_KEY_BYTES} bytes"),
            }));
        }
        let principal = match &self.principal {
            Some(read) => read(request)
                .filter(|principal| caller::present(principal).is_some())
                .map(|principal| json!(["custom", principal]).to_string()),
            None => caller::principal(request),
        };
        let caller = match (self.callers, principal) {
            (CallerScope::Shared, _) => None,
            (_, Some(principal)) => Some(principal),
            (CallerScope::PrincipalOrAnonymous, None) => Some("anonymous".to_owned()),
            (CallerScope::Principal, None) => return Err(ErrorAnswer::caller_unidentified()),
        };
        let key = OperationKey::derive(
            &self.scope,
            None,
            &json!({"caller": caller, "key": key_value}),
        )
        .map_err(|err| ErrorAnswer::for_error(&err))?;
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok());
        let intent = json!({
            "method": request.method().as_str(),
            "path": request.uri().path(),
            "query": query_pairs(request.uri().query()),
            "content_type": content_type,
            "body_sha256": hex::encode(Sha256::digest(request.body().as_ref())),
        });
        let fingerprint = Fingerprint::of(&intent).map_err(|err| ErrorAnswer::for_error(&err))?;
        let context = request.lambda_context_ref();
        let now = self.idem.now();
        let deadline = context.and_then(|context| deadline_of(context, now));
        let invocation = Invocation::new(key, fingerprint, self.lease.lease(deadline, now));
        let invocation = match deadline {
            Some(deadline) => invocation.with_deadline(deadline),
            None => invocation,
        };
        Ok(match context {
            Some(context) => invocation.with_request_id(context.request_id.clone()),
            None => invocation,
        })
    }
}

/// A query string's `(name, value)` pairs ordered by name, values of one name in their order:
/// the same for a retry however the gateway rebuilt the string (REST and ALB requests come
/// through a hash map).
fn query_pairs(query: Option<&str>) -> Vec<(&str, &str)> {
    let mut pairs: Vec<(&str, &str)> = query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    pairs
}

/// A response the handler gave that is not stored (408, 409, 425, 429, 5xx): the claim is
/// released whatever the engine's classifier says ([`Release`]) and the response passed
/// through.
#[derive(Debug)]
struct NotStored(Response<Body>);

impl fmt::Display for NotStored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the handler answered {}, which is not stored",
            self.0.status()
        )
    }
}

impl std::error::Error for NotStored {}

/// Reads a response's body to its bytes.
async fn collect<B>(response: Response<B>) -> Result<(http::response::Parts, Vec<u8>), BoxError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    Ok((parts, bytes.to_vec()))
}

/// The JSON response for an error answer.
fn error_response(answer: &ErrorAnswer) -> Response<Body> {
    let mut response = Response::new(Body::Text(answer.body()));
    *response.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = answer.retry_after_secs()
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}
