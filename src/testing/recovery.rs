//! Conformance cases for the recovery decision table (the protocol guide's "Recovery"): for
//! each way an attempt ends, under each recovery policy, what the attempt leaves in the store
//! and what the next delivery does, every step's effect and check counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::effects::Checked;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::{Status, StepRecord};
use lambda_idempotency::store::{Store, StoreExt};
use lambda_idempotency::{BoxError, Config, Error, ExecutionContext, Idempotency, Origin};
use tokio::sync::oneshot;

use super::conformance::{Fixture, LEASE, engine, invocation};

/// How long the ship step declares its effect may take to land.
const SHIP_TIMEOUT: Duration = Duration::from_secs(1);

/// How the first attempt ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The handler returns a retryable error before any step.
    RetryableBeforeSteps,
    /// The handler charges (a step with a result), then returns a retryable error.
    RetryableAfterAStep,
    /// The handler charges, the ship step's effect fails without saying whether it landed
    /// (uncertain), and the handler returns that retryable error.
    RetryableAfterAnUncertainStep,
    /// The process dies after the charge: nothing more of it runs.
    CrashAfterAStep,
    /// The process dies before any step.
    CrashBeforeSteps,
}

/// What the next delivery gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// The handler runs as this attempt; over both attempts, each step's effect ran, and the
    /// checks were asked, as many times as given.
    Runs {
        attempt: u32,
        charges: usize,
        ships: usize,
        checks: usize,
    },
    /// The operation is held INDETERMINATE for an operator.
    Held,
}

/// Every step's effect and check, over every attempt.
#[derive(Debug, Default)]
struct Counts {
    charges: AtomicUsize,
    ships: AtomicUsize,
    checks: AtomicUsize,
}

