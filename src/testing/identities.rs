//! Conformance cases for business identities as production has them: the same identity string
//! in two tenants or two functions, identities shared across tenants by choice, and deploys
//! that add, change or remove an operation's identity while one of its attempts is in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::key::IdentityScope;
use lambda_idempotency::record::{Evidence, Status};
use lambda_idempotency::store::{Store, StoreExt};
use lambda_idempotency::{
    Config, Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use serde_json::{Value, json};

use super::conformance::{
    Capability, Fixture, LEASE, counted, crash_after_claim, engine, rerunning, stored,
};

/// Retention short enough to pass in a case.
fn an_hour() -> Config {
    Config::builder()
        .retention(Duration::from_secs(3600))
        .build()
        .expect("config")
}

/// An invoice operation of `namespace` (for `tenant`, if any) declaring `identity`.
fn invoice(namespace: &str, tenant: Option<&str>, order: &str, identity: &str) -> Invocation {
    let scope = OperationScope::new(namespace, "issue-invoice").expect("scope");
    let key = OperationKey::derive(&scope, tenant, order).expect("key");
    Invocation::new(
        key,
        Fingerprint::of(&json!({"order": order})).expect("fp"),
        LEASE,
    )
    .with_identity(identity)
    .expect("a valid identity")
}

/// The same operation, without a business identity.
fn without_identity(inv: &Invocation) -> Invocation {
    Invocation::new(
        inv.key().clone(),
        Fingerprint::of(&json!({"order": order_of(inv)})).expect("fp"),
        LEASE,
    )
}

fn order_of(inv: &Invocation) -> String {
    // The cases' operations are named by their order.
    inv.identity()
        .unwrap_or_default()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned()
}

async fn evidence(idem: &Idempotency, inv: &Invocation) -> Option<Evidence> {
    let key = inv.evidence_key().expect("an identity");
    idem.store().evidence(&key).await.expect("evidence")
}

/// Runs `inv` to completion, counting the run.
async fn issue(idem: &Idempotency, inv: &Invocation, runs: &AtomicUsize) -> Value {
    idem.execute(inv, |_| {
        counted(runs, json!({"invoice": inv.key().short()}))
    })
    .await
    .expect("issued")
    .into_value()
}

/// Case: the same identity string in two tenants, and in two functions (namespaces), names four
/// operations: each runs once, each keeps its own evidence, and once their records have
/// expired each redelivery is refused by its own evidence, never by another's.
pub async fn identities_are_scoped_by_tenant_and_namespace<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, sweep) = engine(fx, an_hour());
    let operations = [
        invoice("billing", Some("acme"), "o-1", "invoice:o-1"),
        invoice("billing", Some("globex"), "o-1", "invoice:o-1"),
        invoice("billing", None, "o-1", "invoice:o-1"),
        invoice("shipping", Some("acme"), "o-1", "invoice:o-1"),
    ];
    let runs = AtomicUsize::new(0);
    for inv in &operations {
        issue(&idem, inv, &runs).await;
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "four scopes, four operations"
    );
    for inv in &operations {
        let own = evidence(&idem, inv).await.expect("its own evidence");
        assert_eq!((&own.key, own.status), (inv.key(), Status::Completed));
    }

    clock.advance(Duration::from_secs(2 * 3600));
    sweep().await;
    for inv in &operations {
        let err = idem
            .execute(inv, |_| counted(&runs, json!("again")))
            .await
            .expect_err("refused by its evidence");
        match &err {
            Error::KeyExpiredConflict { key, evidence } => {
                assert_eq!(&evidence.key, key, "its own evidence, not another scope's");
                assert!(err.already_took_effect());
            }
            other => panic!("expected KeyExpiredConflict, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

/// Case: sharing an identity across tenants is an explicit choice (namespace-wide or global);
/// the second tenant is then refused, and its refusal never names or reveals the first
/// tenant's operation.
pub async fn a_shared_identity_never_reveals_another_tenants_operation<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, _, _) = engine(fx, an_hour());
    for (case, scope) in [
        ("namespace", IdentityScope::Namespace),
        ("global", IdentityScope::Global),
    ] {
        let identity = format!("invoice:{case}");
        let acme = invoice("billing", Some("acme"), case, &identity).with_identity_scope(scope);
        let globex = invoice("billing", Some("globex"), case, &identity).with_identity_scope(scope);
        let runs = AtomicUsize::new(0);
        issue(&idem, &acme, &runs).await;
        let err = idem
            .execute(&globex, |_| counted(&runs, json!("globex")))
            .await
            .expect_err("the identity is shared");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}: one effect");
        let Error::KeyExpiredConflict { key, evidence } = &err else {
            panic!("{case}: expected KeyExpiredConflict, got {err:?}");
        };
        assert_eq!(key, globex.key());
        assert_eq!(evidence.status, Status::Completed, "{case}");
        assert_eq!(
            evidence.key.as_str(),
            Evidence::REDACTED,
            "{case}: not acme's key"
        );
        assert_eq!(evidence.result_ref, None, "{case}: not acme's result");
        let message = err.to_string();
        assert!(!message.contains("acme"), "{case}: {message}");
        assert!(!format!("{err:?}").contains("acme"), "{case}: {err:?}");
    }
}

