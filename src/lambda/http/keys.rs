//! The one HTTP key derivation: a [`KeyPolicy`] over `lambda_http` requests. The key is the
//! caller and the `Idempotency-Key` header (a Structured Field String when it is quoted, as the
//! IETF draft sends it, else the raw value); the fingerprint is the method, the path, the
//! query (percent-decoded, sorted by name), the content type and the exact body bytes (a
//! `multipart/*` body's parts, without the boundary a client picks anew for each request).

use std::fmt;
use std::sync::Arc;

use http::header;
use lambda_http::Request;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::caller::{self, CallerScope};
use super::multipart;
use crate::error::Error;
use crate::key::{KeyPolicy, Select};

/// The HTTP header that carries the idempotency key (IETF draft).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// The longest `Idempotency-Key` accepted, in bytes, as it is sent (a quoted key's quotes and
/// escapes included).
pub const MAX_KEY_BYTES: usize = 255;

/// Reads the caller's principal from a request.
type PrincipalFn = dyn Fn(&Request) -> Option<String> + Send + Sync;

/// How HTTP requests are keyed: whose keys they are ([`CallerScope`]) and how the caller is
/// read. Turn it into the [`KeyPolicy`] of an operation with [`HttpKeys::policy`]
/// ([`crate::lambda::sources::http`] is the default's).
///
/// ```
/// use lambda_idempotency::lambda::http::{CallerScope, HttpKeys};
///
/// // ALB with OIDC authentication on the listener: it sets this header itself.
/// let policy = HttpKeys::new()
///     .with_principal(|request| request.headers().get("x-amzn-oidc-identity")?.to_str().ok().map(str::to_owned))
///     .policy();
/// // A public endpoint whose responses are not private to the caller:
/// let public = HttpKeys::new().with_callers(CallerScope::PrincipalOrAnonymous).policy();
/// # let _ = (policy, public);
/// ```
#[derive(Clone, Default)]
pub struct HttpKeys {
    callers: CallerScope,
    principal: Option<Arc<PrincipalFn>>,
}

impl fmt::Debug for HttpKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpKeys")
            .field("callers", &self.callers)
            .field("principal", &self.principal.is_some())
            .finish()
    }
}

impl HttpKeys {
    /// Keys per caller ([`CallerScope::Principal`]), the caller read from the authorizer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whose operations a key names ([`CallerScope`]).
    pub fn with_callers(mut self, callers: CallerScope) -> Self {
        self.callers = callers;
        self
    }

    /// Reads the caller's principal with `principal` instead of from the authorizer context:
    /// for what the built-in reading cannot see (an HTTP API Lambda authorizer's context
    /// naming its caller other than `principalId` or `sub`, an ALB listener that
    /// authenticates with OIDC). Read only what the gateway
    /// vouches for, never a header the client can set.
    pub fn with_principal(
        mut self,
        principal: impl Fn(&Request) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.principal = Some(Arc::new(principal));
        self
    }

    /// The key policy: add a tenant or a business identity with its builder methods.
    pub fn policy(self) -> KeyPolicy<Request> {
        let as_0_4 = KeysAs04(self.clone());
        KeyPolicy::from_selectors(self, Intent)
            .with_key_as_0_4(as_0_4)
            .with_intent_as_0_4(IntentAs04)
    }

    /// The caller part of the key; `Err` when the request must name a caller and does not.
    fn caller(&self, request: &Request) -> Result<Option<String>, Error> {
        let principal = match &self.principal {
            Some(read) => read(request)
                .filter(|principal| caller::present(principal).is_some())
                .map(|principal| caller::name(&["custom", &principal])),
            None => caller::principal(request),
        };
        if principal.as_deref().is_some_and(caller::has_control) {
            // Never a principal a gateway vouches for: refused, neither keyed nor logged.
            return Err(Error::InvalidEvent {
                reason: "the caller's principal holds a control character".into(),
            });
        }
        match (self.callers, principal) {
            (CallerScope::Shared, _) => Ok(None),
            (_, Some(principal)) => Ok(Some(principal)),
            (CallerScope::PrincipalOrAnonymous, None) => Ok(Some("anonymous".to_owned())),
            (CallerScope::Principal, None) => Err(Error::CallerUnidentified),
        }
    }
}

impl From<HttpKeys> for KeyPolicy<Request> {
    fn from(keys: HttpKeys) -> Self {
        keys.policy()
    }
}

/// The key material: the caller and the `Idempotency-Key` (1 to 255 bytes). A value that
/// starts with a double quote is a Structured Field String (RFC 9651, as the IETF draft sends
/// it: `"k"` and `k` are one key); any other value is taken raw, trimmed (a bare UUID is
/// neither a String nor a Token), and holds no comma (an HTTP API joins repeated field lines
/// with one). A request without the header, or with an empty key, has none
/// ([`Error::MissingKey`]).
impl Select<Request> for HttpKeys {
    fn select(&self, request: &Request) -> Result<Option<Value>, Error> {
        let Some(raw) = raw_key(request)? else {
            return Ok(None);
        };
        let key = match raw.starts_with('"') {
            true => structured_string(raw)?,
            false => raw.to_owned(),
        };
        if key.trim().is_empty() {
            return Ok(None);
        }
        let caller = self.caller(request)?;
        Ok(Some(json!({"caller": caller, "key": key})))
    }
}

