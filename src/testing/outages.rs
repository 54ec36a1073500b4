//! Conformance cases for store outages that last seconds after the handler acted: a
//! throttling burst, a partition briefly unavailable. The settlement is retried (capped
//! exponential back-off, full jitter) until shortly before the invocation's deadline, so an
//! outage that ends in time costs retries, never a second run; one that outlasts the
//! invocation leaves the claim to a takeover, which the recovery policy decides.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::reconcile::{Checked, Recovery, Takeover};
use lambda_idempotency::record::Status;
use lambda_idempotency::store::Store;
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, Origin, StoreError};
use serde_json::json;

use super::conformance::{Fixture, invocation, stored};
use super::faults::{FaultKind, FaultyStore, Primitive};

/// How long the invocation may still run when the handler starts.
const DEADLINE: Duration = Duration::from_secs(60);
/// The lease the doors give such an invocation: its time left plus the 5 s skew.
const LEASE: Duration = Duration::from_secs(65);

/// The engine's tries of a settlement that meets an outage of `outage` from its first try:
/// back-off ceilings of 50 ms doubling to 2 s, each pause its whole ceiling on a
/// [`ManualClock`] (src/engine/retry.rs).
pub fn settlement_tries(outage: Duration) -> u64 {
    let (mut waited, mut ceiling, mut tries) = (Duration::ZERO, Duration::from_millis(50), 1);
    while waited < outage {
        waited += ceiling;
        ceiling = (ceiling * 2).min(Duration::from_secs(2));
        tries += 1;
    }
    tries
}

/// An invocation whose deadline is [`DEADLINE`] from now.
fn with_deadline(material: &str, clock: &ManualClock) -> Invocation {
    let inv = invocation(material, &json!({"amount": 10}));
    Invocation::new(inv.key().clone(), inv.fingerprint().clone(), LEASE)
        .with_deadline(clock.now() + DEADLINE)
}

/// Runs `inv` with a handler that counts its run and then starts an outage of `outage` on
/// settlements.
async fn act_then_outage<S: Store + Clone>(
    idem: &Idempotency,
    store: &FaultyStore<S>,
    clock: &ManualClock,
    inv: &Invocation,
    outage: Duration,
    runs: &AtomicUsize,
) -> Result<lambda_idempotency::Execution<serde_json::Value>, Error> {
    idem.execute(inv, |ctx| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        let until: SystemTime = clock.now() + outage;
        store.outage(
            &[Primitive::Settle],
            FaultKind::Throttled,
            until,
            clock.clone(),
        );
        Ok::<_, std::io::Error>(json!({"charged": true, "attempt": ctx.attempt()}))
    })
    .await
}

fn settles<S>(store: &FaultyStore<S>) -> u64 {
    store
        .calls()
        .get(&Primitive::Settle)
        .copied()
        .unwrap_or_default()
}

/// Case: an outage of 1, 5 or 30 seconds right after the handler acted: the caller gets the
/// result of its one run, after as many settlement tries as the back-off fits in the outage
/// (6, 8 and 21), and a redelivery replays it.
pub async fn a_settlement_outlasts_an_outage_of_seconds<S: Store + Clone>(fx: Fixture<S>) {
    let store = FaultyStore::new(fx.store);
    let clock = fx.clock;
    let idem = Idempotency::new(store.clone()).with_clock(clock.clone());
    for (seconds, tries) in [(1, 6), (5, 8), (30, 21)] {
        let outage = Duration::from_secs(seconds);
        assert_eq!(settlement_tries(outage), tries);
        let inv = with_deadline(&format!("outage-{seconds}"), &clock);
        let runs = AtomicUsize::new(0);
        let before = settles(&store);

        let done = act_then_outage(&idem, &store, &clock, &inv, outage, &runs)
            .await
            .unwrap_or_else(|err| panic!("a {seconds} s outage: {err:?}"));

        assert_eq!(
            done.origin(),
            Origin::Executed { attempt: 1 },
            "{seconds} s"
        );
        assert_eq!(
            settles(&store) - before,
            tries,
            "{seconds} s: settlement tries"
        );
        let record = stored(&idem, inv.key(), "settled").await;
        assert_eq!(record.status, Status::Completed, "{seconds} s");
        let again = idem
            .execute(&inv, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(json!("again"))
            })
            .await
            .expect("replayed");
        assert!(again.is_replay(), "{seconds} s");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{seconds} s: nothing ran twice"
        );
        store.clear();
    }
}

