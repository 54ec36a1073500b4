//! Operation keys and fingerprints.
//!
//! An [`OperationKey`] names one intended business operation: `scope#hash`, where the scope is
//! namespace + operation (+ tenant) + key version and the hash is the SHA-256 of the canonical
//! JSON of the key material. A [`Fingerprint`] is the SHA-256 of the canonical JSON of the
//! *intent* of the request; the same key with another fingerprint is a payload conflict.
//!
//! Canonical JSON ([`canonical_json`]) is RFC 8785 except that every integer is written
//! exactly, so that two 64-bit ids that differ above 2^53 are two keys. It makes both stable
//! across field order, whitespace and number spellings:
//!
//! ```
//! use lambda_idempotency::key::{Fingerprint, KeyPolicy, OperationScope};
//! use serde_json::json;
//!
//! let scope = OperationScope::new("orders", "create-order")?;
//! let policy = KeyPolicy::pointer("/order/id")?;
//!
//! let a = json!({"order": {"id": "o-1", "total": 1}});
//! let b: serde_json::Value = serde_json::from_str(r#"{ "order" : { "total": 1.0e0, "id": "o-1" } }"#)?;
//!
//! let (key_a, fp_a) = policy.derive(&scope, &a)?;
//! let (key_b, fp_b) = policy.derive(&scope, &b)?;
//! assert_eq!(key_a, key_b);
//! assert_eq!(fp_a, fp_b);
//! assert!(key_a.as_str().starts_with("orders#create-order#v1#"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod canonical;
mod identity;
mod policy;
mod rule;
mod select;

use std::fmt;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use canonical::Strip;

pub use identity::IdentityScope;
pub(crate) use identity::{Elsewhere, Refusing, Scoped, elsewhere, global_before_0_5};
pub use policy::KeyPolicy;
pub use rule::KeyRule;
pub use select::{JsonPointer, Select, WholeEvent};

use crate::error::{ConfigError, Error};

/// The environment variable Lambda sets to the function's name: the default namespace.
pub const FUNCTION_NAME_VAR: &str = "AWS_LAMBDA_FUNCTION_NAME";

/// Longest accepted scope component, in bytes (keys must stay well under DynamoDB's 2 KB limit).
const MAX_COMPONENT_BYTES: usize = 256;

/// Where an operation's keys live: namespace, operation name and key version.
///
/// Bump the version when the meaning of the key material changes, so that old records are not
/// confused with new operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationScope {
    namespace: String,
    operation: String,
    version: u32,
}

impl OperationScope {
    /// A scope with an explicit namespace, key version 1.
    pub fn new(
        namespace: impl Into<String>,
        operation: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        let namespace = namespace.into();
        let operation = operation.into();
        check_component("namespace", &namespace)?;
        check_component("operation", &operation)?;
        if operation.starts_with("t=") {
            // `t=` marks the tenant in a key (`namespace#operation#t=tenant#v1#…`).
            return Err(ConfigError::InvalidScope {
                field: "operation",
                reason: "must not start with `t=`, which marks a tenant in the key",
            });
        }
        Ok(Self {
            namespace,
            operation,
            version: 1,
        })
    }

    /// A scope whose namespace is the Lambda function name (`AWS_LAMBDA_FUNCTION_NAME`).
    pub fn for_function(operation: impl Into<String>) -> Result<Self, ConfigError> {
        let namespace =
            std::env::var(FUNCTION_NAME_VAR).map_err(|_| ConfigError::MissingNamespace)?;
        Self::new(namespace, operation)
    }

    /// Sets the key version (default 1).
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The operation name.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The key version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The key `prefix#hash` of key material whose canonical form hashes to `digest`, written
    /// once into a string of its final size.
    fn key_of(&self, tenant: Option<&str>, digest: &[u8; 32]) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let tenant_len = tenant.map_or(0, |tenant| tenant.len() + 3);
        let mut key = String::with_capacity(
            self.namespace.len() + self.operation.len() + tenant_len + 16 + 2 * digest.len(),
        );
        key.push_str(&self.namespace);
        key.push('#');
        key.push_str(&self.operation);
        if let Some(tenant) = tenant {
            key.push_str("#t=");
            key.push_str(tenant);
        }
        key.push_str("#v");
        key.push_str(itoa::Buffer::new().format(self.version));
        key.push('#');
        for byte in digest {
            key.push(char::from(HEX[usize::from(byte >> 4)]));
            key.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        key
    }
}

