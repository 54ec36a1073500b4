//! How an event becomes an operation: key, fingerprint, tenant, business identity.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::select::{JsonPointer, Select, WholeEvent};
use super::{Fingerprint, IdentityScope, OperationKey, OperationScope};
use crate::error::{ConfigError, Error};

/// Reads a string (a tenant, a business identity) from an event.
type ReadFn<E> = dyn Fn(&E) -> Option<String> + Send + Sync;

/// The event as a JSON document, where it is one (a `KeyPolicy<Value>`).
type AsDocument<E> = fn(&E) -> Option<&Value>;

fn as_document<E: 'static>(event: &E) -> Option<&Value> {
    (event as &dyn Any).downcast_ref::<Value>()
}

/// How to derive the key and the fingerprint from an event of type `E`.
pub struct KeyPolicy<E> {
    key: Arc<dyn Select<E>>,
    intent: Arc<dyn Select<E>>,
    tenant: Option<Arc<ReadFn<E>>>,
    /// Whether an event whose tenant selector answers `None` is keyed without a tenant.
    tenant_optional: bool,
    identity: Option<Arc<ReadFn<E>>>,
    identity_scope: IdentityScope,
    /// The key material 0.4 selected, where this policy selects another (an SQS policy scoped
    /// by its producer).
    key_as_0_4: Option<Arc<dyn Select<E>>>,
    /// The intent 0.4 projected, where this policy projects another (an HTTP query 0.4 did not
    /// percent-decode); dropped when the intent is chosen anew ([`Self::with_intent`]).
    intent_as_0_4: Option<Arc<dyn Select<E>>>,
    /// The event as a JSON document, where it is one: a [`JsonPointer`]'s key material and a
    /// [`WholeEvent`] intent are then hashed where they lie in it, not copied out.
    as_document: AsDocument<E>,
    /// The key selector, where it is a [`JsonPointer`].
    key_pointer: Option<JsonPointer>,
    /// Whether the intent selector is [`WholeEvent`].
    whole_intent: bool,
}