/// Case: an outage that outlasts the invocation: the settlement stops shortly before the
/// deadline with a typed error, the claim stands (no parallel run while its lease lives), and
/// after the lease the recovery policy decides: a reconciler's evidence, else a declared
/// re-run ([`Recovery::Rerun`]) or an operator ([`Recovery::Indeterminate`]).
pub async fn an_outage_past_the_deadline_leaves_the_claim_to_recovery<S: Store + Clone>(
    fx: Fixture<S>,
) {
    let store = FaultyStore::new(fx.store);
    let clock = fx.clock;
    let idem = Idempotency::new(store.clone())
        .with_clock(clock.clone())
        .with_recovery(Recovery::Rerun);
    let reconciled = idem.clone().with_reconciler(|_: Takeover| async {
        Ok::<_, BoxError>(Checked::Applied(json!({"charged": true, "attempt": 1})))
    });
    let held = idem.clone().with_recovery(Recovery::Indeterminate);
    for (case, taker) in [
        ("rerun", &idem),
        ("reconciled", &reconciled),
        ("held", &held),
    ] {
        let inv = with_deadline(&format!("long-outage-{case}"), &clock);
        let runs = AtomicUsize::new(0);
        let started = clock.now();
        let err = act_then_outage(&idem, &store, &clock, &inv, Duration::from_secs(600), &runs)
            .await
            .expect_err("the outage outlasts the invocation");
        assert!(
            matches!(err, Error::Store(StoreError::Throttled { .. })),
            "{case}: {err:?}"
        );
        let gave_up = clock.now().duration_since(started).unwrap_or_default();
        assert!(
            gave_up < DEADLINE && gave_up + Duration::from_secs(3) > DEADLINE,
            "{case}: retried until shortly before the deadline, not {gave_up:?}"
        );
        store.clear(); // the outage ends
        let busy = idem
            .execute(&inv, |_| async {
                Ok::<_, std::io::Error>(json!("parallel"))
            })
            .await
            .expect_err("the claim stands");
        assert!(
            matches!(busy, Error::AlreadyInProgress { .. }),
            "{case}: {busy:?}"
        );

        clock.advance(LEASE);
        let taken = act_then_outage(taker, &store, &clock, &inv, Duration::ZERO, &runs).await;
        match case {
            "rerun" => {
                let done = taken.expect("re-run, as declared");
                assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
                assert_eq!(runs.load(Ordering::SeqCst), 2, "the declared re-run");
            }
            "reconciled" => {
                let done = taken.expect("reconciled");
                assert_eq!(done.origin(), Origin::Reconciled { attempt: 2 });
                assert_eq!(runs.load(Ordering::SeqCst), 1, "the evidence, not a re-run");
            }
            _ => {
                let err = taken.expect_err("held for an operator");
                assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
                assert_eq!(runs.load(Ordering::SeqCst), 1, "never re-run blind");
                let record = stored(taker, inv.key(), "held").await;
                assert_eq!(record.status, Status::Indeterminate);
            }
        }
        store.clear();
    }
}

/// Case: an outage of 5 seconds on the steps' writes starts right after a step's effect: the
/// write that carries its result (the next step's intent) is retried as patiently as a
/// settlement, so the result is kept, the next step runs, and a redelivery replays the
/// operation. Under the default recovery a brief retry would have given the claim back with
/// the step uncertain, and its redelivery held for an operator an operation whose effect is
/// known.
pub async fn a_step_result_outlasts_an_outage_of_seconds<S: Store + Clone>(fx: Fixture<S>) {
    let store = FaultyStore::new(fx.store);
    let clock = fx.clock;
    let idem = Idempotency::new(store.clone()).with_clock(clock.clone());
    let inv = with_deadline("step-outage", &clock);
    let (charges, shipments) = (&AtomicUsize::new(0), &AtomicUsize::new(0));
    let outage = Duration::from_secs(5);
    let (faults, time) = (&store, &clock);
    let ran = idem
        .execute(&inv, |ctx| async move {
            let charge = ctx
                .step("charge")
                .run(|_| async {
                    charges.fetch_add(1, Ordering::SeqCst);
                    faults.outage(
                        &[Primitive::RecordSteps, Primitive::Shorten],
                        FaultKind::Throttled,
                        time.now() + outage,
                        time.clone(),
                    );
                    Ok::<_, BoxError>(json!("ch_1"))
                })
                .await?;
            let shipment = ctx
                .step("ship")
                .run(|_| async {
                    shipments.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(json!("sh_1"))
                })
                .await?;
            Ok::<_, BoxError>(json!({"charge": charge, "shipment": shipment}))
        })
        .await
        .expect("the charge's result outlasts the outage");
    assert_eq!(ran.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(
        store.calls().get(&Primitive::RecordSteps).copied(),
        Some(settlement_tries(outage) + 1),
        "the charge's result retried through the outage, then the shipment's intent"
    );
    let record = stored(&idem, inv.key(), "settled").await;
    assert_eq!(record.status, Status::Completed);
    let results: Vec<_> = record
        .steps
        .iter()
        .map(|step| step.result.is_some())
        .collect();
    assert_eq!(results, [true, true], "both steps' results kept");

    let again = idem
        .execute(&inv, |_| async { Ok::<_, BoxError>(json!("again")) })
        .await
        .expect("replayed");
    assert!(again.is_replay());
    assert_eq!(charges.load(Ordering::SeqCst), 1, "one charge");
    assert_eq!(shipments.load(Ordering::SeqCst), 1, "one shipment");
}
