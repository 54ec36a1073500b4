//! Conformance cases for recovery points ([`lambda_idempotency::effects`]): what a takeover
//! does with the steps a crashed attempt recorded, and the default for a handler without any.
//!
//! Each case counts every run of every step's effect, so "one effect per step" is what is
//! asserted, not inferred.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::effects::{Checked, NotApplied, StepError};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::{Status, StepRecord};
use lambda_idempotency::store::{Store, StoreExt};
use lambda_idempotency::{
    BoxError, Config, Error, ExecutionContext, Idempotency, Invocation, Origin,
};
use tokio::sync::oneshot;

use super::conformance::{Fixture, LEASE, crash_after_run, engine, invocation, stored};
use super::faults::{Fault, FaultKind, FaultyStore, Primitive};

/// An engine for handlers whose every effect is a step ([`Recovery::Steps`]).
fn with_steps<S: Store>(
    fx: Fixture<S>,
) -> (
    Idempotency,
    lambda_idempotency::clock::ManualClock,
    super::conformance::Sweeper,
) {
    let (idem, clock, sweep) = engine(fx, Config::default());
    (idem.with_recovery(Recovery::Steps), clock, sweep)
}

/// How often each step's effect ran, over every attempt.
#[derive(Debug, Default)]
struct Effects {
    charge: AtomicUsize,
    email: AtomicUsize,
    /// The downstream keys the e-mail effect was given.
    email_keys: Mutex<Vec<String>>,
}

impl Effects {
    fn charges(&self) -> usize {
        self.charge.load(Ordering::SeqCst)
    }

    fn emails(&self) -> usize {
        self.email.load(Ordering::SeqCst)
    }
}

/// What the e-mail step does on a takeover's attempt.
#[derive(Debug, Clone, Copy)]
enum Email {
    /// A check that answers this.
    Checked(Answer),
    /// No check.
    Unchecked,
    /// Declared repeat-safe.
    RepeatSafe,
}

#[derive(Debug, Clone, Copy)]
enum Answer {
    Applied,
    NotApplied,
    Unknown,
    Fails,
}

/// The charge step: counted, `ch_1` (recorded results replay, so a second run would show).
async fn charge(ctx: &ExecutionContext, effects: &Effects) -> Result<String, StepError> {
    ctx.step("charge")
        .run(|_key| async {
            effects.charge.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(String::from("ch_1"))
        })
        .await
}

/// The e-mail step as `email` declares it: counted, `msg_<run>`.
async fn email(
    ctx: &ExecutionContext,
    effects: &Effects,
    email: Email,
) -> Result<String, StepError> {
    let send = |key: String| async move {
        effects.email_keys.lock().expect("keys").push(key);
        let run = effects.email.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, BoxError>(format!("msg_{run}"))
    };
    let step = ctx.step("email");
    match email {
        Email::Unchecked => step.run(send).await,
        Email::RepeatSafe => step.repeat_safe().run(send).await,
        Email::Checked(answer) => {
            step.checked_by(move |_key: String| async move {
                match answer {
                    Answer::Applied => Ok(Checked::Applied(String::from("msg_found"))),
                    Answer::NotApplied => Ok(Checked::NotApplied),
                    Answer::Unknown => Ok(Checked::Unknown),
                    Answer::Fails => {
                        Err::<Checked<String>, BoxError>("the provider is down".into())
                    }
                }
            })
            .run(send)
            .await
        }
    }
}

/// The whole handler on a later attempt: charge, then e-mail as `declared`.
async fn checkout(
    idem: &Idempotency,
    inv: &Invocation,
    effects: &Effects,
    declared: Email,
) -> Result<String, Error> {
    idem.execute(inv, |ctx| async move {
        let charged = charge(&ctx, effects).await?;
        let mailed = email(&ctx, effects, declared).await?;
        Ok::<_, BoxError>(format!("{charged}+{mailed}"))
    })
    .await
    .map(lambda_idempotency::Execution::into_value)
}

