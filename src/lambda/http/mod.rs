//! The HTTP contract: idempotent endpoints as a tower layer over `lambda_http` requests. It
//! composes with `lambda_http::run` and with an axum `Router` served by `lambda_http`, so it
//! covers API Gateway REST (v1) and HTTP (v2) APIs, Function URLs and ALB alike: `lambda_http`
//! turns each of those events into the one request type, and one key derivation ([`HttpKeys`])
//! reads it.
//!
//! `POST` and `PATCH` requests are keyed by their `Idempotency-Key` header (the IETF draft's
//! wire format: a quoted value is a Structured Field String, so `"k"` and `k` are one key; any
//! other value is taken raw), **scoped to the caller** ([`CallerScope`]) and fingerprinted by
//! method, path, percent-decoded query sorted by name, content type and exact body bytes (a
//! multipart body's parts, without the boundary a client picks anew for each request); other
//! methods pass through untouched. Errors are RFC 9457 problem details
//! (`application/problem+json`, with the stable code as the `error` member).
//!
//! | situation | answer |
//! |---|---|
//! | first request | the handler's response; 2xx, 3xx and definitive 4xx are stored for replay |
//! | 401, 403, 407, 408, 409, 412, 425, 428, 429 or 5xx from the handler | passed through, not stored: the retry runs |
//! | another 4xx from the handler (a refusal) | stored and replayed to this key, but it holds no business identity: a corrected request under a new key may run |
//! | the business identity is held by another request's operation | 409 `business_identity_taken`, whatever that operation's state (nothing about it is revealed) |
//! | repeated request, same caller and payload | the first status, every header value (multi-value headers in order) except the [withheld](WITHHELD_HEADERS) ones, and the exact body bytes, plus `Idempotent-Replayed: true` |
//! | no `Idempotency-Key` header | 400 `missing_idempotency_key` (with [`HttpIdempotencyLayer::with_optional_key`]: passed through, unprotected) |
//! | a quoted key that is not a Structured Field String | 400 `invalid_request` |
//! | no caller principal ([`CallerScope::Principal`]) | 401 `caller_unidentified`, with `WWW-Authenticate: Bearer` |
//! | the original is still running | 409 `request_in_progress`, `Retry-After` |
//! | same key, another method, path, query, content type or body | 422 `idempotency_key_reused` |
//! | the handler failed terminally (now or before) | 409 `operation_previously_failed`, to this caller and every retry |
//! | the operation was applied but its response is too large to keep | the response, to this caller; 409 `operation_already_applied` to retries |
//! | the handler answered 2xx or 3xx, then its response body failed | 500 `response_not_kept` to this caller (the operation was applied), 409 `operation_already_applied` to retries: never run again; after a refusal (4xx), a status not stored, or with writes waiting for the completion (`complete_with`, never written): released, the retry runs |
//! | the store is unavailable | 503, `Retry-After` (when only the completion failed, the handler's response to this caller, unless writes waited for the completion: they were not written) |
//! | two `Idempotency-Key` field lines (an ALB's multi-value headers; an HTTP API or Function URL joins them with a comma, refused in a bare key) | 400 `invalid_request`; a REST API's event, as `lambda_http` reads it, keeps the last line alone |
//!
//! **What is stored is what a retry must get.** The headers that carry a credential or a
//! session ([`WITHHELD_HEADERS`]: `Set-Cookie`, `Authorization`, `X-Amz-Security-Token`, …) reach
//! the caller whose request ran the handler, and are not written to the idempotency table: a
//! replay has every other header and no cookie, so a client that lost the first response signs
//! in or fetches its session again rather than receiving one from storage. A response opts a
//! header back in with [`StoreHeaders`] in its extensions. The body is stored as it is: an
//! endpoint whose response body holds a secret must not be made idempotent this way (return a
//! reference to it instead).
//!
//! The handler can read its [`ExecutionContext`](crate::ExecutionContext) from the request's extensions (axum:
//! `Extension<ExecutionContext>`), or from [`current`](super::current).
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use lambda_idempotency::Idempotency;
//! use lambda_idempotency::lambda::sources;
//! use lambda_runtime::tower::ServiceBuilder;
//!
//! async fn pay() -> (http::StatusCode, &'static str) {
//!     (http::StatusCode::CREATED, r#"{"payment":"p-1"}"#)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_http::Error> {
//!     let idem = Idempotency::from_env().await?;
//!     let payments = idem.operation("payments", sources::http())?.http_layer();
//!     let app = Router::new().route("/payments", post(pay));
//!     lambda_http::run(ServiceBuilder::new().layer(payments).service(app)).await
//! }
//! ```
//!
//! The operation's settings are the door's: a business identity or a tenant read from the
//! request ([`HttpKeys::policy`] and the [`KeyPolicy`](crate::KeyPolicy) builder), a result
//! reference and the lease policy ([`Operation`]).
//!
//! **Whose business identity.** A key is the caller's; a business identity is the function's
//! (its namespace and tenant, [`IdentityScope::Tenant`](crate::key::IdentityScope::Tenant)): it names
//! a business effect (`invoice:o-1`) whoever asks for it. So that no caller can hold another's
//! identity by sending a request the application turns down, only a stored success holds one:
//! a 4xx the handler answers is replayed to its key but settles no evidence
//! ([`ExecutionContext::refuse`](crate::ExecutionContext::refuse)). A caller that meets an
//! identity another request holds learns only that (`business_identity_taken`), never that
//! operation's state or result. Read the identity from what the application has authorised
//! the caller to act on (the order the caller owns), not from a field any caller may set.

