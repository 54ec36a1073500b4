//! Conformance cases at the edges of time and failure: retention against leases, records that
//! never expire into a blind re-run, ambiguous and failing writes, panics and cancellations,
//! values checked before they are stored. Each case wraps the fixture's store in a
//! [`FaultyStore`] where it needs a fault, so these cases need a `Clone` store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::config::DEFAULT_MAX_OUTCOME_BYTES;
use lambda_idempotency::key::JsonPointer;
use lambda_idempotency::reconcile::{Checked, Takeover};
use lambda_idempotency::record::Status;
use lambda_idempotency::store::{Store, StoreExt};
use lambda_idempotency::{BoxError, Config, Error, Idempotency, Invocation, Origin, Resolution};
use serde_json::{Value, json};

use super::conformance::{
    Capability, Fixture, LEASE, blocked_worker, counted, crash_after_claim, crash_after_run,
    engine, evidence_key, invocation, operator, rerunning, stalled_worker, stored,
};
use super::faults::{Fault, FaultKind, FaultyStore, Primitive};

/// How long a claim given back by a panicking or cancelled handler still holds.
const GIVE_BACK_GRACE: Duration = Duration::from_secs(5);

/// A reconciler that always gives `answer`.
fn always(
    answer: Checked,
) -> impl Fn(Takeover) -> std::future::Ready<Result<Checked, BoxError>> + Send + Sync + 'static {
    move |_| std::future::ready(Ok(answer.clone()))
}

/// An engine over the fixture's store wrapped in a [`FaultyStore`], with `config`.
fn faulty_engine<S: Store + Clone>(
    fx: Fixture<S>,
    config: Config,
) -> (
    Idempotency,
    FaultyStore<S>,
    lambda_idempotency::clock::ManualClock,
    super::conformance::Sweeper,
) {
    let store = FaultyStore::new(fx.store);
    let idem = Idempotency::new(store.clone())
        .with_config(config)
        .with_clock(fx.clock.clone());
    (idem, store, fx.clock, fx.sweep)
}

fn retention(seconds: u64) -> Config {
    Config::builder()
        .retention(Duration::from_secs(seconds))
        .build()
        .expect("config")
}

fn with_identity(material: &str) -> Invocation {
    invocation(material, &json!({"amount": 10}))
        .with_identity(format!("invoice:{material}"))
        .expect("a valid identity")
        .with_result_ref(JsonPointer::new("/invoice_id").expect("pointer"))
}

/// Case: a takeover moves retention past its new lease, so a third delivery meets attempt 2's
/// live lease instead of claiming afresh (defect: retention longer than the first lease but
/// shorter than the taker's let it run in parallel).
pub async fn takeover_extends_retention_past_its_lease<S: Store>(fx: Fixture<S>) {
    let (idem, clock, sweep) = rerunning(fx, retention(45));
    let inv = invocation("edge-1", &json!({"amount": 10}));
    crash_after_claim(&idem, &inv).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let (taker, resume) = blocked_worker(&idem, &inv, Ok("attempt 2".into())).await;
    let taken = stored(&idem, inv.key(), "taken over").await;
    assert_eq!(taken.lease.attempt, 2);
    assert!(
        taken.expires_at > taken.lease.expires_at,
        "retention outlives the new lease"
    );

    clock.advance(Duration::from_secs(20)); // past the first claim's retention, within attempt 2's lease
    sweep().await;
    let runs = AtomicUsize::new(0);
    let err = idem
        .execute(&inv, |_| counted(&runs, String::from("third")))
        .await
        .expect_err("attempt 2 still holds the lease");

    assert!(
        matches!(err, Error::AlreadyInProgress { attempt: 2, .. }),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no parallel execution");
    let _ = resume.send(());
    assert_eq!(taker.await.expect("join").expect("completes"), "attempt 2");
}

/// Case: a crashed claim redelivered long after its retention (a DLQ redrive, an archive
/// replay) is taken over and reconciled, never run as a blind attempt 1.
pub async fn stale_in_progress_is_reconciled_not_rerun<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, retention(3600));
    let idem = idem.with_reconciler(always(Checked::Applied(json!("found"))));
    let inv = invocation("edge-2", &json!({"amount": 10}));
    let crashed = std::sync::Arc::new(AtomicUsize::new(0));
    crash_after_run(&idem, &inv, &crashed).await;
    clock.advance(Duration::from_secs(10 * 24 * 3600));
    let runs = AtomicUsize::new(0);

    let done = idem
        .execute(&inv, |_| counted(&runs, String::from("blind")))
        .await
        .expect("reconciled");

    assert_eq!(done.origin(), Origin::Reconciled { attempt: 2 });
    assert_eq!(done.value(), "found");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the handler did not run again"
    );
    assert_eq!(crashed.load(Ordering::SeqCst), 1, "only the crashed run");
}