/// What [`KeyPolicy`] derived for one event.
pub(crate) struct Derived {
    pub(crate) key: OperationKey,
    /// The key versions before 0.2 derived, when it was another.
    pub(crate) earlier: Option<OperationKey>,
    /// The key 0.4 derived for the event, when it is another: 0.4 never read Lambda's tenant
    /// nor an SQS producer.
    pub(crate) key_by_0_4: Option<OperationKey>,
    /// The key versions before 0.2 derived for the material and tenant 0.4 read, when 0.4's
    /// key is another and so is this one (an integer past ±2^53 in the material): 0.1 read
    /// neither Lambda's tenant nor an SQS producer either.
    pub(crate) key_by_0_1_as_0_4: Option<OperationKey>,
    pub(crate) fingerprint: Fingerprint,
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
        let key_pointer = (&key as &dyn Any).downcast_ref::<JsonPointer>().cloned();
        let whole_intent = (&intent as &dyn Any).is::<WholeEvent>();
        Self {
            key: Arc::new(key),
            intent: Arc::new(intent),
            as_document: as_document::<E>,
            key_pointer,
            whole_intent,
            tenant: None,
            tenant_optional: false,
            identity: None,
            identity_scope: IdentityScope::default(),
            key_as_0_4: None,
            intent_as_0_4: None,
        }
    }

    /// The same policy, naming the key material 0.4 selected for an event where this one
    /// selects another: the engine answers a redelivery that 0.4 recorded there
    /// ([`ConfigBuilder::keyed_by_0_4_before`](crate::config::ConfigBuilder::keyed_by_0_4_before)).
    #[cfg(any(
        feature = "sqs",
        feature = "http",
        feature = "kinesis",
        feature = "eventbridge"
    ))]
    pub(crate) fn with_key_as_0_4(mut self, key: impl Select<E> + 'static) -> Self {
        self.key_as_0_4 = Some(Arc::new(key));
        self
    }

    /// The same policy, naming the intent 0.4 projected for an event where this one projects
    /// another: a record 0.4 wrote of that intent is of this one.
    #[cfg(any(feature = "sqs", feature = "http", feature = "eventbridge"))]
    pub(crate) fn with_intent_as_0_4(mut self, intent: impl Select<E> + 'static) -> Self {
        self.intent_as_0_4 = Some(Arc::new(intent));
        self
    }

    /// Chooses the intent projection used for the fingerprint (default: the whole event).
    pub fn with_intent(mut self, intent: impl Select<E> + 'static) -> Self {
        self.whole_intent = (&intent as &dyn Any).is::<WholeEvent>();
        self.intent = Arc::new(intent);
        self.intent_as_0_4 = None;
        self
    }

    /// Puts each operation under the tenant this closure reads from the event. An event for
    /// which it answers `None` is refused ([`Error::TenantMissing`]): it would otherwise share
    /// the untenanted scope with every other such event. When Lambda's tenant isolation mode
    /// gives the invocation a tenant, that tenant scopes the operation instead, on every door
    /// (Lambda isolates it; an event cannot forge it).
    pub fn with_tenant(
        mut self,
        tenant: impl Fn(&E) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = Some(Arc::new(tenant));
        self.tenant_optional = false;
        self
    }

    /// As [`Self::with_tenant`], but an event for which the closure answers `None` is keyed in
    /// the untenanted scope (shared by every such event) instead of refused: for functions
    /// that serve tenants and the platform alike.
    ///
    /// ```
    /// use lambda_idempotency::KeyPolicy;
    /// use serde_json::Value;
    ///
    /// let policy = KeyPolicy::<Value>::pointer("/order_id")?.with_optional_tenant(|event| {
    ///     event["tenant"].as_str().map(str::to_owned)
    /// });
    /// # let _ = policy;
    /// # Ok::<(), lambda_idempotency::ConfigError>(())
    /// ```
    pub fn with_optional_tenant(
        mut self,
        tenant: impl Fn(&E) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = Some(Arc::new(tenant));
        self.tenant_optional = true;
        self
    }

    /// Declares each operation's business identity (e.g. `invoice:{order}:{revision}`), read
    /// from the event: its permanent evidence keeps the operation from ever running twice
    /// (see [`Invocation::with_identity`](crate::Invocation::with_identity)). An event for which it answers `None` has none.
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
    /// The business identity this policy reads from `event`, if any.
    pub(crate) fn identity_of(&self, event: &E) -> Option<String> {
        self.identity.as_ref().and_then(|identity| identity(event))
    }

    /// Where the identity's evidence is kept ([`Self::with_identity_scope`]).
    pub(crate) fn identity_scope(&self) -> IdentityScope {
        self.identity_scope
    }

    /// The operation key and fingerprint of `event` in `scope`, under the policy's tenant (not
    /// Lambda's: [`KeyPolicy::invocation_in_context`] reads that).
    ///
    /// # Errors
    /// [`Error::MissingKey`] when the key material is absent or empty; [`Error::InvalidEvent`]
    /// when the event cannot be serialized or the tenant is malformed;
    /// [`Error::TenantMissing`] when the tenant selector finds none and tenants are not
    /// optional ([`Self::with_optional_tenant`]).
    pub fn derive(
        &self,
        scope: &OperationScope,
        event: &E,
    ) -> Result<(OperationKey, Fingerprint), Error> {
        let derived = self.derive_for_tenant(scope, event, None)?;
        Ok((derived.key, derived.fingerprint))
    }

    /// The tenant the policy read from an event (`read`): `Ok(None)` when it reads none (no
    /// selector, or an optional tenant absent).
    fn policy_tenant(
        &self,
        scope: &OperationScope,
        read: Option<&str>,
    ) -> Result<Option<String>, Error> {
        if self.tenant.is_none() {
            return Ok(None);
        }
        match read {
            Some(tenant) => Ok(Some(tenant.to_owned())),
            None if self.tenant_optional => Ok(None),
            None => Err(Error::TenantMissing {
                operation: scope.operation.clone(),
            }),
        }
    }

    /// [`Self::derive`] under Lambda's tenant when the context gives one, with the earlier
    /// keys a compatibility rule may look under.
    pub(crate) fn derive_for_tenant(
        &self,
        scope: &OperationScope,
        event: &E,
        context_tenant: Option<&str>,
    ) -> Result<Derived, Error> {
        let missing_key = || Error::MissingKey {
            operation: scope.operation.clone(),
        };
        let document = (self.as_document)(event);
        let selected;
        let material = match (document, &self.key_pointer) {
            (Some(document), Some(pointer)) => pointer.find(document).ok_or_else(missing_key)?,
            _ => {
                selected = self.key.select(event)?.ok_or_else(missing_key)?;
                &selected
            }
        };
        let mut fingerprint = match document {
            Some(document) if self.whole_intent => Fingerprint::of_event(document)?,
            _ => Fingerprint::of_value(&self.intent.select(event)?.unwrap_or(Value::Null))?,
        };
        if let Some(Some(by_0_4)) = self
            .intent_as_0_4
            .as_ref()
            .map(|select| select.select(event).ok().flatten())
            && let Ok(by_0_4) = Fingerprint::of_value(&by_0_4)
        {
            fingerprint = fingerprint.with_fingerprint_by_0_4(by_0_4);
        }
        // 0.4 ignored Lambda's tenant, and keyed an event its selector found no tenant in
        // without one.
        let tenant_by_0_4 = self.tenant.as_ref().and_then(|tenant| tenant(event));
        let tenant = match context_tenant {
            Some(tenant) => Some(tenant.to_owned()),
            None => self.policy_tenant(scope, tenant_by_0_4.as_deref())?,
        };
        let (key, earlier) = OperationKey::with_earlier(scope, tenant.as_deref(), material)?;
        let keys_by_0_4_of = |material: &Value| {
            OperationKey::with_earlier(scope, tenant_by_0_4.as_deref(), material).ok()
        };
        // An event naming another tenant than Lambda's context: 0.4 keyed it in that tenant's
        // key space, which this tenant never reads.
        let another_tenants = matches!(
            (context_tenant, tenant_by_0_4.as_deref()),
            (Some(context), Some(named)) if context != named
        );
        let (key_by_0_4, key_by_0_1_as_0_4) = match &self.key_as_0_4 {
            _ if another_tenants => None,
            Some(select) => select
                .select(event)
                .ok()
                .flatten()
                .and_then(|material| keys_by_0_4_of(&material)),
            // The same material under the same tenant is the same key: not derived twice.
            None if tenant_by_0_4 == tenant => None,
            None => keys_by_0_4_of(material),
        }
        .filter(|(by_0_4, _)| *by_0_4 != key)
        .map_or((None, None), |(by_0_4, by_0_1)| (Some(by_0_4), by_0_1));
        Ok(Derived {
            key,
            earlier,
            key_by_0_4,
            key_by_0_1_as_0_4,
            fingerprint,
        })
    }
}

