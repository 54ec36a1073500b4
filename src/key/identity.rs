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
//! | [`IdentityScope::Global`], an identity without `#` | `{identity}` (as versions before 0.2 kept every identity) |
//! | [`IdentityScope::Global`], an identity with `#` | `#g#{identity}` |
//!
//! The three forms never meet: a bare identity holds no `#`, a scoped key starts with its
//! (non-empty) namespace, an encoded global one with `#`. So a global identity spelled like a
//! scoped key (`billing#t=acme#id=invoice:o-1`) is not acme's evidence. Versions 0.2 to 0.4
//! kept a global identity with `#` bare: the DynamoDB store's claim still finds such evidence
//! there (unless it is the scoped evidence the key spells, which is another operation's).
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
            (Self::Global, _) if identity.contains('#') => format!("{GLOBAL_MARK}{identity}"),
            (Self::Global, _) => identity.to_owned(),
            (Self::Tenant, Some(tenant)) => {
                format!("{}#t={tenant}#id={identity}", key.namespace())
            }
            (Self::Tenant | Self::Namespace, _) => format!("{}#id={identity}", key.namespace()),
        }
    }
}

/// What starts the evidence key of a global identity that holds a `#`.
pub(crate) const GLOBAL_MARK: &str = "#g#";

/// The key under which versions 0.2 to 0.4 kept the evidence of the global identity that
/// `evidence_key` encodes, when it is another: the identity itself.
pub(crate) fn global_before_0_5(evidence_key: &str) -> Option<&str> {
    evidence_key.strip_prefix(GLOBAL_MARK)
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

    #[test]
    fn a_global_identity_spelled_like_a_scoped_key_is_not_that_key() {
        let scope = OperationScope::new("billing", "op").expect("scope");
        let acme = OperationKey::derive(&scope, Some("acme"), "m").expect("key");
        let scoped = IdentityScope::Tenant.evidence_key("invoice:o-1", &acme);
        let squatter = IdentityScope::Global.evidence_key(&scoped, &acme);
        assert_ne!(squatter, scoped);
        assert_eq!(Scoped::parse(&squatter), None);
        assert_eq!(super::global_before_0_5(&squatter), Some(scoped.as_str()));
        let plain = IdentityScope::Global.evidence_key("invoice:o-1", &acme);
        assert_eq!(plain, "invoice:o-1");
        assert_eq!(super::global_before_0_5(&plain), None);
    }
}