impl Counts {
    fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

/// The first attempt's handler for `ending` (a crash pends after signalling `crashed`).
async fn first(
    ctx: ExecutionContext,
    ending: Ending,
    counts: Arc<Counts>,
    crashed: Option<oneshot::Sender<()>>,
) -> Result<String, BoxError> {
    let retryable = || Box::new(std::io::Error::other("the warehouse timed out")) as BoxError;
    if ending == Ending::RetryableBeforeSteps {
        return Err(retryable());
    }
    if ending != Ending::CrashBeforeSteps {
        charge(&ctx, &counts).await?;
    }
    match ending {
        Ending::RetryableAfterAStep => Err(retryable()),
        Ending::RetryableAfterAnUncertainStep => {
            let counted = Arc::clone(&counts);
            ctx.step("ship")
                .effect_timeout(SHIP_TIMEOUT)
                .run(|_| async move {
                    counted.ships.fetch_add(1, Ordering::SeqCst);
                    Err::<String, _>(std::io::Error::other("no answer from the carrier").into())
                })
                .await?;
            unreachable!("the ship step failed")
        }
        _ => {
            if let Some(crashed) = crashed {
                let _ = crashed.send(());
            }
            std::future::pending().await
        }
    }
}

/// The charge step, counted.
async fn charge(ctx: &ExecutionContext, counts: &Arc<Counts>) -> Result<String, BoxError> {
    let counted = Arc::clone(counts);
    Ok(ctx
        .step("charge")
        .run(|_| async move {
            counted.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(String::from("ch_1"))
        })
        .await?)
}

/// The next delivery's handler: the charge and the ship step, whose checks find the charge
/// and the carrier's shipment.
async fn next(ctx: ExecutionContext, counts: Arc<Counts>) -> Result<String, BoxError> {
    let (checked, charged) = (Arc::clone(&counts), Arc::clone(&counts));
    let charged = ctx
        .step("charge")
        .checked_by(|_| async move {
            checked.checks.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(Checked::Applied(String::from("ch_1")))
        })
        .run(|_| async move {
            charged.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(String::from("ch_1"))
        })
        .await?;
    let (checked, shipped) = (Arc::clone(&counts), Arc::clone(&counts));
    let shipment = ctx
        .step("ship")
        .effect_timeout(SHIP_TIMEOUT)
        .checked_by(|_| async move {
            checked.checks.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(Checked::Applied(String::from("sh_1")))
        })
        .run(|_| async move {
            shipped.ships.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(String::from("sh_1"))
        })
        .await?;
    Ok(format!("{charged} {shipment}"))
}

/// The table's cell for `ending` under `recovery`.
fn expected(ending: Ending, recovery: Recovery) -> Next {
    let runs = |attempt, charges, ships, checks| Next::Runs {
        attempt,
        charges,
        ships,
        checks,
    };
    match (ending, recovery) {
        // Released: the next delivery runs afresh.
        (Ending::RetryableBeforeSteps, _) => runs(1, 1, 1, 0),
        // Given back knowingly: the steps replay under every policy...
        (Ending::RetryableAfterAStep, _) => runs(2, 1, 1, 0),
        // ... and the uncertain one is checked, or run again where every effect is declared
        // safe to repeat.
        (Ending::RetryableAfterAnUncertainStep, Recovery::Rerun) => runs(2, 1, 2, 0),
        (Ending::RetryableAfterAnUncertainStep, _) => runs(2, 1, 1, 1),
        // A crash: the policy decides. The charge's result was never written (a result goes
        // with the next write): its step is uncertain.
        (_, Recovery::Indeterminate) => Next::Held,
        (Ending::CrashAfterAStep, Recovery::Rerun) => runs(2, 2, 1, 0),
        (Ending::CrashAfterAStep, _) => runs(2, 1, 1, 1),
        (Ending::CrashBeforeSteps, _) => runs(2, 1, 1, 0),
    }
}

/// Runs the first attempt to its `ending` under `idem`; returns what the store then holds.
async fn end_first(
    idem: &Idempotency,
    inv: &lambda_idempotency::Invocation,
    ending: Ending,
    counts: &Arc<Counts>,
) -> Option<lambda_idempotency::record::Record> {
    match ending {
        Ending::CrashAfterAStep | Ending::CrashBeforeSteps => {
            let (crashed, signal) = oneshot::channel();
            let worker = tokio::spawn({
                let (idem, inv, counts) = (idem.clone(), inv.clone(), Arc::clone(counts));
                async move {
                    idem.execute(&inv, move |ctx| first(ctx, ending, counts, Some(crashed)))
                        .await
                }
            });
            signal.await.expect("the first attempt reached its crash");
            drop(worker); // detached, pending for ever: a crash, not a cancellation
        }
        _ => {
            let counts = Arc::clone(counts);
            let err = idem
                .execute(inv, move |ctx| first(ctx, ending, counts, None))
                .await
                .expect_err("the first attempt fails");
            assert!(matches!(err, Error::Handler { .. }), "{ending:?}: {err:?}");
        }
    }
    idem.store().get(inv.key()).await.expect("get")
}

/// Case: the recovery decision table, every cell: each way the first attempt ends, under each
/// policy, leaves what the table says, and the next delivery does what it says. A handler's own
/// retryable failure after steps is given back with them under every policy (marked with the
/// attempt's [`StepRecord::given_back`]): the retry replays done steps and checks uncertain
/// ones, never an operator page; a crash's takeover is the policy's.
pub async fn the_recovery_table_holds_in_every_cell<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    let endings = [
        Ending::RetryableBeforeSteps,
        Ending::RetryableAfterAStep,
        Ending::RetryableAfterAnUncertainStep,
        Ending::CrashAfterAStep,
        Ending::CrashBeforeSteps,
    ];
    let recoveries = [Recovery::Indeterminate, Recovery::Steps, Recovery::Rerun];
    for (i, ending) in endings.into_iter().enumerate() {
        for (j, recovery) in recoveries.into_iter().enumerate() {
            let cell = format!("{ending:?} under {recovery:?}");
            let idem = idem.clone().with_recovery(recovery);
            let inv = invocation(&format!("table-{i}-{j}"), &serde_json::json!({"order": i}));
            let counts = Arc::new(Counts::default());

            let left = end_first(&idem, &inv, ending, &counts).await;
            match ending {
                Ending::RetryableBeforeSteps => assert_eq!(left, None, "{cell}: released"),
                Ending::RetryableAfterAStep | Ending::RetryableAfterAnUncertainStep => {
                    let left = left.unwrap_or_else(|| panic!("{cell}: given back, not released"));
                    assert_eq!(left.status, Status::InProgress, "{cell}");
                    assert_eq!(
                        left.steps.last(),
                        Some(&StepRecord::given_back(1)),
                        "{cell}: the steps end with the give-back's mark"
                    );
                }
                Ending::CrashAfterAStep | Ending::CrashBeforeSteps => {
                    let left = left.unwrap_or_else(|| panic!("{cell}: the claim stands"));
                    assert!(
                        !left.steps.iter().any(StepRecord::marks_given_back),
                        "{cell}: a crash leaves no mark"
                    );
                }
            }

            // Past the ship step's declared effect timeout and the clocks' skew (a
            // give-back's grace), and past the lease for a crash.
            let wait = match ending {
                Ending::CrashAfterAStep | Ending::CrashBeforeSteps => LEASE,
                _ => SHIP_TIMEOUT + crate::execution::CLOCK_SKEW,
            };
            clock.advance(wait + Duration::from_millis(1));
            let answer = idem
                .execute(&inv, {
                    let counts = Arc::clone(&counts);
                    move |ctx| next(ctx, counts)
                })
                .await;
            match (expected(ending, recovery), answer) {
                (
                    Next::Runs {
                        attempt,
                        charges,
                        ships,
                        checks,
                    },
                    Ok(done),
                ) => {
                    assert_eq!(done.origin(), Origin::Executed { attempt }, "{cell}");
                    assert_eq!(done.value(), "ch_1 sh_1", "{cell}");
                    assert_eq!(Counts::get(&counts.charges), charges, "{cell}: charges");
                    assert_eq!(Counts::get(&counts.ships), ships, "{cell}: shipments");
                    assert_eq!(Counts::get(&counts.checks), checks, "{cell}: checks");
                }
                (Next::Held, Err(Error::Indeterminate { .. })) => {
                    let held = idem.store().get(inv.key()).await.expect("get");
                    assert_eq!(
                        held.map(|record| record.status),
                        Some(Status::Indeterminate),
                        "{cell}"
                    );
                    let charges = usize::from(ending == Ending::CrashAfterAStep);
                    assert_eq!(
                        Counts::get(&counts.charges),
                        charges,
                        "{cell}: never re-run"
                    );
                }
                (expected, answer) => panic!("{cell}: expected {expected:?}, got {answer:?}"),
            }
        }
    }
}