pub(crate) mod answer;
pub(crate) mod caller;
mod keys;
mod multipart;
mod service;
pub(crate) mod stored;

use std::fmt;
use std::sync::Arc;

use lambda_http::Request;
use lambda_runtime::tower::Layer;

pub use self::caller::CallerScope;
pub use self::keys::{HttpKeys, IDEMPOTENCY_KEY_HEADER, MAX_KEY_BYTES};
pub use self::service::HttpIdempotencyService;
pub use self::stored::{StoreHeaders, WITHHELD_HEADERS};
use super::operation::Operation;

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The stored form of a response with `status`, `headers` and `body`: what a reconciler's
/// [`Checked::Applied`](crate::effects::Checked::Applied) or an operator's
/// [`Resolution::Completed`](crate::Resolution::Completed) (`idemctl resolve --completed
/// FILE`) records for an HTTP operation, so that every retry is answered with it. Any other
/// value is answered 500 `stored_response_unreadable`. The form is
/// `{"status": 201, "headers": [["content-type", "application/json"]], "body": "<base64>"}`
/// (a header value that is not visible ASCII is `b64:` and its base64); the
/// [withheld](WITHHELD_HEADERS) headers are left out.
///
/// ```
/// use lambda_idempotency::lambda::http::stored_response;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("content-type", "application/json".parse()?);
/// let found = stored_response(http::StatusCode::CREATED, &headers, br#"{"payment":"p-1"}"#);
/// assert_eq!(found["status"], 201);
/// assert_eq!(found["body"], "eyJwYXltZW50IjoicC0xIn0=");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn stored_response(
    status: http::StatusCode,
    headers: &http::HeaderMap,
    body: &[u8],
) -> serde_json::Value {
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    *response.headers_mut() = headers.clone();
    let (parts, ()) = response.into_parts();
    // Strings and a number: its serialization cannot fail.
    serde_json::to_value(stored::StoredResponse::new(&parts, body)).unwrap_or_default()
}

/// Makes the wrapped HTTP service idempotent for `POST` and `PATCH`; configuration only (one
/// [`Operation`] over requests, [`Operation::http_layer`]).
pub struct HttpIdempotencyLayer {
    operation: Arc<Operation<Request>>,
    key_optional: bool,
}

impl HttpIdempotencyLayer {
    /// A layer running `operation` for each `POST` and `PATCH` request.
    pub fn new(operation: Operation<Request>) -> Self {
        Self {
            operation: Arc::new(operation),
            key_optional: false,
        }
    }

    /// The IETF draft's optional-key mode: a request without an `Idempotency-Key` header
    /// passes through to the service as any other method does (it is not idempotent, and
    /// nothing is stored), instead of being answered 400 `missing_idempotency_key`. A request
    /// with the header is keyed as always, and one whose header is present but empty is still
    /// refused (400 `missing_idempotency_key`): the client meant to send a key. Document it on the endpoint: a client that omits
    /// the key gets no protection from duplicates.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use lambda_idempotency::Idempotency;
    /// use lambda_idempotency::lambda::sources;
    ///
    /// let idem = Idempotency::from_env().await?;
    /// let payments = idem.operation("payments", sources::http())?.http_layer().with_optional_key();
    /// # let _ = payments;
    /// # Ok(()) }
    /// ```
    pub fn with_optional_key(mut self) -> Self {
        self.key_optional = true;
        self
    }
}

impl Operation<Request> {
    /// The HTTP layer of this operation, under the contract above.
    pub fn http_layer(self) -> HttpIdempotencyLayer {
        HttpIdempotencyLayer::new(self)
    }
}

impl From<Operation<Request>> for HttpIdempotencyLayer {
    fn from(operation: Operation<Request>) -> Self {
        Self::new(operation)
    }
}

impl Clone for HttpIdempotencyLayer {
    fn clone(&self) -> Self {
        Self {
            operation: Arc::clone(&self.operation),
            key_optional: self.key_optional,
        }
    }
}

impl fmt::Debug for HttpIdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpIdempotencyLayer")
            .field("operation", &self.operation)
            .field("key_optional", &self.key_optional)
            .finish()
    }
}

impl<Svc> Layer<Svc> for HttpIdempotencyLayer {
    type Service = HttpIdempotencyService<Svc>;

    fn layer(&self, inner: Svc) -> Self::Service {
        HttpIdempotencyService::new(inner, Arc::clone(&self.operation), self.key_optional)
    }
}