/// A first attempt that charged (its result recorded with the e-mail's intent) and died while
/// the e-mail was being sent (`declared` as on later attempts): the e-mail is uncertain.
async fn crash_while_emailing(
    idem: &Idempotency,
    inv: &Invocation,
    effects: &Arc<Effects>,
    repeat_safe: bool,
) {
    let (sending_tx, sending_rx) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv, effects) = (idem.clone(), inv.clone(), Arc::clone(effects));
        async move {
            idem.execute(&inv, |ctx| async move {
                charge(&ctx, &effects).await?;
                let step = ctx.step("email");
                let step = match repeat_safe {
                    true => step.repeat_safe(),
                    false => step,
                };
                step.run(|key| async move {
                    effects.email_keys.lock().expect("keys").push(key);
                    effects.email.fetch_add(1, Ordering::SeqCst);
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
    assert_eq!(
        record.steps,
        [
            StepRecord {
                name: "charge".into(),
                attempt: 1,
                result: Some(br#""ch_1""#.to_vec()),
            },
            StepRecord::intent("email", 1),
        ],
        "the charge's result was written with the e-mail's intent"
    );
}

/// Case: a takeover replays a recorded step without running it, and a check that finds the
/// uncertain step applied records its result: one effect per step.
pub async fn a_recorded_step_replays_and_a_check_settles_an_uncertain_one<S: Store>(
    fx: Fixture<S>,
) {
    let (idem, clock, _) = with_steps(fx);
    let inv = invocation("steps-applied", &serde_json::json!({"order": 1}));
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let done = idem
        .execute(&inv, |ctx| {
            let effects = Arc::clone(&effects);
            async move {
                let charged = charge(&ctx, &effects).await?;
                let mailed = email(&ctx, &effects, Email::Checked(Answer::Applied)).await?;
                Ok::<_, BoxError>(format!("{charged}+{mailed}"))
            }
        })
        .await
        .expect("the takeover completes from the steps");
    assert_eq!(done.value(), "ch_1+msg_found");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(
        (effects.charges(), effects.emails()),
        (1, 1),
        "one effect per step"
    );
    let replay = checkout(&idem, &inv, &effects, Email::Unchecked)
        .await
        .expect("replay");
    assert_eq!(replay, "ch_1+msg_found");
    assert_eq!((effects.charges(), effects.emails()), (1, 1));
}

/// Case: an uncertain step without a check is never re-run blind: the operation is held
/// INDETERMINATE, with its steps, for an operator.
pub async fn an_uncertain_step_without_a_check_holds_the_operation<S: Store>(fx: Fixture<S>) {
    // Even the policy that re-runs a handler with no step record does not re-run this step.
    let (idem, clock, _) = engine(fx, Config::default());
    let idem = idem.with_recovery(Recovery::Steps);
    let inv = invocation("steps-unchecked", &serde_json::json!({"order": 2}));
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let err = checkout(&idem, &inv, &effects, Email::Unchecked)
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!(
        (effects.charges(), effects.emails()),
        (1, 1),
        "nothing re-ran"
    );
    let record = stored(&idem, inv.key(), "held").await;
    assert_eq!(record.status, Status::Indeterminate);
    assert_eq!(record.steps.len(), 2, "the steps are kept for the operator");
    let again = checkout(&idem, &inv, &effects, Email::Checked(Answer::NotApplied))
        .await
        .expect_err("still held");
    assert!(
        matches!(again, Error::Indeterminate { .. }),
        "got {again:?}"
    );
    assert_eq!(effects.emails(), 1);
}

/// Case: a check that finds nothing runs the uncertain step once more (with the same
/// downstream key); one that cannot tell holds the operation; one that fails gives the claim
/// back for the next delivery to ask again.
pub async fn a_check_decides_an_uncertain_step<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = with_steps(fx);
    let effects = Arc::new(Effects::default());

    let inv = invocation("steps-not-applied", &serde_json::json!({"order": 3}));
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let done = checkout(&idem, &inv, &effects, Email::Checked(Answer::NotApplied))
        .await
        .expect("the e-mail is sent");
    assert_eq!(done, "ch_1+msg_2");
    assert_eq!(
        (effects.charges(), effects.emails()),
        (1, 2),
        "the check said not applied"
    );
    let keys = effects.email_keys.lock().expect("keys").clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the same downstream key on both attempts");

    let inv = invocation("steps-unknown", &serde_json::json!({"order": 4}));
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let err = checkout(&idem, &inv, &effects, Email::Checked(Answer::Unknown))
        .await
        .expect_err("unknown");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!(effects.emails(), 1);
    assert_eq!(
        stored(&idem, inv.key(), "held").await.status,
        Status::Indeterminate
    );

    let inv = invocation("steps-check-fails", &serde_json::json!({"order": 5}));
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let err = checkout(&idem, &inv, &effects, Email::Checked(Answer::Fails))
        .await
        .expect_err("the check failed");
    assert!(matches!(err, Error::ReconcileFailed { .. }), "got {err:?}");
    let record = stored(&idem, inv.key(), "given back").await;
    assert_eq!(record.status, Status::InProgress);
    clock.advance(Duration::from_millis(2));
    assert!(
        record.lease_is_takeable(clock.now()),
        "given back, not held for its lease"
    );
    let done = checkout(&idem, &inv, &effects, Email::Checked(Answer::Applied))
        .await
        .expect("the next delivery asks again");
    assert_eq!(done, "ch_1+msg_found");
    assert_eq!((effects.charges(), effects.emails()), (1, 1));
}

/// Case: an uncertain repeat-safe step runs again, with the same downstream key.
pub async fn a_repeat_safe_step_runs_again_with_its_key<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = with_steps(fx);
    let inv = invocation("steps-repeat-safe", &serde_json::json!({"order": 6}));
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, true).await;
    clock.advance(LEASE + Duration::from_secs(1));

    let done = checkout(&idem, &inv, &effects, Email::RepeatSafe)
        .await
        .expect("completes");
    assert_eq!(done, "ch_1+msg_2");
    assert_eq!((effects.charges(), effects.emails()), (1, 2));
    let keys = effects.email_keys.lock().expect("keys").clone();
    assert_eq!(keys[0], keys[1], "the provider sees one key");
    assert_eq!(keys[0], inv.key().downstream("email"));
}

/// Case: steps are deterministic: another order after a takeover, or a name used twice in one
/// attempt, is [`Error::StepMismatch`] and the operation is held, never answered from another
/// step's result.
pub async fn steps_in_another_order_or_a_reused_name_are_refused<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = with_steps(fx);
    let inv = invocation("steps-order", &serde_json::json!({"order": 7}));
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let err = idem
        .execute(&inv, |ctx| {
            let effects = Arc::clone(&effects);
            async move {
                let mailed = email(&ctx, &effects, Email::RepeatSafe).await?;
                Ok::<_, BoxError>(mailed)
            }
        })
        .await
        .expect_err("another order");
    match err {
        Error::StepMismatch { step, expected, .. } => {
            assert_eq!(
                (step.as_str(), expected.as_deref()),
                ("email", Some("charge"))
            );
        }
        other => panic!("got {other:?}"),
    }
    assert_eq!((effects.charges(), effects.emails()), (1, 1));
    assert_eq!(
        stored(&idem, inv.key(), "held").await.status,
        Status::Indeterminate
    );

    let inv = invocation("steps-twice", &serde_json::json!({"order": 8}));
    let err = idem
        .execute(&inv, |ctx| {
            let effects = Arc::clone(&effects);
            async move {
                charge(&ctx, &effects).await?;
                // Swallowing the error does not help: the engine answers from the halt.
                let _ = charge(&ctx, &effects).await;
                Ok::<_, BoxError>(String::from("done"))
            }
        })
        .await
        .expect_err("a name used twice");
    assert!(
        matches!(&err, Error::StepMismatch { expected: None, .. }),
        "got {err:?}"
    );
    assert_eq!(
        effects.charges(),
        2,
        "the first run only (one per operation)"
    );
    assert_eq!(
        stored(&idem, inv.key(), "held").await.status,
        Status::Indeterminate
    );
}

/// Case: a retryable failure after a step never releases the record (its steps would go with
/// it): the claim is given back, and the next delivery replays the step.
pub async fn a_retryable_failure_after_a_step_gives_the_claim_back<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = with_steps(fx);
    let inv = invocation("steps-retryable", &serde_json::json!({"order": 9}));
    let effects = Arc::new(Effects::default());
    let err = idem
        .execute(&inv, |ctx| {
            let effects = Arc::clone(&effects);
            async move {
                charge(&ctx, &effects).await?;
                Err::<String, BoxError>(Box::new(std::io::Error::other("the warehouse timed out")))
            }
        })
        .await
        .expect_err("retryable");
    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    let record = stored(&idem, inv.key(), "kept, with its step").await;
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.steps.len(), 2, "the step, then the give-back's mark");
    assert!(record.steps[0].is_done(), "the charge's result was written");
    assert_eq!(record.steps[1], StepRecord::given_back(1));

    clock.advance(Duration::from_millis(2));
    let done = idem
        .execute(&inv, |ctx| {
            let effects = Arc::clone(&effects);
            async move {
                let charged = charge(&ctx, &effects).await?;
                Ok::<_, BoxError>(charged)
            }
        })
        .await
        .expect("the redelivery takes over at once");
    assert_eq!(done.value(), "ch_1");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(effects.charges(), 1, "replayed, not charged again");
}