/// Case: a give-back's mark speaks for the attempt that wrote it alone: the attempt that took
/// over and then crashed before writing steps of its own leaves the record as it found it (the
/// earlier mark last), and its takeover is decided as a crash's, held under the default.
pub async fn a_give_backs_mark_is_the_attempts_own<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    let inv = invocation("table-stale-mark", &serde_json::json!({"order": 99}));
    let counts = Arc::new(Counts::default());
    end_first(&idem, &inv, Ending::RetryableAfterAStep, &counts).await;
    clock.advance(Duration::from_millis(1));

    // Attempt 2 replays the charge, then its process dies.
    let (crashed, signal) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv, counts) = (idem.clone(), inv.clone(), Arc::clone(&counts));
        async move {
            idem.execute(&inv, move |ctx| async move {
                charge(&ctx, &counts).await?;
                let _ = crashed.send(());
                std::future::pending::<Result<String, BoxError>>().await
            })
            .await
        }
    });
    signal.await.expect("attempt 2 replayed the charge");
    drop(worker);
    let left = idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(left.lease.attempt, 2);
    assert_eq!(left.steps.last(), Some(&StepRecord::given_back(1)));

    clock.advance(LEASE + Duration::from_millis(1));
    let err = idem
        .execute(&inv, {
            let counts = Arc::clone(&counts);
            move |ctx| next(ctx, counts)
        })
        .await
        .expect_err("attempt 2 crashed: held for an operator");
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");
    assert_eq!(Counts::get(&counts.charges), 1);
}
