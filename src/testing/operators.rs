//! Conformance cases for an operator's way forward from every state the engine leaves to one:
//! a stuck claim (never a live one), an INDETERMINATE record, orphaned evidence, and
//! INDETERMINATE evidence whose record TTL deleted. Each resolution is conditional on what the
//! operator read and leaves its trace on the record or evidence it writes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::key::JsonPointer;
use lambda_idempotency::reconcile::{Checked, Takeover};
use lambda_idempotency::record::{Audit, Status};
use lambda_idempotency::store::{Store, StoreExt};
use lambda_idempotency::{BoxError, Config, Error, Invocation, Origin, Resolution};
use serde_json::{Value, json};

use super::conformance::{
    Capability, Fixture, LEASE, counted, crash_after_claim, engine, invocation, operator,
    rerunning, stalled_worker, stored,
};
use super::faults::{Fault, FaultKind, FaultyStore, Primitive};

fn invoice(material: &str) -> Invocation {
    invocation(material, &json!({"amount": 10}))
        .with_identity(format!("invoice:{material}"))
        .expect("a valid identity")
        .with_result_ref(JsonPointer::new("/invoice_id").expect("pointer"))
}

/// [`invoice`] where the store keeps evidence, else the same operation without an identity:
/// what an operator resolves on the record holds either way.
fn invoice_for<S>(fx: &Fixture<S>, material: &str) -> Invocation {
    match fx.offers(Capability::Evidence) {
        true => invoice(material),
        false => invocation(material, &json!({"amount": 10})),
    }
}

fn retention(seconds: u64) -> Config {
    Config::builder()
        .retention(Duration::from_secs(seconds))
        .build()
        .expect("config")
}

/// Crashes `inv`'s first attempt and takes it over with a reconciler that cannot tell: the
/// operation is INDETERMINATE, held for an operator.
async fn hold_for_an_operator(
    idem: &lambda_idempotency::Idempotency,
    clock: &lambda_idempotency::clock::ManualClock,
    inv: &Invocation,
) {
    crash_after_claim(idem, inv).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let unknown = idem
        .clone()
        .with_reconciler(|_: Takeover| async { Ok::<_, BoxError>(Checked::Unknown) });
    let held = unknown
        .execute(inv, |_| async { Ok::<_, std::io::Error>(json!(0)) })
        .await
        .expect_err("held");
    assert!(matches!(held, Error::Indeterminate { .. }), "{held:?}");
}

fn assert_trace(audit: Option<&Audit>, action: &str) {
    let audit = audit.expect("the operator's trace");
    assert_eq!(audit.by, "conformance-suite");
    assert_eq!(audit.action, action);
}

