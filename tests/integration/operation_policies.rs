//! Per-operation policy (recovery, reconciler, classifier, retention, outcome limit): set on
//! an [`Operation`], it reaches the engine through the operation's invocations and applies
//! to that operation alone; a sibling operation on the same engine keeps the engine's
//! defaults. On the memory store and the embedded DynamoDB server, each with its manual clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::failure::{Classifier, FailureClass};
use lambda_idempotency::reconcile::{Checked, Recovery, Takeover};
use lambda_idempotency::record::Status;
use lambda_idempotency::testing::conformance::{counted, crash_after_claim, stored};
use lambda_idempotency::{
    BoxError, ConfigError, Error, Idempotency, Invocation, KeyPolicy, Operation, OperationScope,
};
use serde_json::{Value, json};

use super::backends::{Backend, both};

/// An engine over `backend` with the engine's defaults (recovery held for an operator, the
/// default classifier, 24 h retention).
fn engine(backend: Backend) -> (Idempotency, ManualClock) {
    let clock = backend.clock.clone();
    (
        Idempotency::new(backend.store).with_clock(backend.clock),
        clock,
    )
}

/// The operation `name` on `idem`, keyed by the event's `/id`.
fn operation(idem: &Idempotency, name: &str) -> Operation<Value> {
    let scope = OperationScope::new("policies", name).expect("scope");
    Operation::new(
        idem.clone(),
        scope,
        KeyPolicy::pointer("/id").expect("pointer"),
    )
}

/// The invocation of `operation` for order `id` (no deadline: the lease policy's 60 s).
fn invocation(operation: &Operation<Value>, id: &str) -> Invocation {
    operation
        .invocation(&json!({"id": id}), &lambda_runtime::Context::default())
        .expect("invocation")
}

/// Past any lease an invocation without a deadline holds.
const PAST_THE_LEASE: Duration = Duration::from_secs(5 * 60);

/// Every handler error is terminal (`declined`).
struct AlwaysTerminal;

impl Classifier for AlwaysTerminal {
    fn classify(&self, _: &(dyn std::error::Error + 'static)) -> FailureClass {
        FailureClass::terminal("declined")
    }
}

/// An error the default classifier releases for a retry.
fn timeout() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "the provider timed out")
}

/// `Operation::with_recovery` re-runs this operation's crashed attempt and no other's: on the
/// same engine, a sibling without a declaration is held for an operator.
#[tokio::test]
async fn recovery_declared_on_an_operation_applies_to_it_alone() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend);
        let rerun = operation(&idem, "rerun").with_recovery(Recovery::Rerun);
        let held = operation(&idem, "held");
        let (rerun_inv, held_inv) = (invocation(&rerun, "o-1"), invocation(&held, "o-1"));
        crash_after_claim(&idem, &rerun_inv).await;
        crash_after_claim(&idem, &held_inv).await;
        clock.advance(PAST_THE_LEASE);

        let runs = AtomicUsize::new(0);
        let rerun_answer = idem
            .execute(&rerun_inv, |_| counted(&runs, String::from("ran again")))
            .await
            .expect("re-run under the operation's Recovery::Rerun");
        assert_eq!(rerun_answer.value(), "ran again", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: re-run once");

        let held_answer = idem
            .execute(&held_inv, |_| counted(&runs, String::from("must not run")))
            .await;
        assert!(
            matches!(held_answer, Err(Error::Indeterminate { .. })),
            "{name}: the sibling keeps the engine's default: {held_answer:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: the sibling not run"
        );
    }
}

/// `Operation::with_reconciler` is asked about this operation's takeovers only.
#[tokio::test]
async fn a_reconciler_declared_on_an_operation_is_asked_for_it_alone() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend);
        let asked = Arc::new(AtomicUsize::new(0));
        let reconciled = operation(&idem, "reconciled").with_reconciler({
            let asked = Arc::clone(&asked);
            move |_: Takeover| {
                asked.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(Checked::Applied(json!("found"))) }
            }
        });
        let plain = operation(&idem, "plain");
        let (reconciled_inv, plain_inv) =
            (invocation(&reconciled, "o-2"), invocation(&plain, "o-2"));
        crash_after_claim(&idem, &reconciled_inv).await;
        crash_after_claim(&idem, &plain_inv).await;
        clock.advance(PAST_THE_LEASE);

        let runs = AtomicUsize::new(0);
        let found = idem
            .execute(&reconciled_inv, |_| counted(&runs, String::from("ran")))
            .await
            .expect("reconciled as applied");
        assert_eq!(found.value(), "found", "{name}");
        let plain_answer = idem
            .execute(&plain_inv, |_| counted(&runs, String::from("ran")))
            .await;
        assert!(
            matches!(plain_answer, Err(Error::Indeterminate { .. })),
            "{name}: no reconciler for the sibling: {plain_answer:?}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1, "{name}: asked once");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: nothing re-run");
    }
}

