//! Conformance cases beyond TTL: permanent evidence, failure classes, reconciled takeover,
//! downstream keys, late duplicates. Run against every store with the rest of the suite.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::failure::{ByErrorType, FailureClass, HasFailureClass, Terminal};
use lambda_idempotency::key::JsonPointer;
use lambda_idempotency::reconcile::{Checked, Takeover};
use lambda_idempotency::record::{Lease, Record, Status};
use lambda_idempotency::store::{Claim, Store, StoreExt};
use lambda_idempotency::{BoxError, Config, Error, Idempotency, Invocation, Origin, Resolution};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::conformance::{
    Capability, Fixture, LEASE, counted, crash_after_run, engine, evidence_key, invocation,
    operator, race, rerunning, start_time, stored,
};

/// An invoice operation: it keeps permanent evidence under `identity`, with the invoice id as
/// the result reference.
fn invoice(material: &str, identity: &str) -> Invocation {
    invocation(material, &json!({"amount": 10}))
        .with_identity(identity)
        .expect("a valid identity")
        .with_result_ref(JsonPointer::new("/invoice_id").expect("pointer"))
}

async fn issue_invoice(runs: &AtomicUsize, id: &str) -> Result<Value, std::io::Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(json!({"invoice_id": id, "total": 10}))
}

fn short_retention() -> Config {
    Config::builder()
        .retention(Duration::from_secs(3600))
        .build()
        .expect("config")
}

fn assert_key_expired_conflict(err: &Error, status: Status, result_ref: Option<&str>) {
    let Error::KeyExpiredConflict { key, evidence } = err else {
        panic!("expected KeyExpiredConflict, got {err:?}");
    };
    assert_eq!(&evidence.key, key);
    assert_eq!(evidence.status, status);
    assert_eq!(evidence.result_ref.as_deref(), result_ref);
    assert!(evidence.completed_at.is_some());
}

