//! A response as it is stored and replayed: status, every header value in order (so multi-value
//! headers come back as they were) except the [withheld](WITHHELD_HEADERS) ones, and the body's
//! exact bytes.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use lambda_http::Body;
use serde::{Deserialize, Serialize};

/// Whether a response with `status` is stored and replayed to a retry: 2xx, 3xx (a `303 See
/// Other` after the effect), and 4xx that a retry must see again. 408, 409, 425 and 429 say
/// "try again"; 401, 403 and 407 "try again with (other) credentials or permissions", which
/// the caller's key and fingerprint do not see (a step-up token, or a role granted since, has
/// the same subject); 412 and 428 answer the
/// request's preconditions (`If-Match`…), which its fingerprint does not cover either; and 5xx
/// may pass on a retry: those are not stored, so that the retry runs.
pub(crate) fn is_definitive(status: StatusCode) -> bool {
    status.is_success()
        || status.is_redirection()
        || (status.is_client_error()
            && !matches!(
                status.as_u16(),
                401 | 403 | 407 | 408 | 409 | 412 | 425 | 428 | 429
            ))
}

/// Response headers the HTTP door does not store (compared without regard to case), unless the
/// response opts in with [`StoreHeaders`]: each carries a credential or a session, or is good for
/// one exchange only, and a stored copy would sit in the idempotency table for the whole retention
/// and be handed to every retry that presents the key.
///
/// | header | why it is not stored |
/// |---|---|
/// | `set-cookie`, `set-cookie2` | a session or a CSRF secret issued to the first caller |
/// | `authorization`, `proxy-authorization` | a credential (a response that echoes one carries it) |
/// | `authentication-info`, `proxy-authentication-info` | the next nonce or proof of one exchange |
/// | `x-amz-security-token` | an AWS session token |
/// | `x-api-key` | an API Gateway API key |
///
/// The caller whose request ran the handler gets every header the handler gave; a replay gets
/// the others (with `Idempotent-Replayed: true`) and none of these. `WWW-Authenticate` and
/// `Proxy-Authenticate` are stored: they are challenges, not credentials.
///
/// ```
/// use lambda_idempotency::lambda::http::WITHHELD_HEADERS;
///
/// assert!(WITHHELD_HEADERS.contains(&"set-cookie"));
/// assert!(!WITHHELD_HEADERS.contains(&"www-authenticate"));
/// ```
pub const WITHHELD_HEADERS: [&str; 8] = [
    "set-cookie",
    "set-cookie2",
    "authorization",
    "proxy-authorization",
    "authentication-info",
    "proxy-authentication-info",
    "x-amz-security-token",
    "x-api-key",
];

/// Whether the header `name` is one of the [`WITHHELD_HEADERS`].
fn is_withheld(name: &str) -> bool {
    WITHHELD_HEADERS
        .iter()
        .any(|withheld| withheld.eq_ignore_ascii_case(name))
}

/// A response's opt-in to store (and so replay) some of the [`WITHHELD_HEADERS`]: put it in the
/// response's extensions (axum: return `Extension(StoreHeaders::new().with(..))` among the
/// response's parts). For every response of an operation, add it inside the HTTP layer with
/// tower's `map_response`. Names that are not withheld change nothing: every other header is
/// stored anyway.
///
/// Opt in only for a header that every retry of the operation may receive: the value is kept
/// in the idempotency table (encrypted at rest, readable by whoever may read the table) until
/// the record expires, and given to each retry with the same key from the same caller.
///
/// ```
/// use axum::Extension;
/// use http::{StatusCode, header};
/// use lambda_idempotency::lambda::http::StoreHeaders;
///
/// // A cookie that only remembers a display preference: replaying it is harmless.
/// async fn pay() -> impl axum::response::IntoResponse {
///     (
///         StatusCode::CREATED,
///         Extension(StoreHeaders::new().with(header::SET_COOKIE)),
///         [(header::SET_COOKIE, "theme=dark; Path=/")],
///         r#"{"payment":"p-1"}"#,
///     )
/// }
/// # let _ = pay;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreHeaders {
    names: Vec<HeaderName>,
}

impl StoreHeaders {
    /// Stores none of the withheld headers (the door's default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Also stores the header `name` (every value of it) and replays it.
    pub fn with(mut self, name: HeaderName) -> Self {
        if !self.names.contains(&name) {
            self.names.push(name);
        }
        self
    }

