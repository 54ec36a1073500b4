//! How an event becomes an operation: key, fingerprint, tenant, business identity.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::select::{JsonPointer, Select, WholeEvent};
use super::{Fingerprint, IdentityScope, OperationKey, OperationScope};
use crate::error::{ConfigError, Error};
use crate::execution::Invocation;

/// Reads a string (a tenant, a business identity) from an event.
type ReadFn<E> = dyn Fn(&E) -> Option<String> + Send + Sync;

/// How to derive the key and the fingerprint from an event of type `E`.
pub struct KeyPolicy<E> {
    key: Arc<dyn Select<E>>,
    intent: Arc<dyn Select<E>>,
    tenant: Option<Arc<ReadFn<E>>>,
    identity: Option<Arc<ReadFn<E>>>,
    identity_scope: IdentityScope,
}

impl<E: Serialize + 'static> KeyPolicy<E> {
    /// Key material chosen by JSON Pointer; intent = the whole event.
    pub fn pointer(pointer: impl Into<String>) -> Result<Self, ConfigError> {
        Ok(Self::select(JsonPointer::new(pointer)?))
    }

    /// Key material chosen by a selector (a closure, a pointer); intent = the whole event.
    pub fn select(key: impl Select<E> + 'static) -> Self {
        Self::from_selectors(key, WholeEvent)
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
        Self::from_selectors(key, intent)
    }

    /// Key material and intent chosen by selectors of your own (a [`Select`] can refuse an
    /// event with a typed [`Error`]): for event types that do not implement `Serialize`, such
    /// as HTTP requests ([`crate::lambda::http::HttpKeys`]).
    pub fn from_selectors(key: impl Select<E> + 'static, intent: impl Select<E> + 'static) -> Self {
        Self {
            key: Arc::new(key),
            intent: Arc::new(intent),
            tenant: None,
            identity: None,
            identity_scope: IdentityScope::default(),
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

    /// Declares each operation's business identity (e.g. `invoice:{order}:{revision}`), read
    /// from the event: its permanent evidence keeps the operation from ever running twice
    /// (see [`Invocation::with_identity`]). An event for which it answers `None` has none.
    pub fn with_identity(
        mut self,
        identity: impl Fn(&E) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.identity = Some(Arc::new(identity));
        self
    }

    /// Shares each business identity's evidence more widely than the operation's tenant
    /// ([`IdentityScope`]; default [`IdentityScope::Tenant`]).
    pub fn with_identity_scope(mut self, scope: IdentityScope) -> Self {
        self.identity_scope = scope;
        self
    }
}

impl<E> KeyPolicy<E> {
    /// The invocation for `event` in `scope`: key, fingerprint and business identity, with a
    /// lease of `lease`.
    ///
    /// # Errors
    /// As [`KeyPolicy::derive`]; and [`Error::InvalidEvent`] for an empty business identity or
    /// one over 1024 bytes.
    pub fn invocation(
        &self,
        scope: &OperationScope,
        event: &E,
        lease: Duration,
    ) -> Result<Invocation, Error> {
        let (key, earlier, fingerprint) = self.derive_with_earlier(scope, event)?;
        let invocation = Invocation::new(key, fingerprint, lease).with_earlier_key(earlier);
        match self.identity.as_ref().and_then(|identity| identity(event)) {
            None => Ok(invocation),
            Some(identity) => Ok(invocation
                .with_identity(identity)?
                .with_identity_scope(self.identity_scope)),
        }
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
        let (key, _, fingerprint) = self.derive_with_earlier(scope, event)?;
        Ok((key, fingerprint))
    }

    /// [`Self::derive`], with the key versions before 0.2 derived when it was another.
    fn derive_with_earlier(
        &self,
        scope: &OperationScope,
        event: &E,
    ) -> Result<(OperationKey, Option<OperationKey>, Fingerprint), Error> {
        let material = self.key.select(event)?.ok_or_else(|| Error::MissingKey {
            operation: scope.operation.clone(),
        })?;
        let tenant = self.tenant.as_ref().and_then(|tenant| tenant(event));
        let (key, earlier) = OperationKey::with_earlier(scope, tenant.as_deref(), &material)?;
        let intent = self.intent.select(event)?.unwrap_or(Value::Null);
        Ok((key, earlier, Fingerprint::of_value(&intent)?))
    }
}

impl<E> Clone for KeyPolicy<E> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            intent: Arc::clone(&self.intent),
            tenant: self.tenant.clone(),
            identity: self.identity.clone(),
            identity_scope: self.identity_scope,
        }
    }
}

impl<E> fmt::Debug for KeyPolicy<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPolicy")
            .field("tenant", &self.tenant.is_some())
            .field("identity", &self.identity.is_some())
            .field("identity_scope", &self.identity_scope)
            .finish_non_exhaustive()
    }
}
