//! Cells of the recovery table (the protocol guide's "Recovery") and claims of the effects
//! guide that no other case pins down: what an attempt that ended so leaves in the store (its
//! steps, the give-back's mark or none) and what the next delivery then does, every step's
//! effect counted. On the memory store and the embedded DynamoDB server, each with its manual
//! clock; the completion's writes on DynamoDB alone (the only store that commits them).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::effects::{Checked, MAX_STEP_RESULTS_BYTES, NotApplied, StepError, Writes};
use lambda_idempotency::failure::{Classifier, FailureClass, Terminal};
use lambda_idempotency::reconcile::{Recovery, Takeover};
use lambda_idempotency::record::{Status, StepRecord};
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::{LEASE, invocation, operator, stored};
use lambda_idempotency::testing::faults::{FaultKind, FaultyStore, Primitive};
use lambda_idempotency::testing::outcomes::incompressible;
use lambda_idempotency::{
    BoxError, Config, Error, Execution, ExecutionContext, Idempotency, Invocation, Origin,
    Resolution,
};
use serde_json::json;
use tokio::sync::oneshot;

use super::backends::{Backend, both};
use super::transactions::Shop;

/// An engine over `backend`'s store and clock under `recovery`.
fn engine(backend: Backend, recovery: Recovery) -> (Idempotency, ManualClock) {
    let clock = backend.clock.clone();
    let idem = Idempotency::new(backend.store)
        .with_clock(backend.clock)
        .with_recovery(recovery);
    (idem, clock)
}

/// How often each step's effect ran, over every attempt.
#[derive(Debug, Default)]
struct Effects {
    charges: AtomicUsize,
    emails: AtomicUsize,
}

impl Effects {
    /// (charges, e-mails) so far.
    fn counts(&self) -> (usize, usize) {
        (
            self.charges.load(Ordering::SeqCst),
            self.emails.load(Ordering::SeqCst),
        )
    }
}

/// The charge step: counted, `ch_1` on every run (so only the count shows a second run).
async fn charge(ctx: &ExecutionContext, effects: &Effects) -> Result<String, StepError> {
    ctx.step("charge")
        .run(|_key| async {
            effects.charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(String::from("ch_1"))
        })
        .await
}

/// The e-mail step: counted, `msg_<run>`; with a check that finds nothing sent when `checked`.
async fn email(
    ctx: &ExecutionContext,
    effects: &Effects,
    checked: bool,
) -> Result<String, StepError> {
    let send = |_key: String| async move {
        let run = effects.emails.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, BoxError>(format!("msg_{run}"))
    };
    let step = ctx.step("email");
    match checked {
        true => {
            step.checked_by(|_key: String| async {
                Ok::<_, BoxError>(Checked::<String>::NotApplied)
            })
            .run(send)
            .await
        }
        false => step.run(send).await,
    }
}

/// The whole handler: charge, then e-mail (checked as `checked` says).
async fn checkout(
    idem: &Idempotency,
    inv: &Invocation,
    effects: &Effects,
    checked: bool,
) -> Result<Execution<String>, Error> {
    idem.execute(inv, |ctx| async move {
        let charged = charge(&ctx, effects).await?;
        let mailed = email(&ctx, effects, checked).await?;
        Ok::<_, BoxError>(format!("{charged}+{mailed}"))
    })
    .await
}

/// A step recorded by `attempt` with `value` as its result.
fn done(name: &str, attempt: u32, value: &str) -> StepRecord {
    StepRecord {
        name: name.to_owned(),
        attempt,
        result: Some(serde_json::to_vec(value).expect("json")),
    }
}

/// What [`crash_while_emailing`] leaves: the charge done, the e-mail uncertain.
fn crashed_steps() -> Vec<StepRecord> {
    vec![done("charge", 1, "ch_1"), StepRecord::intent("email", 1)]
}

/// A first attempt that charged (its result written with the e-mail's intent) and died while
/// the e-mail was being sent: the process is gone, nothing of it runs again.
async fn crash_while_emailing(idem: &Idempotency, inv: &Invocation, effects: &Arc<Effects>) {
    let (sending_tx, sending_rx) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv, effects) = (idem.clone(), inv.clone(), Arc::clone(effects));
        async move {
            idem.execute(&inv, |ctx| async move {
                charge(&ctx, &effects).await?;
                ctx.step("email")
                    .run(|_key| async move {
                        effects.emails.fetch_add(1, Ordering::SeqCst);
                        let _ = sending_tx.send(());
                        std::future::pending::<Result<String, BoxError>>().await
                    })
                    .await
            })
            .await
        }
    });
    sending_rx.await.expect("the e-mail is being sent");
    drop(worker); // detached, pending for ever: a crash, not a cancellation
    let record = stored(idem, inv.key(), "the crashed attempt's record").await;
    assert_eq!(record.steps, crashed_steps());
}