/// Case: a step whose effect says it did not apply ([`NotApplied`]) is withdrawn: with no other
/// step, a retryable failure releases the operation and the next delivery runs afresh.
pub async fn a_step_that_did_not_apply_is_withdrawn<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = with_steps(fx);
    let inv = invocation("steps-withdrawn", &serde_json::json!({"order": 10}));
    let err = idem
        .execute(&inv, |ctx| async move {
            let sent = ctx
                .step("email")
                .run(|_key| async {
                    Err::<String, _>(
                        NotApplied::new(std::io::Error::other("connection refused")).into(),
                    )
                })
                .await?;
            Ok::<_, BoxError>(sent)
        })
        .await
        .expect_err("retryable");
    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    assert!(
        idem.store().get(inv.key()).await.expect("get").is_none(),
        "released: nothing happened"
    );
    let done = idem
        .execute(&inv, |ctx| async move {
            ctx.step("email")
                .run(|_key| async { Ok::<_, BoxError>(String::from("msg_1")) })
                .await
        })
        .await
        .expect("runs afresh");
    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
}

/// Case: a handler that panics after a step keeps the step's result for the takeover.
pub async fn a_panic_after_a_step_keeps_its_result<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = with_steps(fx);
    let inv = invocation("steps-panic", &serde_json::json!({"order": 11}));
    let effects = Arc::new(Effects::default());
    let panicked = tokio::spawn({
        let (idem, inv, effects) = (idem.clone(), inv.clone(), Arc::clone(&effects));
        async move {
            idem.execute(&inv, |ctx| async move {
                charge(&ctx, &effects).await?;
                if effects.charges() > 0 {
                    panic!("a bug after the charge");
                }
                Ok::<_, BoxError>(String::new())
            })
            .await
        }
    })
    .await;
    assert!(panicked.is_err_and(|join| join.is_panic()));
    let record = stored(&idem, inv.key(), "given back").await;
    assert!(record.steps.first().is_some_and(StepRecord::is_done));

    clock.advance(Duration::from_secs(6));
    let done = checkout(&idem, &inv, &effects, Email::Unchecked)
        .await
        .expect("the takeover replays the charge and sends");
    assert_eq!(done, "ch_1+msg_1");
    assert_eq!((effects.charges(), effects.emails()), (1, 1));
}

