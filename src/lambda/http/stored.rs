//! A response as it is stored and replayed: status, every header value in order (so multi-value
//! headers and `Set-Cookie` come back as they were), and the body's exact bytes.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use lambda_http::Body;
use serde::{Deserialize, Serialize};

/// Whether a response with `status` is stored and replayed to a retry: 2xx, 3xx (a `303 See
/// Other` after the effect), and 4xx that a retry must see again. 408, 409, 425 and 429 say
/// "try again", and 5xx may pass on a retry: those are not stored, so that the retry runs.
pub(crate) fn is_definitive(status: StatusCode) -> bool {
    status.is_success()
        || status.is_redirection()
        || (status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 425 | 429))
}

/// A response in its stored form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    /// `(name, value)` in order; a value that is not visible ASCII is base64 with `b64:` ahead.
    headers: Vec<(String, String)>,
    /// The body's bytes, base64.
    body: String,
}

impl StoredResponse {
    /// The stored form of a response whose body was read to `bytes`.
    pub(crate) fn new(parts: &http::response::Parts, bytes: &[u8]) -> Self {
        let headers = parts
            .headers
            .iter()
            .map(|(name, value)| {
                let value = match value.to_str() {
                    Ok(text) if !text.starts_with("b64:") => text.to_owned(),
                    _ => format!("b64:{}", STANDARD.encode(value.as_bytes())),
                };
                (name.as_str().to_owned(), value)
            })
            .collect();
        Self {
            status: parts.status.as_u16(),
            headers,
            body: STANDARD.encode(bytes),
        }
    }

    /// The response again, byte for byte; `Err` (why) when a part of it does not decode: a
    /// damaged record is never replayed as a success.
    pub(crate) fn response(&self) -> Result<Response<Body>, String> {
        let bytes = STANDARD
            .decode(&self.body)
            .map_err(|err| format!("the stored body is not base64: {err}"))?;
        let mut response = Response::new(body_of(bytes));
        *response.status_mut() = StatusCode::from_u16(self.status)
            .map_err(|_| format!("the stored status {} is not an HTTP status", self.status))?;
        for (name, value) in &self.headers {
            let value = match value.strip_prefix("b64:") {
                Some(encoded) => STANDARD
                    .decode(encoded)
                    .ok()
                    .and_then(|bytes| HeaderValue::from_bytes(&bytes).ok()),
                None => HeaderValue::from_str(value).ok(),
            };
            match (HeaderName::try_from(name.as_str()), value) {
                (Ok(name), Some(value)) => {
                    response.headers_mut().append(name, value);
                }
                _ => return Err("a stored header does not decode".to_owned()),
            }
        }
        Ok(response)
    }
}

/// A Lambda HTTP body for `bytes`: text when they are UTF-8, else binary (base64 on the wire).
pub(crate) fn body_of(bytes: Vec<u8>) -> Body {
    if bytes.is_empty() {
        return Body::Empty;
    }
    match String::from_utf8(bytes) {
        Ok(text) => Body::Text(text),
        Err(err) => Body::Binary(err.into_bytes()),
    }
}