/// `err` is the retained failure of `kind`.
fn is_failed(err: &Error, kind: &str) -> bool {
    matches!(err, Error::Failed { failure, .. } if failure.kind.as_str() == kind)
}

/// Protocol guide, terminal error row ("with its steps"), and the effects guide's "a terminal
/// failure is retained as FAILED": under every policy the failure is retained under its kind
/// with the steps the attempt recorded, whether their last result was still to be written
/// (the retention writes it) or already written (the retention keeps it), and every later
/// caller is answered from it without a step running again.
#[tokio::test]
async fn a_terminal_failure_after_steps_is_retained_with_its_steps() {
    for backend in both().await {
        let name = backend.name;
        let (idem, _) = engine(backend, Recovery::Indeterminate);
        for recovery in [Recovery::Indeterminate, Recovery::Steps, Recovery::Rerun] {
            let idem = idem.clone().with_recovery(recovery);
            let cell = format!("{name}, {recovery:?}");

            // The charge's result is not written yet when the handler fails.
            let inv = invocation(
                &format!("terminal-after-charge-{recovery:?}"),
                &json!({"order": 1}),
            );
            let (effects, runs) = (Effects::default(), AtomicUsize::new(0));
            let declined = |ctx: ExecutionContext| {
                let (effects, runs) = (&effects, &runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    charge(&ctx, effects).await?;
                    let declined = std::io::Error::other("the card was declined");
                    Err::<String, BoxError>(Box::new(Terminal::new("card_declined", declined)))
                }
            };
            let err = idem.execute(&inv, declined).await.expect_err("terminal");
            let own = matches!(&err, Error::Handler { source } if source.is::<Terminal>());
            assert!(own, "{cell}: the first caller gets its own error: {err:?}");
            let record = stored(&idem, inv.key(), "retained").await;
            assert_eq!(record.status, Status::Failed, "{cell}");
            assert_eq!(
                record.steps,
                [done("charge", 1, "ch_1")],
                "{cell}: retained with its step, its result written"
            );
            for _ in 0..2 {
                let replay = idem.execute(&inv, declined).await.expect_err("replayed");
                assert!(is_failed(&replay, "card_declined"), "{cell}: {replay:?}");
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{cell}: never run again");
            assert_eq!(effects.counts(), (1, 0), "{cell}");

            // The steps are written already (the charge's result with the e-mail's intent; the
            // e-mail uncertain) when the handler fails.
            let inv = invocation(
                &format!("terminal-after-uncertain-{recovery:?}"),
                &json!({"order": 2}),
            );
            let (effects, runs) = (Effects::default(), AtomicUsize::new(0));
            let refused = |ctx: ExecutionContext| {
                let (effects, runs) = (&effects, &runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    charge(&ctx, effects).await?;
                    let sent = ctx
                        .step("email")
                        .run(|_key| async {
                            effects.emails.fetch_add(1, Ordering::SeqCst);
                            Err::<String, BoxError>("the provider refused the recipient".into())
                        })
                        .await;
                    let err = sent.expect_err("the e-mail failed");
                    Err::<String, BoxError>(Box::new(Terminal::new("recipient_refused", err)))
                }
            };
            idem.execute(&inv, refused).await.expect_err("terminal");
            let record = stored(&idem, inv.key(), "retained").await;
            assert_eq!(record.status, Status::Failed, "{cell}");
            assert_eq!(
                record.steps,
                crashed_steps(),
                "{cell}: retained with its steps as written"
            );
            let replay = idem.execute(&inv, refused).await.expect_err("replayed");
            assert!(
                is_failed(&replay, "recipient_refused"),
                "{cell}: {replay:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{cell}: never run again");
            assert_eq!(effects.counts(), (1, 1), "{cell}");
        }
    }
}

/// The order put and the stock update of [`Shop::place`], as writes of the completion.
fn placing(shop: &Shop, order: &str, seen: u64) -> Writes {
    shop.place(order, seen)
        .writes()
        .iter()
        .fold(Writes::default(), |tx, write| tx.write(write.clone()))
}

/// `err` is the handler's refusal: the completion's write at `index` failed its condition.
fn is_refused(err: &Error, index: usize) -> bool {
    let Error::Handler { source } = err else {
        return false;
    };
    matches!(
        source.downcast_ref::<StepError>(),
        Some(StepError::Refused { write, .. }) if *write == index
    )
}

/// Protocol guide, refused completion after steps: under `Rerun` exactly as under `Steps`
/// (DynamoDB: the only store that commits the completion's writes). The claim is given back
/// with the step and the attempt's mark, the next delivery takes over at once, the step
/// replays and the completion commits once.
#[tokio::test]
async fn a_refused_completion_after_a_step_under_rerun_is_given_back_as_under_steps() {
    let shop = Shop::open().await;
    let mut seen_by_policy = Vec::new();
    for recovery in [Recovery::Steps, Recovery::Rerun] {
        let idem = shop.engine(shop.db.store()).with_recovery(recovery);
        let order = format!("c-refused-after-step-{recovery:?}");
        let inv = invocation(&order, &json!({"order": order}));
        let charges = AtomicUsize::new(0);
        let handler = |seen: u64| {
            let (shop, charges, order) = (&shop, &charges, &order);
            move |ctx: ExecutionContext| async move {
                let charged: String = ctx
                    .step("charge")
                    .run(|_key| async move {
                        charges.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(String::from("ch_1"))
                    })
                    .await?;
                ctx.complete_with(placing(shop, order, seen))?;
                Ok::<_, BoxError>(charged)
            }
        };
        let err = idem
            .execute(&inv, handler(99))
            .await
            .expect_err("a stale version");
        assert!(is_refused(&err, 1), "{recovery:?}: {err:?}");
        let record = stored(&idem, inv.key(), "given back, the step kept").await;
        assert_eq!(record.status, Status::InProgress, "{recovery:?}");
        assert_eq!(
            record.steps,
            [done("charge", 1, "ch_1"), StepRecord::given_back(1)],
            "{recovery:?}: the step, then the give-back's mark"
        );
        assert!(!shop.has_order(&order).await, "{recovery:?}");

        shop.clock.advance(Duration::from_millis(2));
        let version = shop.stock_item("version").await;
        let done = idem
            .execute(&inv, handler(version))
            .await
            .expect("taken over at once: the step replays, the completion commits");
        assert_eq!(done.value(), "ch_1", "{recovery:?}");
        assert_eq!(
            done.origin(),
            Origin::Executed { attempt: 2 },
            "{recovery:?}"
        );
        assert!(shop.has_order(&order).await, "{recovery:?}");
        seen_by_policy.push((record.steps, done.origin(), charges.load(Ordering::SeqCst)));
    }
    assert_eq!(
        seen_by_policy[0], seen_by_policy[1],
        "Rerun does what Steps does"
    );
    assert_eq!(seen_by_policy[0].2, 1, "charged once");
    assert_eq!(shop.reserved().await, 2, "one order per policy, each once");
}

/// Protocol guide, "steps in another order" under `Rerun`: even where every effect is declared
/// safe to repeat, a handler that runs its steps in another order than the crashed attempt
/// recorded is held INDETERMINATE with the steps, and nothing runs again.
#[tokio::test]
async fn under_rerun_steps_in_another_order_are_held() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend, Recovery::Rerun);
        let inv = invocation("rerun-reordered", &json!({"order": 3}));
        let effects = Arc::new(Effects::default());
        crash_while_emailing(&idem, &inv, &effects).await;
        clock.advance(LEASE + Duration::from_secs(1));

        let err = idem
            .execute(&inv, |ctx| {
                let effects = Arc::clone(&effects);
                async move {
                    let mailed = email(&ctx, &effects, false).await?;
                    let charged = charge(&ctx, &effects).await?;
                    Ok::<_, BoxError>(format!("{charged}+{mailed}"))
                }
            })
            .await
            .expect_err("another order");
        match &err {
            Error::StepMismatch { step, expected, .. } => assert_eq!(
                (step.as_str(), expected.as_deref()),
                ("email", Some("charge")),
                "{name}"
            ),
            other => panic!("{name}: got {other:?}"),
        }
        assert_eq!(effects.counts(), (1, 1), "{name}: nothing ran again");
        let record = stored(&idem, inv.key(), "held").await;
        assert_eq!(record.status, Status::Indeterminate, "{name}");
        assert_eq!(record.steps, crashed_steps(), "{name}: the steps kept");

        let again = checkout(&idem, &inv, &effects, false)
            .await
            .expect_err("held for an operator");
        assert!(
            matches!(again, Error::Indeterminate { .. }),
            "{name}: {again:?}"
        );
        assert_eq!(effects.counts(), (1, 1), "{name}");
    }
}

