//! The limits on steps the effects guide states, on both stores: names of 1 to 255 bytes, at
//! most 100 steps per operation, one step at a time and only inside the handler's own future,
//! and no effect started once the lease has run out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::effects::StepError;
use lambda_idempotency::reconcile::{Checked, Recovery};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency};
use serde_json::json;
use tokio::sync::oneshot;

use crate::backends::both;

/// Runs the step `name` whose effect counts in `runs`; the step's own answer.
async fn step(ctx: &ExecutionContext, name: &str, runs: &AtomicUsize) -> Result<u32, StepError> {
    ctx.step(name)
        .run(|_key| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(1_u32)
        })
        .await
}

#[tokio::test]
async fn a_step_name_is_1_to_255_bytes_and_not_blank() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let runs = AtomicUsize::new(0);
        let (longest, too_long) = (&"s".repeat(255), &"s".repeat(256));
        let runs = &runs;
        let answers = idem
            .execute(&invocation("step-names", &json!({})), |ctx| async move {
                let answers = [
                    step(&ctx, "", runs).await,
                    step(&ctx, "   ", runs).await,
                    step(&ctx, too_long, runs).await,
                    step(&ctx, longest, runs).await,
                ];
                Ok::<_, BoxError>(answers.map(|answer| answer.map_err(|err| err.to_string())))
            })
            .await
            .expect("the handler answers");
        let [empty, blank, long, fits] = answers.value().clone();
        for (what, answer) in [("empty", empty), ("blank", blank), ("256 bytes", long)] {
            assert!(
                answer
                    .as_ref()
                    .is_err_and(|err| err.contains("1 to 255 bytes")),
                "{name}: {what}: {answer:?}"
            );
        }
        assert_eq!(fits, Ok(1), "{name}: 255 bytes is a name");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: no refused step ran"
        );
    }
}

#[tokio::test]
async fn an_operation_records_at_most_100_steps() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let runs = AtomicUsize::new(0);
        let runs = &runs;
        let refused = idem
            .execute(&invocation("step-count", &json!({})), |ctx| async move {
                for n in 0..100 {
                    step(&ctx, &format!("s{n}"), runs).await?;
                }
                let the_101st = step(&ctx, "s100", runs).await;
                Ok::<_, BoxError>(the_101st.map_err(|err| err.to_string()))
            })
            .await
            .expect("the handler answers");
        let refused = refused.value().clone();
        assert!(
            refused
                .as_ref()
                .is_err_and(|err| err.contains("at most 100 steps")),
            "{name}: {refused:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 100, "{name}");
    }
}

#[tokio::test]
async fn steps_run_one_at_a_time_and_only_inside_the_handler() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let runs = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered_rx) = oneshot::channel::<()>();
        let (release_tx, release_rx) = oneshot::channel::<()>();
        let (later_tx, later_rx) = oneshot::channel::<ExecutionContext>();
        let during = idem
            .execute(&invocation("step-overlap", &json!({})), |ctx| {
                let runs = Arc::clone(&runs);
                async move {
                    let first = ctx.step("first").run(|_key| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let _ = entered_tx.send(());
                        let _ = release_rx.await;
                        Ok::<_, BoxError>(1_u32)
                    });
                    let second = async {
                        let _ = entered_rx.await;
                        let overlapping = step(&ctx, "second", &runs).await;
                        let _ = release_tx.send(());
                        overlapping
                    };
                    let (first, overlapping) = tokio::join!(first, second);
                    first?;
                    let _ = later_tx.send(ctx.clone());
                    Ok::<_, BoxError>(overlapping.map_err(|err| err.to_string()))
                }
            })
            .await
            .expect("the handler answers");
        let overlapping = during.value().clone();
        assert!(
            overlapping
                .as_ref()
                .is_err_and(|err| err.contains("another step is still running")),
            "{name}: {overlapping:?}"
        );

        // A step from a context kept past the handler's return is refused too.
        let kept = later_rx.await.expect("the context was kept");
        let after = step(&kept, "after", &runs).await;
        assert!(
            matches!(&after, Err(StepError::Invalid { reason, .. }) if reason.contains("has returned")),
            "{name}: {after:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: only the first step ran"
        );
    }
}