/// Case: the default recovery never re-runs a handler blind, whether it recorded no step or
/// some (it may have acted outside them): the operation is held with its steps for an
/// operator. [`Recovery::Steps`] declares that its effects are its steps, so one that recorded
/// none runs again.
pub async fn a_takeover_without_steps_is_held_unless_declared<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let inv = invocation("steps-default", &serde_json::json!({"order": 12}));
    crash_after_run(&idem, &inv, &runs).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let err = idem
        .execute(&inv, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(2_u32)
        })
        .await
        .expect_err("held by default");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never re-run blind");

    let inv = invocation(
        "steps-default-with-steps",
        &serde_json::json!({"order": 16}),
    );
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, true).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let err = checkout(&idem, &inv, &effects, Email::RepeatSafe)
        .await
        .expect_err("held by default, steps or not");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!((effects.charges(), effects.emails()), (1, 1));
    let record = stored(&idem, inv.key(), "held").await;
    assert_eq!(
        (record.status, record.steps.len()),
        (Status::Indeterminate, 2)
    );

    let steps = idem.clone().with_recovery(Recovery::Steps);
    let inv = invocation("steps-declared", &serde_json::json!({"order": 13}));
    crash_after_run(&steps, &inv, &runs).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let done = steps
        .execute(&inv, |ctx| async move {
            ctx.step("charge")
                .run(|_key| async { Ok::<_, BoxError>(7_u32) })
                .await
        })
        .await
        .expect("no intent recorded: nothing happened, it runs");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
}