/// Case: a crashed claim that no delivery takes over is resolved by an operator once its lease
/// has run out (never while it lives), as COMPLETED with the operator's result and trace on the
/// record and its evidence (where the store keeps evidence); the next delivery replays it.
pub async fn a_stuck_claim_is_resolved_by_an_operator_but_never_a_live_one<S: Store>(
    fx: Fixture<S>,
) {
    let inv = invoice_for(&fx, "stuck-1");
    let (idem, clock, _) = engine(fx, Config::default());
    let crashed = crash_after_claim(&idem, &inv).await;
    let found = json!({"invoice_id": "inv-found", "total": 10});

    let live = idem
        .resolve::<Value>(inv.key(), Resolution::Completed(found.clone()), &operator())
        .await
        .expect("resolve");
    assert!(!live, "a live lease is never resolved over");
    assert_eq!(stored(&idem, inv.key(), "record").await, crashed);

    clock.advance(LEASE + Duration::from_secs(1));
    let resolved = idem
        .resolve::<Value>(inv.key(), Resolution::Completed(found.clone()), &operator())
        .await
        .expect("resolve");
    assert!(resolved);
    let record = stored(&idem, inv.key(), "record").await;
    assert_eq!(record.status, Status::Completed);
    assert_trace(record.audit.as_ref(), "completed from IN_PROGRESS");
    if let Some(identity) = inv.evidence_key() {
        let evidence = idem.store().evidence(&identity).await.expect("evidence");
        let evidence = evidence.expect("stands");
        assert_eq!(evidence.status, Status::Completed);
        assert_trace(evidence.audit.as_ref(), "completed from IN_PROGRESS");
    }

    let runs = AtomicUsize::new(0);
    let replay = idem
        .execute(&inv, |_| counted(&runs, json!(null)))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(replay.value(), &found);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Case: an operator's release of an INDETERMINATE operation says what it deletes and keeps a
/// trace: the record stays (FAILED `released`, expired), its evidence goes, the next delivery
/// runs afresh, and a second release finds nothing to do.
pub async fn an_operators_release_leaves_a_trace_and_the_next_delivery_runs<S: Store>(
    fx: Fixture<S>,
) {
    let inv = invoice_for(&fx, "held-1");
    let (idem, clock, _) = engine(fx, Config::default());
    hold_for_an_operator(&idem, &clock, &inv).await;

    let released = idem
        .resolve::<Value>(inv.key(), Resolution::Release, &operator())
        .await
        .expect("release");
    assert!(released);
    let record = stored(&idem, inv.key(), "the released record stays").await;
    assert_eq!(record.status, Status::Failed);
    assert!(
        record.expires_at < clock.now(),
        "expired: claimable at once"
    );
    assert_trace(record.audit.as_ref(), "released from INDETERMINATE");
    if let Some(identity) = inv.evidence_key() {
        assert_eq!(
            idem.store().evidence(&identity).await.expect("evidence"),
            None,
            "the release deletes the evidence"
        );
    }
    let again = idem
        .resolve::<Value>(inv.key(), Resolution::Release, &operator())
        .await
        .expect("release");
    assert!(!again, "nothing held any more");

    let runs = AtomicUsize::new(0);
    let rerun = idem
        .execute(&inv, |_| counted(&runs, json!({"invoice_id": "inv-2"})))
        .await
        .expect("runs afresh");
    assert_eq!(rerun.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Case: evidence orphaned by TTL (its crashed attempt's record deleted) is resolved by an
/// operator from the evidence alone: COMPLETED with a result reference and the trace, after
/// which a redelivery is acknowledged as already done, never run.
pub async fn orphaned_evidence_is_resolved_by_an_operator<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, sweep) = engine(fx, retention(60));
    let inv = invoice("orphan-1");
    crash_after_claim(&idem, &inv).await;
    clock.advance(LEASE + Duration::from_secs(120));
    sweep().await;
    assert_eq!(
        idem.store().get(inv.key()).await.expect("get"),
        None,
        "TTL deleted it"
    );

    let by_key = idem
        .resolve::<Value>(inv.key(), Resolution::Completed(json!("x")), &operator())
        .await
        .expect("resolve");
    assert!(!by_key, "no record to resolve: the evidence is");
    let identity = inv.evidence_key().expect("identity");
    let resolved = idem
        .resolve_evidence::<Value>(
            &identity,
            Resolution::Completed(json!("inv-77")),
            &operator(),
        )
        .await
        .expect("resolve evidence");
    assert!(resolved);
    let evidence = idem.store().evidence(&identity).await.expect("evidence");
    let evidence = evidence.expect("stands");
    assert_eq!(
        (evidence.status, evidence.result_ref.as_deref()),
        (Status::Completed, Some("inv-77"))
    );
    assert_trace(evidence.audit.as_ref(), "completed from IN_PROGRESS");

    let runs = AtomicUsize::new(0);
    let err = idem
        .execute(&inv, |_| counted(&runs, json!(null)))
        .await
        .expect_err("already took effect");
    assert!(err.already_took_effect(), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Case: INDETERMINATE evidence whose record TTL deleted (after the year an INDETERMINATE
/// record is kept) is released by an operator: the evidence goes, a released record keeps the
/// trace, the next delivery runs.
pub async fn indeterminate_evidence_without_its_record_is_released_by_an_operator<S: Store>(
    fx: Fixture<S>,
) {
    fx.require(Capability::Evidence);
    let (idem, clock, sweep) = engine(fx, Config::default());
    let inv = invoice("lost-1");
    hold_for_an_operator(&idem, &clock, &inv).await;
    clock.advance(Duration::from_secs(367 * 24 * 3600));
    sweep().await;
    assert_eq!(
        idem.store().get(inv.key()).await.expect("get"),
        None,
        "TTL deleted it"
    );
    let identity = inv.evidence_key().expect("identity");
    let evidence = idem.store().evidence(&identity).await.expect("evidence");
    assert_eq!(evidence.map(|e| e.status), Some(Status::Indeterminate));

    let released = idem
        .resolve_evidence::<Value>(&identity, Resolution::Release, &operator())
        .await
        .expect("release evidence");
    assert!(released);
    assert_eq!(
        idem.store().evidence(&identity).await.expect("evidence"),
        None
    );
    let record = stored(&idem, inv.key(), "the released record keeps the trace").await;
    assert_trace(record.audit.as_ref(), "released from INDETERMINATE");

    let runs = AtomicUsize::new(0);
    let rerun = idem
        .execute(&inv, |_| counted(&runs, json!({"invoice_id": "inv-9"})))
        .await
        .expect("runs afresh");
    assert_eq!(rerun.origin(), Origin::Executed { attempt: 1 });
}

/// Case: evidence an operator read as orphaned but that a redelivery adopted meanwhile (a live
/// claim again) is not settled under it: the resolution answers `false`, nothing changes.
pub async fn an_operator_never_settles_evidence_a_delivery_has_adopted<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, sweep) = rerunning(fx, retention(60));
    let inv = invoice("adopted-1");
    crash_after_claim(&idem, &inv).await;
    clock.advance(LEASE + Duration::from_secs(120));
    sweep().await;
    let identity = inv.evidence_key().expect("identity");
    let orphan = idem.store().evidence(&identity).await.expect("evidence");
    assert_eq!(orphan.map(|e| e.status), Some(Status::InProgress));

    // A redelivery adopts it and is still running.
    let adopter = stalled_worker(&idem, &inv).await;
    let live = stored(&idem, inv.key(), "the adoption's claim").await;
    assert_eq!((live.status, live.lease.attempt), (Status::InProgress, 2));

    let resolved = idem
        .resolve_evidence::<Value>(
            &identity,
            Resolution::Completed(json!("inv-1")),
            &operator(),
        )
        .await
        .expect("resolve evidence");
    assert!(!resolved, "a live claim holds the evidence");
    let evidence = idem.store().evidence(&identity).await.expect("evidence");
    assert_eq!(evidence.map(|e| e.status), Some(Status::InProgress));
    assert_eq!(
        stored(&idem, inv.key(), "record").await,
        live,
        "nothing changed"
    );
    adopter.abort();
}

/// Case: an operator's write that commits and loses its answer (the retry's condition then
/// fails) is recognised by its trace, and one refused by throttling is retried: on a release of
/// a held record and on the settlement of orphaned evidence.
pub async fn an_operators_lost_answer_is_recognised_and_a_throttled_one_retried<
    S: Store + Clone,
>(
    fx: Fixture<S>,
) {
    fx.require(Capability::Evidence);
    let store = FaultyStore::new(fx.store);
    let clock = fx.clock;
    let idem = lambda_idempotency::Idempotency::new(store.clone())
        .with_config(retention(60))
        .with_clock(clock.clone());
    let held = invoice("lost-answer-1");
    hold_for_an_operator(&idem, &clock, &held).await;
    store.inject(Primitive::Operator, Fault::FailBefore(FaultKind::Throttled));
    store.inject(
        Primitive::Operator,
        Fault::FailAfter(FaultKind::Unavailable),
    );
    let released = idem
        .resolve::<Value>(held.key(), Resolution::Release, &operator())
        .await
        .expect("release");
    assert!(released, "the lost answer is the operator's own write");
    assert_eq!(store.pending(), 0, "both faults fired");
    let record = stored(&idem, held.key(), "released").await;
    assert_trace(record.audit.as_ref(), "released from INDETERMINATE");

    let orphan = invoice("lost-answer-2");
    crash_after_claim(&idem, &orphan).await;
    clock.advance(LEASE + Duration::from_secs(120));
    (fx.sweep)().await;
    let identity = orphan.evidence_key().expect("identity");
    store.inject(
        Primitive::Operator,
        Fault::FailAfter(FaultKind::Unavailable),
    );
    let resolved = idem
        .resolve_evidence::<Value>(
            &identity,
            Resolution::Completed(json!("inv-2")),
            &operator(),
        )
        .await
        .expect("resolve evidence");
    assert!(resolved, "the lost answer is the operator's own write");
    assert_eq!(store.pending(), 0, "the fault fired");
    let evidence = idem.store().evidence(&identity).await.expect("evidence");
    assert_eq!(evidence.map(|e| e.status), Some(Status::Completed));
}
