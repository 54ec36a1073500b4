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
//! A deploy may change an operation's identity scope: its claims then look for the
//! identity's evidence in every other form of its namespace and tenant too, and evidence there
//! of an operation the new scope shares the identity with refuses them (on DynamoDB unless
//! `DynamoDbStore::with_unscoped_evidence_check(false)`), so that a settled identity never runs
//! again because its key moved.
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

/// Another place where the evidence of an evidence key's identity may stand: the form another
/// identity scope gives it (a deploy changed the operation's scope), or
/// the bare identity (the layout before 0.2, and of a global identity with `#` from 0.2 to
/// 0.4); and whose evidence found there is this claim's identity's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elsewhere {
    /// The evidence key to look at.
    pub(crate) evidence_key: String,
    /// Whose evidence there refuses the claim.
    pub(crate) refusing: Refusing,
}

/// Whose evidence, by its operation key, refuses a claim: the operations its identity scope
/// shares the identity with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusing {
    /// Every operation's ([`IdentityScope::Global`]).
    Anyone,
    /// An operation of this namespace, whatever its tenant ([`IdentityScope::Namespace`], or
    /// [`IdentityScope::Tenant`] for an operation without one).
    Namespace(String),
    /// An operation of this namespace and tenant ([`IdentityScope::Tenant`]). Evidence of an
    /// operation without a tenant is not: a function that serves tenants and the platform
    /// alike keeps their identities apart (an operation given a tenant by a deploy keeps
    /// finding what it recorded without one under [`IdentityScope::Namespace`]).
    Tenant {
        /// The namespace.
        namespace: String,
        /// The tenant.
        tenant: String,
    },
}

impl Refusing {
    /// Whether evidence of the operation of `key` refuses the claim.
    pub(crate) fn includes(&self, key: &OperationKey) -> bool {
        match self {
            Self::Anyone => true,
            Self::Namespace(namespace) => key.namespace() == namespace,
            Self::Tenant { namespace, tenant } => {
                key.namespace() == namespace && key.tenant() == Some(tenant.as_str())
            }
        }
    }
}

/// Every other place where an operation of `key`, whose identity's evidence key is
/// `evidence_key`, may have kept that identity's evidence: under each other identity scope's
/// form (of `key`'s namespace and tenant) and, for a scoped key of an identity with `#`, the
/// bare identity. Each refuses the claim for the operations the current scope shares the
/// identity with. (The bare identity of an encoded global one is not here: what stands there
/// is told apart otherwise, see [`global_before_0_5`].)
pub(crate) fn elsewhere(evidence_key: &str, key: &OperationKey) -> Vec<Elsewhere> {
    let (identity, refusing) = match Scoped::parse(evidence_key) {
        Some(scoped) => (
            scoped.identity,
            match scoped.tenant {
                Some(tenant) => Refusing::Tenant {
                    namespace: scoped.namespace.to_owned(),
                    tenant: tenant.to_owned(),
                },
                None => Refusing::Namespace(scoped.namespace.to_owned()),
            },
        ),
        None => (
            global_before_0_5(evidence_key).unwrap_or(evidence_key),
            Refusing::Anyone,
        ),
    };
    let mut forms = Vec::with_capacity(4);
    if key.tenant().is_some() {
        forms.push(IdentityScope::Tenant.evidence_key(identity, key));
    }
    forms.push(IdentityScope::Namespace.evidence_key(identity, key));
    forms.push(IdentityScope::Global.evidence_key(identity, key));
    if identity.contains('#') && refusing != Refusing::Anyone {
        forms.push(identity.to_owned());
    }
    forms.retain(|form| form != evidence_key);
    forms
        .into_iter()
        .map(|evidence_key| Elsewhere {
            evidence_key,
            refusing: refusing.clone(),
        })
        .collect()
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

    #[test]
    fn a_claim_looks_for_its_identity_in_every_other_form() {
        use super::{Refusing, elsewhere};
        let scope = OperationScope::new("billing", "op").expect("scope");
        let acme = OperationKey::derive(&scope, Some("acme"), "m").expect("key");
        let places = |scope: IdentityScope, identity: &str| {
            let places = elsewhere(&scope.evidence_key(identity, &acme), &acme);
            let refusing = places.first().map(|place| place.refusing.clone());
            assert!(
                places
                    .iter()
                    .all(|place| Some(&place.refusing) == refusing.as_ref())
            );
            let keys = places.into_iter().map(|place| place.evidence_key);
            (keys.collect::<Vec<_>>(), refusing)
        };
        let tenant = Refusing::Tenant {
            namespace: "billing".into(),
            tenant: "acme".into(),
        };
        assert_eq!(
            places(IdentityScope::Tenant, "invoice:o-1"),
            (
                vec!["billing#id=invoice:o-1".into(), "invoice:o-1".into()],
                Some(tenant)
            )
        );
        assert_eq!(
            places(IdentityScope::Namespace, "invoice#o-1"),
            (
                vec![
                    "billing#t=acme#id=invoice#o-1".into(),
                    "#g#invoice#o-1".into(),
                    "invoice#o-1".into()
                ],
                Some(Refusing::Namespace("billing".into()))
            )
        );
        // The bare form of a global identity holding `#` is 0.2 to 0.4's, looked at otherwise.
        assert_eq!(
            places(IdentityScope::Global, "invoice#o-1"),
            (
                vec![
                    "billing#t=acme#id=invoice#o-1".into(),
                    "billing#id=invoice#o-1".into()
                ],
                Some(Refusing::Anyone)
            )
        );
        let globex = OperationKey::derive(&scope, Some("globex"), "m").expect("key");
        let untenanted = OperationKey::derive(&scope, None, "m").expect("key");
        let other = OperationKey::derive(
            &OperationScope::new("shipping", "op").expect("scope"),
            Some("acme"),
            "m",
        )
        .expect("key");
        let tenant = Refusing::Tenant {
            namespace: "billing".into(),
            tenant: "acme".into(),
        };
        assert!(tenant.includes(&acme));
        assert!(!tenant.includes(&globex) && !tenant.includes(&untenanted));
        assert!(!tenant.includes(&other));
        let namespace = Refusing::Namespace("billing".into());
        assert!(namespace.includes(&globex) && namespace.includes(&untenanted));
        assert!(!namespace.includes(&other));
    }
}