/// Case: a crashed claim with a business identity whose record TTL deleted: its IN_PROGRESS
/// evidence is neither acknowledged as done nor left without a way forward; the redelivery
/// adopts it as a takeover and the reconciler decides.
pub async fn orphaned_evidence_is_adopted_and_reconciled<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, sweep) = engine(fx, retention(60));
    let not_applied = idem.clone().with_reconciler(always(Checked::NotApplied));
    let applied = idem.with_reconciler(always(Checked::Applied(
        json!({"invoice_id": "inv-found", "total": 10}),
    )));
    let runs = AtomicUsize::new(0);

    for (material, idem) in [("edge-3a", &not_applied), ("edge-3b", &applied)] {
        crash_after_claim(idem, &with_identity(material)).await;
    }
    clock.advance(LEASE + Duration::from_secs(120));
    assert!(sweep().await >= 2, "TTL deleted both crashed records");

    let rerun = not_applied
        .execute(&with_identity("edge-3a"), |_| {
            counted(&runs, json!({"invoice_id": "inv-new", "total": 10}))
        })
        .await
        .expect("not applied: runs as attempt 2");
    assert_eq!(rerun.origin(), Origin::Executed { attempt: 2 });
    let found = applied
        .execute(&with_identity("edge-3b"), |_| {
            counted(&runs, json!({"invoice_id": "never", "total": 10}))
        })
        .await
        .expect("applied: recorded");
    assert_eq!(found.origin(), Origin::Reconciled { attempt: 2 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let evidence = applied
        .store()
        .evidence(&evidence_key("invoice:edge-3b"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(
        (evidence.status, evidence.result_ref.as_deref()),
        (Status::Completed, Some("inv-found"))
    );
}

/// Case: evidence of another operation that is still IN_PROGRESS is not a reason to
/// acknowledge: the error says so ([`Error::already_took_effect`] is false).
pub async fn in_progress_evidence_is_not_acknowledged<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, _, _) = engine(fx, Config::default());
    let first = with_identity("edge-4");
    let other = invocation("edge-4-copy", &json!({"amount": 10}))
        .with_identity("invoice:edge-4")
        .expect("a valid identity");
    let (holder, resume) = blocked_worker(&idem, &first, Ok("held".into())).await;

    let err = idem
        .execute(&other, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect_err("identity held");

    assert!(
        matches!(&err, Error::KeyExpiredConflict { evidence, .. } if evidence.status == Status::InProgress),
        "got {err:?}"
    );
    assert!(!err.already_took_effect(), "in progress is not done");
    let _ = resume.send(());
    holder.await.expect("join").expect("completes");
    let err = idem
        .execute(&other, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect_err("identity taken");
    assert!(err.already_took_effect(), "completed evidence is done");
}

/// Case: an INDETERMINATE record never expires into a fresh claim, however old.
pub async fn indeterminate_never_expires<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, retention(60));
    let idem = idem.with_reconciler(always(Checked::Unknown));
    let inv = invocation("edge-5", &json!({"amount": 10}));
    crash_after_claim(&idem, &inv).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let runs = AtomicUsize::new(0);
    let err = idem
        .execute(&inv, |_| counted(&runs, 1_u32))
        .await
        .expect_err("unknown");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");

    clock.advance(Duration::from_secs(3 * 366 * 24 * 3600));
    let err = idem
        .execute(&inv, |_| counted(&runs, 1_u32))
        .await
        .expect_err("still held for an operator");

    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Case: a completion that fails for a transient reason after the effect is retried within
/// the lease; one that keeps failing leaves the claim to a reconciled takeover, never a re-run.
pub async fn failed_completion_is_retried_then_reconciled<S: Store + Clone>(fx: Fixture<S>) {
    let (idem, store, clock, _) = faulty_engine(fx, Config::default());
    let idem = idem.with_reconciler(always(Checked::Applied(json!(7))));
    let runs = AtomicUsize::new(0);
    let retried = invocation("edge-6a", &json!({"amount": 10}));
    store.inject(Primitive::Settle, Fault::FailBefore(FaultKind::Throttled));
    store.inject(Primitive::Settle, Fault::FailBefore(FaultKind::Contention));

    let done = idem
        .execute(&retried, |_| counted(&runs, 7_u32))
        .await
        .expect("retried");
    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(store.pending(), 0, "both injected failures fired");
    assert_eq!(
        stored(&idem, retried.key(), "record").await.status,
        Status::Completed
    );

    let stuck = invocation("edge-6b", &json!({"amount": 10}));
    let down = clock.now() + Duration::from_secs(3600);
    store.outage(
        &[Primitive::Settle],
        FaultKind::Unavailable,
        down,
        clock.clone(),
    );
    let settles = |store: &FaultyStore<S>| store.calls().get(&Primitive::Settle).copied();
    let before = settles(&store).unwrap_or_default();
    let err = idem
        .execute(&stuck, |_| counted(&runs, 7_u32))
        .await
        .expect_err("the store stays down");
    assert!(matches!(err, Error::Store(_)), "got {err:?}");
    assert!(
        settles(&store).unwrap_or_default() - before > 5,
        "retried until the lease's end, not a few times"
    );
    store.clear();
    assert_eq!(
        stored(&idem, stuck.key(), "kept").await.status,
        Status::InProgress
    );
    clock.advance(LEASE + Duration::from_secs(1));
    let later = idem
        .execute(&stuck, |_| counted(&runs, 8_u32))
        .await
        .expect("reconciled");

    assert_eq!(later.origin(), Origin::Reconciled { attempt: 2 });
    assert_eq!(*later.value(), 7);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "one execution per operation"
    );
}

/// Case: every write that commits and loses its answer (the SDK or the engine sends it again)
/// is recognised as the caller's own: one execution, the truthful answer, a consistent record.
pub async fn ambiguous_writes_are_the_callers_own<S: Store + Clone>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, store, clock, _) = faulty_engine(fx, Config::default());
    // Off the millisecond: what a store gives back must still be recognised as the caller's.
    clock.advance(Duration::from_nanos(123_456));
    let lost = Fault::FailAfter(FaultKind::Unavailable);
    let runs = AtomicUsize::new(0);

    for (material, primitive) in [
        ("edge-7a", Primitive::Claim),
        ("edge-7b", Primitive::Settle),
    ] {
        for inv in [
            invocation(material, &json!({"amount": 10})),
            with_identity(&format!("{material}-id")),
        ] {
            store.inject(primitive, lost);
            let done = idem
                .execute(&inv, |_| counted(&runs, json!({"invoice_id": material})))
                .await
                .unwrap_or_else(|err| panic!("{primitive:?} lost its answer: {err:?}"));
            assert_eq!(store.pending(), 0, "{primitive:?}: the lost answer fired");
            assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
            let record = stored(&idem, inv.key(), "record").await;
            assert_eq!(record.status, Status::Completed);
            if let Some(identity) = inv.evidence_key() {
                let evidence = idem.store().evidence(&identity).await.expect("evidence");
                assert_eq!(evidence.map(|e| e.status), Some(Status::Completed));
            }
        }
    }

    let released = with_identity("edge-7c");
    store.inject(Primitive::Release, lost);
    let err = idem
        .execute(&released, |_| async {
            Err::<Value, _>(std::io::Error::other("retryable"))
        })
        .await
        .expect_err("handler failed");
    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    assert_eq!(store.pending(), 0, "the release's lost answer fired");
    assert_eq!(idem.store().get(released.key()).await.expect("get"), None);
    assert_eq!(
        idem.store()
            .evidence(&evidence_key("invoice:edge-7c"))
            .await
            .expect("evidence"),
        None
    );

    let taken = invocation("edge-7d", &json!({"amount": 10}));
    let crashed = std::sync::Arc::new(AtomicUsize::new(0));
    crash_after_run(&idem, &taken, &crashed).await;
    clock.advance(LEASE + Duration::from_secs(1));
    store.inject(Primitive::TakeOver, lost);
    let done = idem
        .clone()
        .with_recovery(lambda_idempotency::reconcile::Recovery::Rerun)
        .execute(&taken, |ctx| counted(&runs, json!(ctx.attempt())))
        .await
        .expect("takeover recognised");
    assert_eq!(store.pending(), 0, "the takeover's lost answer fired");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(runs.load(Ordering::SeqCst), 5, "one execution each");
    assert_eq!(
        crashed.load(Ordering::SeqCst),
        1,
        "the crashed run, before its declared re-run"
    );
}