/// Protocol guide, stopped at a step with steps recorded: a step's write that fails after all
/// its tries, after a done step, gives the claim back marked with the attempt's
/// [`StepRecord::given_back`] (the done step's result written before it). Under the default
/// policy the mark is what continues the operation: the next delivery takes over at once, the
/// charge replays and the e-mail runs, where an unmarked claim would be held.
#[tokio::test]
async fn a_step_write_failing_after_a_done_step_gives_the_claim_back_marked() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let faulty = FaultyStore::new(backend.store);
        let idem = Idempotency::new(faulty.clone()).with_clock(clock.clone());
        let inv = invocation("step-write-fails", &json!({"order": 4}));
        let effects = Effects::default();

        let err = idem
            .execute(&inv, |ctx| {
                let (faulty, clock, effects) = (&faulty, &clock, &effects);
                async move {
                    let charged = charge(&ctx, effects).await?;
                    // From here every step write fails, through all its tries...
                    let for_ever = clock.now() + Duration::from_secs(24 * 3600);
                    faulty.outage(
                        &[Primitive::RecordSteps],
                        FaultKind::Unavailable,
                        for_ever,
                        clock.clone(),
                    );
                    let mailed = email(&ctx, effects, false).await;
                    // ... until the step has given up: the store is back for the give-back.
                    faulty.clear();
                    assert!(
                        matches!(mailed, Err(StepError::Stopped { .. })),
                        "the e-mail's intent was not written: {mailed:?}"
                    );
                    Ok::<_, BoxError>(format!("{charged}+{}", mailed?))
                }
            })
            .await
            .expect_err("stopped at the e-mail");
        assert!(matches!(err, Error::Store(_)), "{name}: {err:?}");
        let failed_tries = faulty
            .fired_in_outages()
            .get(&(Primitive::RecordSteps, FaultKind::Unavailable))
            .copied()
            .unwrap_or_default();
        assert!(
            failed_tries > 1,
            "{name}: the write was tried again: {failed_tries}"
        );
        assert_eq!(effects.counts(), (1, 0), "{name}: the e-mail never ran");
        let record = stored(&idem, inv.key(), "given back").await;
        assert_eq!(record.status, Status::InProgress, "{name}");
        assert_eq!(
            record.steps,
            [done("charge", 1, "ch_1"), StepRecord::given_back(1)],
            "{name}: the done step, then the attempt's mark"
        );
        assert!(
            record
                .steps
                .last()
                .is_some_and(StepRecord::marks_given_back),
            "{name}"
        );
        clock.advance(Duration::from_millis(1));
        assert!(record.lease_is_takeable(clock.now()), "{name}: given back");

        let done = checkout(&idem, &inv, &effects, false)
            .await
            .expect("continued from its steps under the default policy");
        assert_eq!(done.value(), "ch_1+msg_1", "{name}");
        assert_eq!(done.origin(), Origin::Executed { attempt: 2 }, "{name}");
        assert_eq!(effects.counts(), (1, 1), "{name}: one effect per step");
    }
}

