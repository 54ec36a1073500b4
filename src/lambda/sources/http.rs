//! HTTP requests (API Gateway REST and HTTP APIs, Function URLs, ALB), as `lambda_http` gives
//! them: the key policy of the HTTP contract ([`crate::lambda::http`]).

use lambda_http::Request;

use crate::key::KeyPolicy;
use crate::lambda::http::HttpKeys;

/// The `Idempotency-Key` header (1 to 255 bytes; a Structured Field String when it is quoted,
/// else the value trimmed), scoped to the caller (the authorizer's principal: a request without
/// one is refused, 401 `caller_unidentified`); fingerprint over method, path, the
/// percent-decoded query sorted by name, content type and exact body bytes. Choose the caller
/// scope or the principal reader with [`HttpKeys`].
pub fn http() -> KeyPolicy<Request> {
    HttpKeys::new().policy()
}
