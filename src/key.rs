//! Operation keys and fingerprints.
//!
//! An [`OperationKey`] names one intended business operation: `scope#hash`, where the scope is
//! namespace + operation (+ tenant) + key version and the hash is the SHA-256 of the RFC 8785
//! canonical JSON of the key material. A [`Fingerprint`] is the SHA-256 of the canonical JSON of
//! the *intent* of the request; the same key with another fingerprint is a payload conflict.
//!
//! Canonical JSON makes both stable across field order, whitespace and number spellings:
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

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

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

    fn prefix(&self, tenant: Option<&str>) -> String {
        match tenant {
            Some(tenant) => format!(
                "{}#{}#t={}#v{}",
                self.namespace, self.operation, tenant, self.version
            ),
            None => format!("{}#{}#v{}", self.namespace, self.operation, self.version),
        }
    }
}

fn check_component(field: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.contains('#') || value.len() > MAX_COMPONENT_BYTES {
        return Err(ConfigError::InvalidScope {
            field,
            reason: "must be 1 to 256 bytes long and contain no '#'",
        });
    }
    Ok(())
}

/// The identity of one intended operation: `scope#sha256(canonical key material)`.
///
/// It holds no payload data: the material is hashed, so a key is safe to log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationKey(String);

impl OperationKey {
    /// Derives the key for `material` in `scope`, optionally under a tenant.
    pub fn derive<M: Serialize + ?Sized>(
        scope: &OperationScope,
        tenant: Option<&str>,
        material: &M,
    ) -> Result<Self, Error> {
        if let Some(tenant) = tenant {
            check_component("tenant", tenant).map_err(|_| Error::InvalidEvent {
                reason: "the tenant must be 1 to 256 bytes long and contain no '#'".into(),
            })?;
        }
        let material = serde_json::to_value(material).map_err(invalid_event)?;
        if is_empty_material(&material) {
            return Err(Error::MissingKey {
                operation: scope.operation.clone(),
            });
        }
        Ok(Self(format!(
            "{}#{}",
            scope.prefix(tenant),
            canonical_sha256(&material)?
        )))
    }

    /// Wraps a key read back from a store, unchecked.
    pub fn from_stored(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
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

/// The SHA-256 (hex) of the canonical JSON of a request's intent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of `intent`.
    pub fn of<I: Serialize + ?Sized>(intent: &I) -> Result<Self, Error> {
        let intent = serde_json::to_value(intent).map_err(invalid_event)?;
        Ok(Self(canonical_sha256(&intent)?))
    }

    /// Wraps a fingerprint read back from a store, unchecked.
    pub fn from_stored(hex: impl Into<String>) -> Self {
        Self(hex.into())
    }

    /// The hex digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// RFC 8785 canonical JSON of `value`.
pub fn canonical_json(value: &Value) -> Result<Vec<u8>, Error> {
    serde_json_canonicalizer::to_vec(value).map_err(invalid_event)
}

fn canonical_sha256(value: &Value) -> Result<String, Error> {
    Ok(sha256_hex(&canonical_json(value)?))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn invalid_event(err: serde_json::Error) -> Error {
    Error::InvalidEvent {
        reason: format!("the event does not serialize to JSON: {err}"),
    }
}

fn is_empty_material(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(items) => items.is_empty() || items.iter().all(is_empty_material),
        Value::Object(fields) => fields.is_empty() || fields.values().all(is_empty_material),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Picks part of an event as JSON: the key material or the intent projection.
///
/// One method, like tower-http's `MakeRequestId`. Closures `Fn(&E) -> Option<T>` with
/// `T: Serialize` implement it; so do [`JsonPointer`] and [`WholeEvent`]. `Ok(None)` means the
/// part is absent.
pub trait Select<E>: Send + Sync {
    /// The selected part of `event`, or `None` when it is absent.
    fn select(&self, event: &E) -> Result<Option<Value>, Error>;
}

impl<E, F, T> Select<E> for F
where
    F: Fn(&E) -> Option<T> + Send + Sync,
    T: Serialize,
{
    fn select(&self, event: &E) -> Result<Option<Value>, Error> {
        self(event)
            .map(|part| serde_json::to_value(part).map_err(invalid_event))
            .transpose()
    }
}

/// Selects one value by RFC 6901 JSON Pointer (`/order/id`), after serializing the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer(String);

impl JsonPointer {
    /// A pointer; it must be empty (the whole document) or start with `/`.
    pub fn new(pointer: impl Into<String>) -> Result<Self, ConfigError> {
        let pointer = pointer.into();
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return Err(ConfigError::InvalidPointer { pointer });
        }
        Ok(Self(pointer))
    }
}

impl JsonPointer {
    /// The value at this pointer in `document`.
    pub fn find<'a>(&self, document: &'a Value) -> Option<&'a Value> {
        document.pointer(&self.0)
    }
}

impl<E: Serialize> Select<E> for JsonPointer {
    fn select(&self, event: &E) -> Result<Option<Value>, Error> {
        let mut document = serde_json::to_value(event).map_err(invalid_event)?;
        Ok(document.pointer_mut(&self.0).map(Value::take))
    }
}

/// Selects the whole event: the default intent projection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WholeEvent;

impl<E: Serialize> Select<E> for WholeEvent {
    fn select(&self, event: &E) -> Result<Option<Value>, Error> {
        serde_json::to_value(event).map(Some).map_err(invalid_event)
    }
}

/// Reads the tenant of an event.
type TenantFn<E> = dyn Fn(&E) -> Option<String> + Send + Sync;

/// How to derive the key and the fingerprint from an event of type `E`.
pub struct KeyPolicy<E> {
    key: Arc<dyn Select<E>>,
    intent: Arc<dyn Select<E>>,
    tenant: Option<Arc<TenantFn<E>>>,
}

impl<E: Serialize + 'static> KeyPolicy<E> {
    /// Key material chosen by JSON Pointer; intent = the whole event.
    pub fn pointer(pointer: impl Into<String>) -> Result<Self, ConfigError> {
        Ok(Self::select(JsonPointer::new(pointer)?))
    }