/// Case: a completion the store holds up (a slow write) keeps duplicates out until it lands;
/// they meet the live claim, then the stored outcome.
pub async fn delayed_completion_keeps_duplicates_out<S: Store + Clone>(fx: Fixture<S>) {
    let (idem, store, _, _) = faulty_engine(fx, Config::default());
    let inv = invocation("edge-12", &json!({"amount": 10}));
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    store.inject(Primitive::Settle, Fault::Hold);
    let first = tokio::spawn({
        let (idem, inv, runs) = (idem.clone(), inv.clone(), runs.clone());
        async move {
            idem.execute(&inv, |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(12_u32)
            })
            .await
            .map(|done| *done.value())
        }
    });
    store.held().await;

    let err = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect_err("the completion is still in flight");
    assert!(
        matches!(err, Error::AlreadyInProgress { attempt: 1, .. }),
        "got {err:?}"
    );
    store.let_go();
    assert_eq!(first.await.expect("join").expect("completes"), 12);
    let replay = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect("replay");
    assert_eq!(*replay.value(), 12);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Case: with single flight, concurrent callers of one key in one process share its one
/// execution: the copies replay it instead of failing with `AlreadyInProgress`.
pub async fn concurrent_callers_share_one_flight<S: Store>(fx: Fixture<S>) {
    const CALLERS: usize = 16;
    let (idem, _, _) = engine(fx, Config::default());
    let idem = idem.with_single_flight();
    let inv = invocation("edge-13", &json!({"amount": 10}));
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let (arrived_tx, arrived_rx) = tokio::sync::watch::channel(0_usize);
    let arrived_tx = std::sync::Arc::new(arrived_tx);

    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (idem, inv, runs) = (idem.clone(), inv.clone(), runs.clone());
            let (arrived_tx, mut arrived_rx) = (arrived_tx.clone(), arrived_rx.clone());
            tokio::spawn(async move {
                arrived_tx.send_modify(|n| *n += 1);
                idem.execute(&inv, |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Every caller has arrived (and waits its turn) before this one completes.
                    let _ = arrived_rx.wait_for(|n| *n == CALLERS).await;
                    Ok::<_, std::io::Error>(String::from("shared"))
                })
                .await
            })
        })
        .collect();
    let mut replays = 0;
    for caller in callers {
        let done = tokio::time::timeout(Duration::from_secs(60), caller)
            .await
            .expect("no caller hangs")
            .expect("join")
            .expect("every caller gets the outcome");
        assert_eq!(done.value(), "shared");
        replays += usize::from(done.is_replay());
    }

    assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution");
    assert_eq!(replays, CALLERS - 1, "the copies replay it");
}