/// `Operation::with_classifier` retains this operation's failure as terminal, where the
/// sibling's same error is released for a retry by the engine's default classifier.
#[tokio::test]
async fn a_classifier_declared_on_an_operation_classifies_its_errors_alone() {
    for backend in both().await {
        let name = backend.name;
        let (idem, _clock) = engine(backend);
        let strict = operation(&idem, "strict").with_classifier(AlwaysTerminal);
        let lenient = operation(&idem, "lenient");
        let runs = AtomicUsize::new(0);
        let failing = |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<String, _>(timeout()) }
        };
        for op in [&strict, &lenient] {
            let inv = invocation(op, "o-3");
            let err = idem.execute(&inv, failing).await.expect_err("fails");
            assert!(matches!(err, Error::Handler { .. }), "{name}: {err:?}");
            let again = idem.execute(&inv, failing).await.expect_err("fails");
            if op.scope() == strict.scope() {
                assert!(
                    matches!(&again, Error::Failed { failure, .. } if failure.kind.as_str() == "declined"),
                    "{name}: retained under the operation's classifier: {again:?}"
                );
                let record = stored(&idem, inv.key(), "retained").await;
                assert_eq!(record.status, Status::Failed, "{name}");
            } else {
                assert!(
                    matches!(again, Error::Handler { .. }),
                    "{name}: the sibling's failure released and run again: {again:?}"
                );
            }
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "{name}: the strict operation ran once, the lenient one twice"
        );
    }
}

/// `Operation::with_retention` and `with_max_outcome_bytes` bound this operation's records;
/// the sibling keeps the engine's 24 hours and 6 MiB.
#[tokio::test]
async fn retention_and_outcome_limit_declared_on_an_operation_bound_it_alone() {
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend);
        let short = operation(&idem, "short")
            .with_retention(Duration::from_secs(3600))
            .expect("retention")
            .with_max_outcome_bytes(64)
            .expect("limit");
        let plain = operation(&idem, "plain");
        let long_result = "x".repeat(100);
        let runs = AtomicUsize::new(0);

        let inv = invocation(&short, "o-4");
        let kept = idem
            .execute(&inv, |_| counted(&runs, String::from("small")))
            .await
            .expect("stored");
        assert_eq!(kept.value(), "small", "{name}");
        let record = stored(&idem, inv.key(), "completed").await;
        assert_eq!(
            record.expires_at,
            lambda_idempotency::clock::Clock::now(&clock) + Duration::from_secs(3600),
            "{name}: kept for the operation's hour"
        );
        let too_large = idem
            .execute(&invocation(&short, "o-5"), |_| {
                counted(&runs, long_result.clone())
            })
            .await;
        assert!(
            matches!(too_large, Err(Error::OutcomeTooLarge { size: 102, .. })),
            "{name}: past the operation's 64 bytes: {too_large:?}"
        );

        let inv = invocation(&plain, "o-4");
        let stored_whole = idem
            .execute(&inv, |_| counted(&runs, long_result.clone()))
            .await
            .expect("within the engine's limit");
        assert_eq!(stored_whole.value(), &long_result, "{name}");
        let record = stored(&idem, inv.key(), "completed").await;
        assert_eq!(
            record.expires_at,
            lambda_idempotency::clock::Clock::now(&clock) + Duration::from_secs(24 * 3600),
            "{name}: the engine's retention"
        );
    }
}