    /// Whether the header `name` is stored.
    fn stores(&self, name: &str) -> bool {
        self.names
            .iter()
            .any(|stored| stored.as_str().eq_ignore_ascii_case(name))
    }
}

/// A response in its stored form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    /// `(name, value)` in order; a value that is not visible ASCII is base64 with `b64:` ahead.
    /// Withheld headers only when the response opted in.
    headers: Vec<(String, String)>,
    /// The body's bytes, base64.
    body: String,
    /// The withheld headers the response opted to store ([`StoreHeaders`]): replayed. Any other
    /// withheld header in a record (one a version before 0.5 stored) is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    stored_withheld: Vec<String>,
    /// Every header as the handler gave it, withheld ones included, for the caller whose request
    /// ran the handler: never serialized, so never stored.
    #[serde(skip)]
    first: Option<Vec<(String, String)>>,
}

impl StoredResponse {
    /// The stored form of a response whose body was read to `bytes`: the withheld headers are
    /// kept for this caller only, unless the response opts in ([`StoreHeaders`] in its
    /// extensions).
    pub(crate) fn new(parts: &http::response::Parts, bytes: &[u8]) -> Self {
        let every: Vec<(String, String)> = parts
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
        let opted = parts.extensions.get::<StoreHeaders>();
        let stored =
            |name: &str| !is_withheld(name) || opted.is_some_and(|opted| opted.stores(name));
        let headers: Vec<(String, String)> = every
            .iter()
            .filter(|(name, _)| stored(name))
            .cloned()
            .collect();
        let mut stored_withheld: Vec<String> = headers
            .iter()
            .filter(|(name, _)| is_withheld(name))
            .map(|(name, _)| name.clone())
            .collect();
        stored_withheld.sort();
        stored_withheld.dedup();
        let first = (headers.len() != every.len()).then_some(every);
        Self {
            status: parts.status.as_u16(),
            headers,
            body: STANDARD.encode(bytes),
            stored_withheld,
            first,
        }
    }