/// Case: a handler that panics gives its claim back (the next delivery takes over at once,
/// reconciled), and the panic still reaches the caller.
pub async fn panicking_handler_gives_the_claim_back<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    let idem = idem.with_reconciler(always(Checked::NotApplied));
    let inv = invocation("edge-8", &json!({"amount": 10}));

    let panicked = tokio::spawn({
        let (idem, inv) = (idem.clone(), inv.clone());
        async move {
            idem.execute(&inv, |_| async {
                if inv.identity().is_none() {
                    panic!("handler bug");
                }
                Ok::<_, std::io::Error>(0_u32)
            })
            .await
        }
    })
    .await;
    assert!(panicked.expect_err("panicked").is_panic());
    let record = stored(&idem, inv.key(), "claim kept").await;
    assert_eq!(record.status, Status::InProgress);
    assert!(
        record.lease.expires_at <= clock.now() + GIVE_BACK_GRACE,
        "lease given back"
    );

    taken_over_after_the_grace(&idem, &clock, &inv).await;
}

/// Case: a cancelled execution (its future dropped: a timeout, an aborted task) gives its claim
/// back instead of holding it for the rest of the lease.
pub async fn cancelled_execution_gives_the_claim_back<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = rerunning(fx, Config::default());
    let inv = invocation("edge-9", &json!({"amount": 10}));
    let worker = stalled_worker(&idem, &inv).await;
    worker.abort();
    let _ = worker.await;

    // The give-back runs in a task of its own: each read lets it on (a read is a round trip to
    // the store), and a bounded number of reads, not a wall-clock timeout, stops the wait.
    let mut given_back = None;
    for _ in 0..10_000 {
        let record = stored(&idem, inv.key(), "claim").await;
        if record.lease.expires_at <= clock.now() + GIVE_BACK_GRACE {
            given_back = Some(record);
            break;
        }
        tokio::task::yield_now().await;
    }
    let given_back = given_back.expect("the claim is given back within 10,000 reads");
    assert_eq!(given_back.status, Status::InProgress);
    taken_over_after_the_grace(&idem, &clock, &inv).await;
}

