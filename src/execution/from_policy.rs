//! The invocation a key policy derives for an event: built beside the invocation, so that the
//! key module builds none.

use std::time::Duration;

use super::Invocation;
use crate::error::Error;
use crate::key::{KeyPolicy, OperationScope};

/// The invocation a key policy derives for an event: built here, beside the invocation, so
/// that the key module builds none.
impl<E> KeyPolicy<E> {
    /// The invocation for `event` in `scope`: key, fingerprint and business identity, with a
    /// lease of `lease`. It reads the policy's tenant only: in a function with Lambda's tenant
    /// isolation mode, use [`Self::invocation_in_context`] (or an [`Operation`](crate::Operation)),
    /// or two tenants' events of one key are one operation.
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
        self.invocation_for_tenant(scope, event, lease, None)
    }

    /// [`Self::invocation`] for an event Lambda delivered with `context`: the tenant Lambda's
    /// tenant isolation mode names there scopes the key and the identity's evidence, instead
    /// of the policy's, as on every door. (An [`Operation`](crate::Operation) also takes the
    /// lease and the deadline from the context.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use lambda_idempotency::{KeyPolicy, OperationScope};
    /// use serde_json::json;
    ///
    /// let policy = KeyPolicy::pointer("/order_id")?;
    /// let scope = OperationScope::new("shop", "charge")?;
    /// let event = json!({"order_id": "o-1"});
    /// let mut context = lambda_runtime::Context::default();
    /// context.tenant_id = Some("tenant-a".into());
    /// let a = policy.invocation_in_context(&scope, &event, Duration::from_secs(60), &context)?;
    /// context.tenant_id = Some("tenant-b".into());
    /// let b = policy.invocation_in_context(&scope, &event, Duration::from_secs(60), &context)?;
    /// assert_ne!(a.key(), b.key(), "two tenants' operations");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Self::invocation`].
    pub fn invocation_in_context(
        &self,
        scope: &OperationScope,
        event: &E,
        lease: Duration,
        context: &lambda_runtime::Context,
    ) -> Result<Invocation, Error> {
        self.invocation_for_tenant(scope, event, lease, context.tenant_id.as_deref())
    }

    /// [`Self::invocation`] under the tenant Lambda's tenant isolation mode gave the
    /// invocation, if it gave one: that tenant scopes the key (and the identity's evidence)
    /// instead of the policy's.
    pub(crate) fn invocation_for_tenant(
        &self,
        scope: &OperationScope,
        event: &E,
        lease: Duration,
        context_tenant: Option<&str>,
    ) -> Result<Invocation, Error> {
        let derived = self.derive_for_tenant(scope, event, context_tenant)?;
        let invocation = Invocation::new(derived.key, derived.fingerprint, lease)
            .with_earlier_key(derived.earlier)
            .with_keys_by_0_4(derived.key_by_0_4, derived.key_by_0_1_as_0_4);
        match self.identity_of(event) {
            None => Ok(invocation),
            Some(identity) => Ok(invocation
                .with_identity(identity)?
                .with_identity_scope(self.identity_scope())),
        }
    }
}