/// Protocol guide, panic row: a panicking handler's steps are written before its claim is
/// given back, and without the give-back's mark: the next delivery recovers as from a crash,
/// held under the default policy (a marked give-back would be continued), the steps replaying
/// under `Steps`.
#[tokio::test]
async fn a_panics_steps_are_written_unmarked_and_recovered_as_a_crashs() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend, Recovery::Indeterminate);
        for recovery in [Recovery::Indeterminate, Recovery::Steps] {
            let cell = format!("{name}, {recovery:?}");
            let idem = idem.clone().with_recovery(recovery);
            let inv = invocation(&format!("panic-{recovery:?}"), &json!({"order": 5}));
            let effects = Arc::new(Effects::default());
            let panicked = tokio::spawn({
                let (idem, inv, effects) = (idem.clone(), inv.clone(), Arc::clone(&effects));
                async move {
                    idem.execute(&inv, |ctx| async move {
                        charge(&ctx, &effects).await?;
                        if effects.counts().0 > 0 {
                            panic!("a bug after the charge");
                        }
                        Ok::<_, BoxError>(String::new())
                    })
                    .await
                }
            })
            .await;
            assert!(
                panicked.is_err_and(|join| join.is_panic()),
                "{cell}: the panic goes on"
            );
            let record = stored(&idem, inv.key(), "given back").await;
            assert_eq!(record.status, Status::InProgress, "{cell}");
            assert_eq!(
                record.steps,
                [done("charge", 1, "ch_1")],
                "{cell}: the charge's result written, no give-back mark"
            );

            // Past the give-back's 5 s grace.
            clock.advance(Duration::from_secs(6));
            let next = checkout(&idem, &inv, &effects, false).await;
            match recovery {
                Recovery::Indeterminate => {
                    assert!(
                        matches!(next, Err(Error::Indeterminate { .. })),
                        "{cell}: a crash's takeover is held: {next:?}"
                    );
                    assert_eq!(effects.counts(), (1, 0), "{cell}");
                }
                _ => {
                    let done = next.expect("the steps replay");
                    assert_eq!(done.value(), "ch_1+msg_1", "{cell}");
                    assert_eq!(done.origin(), Origin::Executed { attempt: 2 }, "{cell}");
                    assert_eq!(effects.counts(), (1, 1), "{cell}");
                }
            }
        }
    }
}