#[tokio::test]
async fn no_effect_starts_once_the_lease_has_run_out() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let runs = AtomicUsize::new(0);
        let inv = invocation("step-late", &json!({}));
        let (runs, clock) = (&runs, &clock);
        let answer = idem
            .execute(&inv, |ctx| async move {
                step(&ctx, "before", runs).await?;
                // The handler outlives its lease (a pause, a slow call): no step starts after.
                clock.advance(Duration::from_secs(3600));
                step(&ctx, "after", runs).await?;
                Ok::<_, BoxError>(())
            })
            .await;
        assert!(
            matches!(answer, Err(Error::LeaseLost { .. })),
            "{name}: {answer:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: the late step did not run"
        );
    }
}

/// The execution context's `Debug` says where the attempt stands (its attempt, how many steps
/// it holds and which it runs next; the ledger names the key by its short hash).
#[tokio::test]
async fn the_contexts_debug_shows_the_attempts_steps_and_the_short_key() {
    let idem = Idempotency::new(lambda_idempotency::store::MemoryStore::new());
    let inv = invocation("debug-ledger", &json!({"order": "d-1"}));
    let runs = &AtomicUsize::new(0);
    let shown = idem
        .execute(&inv, |ctx: ExecutionContext| async move {
            step(&ctx, "first", runs).await?;
            Ok::<_, StepError>(format!("{ctx:?}"))
        })
        .await
        .expect("executed");
    let shown = shown.value();
    for part in [
        "StepLedger",
        "attempt: 1",
        "steps: 1",
        "cursor: 1",
        inv.key().short(),
    ] {
        assert!(shown.contains(part), "{part} not in {shown}");
    }
}

/// The step `charge`, whose check finds its effect applied once it ran (an uncertain charge
/// is looked up, not run again).
async fn checked_charge(ctx: &ExecutionContext, runs: &AtomicUsize) -> Result<u32, StepError> {
    let ran = runs.load(Ordering::SeqCst) > 0;
    ctx.step("charge")
        .checked_by(move |_key: String| async move {
            Ok::<_, BoxError>(match ran {
                true => Checked::Applied(1_u32),
                false => Checked::NotApplied,
            })
        })
        .run(|_key| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(1_u32)
        })
        .await
}

/// A handler that recorded a step and then fails retryably after another worker took its
/// expired lease over cannot give the claim back: its caller is told the lease was lost
/// (logged and counted), not the handler's error, and the new owner's record stands.
#[tokio::test]
async fn a_give_back_after_a_takeover_answers_the_lost_lease() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let runs = AtomicUsize::new(0);
        let inv = invocation("give-back-lost", &json!({}));
        let (runs, clock, engine, inv_ref) = (&runs, &clock, &idem, &inv);
        let answer = idem
            .execute(inv_ref, |ctx| async move {
                checked_charge(&ctx, runs).await?;
                // The handler outlives its lease; a redelivery takes over and completes.
                clock.advance(Duration::from_secs(3600));
                let taken_over = engine
                    .execute(inv_ref, |ctx| async move {
                        checked_charge(&ctx, runs).await?;
                        Ok::<_, BoxError>("done by the second worker".to_owned())
                    })
                    .await;
                assert!(taken_over.is_ok(), "{taken_over:?}");
                Err::<String, BoxError>(std::io::Error::other("downstream timed out").into())
            })
            .await;
        assert!(
            matches!(answer, Err(Error::LeaseLost { attempt: 1, .. })),
            "{name}: {answer:?}"
        );
        let replay = idem
            .execute(&inv, |_ctx| async {
                Ok::<_, BoxError>("ran a third time".to_owned())
            })
            .await
            .expect("replayed");
        assert_eq!(*replay.value(), "done by the second worker", "{name}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: the step ran once (the takeover checked it)"
        );
    }
}