fn check_component(field: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty()
        || value.contains('#')
        || value.len() > MAX_COMPONENT_BYTES
        || value.chars().any(char::is_control)
    {
        return Err(ConfigError::InvalidScope {
            field,
            reason: "must be 1 to 256 bytes long and contain no '#' and no control character",
        });
    }
    Ok(())
}

/// Why key material holding a number that may have been rounded is refused (it names no value).
const ROUNDED_KEY: &str = "the key material holds a number of magnitude 2^53 or more that is not a 64-bit integer (an integer beyond u64, or one written with a fraction or an exponent): JSON readers round it, so two ids would share one key; send the id as a string";

/// The identity of one intended operation: `scope#sha256(canonical key material)`.
///
/// It holds no payload data: the material is hashed, so a key is safe to log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationKey(String);

impl OperationKey {
    /// Derives the key for `material` in `scope`, optionally under a tenant.
    ///
    /// # Errors
    /// [`Error::MissingKey`] for empty material; [`Error::InvalidEvent`] for material that is
    /// not JSON, a malformed tenant, or a number that JSON readers may have rounded (magnitude
    /// 2^53 or more, held as a double: an integer beyond `u64`, `9007199254740993.0`), which
    /// would key two ids alike: send such an id as a string.
    pub fn derive<M: Serialize + ?Sized>(
        scope: &OperationScope,
        tenant: Option<&str>,
        material: &M,
    ) -> Result<Self, Error> {
        let material = serde_json::to_value(material).map_err(invalid_event)?;
        Self::of_value(scope, tenant, &material)
    }

    /// [`Self::derive`] for material that is JSON already (no copy made).
    pub(crate) fn of_value(
        scope: &OperationScope,
        tenant: Option<&str>,
        material: &Value,
    ) -> Result<Self, Error> {
        Ok(Self::with_earlier(scope, tenant, material)?.0)
    }

    /// The key of `material`, and the key versions before 0.2 derived for it when that was
    /// another (the material holds an integer past ±2^53 whose digits RFC 8785 alone did not
    /// keep): the engine continues an operation that an earlier version recorded under it.
    pub(crate) fn with_earlier(
        scope: &OperationScope,
        tenant: Option<&str>,
        material: &Value,
    ) -> Result<(Self, Option<Self>), Error> {
        if let Some(tenant) = tenant {
            check_component("tenant", tenant).map_err(|_| Error::InvalidEvent {
                reason: "the tenant must be 1 to 256 bytes long and contain no '#' and no control character".into(),
            })?;
        }
        if is_empty_material(material) {
            return Err(Error::MissingKey {
                operation: scope.operation.clone(),
            });
        }
        let digest = canonical::digest(material, Strip::Nothing)?;
        if digest.holds_rounded_number {
            return Err(Error::InvalidEvent {
                reason: ROUNDED_KEY.into(),
            });
        }
        let key = Self(scope.key_of(tenant, &digest.written));
        let earlier = match digest.differs_from_rfc8785 {
            true => Some(Self(scope.key_of(
                tenant,
                &Sha256::digest(canonical::rfc8785(material)?).into(),
            ))),
            false => None,
        };
        Ok((key, earlier))
    }