/// The next delivery, once a given-back claim's grace has passed, takes over as attempt 2.
async fn taken_over_after_the_grace(
    idem: &Idempotency,
    clock: &lambda_idempotency::clock::ManualClock,
    inv: &Invocation,
) {
    clock.advance(GIVE_BACK_GRACE + Duration::from_millis(1));
    let done = idem
        .execute(
            inv,
            |ctx| async move { Ok::<_, std::io::Error>(ctx.attempt()) },
        )
        .await
        .expect("taken over");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
}

/// Case: a value given in the handler's place (a reconciler's `Applied`, an operator's
/// `Completed`) that does not decode as the handler's output, or is over the outcome limit,
/// is refused before it is stored (a reconciler's holds the operation for an operator).
pub async fn values_are_type_checked_before_they_are_stored<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    let wrong = idem
        .clone()
        .with_reconciler(always(Checked::Applied(json!("not a number"))));
    let unknown = idem.clone().with_reconciler(always(Checked::Unknown));
    let reconciled = invocation("edge-11a", &json!({"amount": 10}));
    let resolved = invocation("edge-11b", &json!({"amount": 10}));
    crash_after_claim(&idem, &reconciled).await;
    crash_after_claim(&idem, &resolved).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let err = wrong
        .execute(&reconciled, |_| async { Ok::<_, std::io::Error>(1_u32) })
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    let record = stored(&idem, reconciled.key(), "kept").await;
    // Held for an operator with nothing stored, not left in progress for the next takeover to
    // ask again.
    assert_eq!(
        (record.status, record.outcome),
        (Status::Indeterminate, None)
    );

    let err = unknown
        .execute(&resolved, |_| async { Ok::<_, std::io::Error>(1_u32) })
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    let err = idem
        .resolve::<u32>(
            resolved.key(),
            Resolution::Completed(json!("text")),
            &operator(),
        )
        .await
        .expect_err("mismatch");
    assert!(matches!(err, Error::OutcomeMismatch { .. }), "got {err:?}");
    assert_eq!(
        stored(&idem, resolved.key(), "kept").await.status,
        Status::Indeterminate
    );
    let oversized = Resolution::Completed(json!("z".repeat(DEFAULT_MAX_OUTCOME_BYTES)));
    let err = idem
        .resolve::<String>(resolved.key(), oversized, &operator())
        .await
        .expect_err("over the limit");
    assert!(matches!(err, Error::OutcomeTooLarge { .. }), "got {err:?}");
    assert!(
        idem.resolve::<u32>(resolved.key(), Resolution::Completed(json!(5)), &operator())
            .await
            .expect("resolves")
    );
    let replay = idem
        .execute(&resolved, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect("replay");
    assert_eq!(*replay.value(), 5);
}