/// Case: a step write that fails, before it applies or after (its answer lost), never runs the
/// effect blind: one lost answer is retried transparently; a write that keeps failing stops
/// the attempt before the effect, and with nothing else recorded the operation is released
/// (the intent with it): the next delivery runs the step once.
pub async fn a_failing_step_write_never_runs_the_effect_blind<S: Store + Clone>(fx: Fixture<S>) {
    let store = FaultyStore::new(fx.store);
    let clock = fx.clock;
    let idem = Idempotency::new(store.clone())
        .with_clock(clock.clone())
        .with_recovery(Recovery::Steps);
    let runs = Arc::new(AtomicUsize::new(0));
    let send = |ctx: ExecutionContext| {
        let runs = Arc::clone(&runs);
        async move {
            ctx.step("email")
                .run(|_key| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(String::from("msg"))
                })
                .await
        }
    };

    let inv = invocation("steps-lost-answer", &serde_json::json!({"order": 14}));
    store.inject(
        Primitive::RecordSteps,
        Fault::FailAfter(FaultKind::Unavailable),
    );
    idem.execute(&inv, send)
        .await
        .expect("one lost answer is retried");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    for (case, fault) in [
        ("before", Fault::FailBefore(FaultKind::Unavailable)),
        ("after", Fault::FailAfter(FaultKind::Unavailable)),
        ("throttled", Fault::FailBefore(FaultKind::Throttled)),
    ] {
        runs.store(0, Ordering::SeqCst);
        let inv = invocation(
            &format!("steps-failing-{case}"),
            &serde_json::json!({"order": 15}),
        );
        for _ in 0..5 {
            store.inject(Primitive::RecordSteps, fault);
        }
        let err = idem
            .execute(&inv, send)
            .await
            .expect_err("the intent is not recorded");
        assert!(matches!(err, Error::Store(_)), "{case}: {err:?}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "{case}: the effect did not run"
        );
        assert!(
            idem.store().get(inv.key()).await.expect("get").is_none(),
            "{case}: nothing happened, so the operation is released"
        );
        let done = idem
            .execute(&inv, send)
            .await
            .expect("the next delivery runs the step");
        assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}: one effect");
    }
}

/// Case: a takeover starts from the steps the record holds when it commits: an expired
/// holder that records a step after the taker read the record fails the takeover, so the
/// taker never runs that step as new.
pub async fn a_step_recorded_after_the_takers_read_fails_the_takeover<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = with_steps(fx);
    let inv = invocation("steps-late-intent", &serde_json::json!({"order": 17}));
    let read = crash_after_run(&idem, &inv, &Arc::default()).await;
    assert!(read.steps.is_empty());
    // The expired holder is still running: it records an intent after the taker's read.
    let target = lambda_idempotency::store::Target {
        key: inv.key(),
        identity: None,
        guard: lambda_idempotency::store::Guard::Lease(&read.lease.token),
    };
    let late = [StepRecord::intent("email", 1)];
    let fence = idem
        .store()
        .record_steps(target, &late)
        .await
        .expect("write");
    assert_eq!(fence, lambda_idempotency::store::Fence::Held);
    clock.advance(LEASE + Duration::from_secs(1));
    let lease = lambda_idempotency::record::Lease {
        token: "taker".into(),
        attempt: 2,
        expires_at: clock.now() + LEASE,
    };
    let expires_at = clock.now() + Duration::from_secs(3600);
    let stale = idem
        .store()
        .take_over(&read, &lease, expires_at, clock.now())
        .await
        .expect("take over");
    assert!(
        matches!(stale, lambda_idempotency::store::Fence::Lost { .. }),
        "a takeover from a stale read fails: {stale:?}"
    );
    // A rewrite of the same length (an intent withdrawn, another recorded) fails it too.
    let fresh = stored(&idem, inv.key(), "record").await;
    let rewritten = [StepRecord::intent("sms", 1)];
    let fence = idem
        .store()
        .record_steps(target, &rewritten)
        .await
        .expect("write");
    assert_eq!(fence, lambda_idempotency::store::Fence::Held);
    let stale = idem
        .store()
        .take_over(&fresh, &lease, expires_at, clock.now())
        .await
        .expect("take over");
    assert!(
        matches!(stale, lambda_idempotency::store::Fence::Lost { .. }),
        "the same number of steps, other steps: {stale:?}"
    );
    let fresh = stored(&idem, inv.key(), "record").await;
    let taken = idem
        .store()
        .take_over(&fresh, &lease, expires_at, clock.now())
        .await
        .expect("take over");
    assert_eq!(
        taken,
        lambda_idempotency::store::Fence::Held,
        "from a fresh read"
    );
}

