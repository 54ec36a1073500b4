//! The HTTP service: key the request, claim, call the inner service once, store the response
//! when it is definitive, answer (replays marked, refusals from the one error table).

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::BodyExt;
use lambda_http::{Body, Request, RequestExt};
use lambda_runtime::tower::Service;
use tracing::warn;

use super::answer::ErrorAnswer;
use super::stored::{StoredResponse, body_of, is_definitive};
use super::{IDEMPOTENCY_KEY_HEADER, REPLAYED_HEADER};
use crate::error::{BoxError, Error};
use crate::execution::Origin;
use crate::failure::{AfterEffect, Release};
use crate::lambda::context;
use crate::lambda::operation::Operation;
use crate::reconcile::BoxFuture;

/// An HTTP service made idempotent by [`HttpIdempotencyLayer`](super::HttpIdempotencyLayer).
pub struct HttpIdempotencyService<Svc> {
    inner: Svc,
    operation: Arc<Operation<Request>>,
    key_optional: bool,
}

impl<Svc> HttpIdempotencyService<Svc> {
    pub(super) fn new(inner: Svc, operation: Arc<Operation<Request>>, key_optional: bool) -> Self {
        Self {
            inner,
            operation,
            key_optional,
        }
    }
}

impl<Svc: Clone> Clone for HttpIdempotencyService<Svc> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            operation: Arc::clone(&self.operation),
            key_optional: self.key_optional,
        }
    }
}

impl<Svc> fmt::Debug for HttpIdempotencyService<Svc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpIdempotencyService")
            .field("operation", &self.operation)
            .finish_non_exhaustive()
    }
}

impl<Svc, B> Service<Request> for HttpIdempotencyService<Svc>
where
    Svc: Service<Request, Response = Response<B>> + Clone + Send + 'static,
    Svc::Error: Into<BoxError> + Send,
    Svc::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
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
        let operation = Arc::clone(&self.operation);
        let key_optional = self.key_optional;
        Box::pin(async move { handle(&operation, key_optional, inner, request).await })
    }
}

async fn handle<Svc, B>(
    operation: &Operation<Request>,
    key_optional: bool,
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
    let longest = operation.lease.max;
    let respond = |answer: &ErrorAnswer| error_response(answer, longest);
    let unkeyed = key_optional && !request.headers().contains_key(IDEMPOTENCY_KEY_HEADER);
    if unkeyed || !matches!(*request.method(), Method::POST | Method::PATCH) {
        let response = inner.call(request).await.map_err(Into::into)?;
        return collect(response)
            .await
            .map(|(parts, bytes)| Response::from_parts(parts, body_of(bytes)));
    }
    let invocation = match operation.invocation_in(&request, request.lambda_context_ref()) {
        Ok(invocation) => invocation,
        Err(err) => return Ok(respond(&ErrorAnswer::for_error(&err))),
    };
    let applied = Arc::new(std::sync::Mutex::new(None));
    let result = operation
        .idem
        .execute(&invocation, |ctx| {
            let mut request = request;
            request.extensions_mut().insert(ctx.clone());
            let applied = Arc::clone(&applied);
            context::scope(ctx.clone(), async move {
                let response = inner.call(request).await.map_err(Into::into)?;
                let status = response.status();
                let definitive = is_definitive(status);
                let (parts, bytes) = match collect(response).await {
                    Ok(read) => read,
                    // A status that says done, from a handler whose effect is not waiting to
                    // commit with the completion (read once the body has ended: a body may
                    // queue writes as it streams): its effect happened, retained, never
                    // released for a retry to run it again.
                    Err(err)
                        if definitive
                            && !status.is_client_error()
                            && !ctx.steps.completes_with_writes() =>
                    {
                        return Err(BoxError::from(AfterEffect::new(err)));
                    }
                    // Nothing took effect (a refusal took none), or it waits for the
                    // completion, which is not written: the retry runs the handler again.
                    Err(err) => return Err(BoxError::from(Release::new(err))),
                };
                if definitive {
                    if parts.status.is_client_error() {
                        // The application refused the request: replayed to this key, but it
                        // holds no business identity.
                        ctx.refuse();
                    }
                    let stored = StoredResponse::new(&parts, &bytes);
                    // Kept in case the store cannot take it: the client still gets it. Not when
                    // the attempt stopped at a step (the handler answered past a step's error):
                    // the answer is then the stop's, and the next delivery goes on. Nor when
                    // writes wait for the completion: until it commits, nothing is done.
                    if !ctx.steps.stopped() && !ctx.steps.completes_with_writes() {
                        *applied.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some(stored.clone());
                    }
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
                // A response this request's run did not make (stored earlier, or recorded by a
                // reconciler after a takeover): a replay to the client.
                if !matches!(done.origin(), Origin::Executed { .. }) {
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
                respond(&ErrorAnswer::for_error(&unreadable))
            }
        },
        // The handler answered and its effect happened, but its response was not recorded:
        // too large or refused by the store (retained as failed so that it never runs again:
        // later callers get a 409), or its completion failed in the store (the record is
        // still this attempt's: later callers get what it comes to). This caller still gets
        // the response it produced, not a "retry" that would find the operation in progress.
        // A lost lease is not one of them: a takeover may have recorded another answer, which
        // the retry gets.
        Err(err) if err.applied_but_not_kept() || matches!(err, Error::Store(_)) => {
            let kept = applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            match kept.map(|stored| stored.response()) {
                Some(Ok(response)) => {
                    warn!(
                        key = invocation.key().short(),
                        kind = err.kind().name(),
                        "the response was not recorded: answered as the handler gave it"
                    );
                    response
                }
                _ => respond(&ErrorAnswer::for_error(&err)),
            }
        }
        // Its status said done, its body failed: applied, and answered so to every retry.
        Err(Error::Handler { source }) if AfterEffect::is(&*source) => {
            warn!(
                key = invocation.key().short(),
                "the handler's response body failed after a definitive status: retained as applied"
            );
            respond(&ErrorAnswer::applied_not_kept())
        }
        Err(Error::Handler { source }) => match Release::take::<NotStored>(source) {
            Ok(not_stored) => not_stored.0,
            // Retained as a terminal failure: answered as every retry will be.
            Err(source) if operation.is_terminal(&*source) => {
                respond(&ErrorAnswer::failed_for_good())
            }
            Err(source) => respond(&ErrorAnswer::for_error(&Error::Handler { source })),
        },
        Err(err) => respond(&ErrorAnswer::for_error(&err)),
    })
}

/// A response the handler gave that is not stored (401, 403, 407, 408, 409, 412, 425, 428, 429,
/// 5xx): the claim is released whatever the operation's classifier says ([`Release`]) and the
/// response passed through.
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

/// The problem-detail response (RFC 9457) for an error answer.
fn error_response(answer: &ErrorAnswer, longest_lease: std::time::Duration) -> Response<Body> {
    let mut response = Response::new(Body::Text(answer.body()));
    *response.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(seconds) = answer.retry_after_secs(longest_lease)
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    // A 401 carries a challenge (RFC 9110 §15.5.2): the scheme an authorizer in front of the
    // door most often takes (a JWT or Cognito authorizer's bearer token).
    if response.status() == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}