/// Protocol guide, reconciler-failed row with steps: the claim is given back at once and
/// without the give-back's mark (the crashed attempt's steps as they were), so the next
/// delivery asks the reconciler again instead of continuing from the steps.
#[tokio::test]
async fn a_failing_reconcilers_give_back_after_steps_is_unmarked() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend, Recovery::Indeterminate);
        let asked = Arc::new(AtomicUsize::new(0));
        let idem = idem.with_reconciler({
            let asked = Arc::clone(&asked);
            move |_: Takeover| {
                let asked = asked.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    match asked {
                        1 => Err::<_, BoxError>("the provider is unreachable".into()),
                        _ => Ok(Checked::NotApplied),
                    }
                }
            }
        });
        let inv = invocation("reconciler-fails-after-steps", &json!({"order": 6}));
        let effects = Arc::new(Effects::default());
        crash_while_emailing(&idem, &inv, &effects).await;
        clock.advance(LEASE + Duration::from_secs(1));

        let err = checkout(&idem, &inv, &effects, true)
            .await
            .expect_err("the reconciler failed");
        assert!(
            matches!(err, Error::ReconcileFailed { .. }),
            "{name}: {err:?}"
        );
        let record = stored(&idem, inv.key(), "given back").await;
        assert_eq!(record.status, Status::InProgress, "{name}");
        assert_eq!(record.lease.attempt, 2, "{name}");
        assert!(
            record.lease.expires_at <= clock.now(),
            "{name}: given back at once"
        );
        assert_eq!(
            record.steps,
            crashed_steps(),
            "{name}: the crashed attempt's steps, no mark"
        );
        assert!(
            !record.steps.iter().any(StepRecord::marks_given_back),
            "{name}"
        );
        assert_eq!(effects.counts(), (1, 1), "{name}: nothing ran");

        clock.advance(Duration::from_millis(1));
        let done = checkout(&idem, &inv, &effects, true)
            .await
            .expect("the next delivery asks again, then runs");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            2,
            "{name}: the reconciler was asked again"
        );
        assert_eq!(done.origin(), Origin::Executed { attempt: 3 }, "{name}");
        assert_eq!(done.value(), "ch_1+msg_2", "{name}");
        assert_eq!(effects.counts(), (1, 2), "{name}");
    }
}

/// Effects guide, the recovery policy: under the default, a takeover of a crashed attempt with
/// steps asks the reconciler, and when it answers `NotApplied` the handler runs again with the
/// recorded results replaying (the charge is not made again; the uncertain e-mail is checked).
#[tokio::test]
async fn a_reconcilers_not_applied_rerun_still_replays_recorded_results() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend, Recovery::Indeterminate);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let idem = idem.with_reconciler({
            let seen = Arc::clone(&seen);
            move |takeover: Takeover| {
                seen.lock().expect("seen").push(takeover.previous.steps);
                async { Ok::<_, BoxError>(Checked::NotApplied) }
            }
        });
        let inv = invocation("reconciler-not-applied", &json!({"order": 7}));
        let effects = Arc::new(Effects::default());
        crash_while_emailing(&idem, &inv, &effects).await;
        clock.advance(LEASE + Duration::from_secs(1));

        let done = checkout(&idem, &inv, &effects, true)
            .await
            .expect("not applied: the handler runs");
        assert_eq!(
            *seen.lock().expect("seen"),
            [crashed_steps()],
            "{name}: asked once, with the steps"
        );
        assert_eq!(done.origin(), Origin::Executed { attempt: 2 }, "{name}");
        assert_eq!(done.value(), "ch_1+msg_2", "{name}");
        assert_eq!(
            effects.counts(),
            (1, 2),
            "{name}: the charge replayed, the e-mail checked and sent"
        );
    }
}