    /// Wraps a key read back from a store, unchecked.
    pub fn from_stored(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The operation name of the key's scope (`namespace#operation#…`), e.g. for metrics.
    pub fn operation(&self) -> &str {
        self.0.split('#').nth(1).unwrap_or_default()
    }

    /// The namespace of the key's scope (`namespace#…`).
    pub fn namespace(&self) -> &str {
        self.0.split('#').next().unwrap_or_default()
    }

    /// The tenant of the key's scope (`namespace#operation#t=tenant#v…#hash`), if it has one.
    pub fn tenant(&self) -> Option<&str> {
        let mut parts = self.0.split('#');
        let tenant = parts.nth(2)?.strip_prefix("t=")?;
        // A tenant is followed by the version and the hash.
        (parts.count() >= 2).then_some(tenant)
    }

    /// A short, stable tag for logs and error messages: the first 12 hex digits of the hash.
    pub fn short(&self) -> &str {
        let hash = self.0.rsplit('#').next().unwrap_or(&self.0);
        hash.get(..12).unwrap_or(hash)
    }

    /// A key for a downstream call made by this operation (a payment API's `Idempotency-Key`,
    /// an SQS FIFO deduplication id): the same on every attempt, distinct per `step`.
    pub fn downstream(&self, step: &str) -> String {
        sha256_hex(format!("{}#step={step}", self.0).as_bytes())
    }
}

impl fmt::Display for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The SHA-256 (hex) of the canonical JSON of a request's intent, and the [`KeyRule`] that
/// derived it.
///
/// Two fingerprints are equal when their digests are. One derived here is of
/// [`KeyRule::CURRENT`]; one read back from a store is of the rule its record names.
#[derive(Debug, Clone, Eq)]
pub struct Fingerprint {
    digest: String,
    rule: KeyRule,
    /// What the 0.1 rule (RFC 8785 alone) derived for the same intent, when that was another
    /// digest (the intent holds an integer past ±2^53).
    rfc8785_digest: Option<String>,
    /// The instant before which a record that names no rule may have been written by 0.1, when
    /// the engine reads such records under the compatibility rule (`None`: it does not).
    rfc8785_records_before: Option<SystemTime>,
    /// What 0.4 derived for the same request, when its door projected the intent otherwise
    /// (an HTTP query it did not percent-decode): read for records that name no rule only.
    digest_by_0_4: Option<String>,
}

impl Fingerprint {
    /// The fingerprint of `intent`: the SHA-256 of its canonical JSON, every integer that
    /// `serde_json` holds as an `i64` or a `u64` written exactly. A number past those (an
    /// integer beyond `u64`, a fraction of more than 17 significant digits) is read as the
    /// double `serde_json` makes of it before it is fingerprinted, as the handler reading the
    /// same JSON sees it: two intents that differ only past a double's precision are one
    /// intent. (An operation *key* holding such a number is refused instead: its digits would
    /// not name one operation.)
    pub fn of<I: Serialize + ?Sized>(intent: &I) -> Result<Self, Error> {
        let intent = serde_json::to_value(intent).map_err(invalid_event)?;
        Self::of_value(&intent)
    }

    /// [`Self::of`] for an intent that is JSON already (no copy made).
    pub(crate) fn of_value(intent: &Value) -> Result<Self, Error> {
        let canonical = canonical::digest(intent, Strip::Nothing)?;
        let rfc8785_digest = match canonical.differs_from_rfc8785 {
            true => Some(sha256_hex(&canonical::rfc8785(intent)?)),
            false => None,
        };
        Ok(Self::of_digest(&canonical.written, rfc8785_digest))
    }

    /// The fingerprint of a whole JSON event as [`WholeEvent`] projects it (without what the
    /// transport adds), hashed where the event lies: nothing is copied unless an integer past
    /// 2^53 needs the 0.1 rule's digest too.
    pub(crate) fn of_event(event: &Value) -> Result<Self, Error> {
        let canonical = canonical::digest(event, Strip::Transport)?;
        let rfc8785_digest = match canonical.differs_from_rfc8785 {
            true => {
                let mut projected = event.clone();
                select::strip_transport(&mut projected);
                Some(sha256_hex(&canonical::rfc8785(&projected)?))
            }
            false => None,
        };
        Ok(Self::of_digest(&canonical.written, rfc8785_digest))
    }

    fn of_digest(digest: &[u8; 32], rfc8785_digest: Option<String>) -> Self {
        Self {
            digest: hex::encode(digest),
            rule: KeyRule::CURRENT,
            rfc8785_digest,
            rfc8785_records_before: None,
            digest_by_0_4: None,
        }
    }

    /// Wraps a fingerprint read back from a store whose record names no rule, unchecked (a
    /// record a version before 0.5 wrote). A store keeps the rule with the digest and reads it
    /// back with [`Self::from_stored_under`]; the conformance suite checks that it does.
    pub fn from_stored(hex: impl Into<String>) -> Self {
        Self::from_stored_under(hex, KeyRule::Unstated)
    }

    /// Wraps a fingerprint read back from a store, with the rule its record names, unchecked.
    pub fn from_stored_under(hex: impl Into<String>, rule: KeyRule) -> Self {
        Self {
            digest: hex.into(),
            rule,
            rfc8785_digest: None,
            rfc8785_records_before: None,
            digest_by_0_4: None,
        }
    }