/// Case: Expired and swept record with evidence is not rerun.
pub async fn expired_and_swept_record_with_evidence_is_not_rerun<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, sweep) = engine(fx, short_retention());
    let inv = invoice("order-20", "invoice:o-20:rev-1");
    let runs = AtomicUsize::new(0);

    idem.execute(&inv, |_| issue_invoice(&runs, "inv-20"))
        .await
        .expect("first");
    clock.advance(Duration::from_secs(3600 + 2));
    assert!(sweep().await >= 1, "TTL deleted the expired record");
    assert_eq!(idem.store().get(inv.key()).await.expect("get"), None);

    let err = idem
        .execute(&inv, |_| issue_invoice(&runs, "inv-20-again"))
        .await
        .expect_err("not re-run");

    assert_key_expired_conflict(&err, Status::Completed, Some("inv-20"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let evidence = idem
        .store()
        .evidence(&evidence_key("invoice:o-20:rev-1"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(evidence.fingerprint, amount_fingerprint());
}

/// The fingerprint of `invocation`'s intent, `{"amount": 10}`.
fn amount_fingerprint() -> lambda_idempotency::Fingerprint {
    lambda_idempotency::Fingerprint::of(&json!({"amount": 10})).expect("fingerprint")
}

/// Case: Expired record with evidence is not rerun.
pub async fn expired_record_with_evidence_is_not_rerun<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, clock, _) = engine(fx, short_retention());
    let inv = invoice("order-21", "invoice:o-21:rev-1");
    let runs = AtomicUsize::new(0);

    idem.execute(&inv, |_| issue_invoice(&runs, "inv-21"))
        .await
        .expect("first");
    clock.advance(Duration::from_secs(3600 + 2));
    let err = idem
        .execute(&inv, |_| issue_invoice(&runs, "again"))
        .await
        .expect_err("not re-run");

    assert_key_expired_conflict(&err, Status::Completed, Some("inv-21"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Case: Identity taken by another key is refused.
pub async fn identity_taken_by_another_key_is_refused<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, _, _) = engine(fx, Config::default());
    let first = invoice("message-a", "invoice:o-22:rev-1");
    let other = invoice("message-b", "invoice:o-22:rev-1");
    let runs = AtomicUsize::new(0);

    idem.execute(&first, |_| issue_invoice(&runs, "inv-22"))
        .await
        .expect("first");
    let err = idem
        .execute(&other, |_| issue_invoice(&runs, "twice"))
        .await
        .expect_err("same identity");

    let Error::KeyExpiredConflict { evidence, .. } = &err else {
        panic!("expected KeyExpiredConflict, got {err:?}");
    };
    assert_eq!(
        &evidence.key,
        first.key(),
        "the evidence names the operation that executed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        idem.store().get(other.key()).await.expect("get"),
        None,
        "nothing written for the refused key"
    );
}

/// Case: Terminal failure is replayed not rerun.
pub async fn terminal_failure_is_replayed_not_rerun<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invoice("order-23", "invoice:o-23:rev-1");
    let runs = AtomicUsize::new(0);
    let declined = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<Value, _>(Terminal::new(
            "card_declined",
            std::io::Error::other("the card was declined"),
        ))
    };

    let err = idem
        .execute(&inv, |_| declined())
        .await
        .expect_err("declined");
    let Error::Handler { source } = &err else {
        panic!("expected Error::Handler, got {err:?}");
    };
    assert!(
        source.downcast_ref::<Terminal>().is_some(),
        "the first caller gets its own error"
    );
    for _ in 0..3 {
        let err = idem
            .execute(&inv, |_| declined())
            .await
            .expect_err("retained");
        match err {
            Error::Failed { failure, .. } => {
                assert_eq!(failure.kind, "card_declined");
                assert_eq!(failure.message, "the card was declined");
            }
            other => panic!("expected the retained failure, got {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one execution for four callers"
    );
    assert_eq!(
        stored(&idem, inv.key(), "record").await.status,
        Status::Failed
    );
    let evidence = idem
        .store()
        .evidence(&evidence_key("invoice:o-23:rev-1"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(evidence.status, Status::Failed);
}

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("the card was declined")]
    Declined,
    #[error("the gateway timed out before charging")]
    GatewayTimeout,
}

impl HasFailureClass for PaymentError {
    fn failure_class(&self) -> FailureClass {
        match self {
            Self::Declined => FailureClass::terminal("card_declined"),
            Self::GatewayTimeout => FailureClass::Retryable,
        }
    }
}

/// Case: Handler error type decides the class.
pub async fn handler_error_type_decides_the_class<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let idem = idem.with_classifier(ByErrorType::<PaymentError>::new());
    let timeout = invocation("order-24", &json!({"amount": 10}));
    let declined = invocation("order-25", &json!({"amount": 10}));

    let _ = idem
        .execute(&timeout, |_| async {
            Err::<u32, _>(PaymentError::GatewayTimeout)
        })
        .await;
    let _ = idem
        .execute(&declined, |_| async {
            Err::<u32, _>(PaymentError::Declined)
        })
        .await;

    assert_eq!(
        idem.store().get(timeout.key()).await.expect("get"),
        None,
        "retryable: released"
    );
    let retry = idem
        .execute(&timeout, |_| async { Ok::<_, PaymentError>(1_u32) })
        .await
        .expect("retry runs");
    assert_eq!(retry.origin(), Origin::Executed { attempt: 1 });
    let err = idem
        .execute(&declined, |_| async { Ok::<_, PaymentError>(1_u32) })
        .await
        .expect_err("terminal: retained");
    assert!(
        matches!(&err, Error::Failed { failure, .. } if failure.kind == "card_declined"),
        "got {err:?}"
    );
}

/// Case: Retryable failure releases evidence and reruns.
pub async fn retryable_failure_releases_evidence_and_reruns<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invoice("order-26", "invoice:o-26:rev-1");
    let runs = AtomicUsize::new(0);

    let err = idem
        .execute(&inv, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<Value, _>(std::io::Error::other("ledger unavailable"))
        })
        .await
        .expect_err("retryable");
    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    assert_eq!(idem.store().get(inv.key()).await.expect("get"), None);
    assert_eq!(
        idem.store()
            .evidence(&evidence_key("invoice:o-26:rev-1"))
            .await
            .expect("evidence"),
        None,
        "evidence released too"
    );

    idem.execute(&inv, |_| issue_invoice(&runs, "inv-26"))
        .await
        .expect("re-run");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let evidence = idem
        .store()
        .evidence(&evidence_key("invoice:o-26:rev-1"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(
        (evidence.status, evidence.result_ref.as_deref()),
        (Status::Completed, Some("inv-26"))
    );
}

/// A reconciler that answers from a script and records what it was asked.
#[derive(Clone, Default)]
struct ScriptedReconciler {
    answers: Arc<Mutex<Vec<Result<Checked, String>>>>,
    asked: Arc<Mutex<Vec<(u32, u32)>>>,
}

impl ScriptedReconciler {
    fn answering(answers: Vec<Result<Checked, String>>) -> Self {
        let reconciler = Self::default();
        *reconciler.answers.lock().expect("lock") = answers.into_iter().rev().collect();
        reconciler
    }

    /// (new attempt, crashed attempt) of each question asked.
    fn asked(&self) -> Vec<(u32, u32)> {
        self.asked.lock().expect("lock").clone()
    }

    fn reconciler(
        &self,
    ) -> impl Fn(Takeover) -> std::future::Ready<Result<Checked, BoxError>> + Send + Sync + 'static
    {
        let this = self.clone();
        move |takeover: Takeover| {
            this.asked
                .lock()
                .expect("lock")
                .push((takeover.attempt, takeover.previous.lease.attempt));
            let answer = this
                .answers
                .lock()
                .expect("lock")
                .pop()
                .expect("a scripted answer");
            std::future::ready(answer.map_err(BoxError::from))
        }
    }
}

/// An engine with a scripted reconciler, and `crashed` claims whose leases have run out: the
/// next delivery of each is a takeover.
async fn after_crashes<S: Store>(
    fx: Fixture<S>,
    answers: Vec<Result<Checked, String>>,
    crashed: &[&Invocation],
) -> (
    Idempotency,
    ManualClock,
    ScriptedReconciler,
    Arc<AtomicUsize>,
) {
    let script = ScriptedReconciler::answering(answers);
    let (idem, clock, _) = engine(fx, Config::default());
    let idem = idem.with_reconciler(script.reconciler());
    // Every crashed attempt ran its handler: the cases count those runs too.
    let runs = Arc::new(AtomicUsize::new(0));
    for inv in crashed {
        crash_after_run(&idem, inv, &runs).await;
    }
    clock.advance(LEASE + Duration::from_secs(1));
    (idem, clock, script, runs)
}

/// Case: Takeover reconciled as applied records without running.
pub async fn takeover_reconciled_as_applied_records_without_running<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let inv = invoice("order-27", "invoice:o-27:rev-1");
    let applied = json!({"invoice_id": "inv-provider", "total": 10});
    let (idem, _, script, runs) =
        after_crashes(fx, vec![Ok(Checked::Applied(applied))], &[&inv]).await;

    let done = idem
        .execute(&inv, |_| issue_invoice(&runs, "inv-again"))
        .await
        .expect("reconciled");

    assert_eq!(done.origin(), Origin::Reconciled { attempt: 2 });
    assert_eq!(done.value()["invoice_id"], "inv-provider");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the crashed run only: the handler did not run again"
    );
    assert_eq!(script.asked(), [(2, 1)]);
    let replay = idem
        .execute(&inv, |_| issue_invoice(&runs, "inv-again"))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(replay.raw_json().get(), done.raw_json().get());
    let evidence = idem
        .store()
        .evidence(&evidence_key("invoice:o-27:rev-1"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(
        (evidence.status, evidence.result_ref.as_deref()),
        (Status::Completed, Some("inv-provider"))
    );
}

/// Case: Takeover reconciled as not applied runs the handler.
pub async fn takeover_reconciled_as_not_applied_runs_the_handler<S: Store>(fx: Fixture<S>) {
    let inv = invocation("order-28", &json!({"amount": 10}));
    let (idem, _, script, runs) = after_crashes(fx, vec![Ok(Checked::NotApplied)], &[&inv]).await;

    let done = idem
        .execute(&inv, |ctx| counted(&runs, ctx.attempt()))
        .await
        .expect("re-run");

    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the crashed run, and the re-run NotApplied excuses"
    );
    assert_eq!(script.asked(), [(2, 1)]);
}