impl<E> Clone for KeyPolicy<E> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            intent: Arc::clone(&self.intent),
            tenant: self.tenant.clone(),
            tenant_optional: self.tenant_optional,
            identity: self.identity.clone(),
            identity_scope: self.identity_scope,
            key_as_0_4: self.key_as_0_4.clone(),
            intent_as_0_4: self.intent_as_0_4.clone(),
            as_document: self.as_document,
            key_pointer: self.key_pointer.clone(),
            whole_intent: self.whole_intent,
        }
    }
}

impl<E> fmt::Debug for KeyPolicy<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPolicy")
            .field("tenant", &self.tenant.is_some())
            .field("tenant_optional", &self.tenant_optional)
            .field("identity", &self.identity.is_some())
            .field("identity_scope", &self.identity_scope)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::KeyPolicy;
    use crate::error::Error;
    use crate::key::{JsonPointer, OperationScope, Select, WholeEvent};

    /// A selector the policy cannot recognise: it takes the copying path.
    struct Opaque<S>(S);

    impl<S: Select<Value>> Select<Value> for Opaque<S> {
        fn select(&self, event: &Value) -> Result<Option<Value>, Error> {
            self.0.select(event)
        }
    }

    /// A `KeyPolicy<Value>` hashes a pointer's key material and a whole-event intent where
    /// they lie in the event; that must derive what copying them out derives, for every shape
    /// of event the transport stripping looks at.
    #[test]
    fn hashing_in_place_derives_what_copying_derives() {
        let scope = OperationScope::new("orders", "place").expect("scope");
        let events = [
            json!({"id": "o-1", "lines": [{"sku": "A", "qty": 2}], "total": 19.99}),
            json!({"id": 18446744073709551615_u64, "big": 9007199254740993_u64}),
            json!({"id": "e-1", "detail-type": "Placed", "source": "shop", "replay-name": "r-1", "detail": {"n": 1}}),
            json!({"id": "m-1", "eventSource": "aws:sqs", "receiptHandle": "h", "body": "{}",
                   "attributes": {"ApproximateReceiveCount": "3", "ApproximateFirstReceiveTimestamp": "1", "SentTimestamp": "2"}}),
            json!({"id": "b-1", "Records": [
                {"eventSource": "aws:sqs", "receiptHandle": "h1", "attributes": {"ApproximateReceiveCount": "1"}},
                {"Records": [{"detail-type": "x", "source": "y", "replay-name": "z"}]},
                "not an object"
            ]}),
            json!({"id": "n-1", "nested": {"eventSource": "aws:sqs", "receiptHandle": "kept"}}),
            json!({"id": "u-1", "\u{e000}": 1, "\u{10000}": 2, "esc\"aped\n": "\u{1}\u{7f}"}),
            json!({"id": "r-1", "Records": {"receiptHandle": "not records"}, "eventSource": "aws:sqs", "attributes": "text"}),
        ];
        let in_place = KeyPolicy::<Value>::pointer("/id").expect("pointer");
        let copying = KeyPolicy::<Value>::from_selectors(
            Opaque(JsonPointer::new("/id").expect("pointer")),
            Opaque(WholeEvent),
        );
        assert!(in_place.key_pointer.is_some() && in_place.whole_intent);
        assert!(copying.key_pointer.is_none() && !copying.whole_intent);
        for event in &events {
            let fast = in_place
                .derive_for_tenant(&scope, event, None)
                .expect("derive");
            let slow = copying
                .derive_for_tenant(&scope, event, None)
                .expect("derive");
            assert_eq!(fast.key, slow.key, "{event}");
            assert_eq!(fast.earlier, slow.earlier, "{event}");
            assert_eq!(
                fast.fingerprint.as_str(),
                slow.fingerprint.as_str(),
                "{event}"
            );
            assert_eq!(
                fast.fingerprint.has_rfc8785_digest(),
                slow.fingerprint.has_rfc8785_digest(),
                "{event}"
            );
        }
        let missing = in_place.derive(&scope, &json!({"other": 1}));
        assert!(matches!(missing, Err(Error::MissingKey { .. })));
    }

    /// Choosing another intent leaves the in-place path for it.
    #[test]
    fn another_intent_is_selected_not_the_whole_event() {
        let scope = OperationScope::new("orders", "place").expect("scope");
        let policy = KeyPolicy::<Value>::pointer("/id")
            .expect("pointer")
            .with_intent(JsonPointer::new("/amount").expect("pointer"));
        assert!(!policy.whole_intent);
        let (_, a) = policy
            .derive(&scope, &json!({"id": "o-1", "amount": 5, "note": "x"}))
            .expect("derive");
        let (_, b) = policy
            .derive(&scope, &json!({"id": "o-1", "amount": 5, "note": "y"}))
            .expect("derive");
        assert_eq!(a, b);
    }
}