    /// The hex digest.
    pub fn as_str(&self) -> &str {
        &self.digest
    }

    /// The rule that derived the fingerprint (and its record's key).
    pub fn rule(&self) -> KeyRule {
        self.rule
    }

    /// Whether a `stored` fingerprint names this intent: the same digest.
    pub fn matches(&self, stored: &Fingerprint) -> bool {
        stored.digest == self.digest
    }

    /// The same fingerprint, reading records that name no rule and were created before
    /// `records_before` as 0.1 may have written them (`None`: never).
    pub(crate) fn with_rfc8785_records_before(
        mut self,
        records_before: Option<SystemTime>,
    ) -> Self {
        self.rfc8785_records_before = records_before;
        self
    }

    /// The same fingerprint, naming what 0.4 derived for the same request (`by_0_4`, the
    /// fingerprint of its intent as 0.4 projected it) when that is another digest: a record
    /// that names no rule (0.4 or before wrote it) of that digest is of this intent; a record
    /// that names one never is.
    pub(crate) fn with_fingerprint_by_0_4(mut self, by_0_4: Fingerprint) -> Self {
        if by_0_4.digest != self.digest {
            self.digest_by_0_4 = Some(by_0_4.digest);
        }
        self
    }

    /// Whether the 0.1 rule derived another digest for this intent.
    pub(crate) fn has_rfc8785_digest(&self) -> bool {
        self.rfc8785_digest.is_some()
    }

    /// Whether a record stored with `stored`, created at `created_at`, may have been written by
    /// 0.1 under the compatibility rule: it names no rule and predates the cut-over.
    pub(crate) fn reads_as_rfc8785(&self, stored: &Fingerprint, created_at: SystemTime) -> bool {
        stored.rule == KeyRule::Unstated
            && self
                .rfc8785_records_before
                .is_some_and(|before| created_at < before)
    }

    /// Whether the record stored with `stored` at `created_at` is of this intent: the same
    /// digest, or, for a record the compatibility rule reads as 0.1's, the digest 0.1 derived.
    /// A record that names no rule, where 0.4's door derived another digest for this request,
    /// is of this intent by that digest only: it was written under 0.4's projection, so
    /// today's digest in it names another request (`?a=%41` recorded raw by 0.4 is not
    /// `?a=%2541`, which decodes to it today).
    pub(crate) fn names(&self, stored: &Fingerprint, created_at: SystemTime) -> bool {
        let by_its_projection = match (&self.digest_by_0_4, stored.rule) {
            (Some(by_0_4), KeyRule::Unstated) => *by_0_4 == stored.digest,
            _ => self.matches(stored),
        };
        by_its_projection
            || (self.reads_as_rfc8785(stored, created_at)
                && self.rfc8785_digest.as_deref() == Some(stored.digest.as_str()))
    }
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.digest)
    }
}

/// The canonical JSON of `value`: RFC 8785, except that every integer `serde_json` holds as an
/// `i64` or a `u64` is written as its exact decimal digits (RFC 8785 would round one above
/// 2^53 to the nearest double). Strings, literals, fractions, exponents and integers beyond
/// `u64` (which `serde_json` holds as doubles) are written as RFC 8785 writes them, and object
/// members are sorted by their UTF-16 code units. The rule is stable: a change to it is a new
/// key version.
///
/// ```
/// use lambda_idempotency::key::canonical_json;
/// use serde_json::json;
///
/// let canonical = canonical_json(&json!({"b": 1.50, "a": 9007199254740993_u64}))?;
/// assert_eq!(canonical, br#"{"a":9007199254740993,"b":1.5}"#);
/// # Ok::<(), lambda_idempotency::Error>(())
/// ```
pub fn canonical_json(value: &Value) -> Result<Vec<u8>, Error> {
    Ok(canonical::canonicalize(value)?.written)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn invalid_event(err: serde_json::Error) -> Error {
    Error::InvalidEvent {
        reason: format!("the event does not serialize to JSON: {err}"),
    }
}

/// Whether key material names nothing: null, a blank string, or only such values.
pub(crate) fn is_empty_material(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(items) => items.is_empty() || items.iter().all(is_empty_material),
        Value::Object(fields) => fields.is_empty() || fields.values().all(is_empty_material),
        Value::Bool(_) | Value::Number(_) => false,
    }
}