/// Case: a deploy adds `with_identity` while an attempt without one is in flight. The
/// takeover settles the operation as it was claimed (no identity): it completes, once, and is
/// replayed after, never failing or looping on evidence it never wrote.
pub async fn a_deploy_that_adds_an_identity_completes_the_operation_as_claimed<S: Store>(
    fx: Fixture<S>,
) {
    fx.require(Capability::Evidence);
    let (idem, clock, _) = rerunning(fx, an_hour());
    let with = invoice("billing", None, "o-add", "invoice:o-add");
    let before = without_identity(&with);
    crash_after_claim(&idem, &before).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let runs = AtomicUsize::new(0);
    let done = idem
        .execute(&with, |ctx| {
            counted(&runs, json!({"attempt": ctx.attempt()}))
        })
        .await
        .expect("the takeover completes");
    assert_eq!(done.value(), &json!({"attempt": 2}));
    let again = idem
        .execute(&with, |_| counted(&runs, json!("again")))
        .await
        .expect("replayed");
    assert!(again.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run, no loop");
    let record = stored(&idem, with.key(), "record").await;
    assert_eq!((record.status, record.identity), (Status::Completed, None));
    assert_eq!(
        evidence(&idem, &with).await,
        None,
        "no evidence was claimed"
    );
}

/// Case: a deploy removes `with_identity` while an attempt with one is in flight. The takeover
/// settles the recorded identity's evidence too: nothing stays IN_PROGRESS for good.
pub async fn a_deploy_that_removes_an_identity_settles_its_evidence<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, _) = rerunning(fx, an_hour());
    let with = invoice("billing", None, "o-remove", "invoice:o-remove");
    crash_after_claim(&idem, &with).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let runs = AtomicUsize::new(0);
    idem.execute(&without_identity(&with), |_| counted(&runs, json!("done")))
        .await
        .expect("the takeover completes");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let evidence = evidence(&idem, &with).await.expect("the recorded evidence");
    assert_eq!(
        evidence.status,
        Status::Completed,
        "settled with its operation"
    );
}

/// Case: a deploy changes the identity's format while an attempt is in flight; the takeover
/// settles the recorded identity and claims no evidence under the new one. A retryable failure
/// of the takeover releases the recorded evidence, so that the retry runs.
pub async fn a_deploy_that_changes_an_identity_keeps_the_recorded_one<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, _) = rerunning(fx, an_hour());
    let old = invoice("billing", None, "o-change", "invoice:o-change");
    let new = invoice("billing", None, "o-change", "invoice:rev-2:o-change");
    crash_after_claim(&idem, &old).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let failed = idem
        .execute(&new, |_| async {
            Err::<Value, _>(std::io::Error::other("downstream timed out"))
        })
        .await
        .expect_err("a retryable failure");
    assert!(matches!(failed, Error::Handler { .. }), "{failed:?}");
    assert_eq!(
        idem.store().get(new.key()).await.expect("get"),
        None,
        "released"
    );
    assert_eq!(
        evidence(&idem, &old).await,
        None,
        "the recorded evidence released"
    );

    let runs = AtomicUsize::new(0);
    issue(&idem, &new, &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let claimed = evidence(&idem, &new)
        .await
        .expect("a fresh claim's evidence");
    assert_eq!(claimed.status, Status::Completed);

    // And a crash under the new identity, taken over by a deploy back on the old one.
    let other = invoice("billing", None, "o-back", "invoice:rev-2:o-back");
    crash_after_claim(&idem, &other).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let back = invoice("billing", None, "o-back", "invoice:o-back");
    issue(&idem, &back, &runs).await;
    let recorded = evidence(&idem, &other)
        .await
        .expect("the recorded evidence");
    assert_eq!(recorded.status, Status::Completed);
    assert_eq!(
        evidence(&idem, &back).await,
        None,
        "nothing claimed under the new one"
    );
}