/// Case: an operation whose record TTL deleted while it was IN_PROGRESS (its steps with it)
/// is adopted from its evidence, and even under [`Recovery::Steps`] it is held, never re-run:
/// the record that said which steps ran is gone, which is not the same as no step.
pub async fn an_adopted_orphan_is_held_even_when_its_effects_are_steps<S: Store>(fx: Fixture<S>) {
    fx.require(super::conformance::Capability::Evidence);
    let config = Config::builder()
        .retention(Duration::from_secs(60))
        .build()
        .expect("config");
    let (idem, clock, sweep) = engine(fx, config);
    let idem = idem.with_recovery(Recovery::Steps);
    let inv = invocation("steps-orphan", &serde_json::json!({"order": 18}))
        .with_identity("invoice:steps-orphan")
        .expect("identity");
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(120));
    assert!(sweep().await >= 1, "TTL deleted the record, steps and all");

    let err = checkout(&idem, &inv, &effects, Email::Unchecked)
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!(
        (effects.charges(), effects.emails()),
        (1, 1),
        "nothing ran again"
    );
}

/// Case: the adoption of an orphan whose record TTL deleted (its steps with it) stops before
/// it holds the operation (its task cancelled): the record it re-created says its steps are
/// lost, so the next takeover holds the operation too, instead of reading "no step" as
/// "nothing happened" and running every step again. The simulation's seed 917 found it.
pub async fn an_adopted_record_stays_held_after_its_adoption_stopped<S: Store + Clone>(
    fx: Fixture<S>,
) {
    fx.require(super::conformance::Capability::Evidence);
    let store = FaultyStore::new(fx.store);
    let (clock, sweep) = (fx.clock, fx.sweep);
    let config = Config::builder()
        .retention(Duration::from_secs(60))
        .build()
        .expect("config");
    let idem = Idempotency::new(store.clone())
        .with_config(config)
        .with_clock(clock.clone())
        .with_recovery(Recovery::Steps);
    let inv = invocation("steps-orphan-stopped", &serde_json::json!({"order": 20}))
        .with_identity("invoice:steps-orphan-stopped")
        .expect("identity");
    let effects = Arc::new(Effects::default());
    crash_while_emailing(&idem, &inv, &effects, false).await;
    clock.advance(LEASE + Duration::from_secs(120));
    assert!(sweep().await >= 1, "TTL deleted the record, steps and all");

    // The adoption re-creates the record, then its hold is cancelled before it is written.
    store.inject(Primitive::Settle, Fault::CancelBefore);
    let stopped = store
        .cancellable(checkout(&idem, &inv, &effects, Email::Unchecked))
        .await;
    assert!(stopped.is_none(), "the adoption's task was cancelled");
    let record = stored(&idem, inv.key(), "re-created by the adoption").await;
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(
        record.steps,
        [StepRecord::steps_lost()],
        "marked: steps unknown"
    );

    clock.advance(LEASE + Duration::from_secs(1));
    let err = checkout(&idem, &inv, &effects, Email::Unchecked)
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    assert_eq!(
        (effects.charges(), effects.emails()),
        (1, 1),
        "nothing ran again"
    );
}

/// Case: a task cancelled right after its step's intent committed (the effect never ran):
/// the claim is given back, the intent stands, and the next delivery's check finds nothing
/// and runs the step once.
pub async fn a_task_cancelled_after_its_intent_leaves_the_step_to_its_check<S: Store + Clone>(
    fx: Fixture<S>,
) {
    let store = FaultyStore::new(fx.store);
    let clock = fx.clock;
    let idem = Idempotency::new(store.clone())
        .with_clock(clock.clone())
        .with_recovery(Recovery::Steps);
    let inv = invocation("steps-cancelled", &serde_json::json!({"order": 19}));
    let runs = Arc::new(AtomicUsize::new(0));
    let send = |ctx: ExecutionContext| {
        let (runs, checked) = (Arc::clone(&runs), Arc::clone(&runs));
        async move {
            ctx.step("email")
                .checked_by(move |_key: String| {
                    let found = checked.load(Ordering::SeqCst) > 0;
                    async move {
                        Ok::<_, BoxError>(match found {
                            true => Checked::Applied(String::from("msg")),
                            false => Checked::NotApplied,
                        })
                    }
                })
                .run(|_key| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(String::from("msg"))
                })
                .await
        }
    };
    store.inject(Primitive::RecordSteps, Fault::CancelAfter);
    let cancelled = store.cancellable(idem.execute(&inv, send)).await;
    assert!(cancelled.is_none(), "the task was cancelled");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the effect never ran");
    let record = stored(&idem, inv.key(), "given back").await;
    assert_eq!(
        record.steps,
        [StepRecord::intent("email", 1)],
        "the intent committed"
    );

    clock.advance(super::conformance::LEASE + Duration::from_secs(1));
    let done = idem
        .execute(&inv, send)
        .await
        .expect("the check finds nothing: it runs");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one effect");
}