/// Effects guide, "Failures": a handler that panics on a [`StepError::Stopped`] (it unwrapped
/// the step's error) is answered from the stop, as one that returns it: a reused name holds
/// the operation for an operator, a result past the budget retains it as FAILED
/// `outcome_too_large`; every later caller gets that answer and the handler does not run again.
#[tokio::test]
async fn a_handler_that_panics_on_a_stop_is_answered_from_the_stop() {
    for backend in both().await {
        let name = backend.name;
        let (idem, _) = engine(backend, Recovery::Steps);

        let inv = invocation("panic-on-held", &json!({"order": 8}));
        let effects = Arc::new(Effects::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let panicked = tokio::spawn({
            let (idem, inv) = (idem.clone(), inv.clone());
            let (effects, runs) = (Arc::clone(&effects), Arc::clone(&runs));
            async move {
                idem.execute(&inv, |ctx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    charge(&ctx, &effects).await?;
                    let again = charge(&ctx, &effects).await;
                    Ok::<_, BoxError>(again.expect("a name used twice stops the attempt"))
                })
                .await
            }
        })
        .await;
        assert!(panicked.is_err_and(|join| join.is_panic()), "{name}");
        let record = stored(&idem, inv.key(), "held").await;
        assert_eq!(
            record.status,
            Status::Indeterminate,
            "{name}: held, as the stop says"
        );
        assert_eq!(record.steps, [done("charge", 1, "ch_1")], "{name}");
        let answer = idem
            .execute(&inv, |_ctx| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(String::new())
            })
            .await
            .expect_err("held");
        assert!(
            matches!(answer, Error::Indeterminate { .. }),
            "{name}: {answer:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: never run again");
        assert_eq!(
            effects.counts(),
            (1, 0),
            "{name}: the reused name never ran"
        );

        let inv = invocation("panic-on-too-large", &json!({"order": 9}));
        let reports = Arc::new(AtomicUsize::new(0));
        let panicked = tokio::spawn({
            let (idem, inv, reports) = (idem.clone(), inv.clone(), Arc::clone(&reports));
            async move {
                idem.execute(&inv, |ctx| async move {
                    let report = ctx
                        .step("report")
                        .run(|_key| async {
                            reports.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, BoxError>(incompressible(MAX_STEP_RESULTS_BYTES + 1024, 9))
                        })
                        .await;
                    Ok::<_, BoxError>(report.expect("a result past the budget stops the attempt"))
                })
                .await
            }
        })
        .await;
        assert!(panicked.is_err_and(|join| join.is_panic()), "{name}");
        let record = stored(&idem, inv.key(), "retained").await;
        assert_eq!(record.status, Status::Failed, "{name}");
        let answer = idem
            .execute(&inv, |_ctx| async { Ok::<_, BoxError>(String::new()) })
            .await
            .expect_err("retained");
        assert!(
            is_failed(&answer, "outcome_too_large"),
            "{name}: {answer:?}"
        );
        assert_eq!(reports.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}

/// Effects guide, "Inside the handler": an effect whose error is a [`NotApplied`] withdraws
/// its intent, so the same plain step may run again under its name in the same attempt; an
/// effect that failed otherwise is uncertain, and the same name again is a reused name (held,
/// the second run never starts).
#[tokio::test]
async fn not_applied_lets_a_plain_step_run_again_under_its_name() {
    for backend in both().await {
        let name = backend.name;
        let (idem, _) = engine(backend, Recovery::Steps);

        let inv = invocation("not-applied-again", &json!({"order": 10}));
        let sends = AtomicUsize::new(0);
        let done = idem
            .execute(&inv, |ctx| {
                let sends = &sends;
                async move {
                    let refused = ctx
                        .step("email")
                        .run(|_key| async {
                            sends.fetch_add(1, Ordering::SeqCst);
                            let refused = std::io::Error::other("connection refused");
                            Err::<String, _>(NotApplied::new(refused).into())
                        })
                        .await;
                    assert!(
                        matches!(refused, Err(StepError::Effect { .. })),
                        "{refused:?}"
                    );
                    let sent = ctx
                        .step("email")
                        .run(|_key| async {
                            let run = sends.fetch_add(1, Ordering::SeqCst) + 1;
                            Ok::<_, BoxError>(format!("msg_{run}"))
                        })
                        .await?;
                    Ok::<_, BoxError>(sent)
                }
            })
            .await
            .expect("the second try under the same name runs");
        assert_eq!(done.value(), "msg_2", "{name}");
        assert_eq!(sends.load(Ordering::SeqCst), 2, "{name}");
        let record = stored(&idem, inv.key(), "completed").await;
        assert_eq!(record.status, Status::Completed, "{name}");
        assert_eq!(
            record.steps,
            [done_step("email", "msg_2")],
            "{name}: one step, its second run's result"
        );

        let inv = invocation("uncertain-again", &json!({"order": 11}));
        let sends = AtomicUsize::new(0);
        let err = idem
            .execute(&inv, |ctx| {
                let sends = &sends;
                async move {
                    let failed = ctx
                        .step("email")
                        .run(|_key| async {
                            sends.fetch_add(1, Ordering::SeqCst);
                            Err::<String, BoxError>("the provider timed out".into())
                        })
                        .await;
                    assert!(
                        matches!(failed, Err(StepError::Effect { .. })),
                        "{failed:?}"
                    );
                    ctx.step("email")
                        .run(|_key| async {
                            sends.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, BoxError>(String::from("msg"))
                        })
                        .await
                }
            })
            .await
            .expect_err("a reused name");
        assert!(
            matches!(err, Error::StepMismatch { expected: None, .. }),
            "{name}: {err:?}"
        );
        assert_eq!(sends.load(Ordering::SeqCst), 1, "{name}: not run again");
        let record = stored(&idem, inv.key(), "held").await;
        assert_eq!(record.status, Status::Indeterminate, "{name}");
    }
}

/// The step attempt 1 recorded with `value`.
fn done_step(name: &str, value: &str) -> StepRecord {
    done(name, 1, value)
}

/// Effects guide, "Limits": step results take at most [`MAX_STEP_RESULTS_BYTES`] together,
/// and at most the configured outcome limit when that is smaller; a result that does not fit
/// has taken effect, so the operation is retained as FAILED `outcome_too_large` and no step
/// runs again. Each result here fits alone; the second one does not fit with the first.
#[tokio::test]
async fn step_results_past_their_budget_are_retained_as_outcome_too_large() {
    for backend in both().await {
        let name = backend.name;
        let small = Config::builder()
            .max_outcome_bytes(8 * 1024)
            .build()
            .expect("config");
        for (case, config, each, limit) in [
            (
                "256 KiB together",
                Config::default(),
                150 * 1024,
                MAX_STEP_RESULTS_BYTES,
            ),
            ("the outcome limit", small, 5 * 1024, 8 * 1024),
        ] {
            let cell = format!("{name}, {case}");
            let idem = Idempotency::new(backend.store.clone())
                .with_clock(backend.clock.clone())
                .with_config(config)
                .with_recovery(Recovery::Steps);
            let inv = invocation(&format!("step-budget-{limit}"), &json!({"order": 12}));
            let (scans, runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let scan = |ctx: ExecutionContext| {
                let (scans, runs) = (&scans, &runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let mut results = Vec::new();
                    for (seed, step) in [(1, "scan-1"), (2, "scan-2")] {
                        let result: String = ctx
                            .step(step)
                            .run(|_key| async move {
                                scans.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, BoxError>(incompressible(each, seed))
                            })
                            .await?;
                        results.push(result.len());
                    }
                    Ok::<_, BoxError>(results)
                }
            };
            let err = idem.execute(&inv, scan).await.expect_err("too large");
            assert!(
                matches!(err, Error::OutcomeTooLarge { limit: l, .. } if l == limit),
                "{cell}: {err:?}"
            );
            let record = stored(&idem, inv.key(), "retained").await;
            assert_eq!(record.status, Status::Failed, "{cell}");
            assert!(
                record.steps.first().is_some_and(StepRecord::is_done),
                "{cell}: the first result, which fits, is kept"
            );
            let answer = idem.execute(&inv, scan).await.expect_err("retained");
            assert!(
                is_failed(&answer, "outcome_too_large"),
                "{cell}: {answer:?}"
            );
            assert_eq!(
                scans.load(Ordering::SeqCst),
                2,
                "{cell}: each effect ran once"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{cell}: not run again");
        }
    }
}

/// Classifies a refused completion as terminal (`stock_changed`), anything else retryable.
struct RefusalIsTerminal;

impl Classifier for RefusalIsTerminal {
    fn classify(&self, error: &(dyn std::error::Error + 'static)) -> FailureClass {
        match error.downcast_ref::<StepError>() {
            Some(StepError::Refused { .. }) => FailureClass::terminal("stock_changed"),
            _ => FailureClass::Retryable,
        }
    }
}

/// Effects guide, a failed condition of the completion's writes classified as terminal: the
/// refusal is retained as FAILED under the classifier's kind under every policy (not held
/// under the default, not released under `Steps` or `Rerun`), replayed to every later caller,
/// nothing committed and the handler not run again.
#[tokio::test]
async fn a_refused_completion_classified_terminal_is_kept() {
    let shop = Shop::open().await;
    for recovery in [Recovery::Indeterminate, Recovery::Steps, Recovery::Rerun] {
        let idem = shop
            .engine(shop.db.store())
            .with_recovery(recovery)
            .with_classifier(RefusalIsTerminal);
        let order = format!("c-terminal-refusal-{recovery:?}");
        let inv = invocation(&order, &json!({"order": order}));
        let runs = AtomicUsize::new(0);
        let stale = |ctx: ExecutionContext| {
            let (shop, order, runs) = (&shop, &order, &runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                ctx.complete_with(placing(shop, order, 99))?;
                Ok::<_, BoxError>(order.clone())
            }
        };
        let err = idem.execute(&inv, stale).await.expect_err("refused");
        assert!(is_refused(&err, 1), "{recovery:?}: {err:?}");
        let record = stored(&idem, inv.key(), "retained").await;
        assert_eq!(record.status, Status::Failed, "{recovery:?}");
        let replay = idem.execute(&inv, stale).await.expect_err("replayed");
        assert!(
            is_failed(&replay, "stock_changed"),
            "{recovery:?}: {replay:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{recovery:?}: never run again"
        );
        assert!(!shop.has_order(&order).await, "{recovery:?}");
    }
    assert_eq!(shop.reserved().await, 0, "nothing committed");
}

/// Every item of the idempotency table (records and outcome parts).
async fn table_items(shop: &Shop) -> usize {
    let items: Vec<_> = shop
        .db
        .client
        .scan()
        .table_name(&shop.db.table)
        .consistent_read(true)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .expect("scan the idempotency table");
    items.len()
}

/// Effects guide, a completion DynamoDB would refuse: retained FAILED `completion_rejected`
/// before any part item of its (large) outcome is written: no `PutItem` after the claim, no
/// item beside the record. The same outcome with writes that can be sent does take part
/// items, so the first case's count is the refusal's, not an outcome that stayed inline.
#[tokio::test]
async fn a_rejected_completion_is_retained_before_any_part_item_is_written() {
    let shop = Shop::open().await;
    let idem = shop.engine(shop.db.store());
    let report = incompressible(600 * 1024, 13);
    let put = |item: String| {
        Put::builder()
            .table_name(&shop.orders)
            .item("pk", AttributeValue::S(item))
            .build()
            .expect("put")
    };

    let inv = invocation("rejected-large", &json!({"order": "c-rejected"}));
    let runs = AtomicUsize::new(0);
    let too_many = |ctx: ExecutionContext| {
        let (report, runs, put) = (report.clone(), &runs, &put);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            // 100 writes and the record's own update: 101 actions.
            let writes = (0..100).fold(Writes::default(), |tx, n| tx.put(put(format!("bulk-{n}"))));
            ctx.complete_with(writes)?;
            Ok::<_, BoxError>(report)
        }
    };
    let before = shop.db.requests.count();
    let err = idem.execute(&inv, too_many).await.expect_err("rejected");
    let sent = shop.db.requests.since(before);
    let Error::Handler { source } = &err else {
        panic!("got {err:?}");
    };
    let terminal = source.downcast_ref::<Terminal>().expect("terminal");
    assert_eq!(terminal.kind(), "completion_rejected");
    assert_eq!(
        sent.iter().filter(|request| *request == "PutItem").count(),
        1,
        "the claim's PutItem alone, no part item: {sent:?}"
    );
    assert!(
        !sent.iter().any(|request| request == "TransactWriteItems"),
        "nothing sent: {sent:?}"
    );
    assert_eq!(table_items(&shop).await, 1, "the record alone");
    let record = stored(&idem, inv.key(), "retained").await;
    assert_eq!(record.status, Status::Failed);
    let replay = idem.execute(&inv, too_many).await.expect_err("replayed");
    assert!(is_failed(&replay, "completion_rejected"), "{replay:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
    assert!(!shop.has_order("bulk-0").await);

    let inv = invocation("completed-large", &json!({"order": "c-parts"}));
    let before = shop.db.requests.count();
    let done = idem
        .execute(&inv, |ctx| {
            let (report, put) = (report.clone(), &put);
            async move {
                ctx.complete_with(Writes::default().put(put(String::from("c-parts"))))?;
                Ok::<_, BoxError>(report)
            }
        })
        .await
        .expect("completed");
    assert_eq!(done.value().len(), report.len());
    let sent = shop.db.requests.since(before);
    assert!(
        sent.iter().filter(|request| *request == "PutItem").count() > 1,
        "the claim, then the outcome's parts: {sent:?}"
    );
    assert!(
        table_items(&shop).await > 3,
        "two records and the second one's parts"
    );
}

/// Effects guide, the recovery policy: an operator's `Release` of an operation held with its
/// steps clears them with the record, so the next delivery runs afresh and every step runs
/// again (the done charge and the uncertain e-mail, which would otherwise be held).
#[tokio::test]
async fn an_operators_release_clears_the_steps_and_every_step_runs_again() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend, Recovery::Indeterminate);
        let inv = invocation("released-with-steps", &json!({"order": 14}));
        let effects = Arc::new(Effects::default());
        crash_while_emailing(&idem, &inv, &effects).await;
        clock.advance(LEASE + Duration::from_secs(1));
        let held = checkout(&idem, &inv, &effects, false)
            .await
            .expect_err("held");
        assert!(
            matches!(held, Error::Indeterminate { .. }),
            "{name}: {held:?}"
        );
        let record = stored(&idem, inv.key(), "held").await;
        assert_eq!(
            (record.status, record.steps),
            (Status::Indeterminate, crashed_steps()),
            "{name}"
        );

        let released = idem
            .resolve::<String>(inv.key(), Resolution::Release, &operator())
            .await
            .expect("resolve");
        assert!(released, "{name}");
        if let Some(record) = idem.store().get(inv.key()).await.expect("get") {
            assert!(record.steps.is_empty(), "{name}: the steps are cleared");
        }

        let done = checkout(&idem, &inv, &effects, false)
            .await
            .expect("runs afresh");
        assert_eq!(done.origin(), Origin::Executed { attempt: 1 }, "{name}");
        assert_eq!(done.value(), "ch_1+msg_2", "{name}");
        assert_eq!(effects.counts(), (2, 2), "{name}: every step ran again");
    }
}