    /// Key material chosen by a selector (a closure, a pointer); intent = the whole event.
    pub fn select(key: impl Select<E> + 'static) -> Self {
        Self {
            key: Arc::new(key),
            intent: Arc::new(WholeEvent),
            tenant: None,
        }
    }
}

impl<E: 'static> KeyPolicy<E> {
    /// Key material chosen by a typed closure, intent chosen by another: for event types that
    /// do not implement `Serialize`.
    pub fn from_fns<K, I>(
        key: impl Fn(&E) -> Option<K> + Send + Sync + 'static,
        intent: impl Fn(&E) -> Option<I> + Send + Sync + 'static,
    ) -> Self
    where
        K: Serialize + 'static,
        I: Serialize + 'static,
    {
        Self {
            key: Arc::new(key),
            intent: Arc::new(intent),
            tenant: None,
        }
    }

    /// Chooses the intent projection used for the fingerprint (default: the whole event).
    pub fn with_intent(mut self, intent: impl Select<E> + 'static) -> Self {
        self.intent = Arc::new(intent);
        self
    }

    /// Puts each operation under the tenant this closure reads from the event.
    pub fn with_tenant(
        mut self,
        tenant: impl Fn(&E) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = Some(Arc::new(tenant));
        self
    }

    /// The operation key and fingerprint of `event` in `scope`.
    ///
    /// # Errors
    /// [`Error::MissingKey`] when the key material is absent or empty; [`Error::InvalidEvent`]
    /// when the event cannot be serialized or the tenant is malformed.
    pub fn derive(
        &self,
        scope: &OperationScope,
        event: &E,
    ) -> Result<(OperationKey, Fingerprint), Error> {
        let material = self.key.select(event)?.ok_or_else(|| Error::MissingKey {
            operation: scope.operation.clone(),
        })?;
        let tenant = self.tenant.as_ref().and_then(|tenant| tenant(event));
        let key = OperationKey::derive(scope, tenant.as_deref(), &material)?;
        let intent = self.intent.select(event)?.unwrap_or(Value::Null);
        Ok((key, Fingerprint::of(&intent)?))
    }
}

impl<E> Clone for KeyPolicy<E> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            intent: Arc::clone(&self.intent),
            tenant: self.tenant.clone(),
        }
    }
}

impl<E> fmt::Debug for KeyPolicy<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPolicy")
            .field("tenant", &self.tenant.is_some())
            .finish_non_exhaustive()
    }
}