/// The header's value, trimmed; `None` when it is absent or blank.
fn raw_key(request: &Request) -> Result<Option<&str>, Error> {
    let mut values = request.headers().get_all(IDEMPOTENCY_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    // Field lines are combined before they are parsed (RFC 9651 §4.2): two keys are no one
    // key, and which one a door kept would differ by door.
    if values.next().is_some() {
        return Err(Error::InvalidEvent {
            reason: "the request carries more than one Idempotency-Key: send one".into(),
        });
    }
    let Ok(value) = value.to_str() else {
        return Err(Error::InvalidEvent {
            reason: "the Idempotency-Key holds a byte that is not visible ASCII".into(),
        });
    };
    let value = value.trim();
    // An HTTP API (and a Function URL) joins repeated field lines with a comma: a bare key
    // holding one is two keys, refused as two field lines are (a quoted key may hold one).
    if !value.starts_with('"') && value.contains(',') {
        return Err(Error::InvalidEvent {
            reason: "the Idempotency-Key holds a comma (repeated field lines are joined with one): send one key, quoted as a Structured Field String if it must hold a comma".into(),
        });
    }
    if value.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidEvent {
            reason: format!("the Idempotency-Key is over {MAX_KEY_BYTES} bytes"),
        });
    }
    Ok((!value.is_empty()).then_some(value))
}

/// The string a quoted `Idempotency-Key` holds (parameters, which the draft defines none of,
/// are ignored); a value that is not a Structured Field String is refused.
fn structured_string(value: &str) -> Result<String, Error> {
    let item = sfv::Parser::new(value)
        .parse_item::<sfv::Item>()
        .map_err(|_| Error::InvalidEvent {
            reason: "the Idempotency-Key starts with a double quote but is not a Structured Field String (RFC 9651): send \"key\" or the key bare".into(),
        })?;
    match item.bare_item.as_string() {
        Some(string) => Ok(string.as_str().to_owned()),
        None => Err(Error::InvalidEvent {
            reason: "the Idempotency-Key must be a Structured Field String or a bare value".into(),
        }),
    }
}

/// The key material as 0.4 selected it: the header's raw value, quotes and all.
#[derive(Clone)]
struct KeysAs04(HttpKeys);

impl Select<Request> for KeysAs04 {
    fn select(&self, request: &Request) -> Result<Option<Value>, Error> {
        let Some(key) = raw_key(request)? else {
            return Ok(None);
        };
        let caller = self.0.caller(request)?;
        Ok(Some(json!({"caller": caller, "key": key})))
    }
}

/// The intent: method, path, query (percent-decoded as `application/x-www-form-urlencoded`,
/// sorted by name), content type, and the SHA-256 of the exact body bytes; a complete
/// `multipart/*` body's parts instead, its content type without the boundary.
#[derive(Debug, Clone, Copy)]
struct Intent;

impl Select<Request> for Intent {
    fn select(&self, request: &Request) -> Result<Option<Value>, Error> {
        let query = request.uri().query().unwrap_or_default();
        let mut pairs: Vec<(Vec<u8>, Value)> = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|raw| {
                let (name, value) = raw.split_once('=').unwrap_or((raw, ""));
                let name = form_decoded(name);
                (
                    name.clone(),
                    json!([text_or_bytes(name), text_or_bytes(form_decoded(value))]),
                )
            })
            .collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let query: Vec<Value> = pairs.into_iter().map(|(_, pair)| pair).collect();
        Ok(Some(intent(request, Value::Array(query), true)))
    }
}

/// A query name or value decoded as `application/x-www-form-urlencoded` does (`+` is a space,
/// then percent-decoding), to its bytes: nothing is replaced, so `%FF` and `%FE` stay two.
fn form_decoded(part: &str) -> Vec<u8> {
    let spaced: Vec<u8> = part
        .bytes()
        .map(|byte| if byte == b'+' { b' ' } else { byte })
        .collect();
    percent_encoding::percent_decode(&spaced).collect()
}

/// Decoded bytes as the intent holds them: a string when they are UTF-8, else the bytes as an
/// array of numbers, which no string equals.
fn text_or_bytes(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(text) => Value::String(text),
        Err(not_utf8) => json!(not_utf8.into_bytes()),
    }
}

/// The intent as 0.4 projected it: the query's pairs as sent, not percent-decoded. Read only
/// for records that name no key rule, so it answers as 0.4 did, no more: two queries 0.4 could
/// not tell apart (`?a=1&%61=2` and `?%61=2&a=1`, sorted by their raw names) are one request
/// to a record 0.4 wrote, as they were under 0.4.
#[derive(Debug, Clone, Copy)]
struct IntentAs04;