/// An operator resolving a crashed attempt of an operation whose retention is longer than the
/// engine's (18 days, to outlast its dead-letter queue) keeps the outcome at least as long as
/// the record was kept: a redrive on day 3 replays it instead of running the charge again.
#[tokio::test]
async fn an_operators_resolution_keeps_the_operations_retention() {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    for backend in both().await {
        let name = backend.name;
        let (idem, clock) = engine(backend);
        let charge = operation(&idem, "charge")
            .with_retention(18 * DAY)
            .expect("retention");
        let inv = invocation(&charge, "o-6");
        crash_after_claim(&idem, &inv).await;
        clock.advance(PAST_THE_LEASE);
        let crashed = stored(&idem, inv.key(), "the crashed claim").await;
        let resolved = idem
            .resolve::<Value>(
                inv.key(),
                lambda_idempotency::engine::Resolution::Completed(json!("charged")),
                &lambda_idempotency::testing::conformance::operator(),
            )
            .await
            .expect("resolved");
        assert!(resolved, "{name}");
        let record = stored(&idem, inv.key(), "resolved").await;
        assert_eq!(record.status, Status::Completed, "{name}");
        assert!(
            record.expires_at >= crashed.expires_at,
            "{name}: kept until {:?}, the crashed claim until {:?}",
            record.expires_at,
            crashed.expires_at
        );

        clock.advance(3 * DAY);
        let runs = AtomicUsize::new(0);
        let redriven = idem
            .execute(&inv, |_| counted(&runs, String::from("charged again")))
            .await
            .expect("replayed");
        assert_eq!(redriven.value(), "charged", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not charged again");

        // An INDETERMINATE record is held a year, whatever its operation's retention: its
        // resolution is kept for the engine's (the operator's `--retention`), not that year.
        let inv = invocation(&charge, "o-7");
        crash_after_claim(&idem, &inv).await;
        clock.advance(PAST_THE_LEASE);
        let held = idem
            .execute(&inv, |_| counted(&runs, String::from("must not run")))
            .await;
        assert!(
            matches!(held, Err(Error::Indeterminate { .. })),
            "{name}: {held:?}"
        );
        assert!(
            idem.resolve::<Value>(
                inv.key(),
                lambda_idempotency::engine::Resolution::Completed(json!("charged")),
                &lambda_idempotency::testing::conformance::operator(),
            )
            .await
            .expect("resolved"),
            "{name}"
        );
        let record = stored(&idem, inv.key(), "resolved").await;
        assert_eq!(
            record.expires_at,
            lambda_idempotency::clock::Clock::now(&clock) + DAY,
            "{name}: the engine's retention from the resolution"
        );
    }
}

/// Out-of-range settings are refused when declared, naming the setting.
#[test]
fn out_of_range_operation_settings_are_refused() {
    let idem = Idempotency::new(lambda_idempotency::MemoryStore::new());
    for (setting, refused) in [
        (
            "retention",
            operation(&idem, "a").with_retention(Duration::ZERO).err(),
        ),
        (
            "retention",
            operation(&idem, "b")
                .with_retention(Duration::from_secs(400 * 24 * 3600))
                .err(),
        ),
        (
            "max_outcome_bytes",
            operation(&idem, "c").with_max_outcome_bytes(0).err(),
        ),
        (
            "max_outcome_bytes",
            operation(&idem, "d")
                .with_max_outcome_bytes(lambda_idempotency::config::MAX_OUTCOME_BYTES + 1)
                .err(),
        ),
    ] {
        assert!(
            matches!(refused, Some(ConfigError::InvalidSetting { setting: s, .. }) if s == setting),
            "{setting}: {refused:?}"
        );
    }
}

/// On the HTTP door too, the operation's classifier decides: its terminal failure is answered
/// `409 operation_previously_failed` and never run again, where the sibling's same error is
/// released and runs on every retry.
#[tokio::test]
async fn the_http_door_answers_by_the_operations_classifier() {
    use lambda_http::{Body, Request};
    use lambda_idempotency::HttpKeys;
    use lambda_idempotency::lambda::http::CallerScope;
    use lambda_runtime::tower::{Layer, Service, ServiceExt};

    for backend in both().await {
        let name = backend.name;
        let (idem, _clock) = engine(backend);
        let keys = || HttpKeys::new().with_callers(CallerScope::Shared).policy();
        let strict = Operation::new(
            idem.clone(),
            OperationScope::new("policies", "strict-http").expect("scope"),
            keys(),
        )
        .with_classifier(AlwaysTerminal);
        let lenient = Operation::new(
            idem.clone(),
            OperationScope::new("policies", "lenient-http").expect("scope"),
            keys(),
        );
        for (operation, statuses, runs_expected) in
            [(strict, [409, 409], 1), (lenient, [500, 500], 2)]
        {
            let runs = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&runs);
            let inner = lambda_runtime::tower::service_fn(move |_: Request| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Err::<http::Response<Body>, BoxError>(timeout().into()) }
            });
            let scope = operation.scope().clone();
            let mut service = operation.http_layer().layer(inner);
            for expected in statuses {
                let request = http::Request::builder()
                    .method("POST")
                    .uri("/payments")
                    .header("idempotency-key", "\"k-1\"")
                    .body(Body::from("{}"))
                    .expect("request");
                let answer = service
                    .ready()
                    .await
                    .expect("ready")
                    .call(request)
                    .await
                    .expect("answer");
                assert_eq!(answer.status().as_u16(), expected, "{name}: {scope:?}");
            }
            assert_eq!(runs.load(Ordering::SeqCst), runs_expected, "{name}");
        }
    }
}