    /// The response again, byte for byte (a replay without the withheld headers it did not
    /// store); `Err` (why) when a part of it does not decode: a damaged record is never
    /// replayed as a success.
    pub(crate) fn response(&self) -> Result<Response<Body>, String> {
        let bytes = STANDARD
            .decode(&self.body)
            .map_err(|err| format!("the stored body is not base64: {err}"))?;
        let mut response = Response::new(body_of(bytes));
        *response.status_mut() = StatusCode::from_u16(self.status)
            .map_err(|_| format!("the stored status {} is not an HTTP status", self.status))?;
        let headers = match &self.first {
            Some(every) => every.iter().collect::<Vec<_>>(),
            None => self
                .headers
                .iter()
                .filter(|(name, _)| !is_withheld(name) || self.stored_withheld.contains(name))
                .collect(),
        };
        for (name, value) in headers {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(opt_in: Option<StoreHeaders>) -> http::response::Parts {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::CREATED;
        let headers = response.headers_mut();
        headers.append(
            "set-cookie",
            HeaderValue::from_static("session=s3cr3t; Path=/"),
        );
        headers.append("x-trace", HeaderValue::from_static("one"));
        headers.append("set-cookie", HeaderValue::from_static("csrf=t0k3n"));
        headers.append(
            "x-amz-security-token",
            HeaderValue::from_static("FwoG-token"),
        );
        headers.append(
            "www-authenticate",
            HeaderValue::from_static("Bearer realm=\"x\""),
        );
        if let Some(opt_in) = opt_in {
            response.extensions_mut().insert(opt_in);
        }
        response.into_parts().0
    }

    fn values(response: &Response<Body>, name: &str) -> Vec<String> {
        response
            .headers()
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok().map(str::to_owned))
            .collect()
    }

    /// The stored form as the engine keeps it and a replay reads it back.
    fn stored_and_read(stored: &StoredResponse) -> Result<StoredResponse, serde_json::Error> {
        let json = serde_json::to_string(stored)?;
        serde_json::from_str(&json)
    }

    #[test]
    fn withheld_headers_reach_the_first_caller_and_are_neither_stored_nor_replayed()
    -> Result<(), Box<dyn std::error::Error>> {
        let stored = StoredResponse::new(&parts(None), b"{}");
        let json = serde_json::to_string(&stored)?;
        assert!(!json.contains("s3cr3t") && !json.contains("t0k3n") && !json.contains("FwoG"));
        assert!(json.contains("x-trace") && json.contains("www-authenticate"));

        let first = stored.response()?;
        assert_eq!(
            values(&first, "set-cookie"),
            ["session=s3cr3t; Path=/", "csrf=t0k3n"]
        );
        assert_eq!(values(&first, "x-amz-security-token"), ["FwoG-token"]);

        let replay = stored_and_read(&stored)?.response()?;
        assert!(values(&replay, "set-cookie").is_empty());
        assert!(values(&replay, "x-amz-security-token").is_empty());
        assert_eq!(values(&replay, "x-trace"), ["one"]);
        assert_eq!(values(&replay, "www-authenticate"), ["Bearer realm=\"x\""]);
        assert_eq!(replay.status(), StatusCode::CREATED);
        Ok(())
    }

    /// Every header of the documented list, in any letter case, is withheld; the challenges a
    /// replayed 401 or 407 needs are kept.
    #[test]
    fn every_listed_header_is_withheld_and_challenges_are_kept()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        for (n, name) in WITHHELD_HEADERS.iter().enumerate() {
            let shouted = HeaderName::from_bytes(name.to_ascii_uppercase().as_bytes())?;
            response
                .headers_mut()
                .append(shouted, HeaderValue::from_str(&format!("secret-{n}"))?);
        }
        for (name, value) in [
            ("www-authenticate", "Basic realm=\"r\""),
            ("proxy-authenticate", "Basic realm=\"p\""),
        ] {
            response
                .headers_mut()
                .append(name, HeaderValue::from_static(value));
        }
        let stored = StoredResponse::new(&response.into_parts().0, b"");
        let json = serde_json::to_string(&stored)?;
        assert!(!json.contains("secret-"), "{json}");
        let replay = stored_and_read(&stored)?.response()?;
        for name in WITHHELD_HEADERS {
            assert!(values(&replay, name).is_empty(), "{name} replayed");
        }
        assert_eq!(values(&replay, "www-authenticate"), ["Basic realm=\"r\""]);
        assert_eq!(values(&replay, "proxy-authenticate"), ["Basic realm=\"p\""]);
        Ok(())
    }

    #[test]
    fn an_opted_in_header_is_stored_and_replayed_and_only_that_one()
    -> Result<(), Box<dyn std::error::Error>> {
        let opt_in = StoreHeaders::new()
            .with(http::header::SET_COOKIE)
            .with(http::header::SET_COOKIE);
        let stored = StoredResponse::new(&parts(Some(opt_in)), b"{}");
        let json = serde_json::to_string(&stored)?;
        assert!(json.contains("s3cr3t") && !json.contains("FwoG"));

        let replay = stored_and_read(&stored)?.response()?;
        assert_eq!(
            values(&replay, "set-cookie"),
            ["session=s3cr3t; Path=/", "csrf=t0k3n"]
        );
        assert!(values(&replay, "x-amz-security-token").is_empty());
        Ok(())
    }

    #[test]
    fn a_response_without_withheld_headers_is_stored_as_before() -> Result<(), serde_json::Error> {
        let mut response = Response::new(());
        response
            .headers_mut()
            .append("x-trace", HeaderValue::from_static("one"));
        let stored = StoredResponse::new(&response.into_parts().0, b"ok");
        assert_eq!(
            serde_json::to_string(&stored)?,
            r#"{"status":200,"headers":[["x-trace","one"]],"body":"b2s="}"#
        );
        Ok(())
    }

    /// A record an earlier version wrote with its cookies: the replay leaves them out.
    #[test]
    fn a_cookie_an_earlier_version_stored_is_not_replayed() -> Result<(), Box<dyn std::error::Error>>
    {
        let earlier: StoredResponse = serde_json::from_str(
            r#"{"status":201,"headers":[["set-cookie","session=old"],["Set-Cookie","b=1"],["x-trace","one"]],"body":""}"#,
        )?;
        let replay = earlier.response()?;
        assert!(values(&replay, "set-cookie").is_empty());
        assert_eq!(values(&replay, "x-trace"), ["one"]);
        Ok(())
    }
}