/// Case: Takeover reconciled as unknown holds for an operator.
pub async fn takeover_reconciled_as_unknown_holds_for_an_operator<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let resolved = invoice("order-29", "invoice:o-29:rev-1");
    let released = invoice("order-30", "invoice:o-30:rev-1");
    let unknown = vec![Ok(Checked::Unknown), Ok(Checked::Unknown)];
    let (idem, clock, script, _) = after_crashes(fx, unknown, &[&resolved, &released]).await;
    let runs = AtomicUsize::new(0);

    for inv in [&resolved, &released] {
        let err = idem
            .execute(inv, |_| issue_invoice(&runs, "x"))
            .await
            .expect_err("unknown");
        assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    }
    clock.advance(LEASE * 4);
    for _ in 0..3 {
        let err = idem
            .execute(&resolved, |_| issue_invoice(&runs, "x"))
            .await
            .expect_err("held");
        assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        script.asked().len(),
        2,
        "asked once per takeover, not per caller"
    );
    let evidence = idem
        .store()
        .evidence(&evidence_key("invoice:o-29:rev-1"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(evidence.status, Status::Indeterminate);

    let operator_answer = json!({"invoice_id": "inv-found-by-operator", "total": 10});
    assert!(
        idem.resolve::<Value>(
            resolved.key(),
            Resolution::Completed(operator_answer.clone()),
            &operator()
        )
        .await
        .expect("resolve")
    );
    assert!(
        !idem
            .resolve::<Value>(resolved.key(), Resolution::Release, &operator())
            .await
            .expect("resolve"),
        "only INDETERMINATE resolves"
    );
    let replay = idem
        .execute(&resolved, |_| issue_invoice(&runs, "x"))
        .await
        .expect("replay");
    assert_eq!(replay.value(), &operator_answer);

    assert!(
        idem.resolve::<Value>(released.key(), Resolution::Release, &operator())
            .await
            .expect("release")
    );
    assert_eq!(
        idem.store()
            .evidence(&evidence_key("invoice:o-30:rev-1"))
            .await
            .expect("evidence"),
        None
    );
    let rerun = idem
        .execute(&released, |_| issue_invoice(&runs, "inv-30"))
        .await
        .expect("runs afresh");
    assert_eq!(rerun.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Case: a failing reconciler gives the claim back at once, as a failed step check does: the
/// next delivery asks again without waiting out the lease, and nothing runs in parallel.
pub async fn a_failing_reconciler_gives_the_claim_back<S: Store>(fx: Fixture<S>) {
    let inv = invocation("order-31", &json!({"amount": 10}));
    let answers = vec![Err("provider unreachable".into()), Ok(Checked::NotApplied)];
    let (idem, clock, script, _) = after_crashes(fx, answers, &[&inv]).await;
    let runs = AtomicUsize::new(0);

    let err = idem
        .execute(&inv, |ctx| counted(&runs, ctx.attempt()))
        .await
        .expect_err("reconciler failed");
    assert!(matches!(err, Error::ReconcileFailed { .. }), "got {err:?}");
    let record = stored(&idem, inv.key(), "given back").await;
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.lease.attempt, 2);
    assert!(
        record.lease.expires_at <= clock.now(),
        "the lease is cut to now, not left to run out"
    );

    clock.advance(Duration::from_millis(1));
    let done = idem
        .execute(&inv, |ctx| counted(&runs, ctx.attempt()))
        .await
        .expect("asked again at once");

    assert_eq!(done.origin(), Origin::Executed { attempt: 3 });
    assert_eq!(script.asked(), [(2, 1), (3, 2)]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Case: Concurrent claims across both tables have one winner.
pub async fn concurrent_claims_across_both_tables_have_one_winner<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let (idem, _, _) = engine(fx, Config::default());
    // Half the callers share one key; the others each bring a key of their own. All declare
    // the same business identity.
    let invocations = (0..16)
        .map(|i| {
            let material = if i % 2 == 0 {
                "order-32".to_owned()
            } else {
                format!("order-32-copy-{i}")
            };
            invoice(&material, "invoice:o-32:rev-1")
        })
        .collect();

    let (answers, runs) = race(&idem, invocations).await;

    let mut winners = 0;
    for answer in answers {
        match answer {
            Ok(done) => {
                assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
                winners += 1;
            }
            Err(Error::AlreadyInProgress { .. } | Error::KeyExpiredConflict { .. }) => {}
            Err(other) => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!((winners, runs), (1, 1), "one winner, one execution");
}

fn claim_record(material: &str, identity: &str, token: &str) -> Record {
    let inv = invocation(material, &json!({"amount": 10}));
    let now = start_time();
    Record {
        key: inv.key().clone(),
        status: Status::InProgress,
        fingerprint: amount_fingerprint(),
        lease: Lease {
            token: token.into(),
            attempt: 1,
            expires_at: now + LEASE,
        },
        expires_at: now + Duration::from_secs(3600),
        outcome: None,
        created_at: now,
        completed_at: None,
        request_id: None,
        identity: Some(identity.into()),
        audit: None,
        steps: Vec::new(),
        steps_version: 0,
    }
}

/// Case: Cancelled claim reports which condition failed.
pub async fn cancelled_claim_reports_which_condition_failed<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let store = fx.store;
    let now = start_time();
    let first = claim_record("order-33", "invoice:o-33", "token-1");

    assert_eq!(
        store.claim(&first, now).await.expect("claim"),
        Claim::Acquired
    );
    match store
        .claim(&claim_record("order-33", "invoice:o-33", "token-2"), now)
        .await
        .expect("claim")
    {
        Claim::Existing(existing) => assert_eq!(
            existing.lease.token, "token-1",
            "the record's condition failed"
        ),
        other => panic!("expected the existing record, got {other:?}"),
    }
    match store
        .claim(&claim_record("order-34", "invoice:o-33", "token-3"), now)
        .await
        .expect("claim")
    {
        Claim::IdentityTaken(evidence) => {
            assert_eq!(evidence.key, first.key, "the identity's condition failed");
            assert_eq!(
                (evidence.status, evidence.identity.as_str()),
                (Status::InProgress, "invoice:o-33")
            );
        }
        other => panic!("expected the standing evidence, got {other:?}"),
    }
    assert_eq!(
        store
            .get(&claim_record("order-34", "x", "t").key)
            .await
            .expect("get"),
        None,
        "nothing written"
    );
    let other_identity = claim_record("order-35", "invoice:o-35", "token-4");
    assert_eq!(
        store.claim(&other_identity, now).await.expect("claim"),
        Claim::Acquired
    );
}

/// Case: Downstream key is the same on every attempt.
pub async fn downstream_key_is_the_same_on_every_attempt<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = rerunning(fx, Config::default());
    let inv = invocation("order-36", &json!({"amount": 10}));
    let (seen_tx, seen_rx) = oneshot::channel();
    let crashed = tokio::spawn({
        let (idem, inv) = (idem.clone(), inv.clone());
        async move {
            idem.execute(&inv, |ctx| async move {
                let _ = seen_tx.send(ctx.downstream_key("charge"));
                std::future::pending::<Result<String, std::io::Error>>().await
            })
            .await
        }
    });
    let first_attempt_key = seen_rx.await.expect("first attempt ran");
    drop(crashed); // detached, pending for ever: a crash
    clock.advance(LEASE + Duration::from_secs(1));

    let done = idem
        .execute(&inv, |ctx| async move {
            Ok::<_, std::io::Error>(ctx.downstream_key("charge"))
        })
        .await
        .expect("attempt 2");

    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(
        done.value(),
        &first_attempt_key,
        "the payment provider sees one idempotency key"
    );
    assert_ne!(inv.key().downstream("refund"), first_attempt_key);
}

/// Case: Old message after newer state is replayed.
pub async fn old_message_after_newer_state_is_replayed<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let balance = Arc::new(Mutex::new(0_u32));
    let runs = AtomicUsize::new(0);
    let set_balance = |value: u32| {
        let balance = Arc::clone(&balance);
        let runs = &runs;
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            *balance.lock().expect("lock") = value;
            Ok::<_, std::io::Error>(value)
        }
    };
    let older = invocation("account-1:set:100", &json!({"balance": 100}));
    let newer = invocation("account-1:set:250", &json!({"balance": 250}));

    idem.execute(&older, set_balance(100)).await.expect("older");
    idem.execute(&newer, set_balance(250)).await.expect("newer");
    let late = idem
        .execute(&older, set_balance(100))
        .await
        .expect("late duplicate");

    assert!(late.is_replay(), "the late duplicate is recognised");
    assert_eq!(
        *late.value(),
        100,
        "and answered with its own original result"
    );
    assert_eq!(
        *balance.lock().expect("lock"),
        250,
        "the newer state stands"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