impl Select<Request> for IntentAs04 {
    fn select(&self, request: &Request) -> Result<Option<Value>, Error> {
        let mut query: Vec<(&str, &str)> = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
            .collect();
        query.sort_by(|a, b| a.0.cmp(b.0));
        Ok(Some(intent(request, json!(query), false)))
    }
}

/// The intent of `request` with its `query` pairs ordered by name (values of one name in their
/// order: the same for a retry however the gateway rebuilt the string; REST and ALB requests
/// come through a hash map). With `forms`, a complete `multipart/*` body is its parts, and its
/// content type is read without the boundary, which a client picks anew for each request.
fn intent(request: &Request, query: Value, forms: bool) -> Value {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    let body = request.body().as_ref();
    let form = content_type.filter(|_| forms).and_then(|sent| {
        let (_, boundary) = multipart::boundary_of(sent)?;
        Some((sent, multipart::parts(body, &boundary)?))
    });
    match form {
        Some((sent, parts)) => json!({
            "method": request.method().as_str(),
            "path": request.uri().path(),
            "query": query,
            "content_type": multipart::without_boundary(sent),
            "parts": parts,
        }),
        None => json!({
            "method": request.method().as_str(),
            "path": request.uri().path(),
            "query": query,
            "content_type": content_type,
            "body_sha256": hex::encode(Sha256::digest(body)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Fingerprint, OperationKey, OperationScope};

    fn request() -> Request {
        http::Request::builder()
            .method("POST")
            .uri("https://api.example/payments?b=2&a=1")
            .header(IDEMPOTENCY_KEY_HEADER, " k-1 ")
            .header(header::CONTENT_TYPE, "application/json")
            .body(lambda_http::Body::Text(r#"{"amount": 10}"#.into()))
            .unwrap_or_default()
    }

    /// Records 0.2's layer wrote are found again: the same key and fingerprint as it derived.
    #[test]
    fn keys_and_fingerprints_are_the_ones_0_2_derived() -> Result<(), Error> {
        let scope = OperationScope::new("shop", "payments").map_err(|err| Error::InvalidEvent {
            reason: err.to_string(),
        })?;
        let policy = HttpKeys::new().with_callers(CallerScope::Shared).policy();
        let (key, fingerprint) = policy.derive(&scope, &request())?;
        let before = OperationKey::derive(&scope, None, &json!({"caller": null, "key": "k-1"}))?;
        let intent = json!({
            "method": "POST",
            "path": "/payments",
            "query": [["a", "1"], ["b", "2"]],
            "content_type": "application/json",
            "body_sha256": hex::encode(Sha256::digest(br#"{"amount": 10}"#)),
        });
        assert_eq!(key, before);
        assert_eq!(fingerprint, Fingerprint::of(&intent)?);
        Ok(())
    }

    #[test]
    fn a_request_without_a_principal_is_refused_by_variant() {
        let scope = OperationScope::new("shop", "payments").ok();
        let policy = HttpKeys::new().policy();
        let refused = scope.map(|scope| policy.derive(&scope, &request()));
        assert!(matches!(refused, Some(Err(Error::CallerUnidentified))));
    }

    fn fingerprint_with(query: &str) -> Result<Fingerprint, Error> {
        let mut request = request();
        *request.uri_mut() = format!("https://api.example/payments{query}")
            .parse()
            .unwrap_or_default();
        let scope = OperationScope::new("shop", "payments").map_err(|err| Error::InvalidEvent {
            reason: err.to_string(),
        })?;
        let policy = HttpKeys::new().with_callers(CallerScope::Shared).policy();
        Ok(policy.derive(&scope, &request)?.1)
    }

    /// Bytes that are not UTF-8 are not all one replacement character: a changed query is
    /// another intent, and a UTF-8 query keeps the fingerprint 0.5 gave it.
    #[test]
    fn queries_that_are_not_utf8_are_told_apart() -> Result<(), Error> {
        assert_ne!(fingerprint_with("?q=%FF")?, fingerprint_with("?q=%FE")?);
        assert_ne!(
            fingerprint_with("?q=%FF")?,
            fingerprint_with("?q=%EF%BF%BD")?
        );
        assert_ne!(fingerprint_with("?%FF=1")?, fingerprint_with("?%FE=1")?);
        assert_eq!(
            fingerprint_with("?b=2&a=%41+x")?,
            fingerprint_with("?a=A%20x&b=2")?
        );
        assert_eq!(fingerprint_with("?&a=1&&")?, fingerprint_with("?a=1")?);
        Ok(())
    }

    #[test]
    fn a_quoted_blank_key_is_no_key() {
        let mut blank = request();
        blank.headers_mut().insert(
            IDEMPOTENCY_KEY_HEADER,
            http::HeaderValue::from_static("\"  \""),
        );
        assert!(matches!(HttpKeys::new().select(&blank), Ok(None)));
    }
}
