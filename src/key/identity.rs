//! Business identities and their scope: where an identity's permanent evidence lives.
//!
//! An identity such as `invoice:o-1` names one business effect, but two tenants (or two
//! functions) can use the same string for different things. Its evidence is therefore kept
//! under the operation's scope, as the operation key is: its namespace and, when the key policy
//! has one, its tenant. Sharing evidence across tenants or across functions is an explicit
//! choice ([`IdentityScope`]).
//!
//! | scope | evidence key (the uniqueness table's `pk`) |
//! |---|---|
//! | [`IdentityScope::Tenant`] (default), with a tenant | `{namespace}#t={tenant}#id={identity}` |
//! | [`IdentityScope::Tenant`], without one; [`IdentityScope::Namespace`] | `{namespace}#id={identity}` |
//! | [`IdentityScope::Global`] | `{identity}` (as versions before 0.2 kept every identity) |
//!
//! ```
//! use lambda_idempotency::key::{IdentityScope, OperationKey, OperationScope};
//!
//! let scope = OperationScope::new("billing", "issue-invoice")?;
//! let acme = OperationKey::derive(&scope, Some("acme"), "o-1")?;
//! let globex = OperationKey::derive(&scope, Some("globex"), "o-1")?;
//! let of = |key| IdentityScope::default().evidence_key("invoice:o-1", key);
//! assert_eq!(of(&acme), "billing#t=acme#id=invoice:o-1");
//! assert_ne!(of(&acme), of(&globex));
//! assert_eq!(IdentityScope::Global.evidence_key("invoice:o-1", &acme), "invoice:o-1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::OperationKey;

/// Whose operations share a business identity's evidence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdentityScope {
    /// The operation's namespace and tenant: tenant B's `invoice:o-1` is not tenant A's. The
    /// default.
    #[default]
    Tenant,
    /// The operation's namespace, across its tenants: one effect per identity for the whole
    /// function (or namespace), whichever tenant asks. An explicit opt-in.
    Namespace,
    /// Every operation on the uniqueness table, whatever its function or tenant: the layout of
    /// versions before 0.2. An explicit opt-in; a refusal then redacts an evidence that is
    /// another tenant's.
    Global,
}

impl IdentityScope {
    /// The evidence key of `identity` for an operation of `key` (see the module's table).
    pub fn evidence_key(self, identity: &str, key: &OperationKey) -> String {
        match (self, key.tenant()) {
            (Self::Global, _) => identity.to_owned(),
            (Self::Tenant, Some(tenant)) => {
                format!("{}#t={tenant}#id={identity}", key.namespace())
            }
            (Self::Tenant | Self::Namespace, _) => format!("{}#id={identity}", key.namespace()),
        }
    }
}

/// An evidence key in a scoped form, read back: the namespace, the tenant (if the scope has
/// one) and the bare identity, under which versions before 0.2 kept the identity's evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scoped<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) identity: &'a str,
}

impl<'a> Scoped<'a> {
    /// `evidence_key` read as a scoped key; `None` for a bare ([`IdentityScope::Global`]) one.
    pub(crate) fn parse(evidence_key: &'a str) -> Option<Self> {
        let (namespace, rest) = evidence_key.split_once('#')?;
        let (tenant, rest) = match rest.strip_prefix("t=") {
            Some(tenanted) => {
                let (tenant, rest) = tenanted.split_once('#')?;
                (Some(tenant), rest)
            }
            None => (None, rest),
        };
        let identity = rest.strip_prefix("id=")?;
        (!namespace.is_empty() && !identity.is_empty()).then_some(Self {
            namespace,
            tenant,
            identity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{IdentityScope, Scoped};
    use crate::key::{OperationKey, OperationScope};

    #[test]
    fn every_scoped_key_reads_back_and_a_bare_one_does_not() {
        let scope = OperationScope::new("ns", "op").expect("scope");
        let tenanted = OperationKey::derive(&scope, Some("t1"), "m").expect("key");
        let plain = OperationKey::derive(&scope, None, "m").expect("key");
        let identity = "invoice:o#1:rev=2";
        let tenant_key = IdentityScope::Tenant.evidence_key(identity, &tenanted);
        assert_eq!(
            Scoped::parse(&tenant_key),
            Some(Scoped {
                namespace: "ns",
                tenant: Some("t1"),
                identity
            })
        );
        for key in [
            IdentityScope::Tenant.evidence_key(identity, &plain),
            IdentityScope::Namespace.evidence_key(identity, &tenanted),
        ] {
            let scoped = Scoped::parse(&key).expect("scoped");
            assert_eq!((scoped.namespace, scoped.tenant), ("ns", None));
            assert_eq!(scoped.identity, identity);
        }
        let bare = IdentityScope::Global.evidence_key("invoice:o-1", &plain);
        assert_eq!(Scoped::parse(&bare), None);
    }
}
