//! A durable execution that pauses after its operation completed: the owned record outlives
//! the owner's longest pause (its lease), so the replay after a pause longer than the
//! retention is answered from the stored outcome and runs nothing again, on both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_durable_execution_sdk::DurableContext;
use aws_durable_execution_sdk::test_util::LocalRunner;
use lambda_idempotency::observe::Decision;
use lambda_idempotency::{BoxError, ExecutionContext};
use serde_json::{Value, json};

use super::backends::both;
use super::durable_functions::{LONG_LEASE, Ran, fulfil};

/// The pause after the operation: two days, past the retention (24 hours), within the lease.
const PAUSE: Duration = Duration::from_secs(2 * 24 * 3600);

#[tokio::test]
async fn a_replay_after_a_pause_past_the_retention_replays_the_outcome() {
    for backend in both().await {
        let name = backend.name;
        let ran = Arc::new(Ran::default());
        let operation = fulfil(&backend, &ran);
        let (reserves, replays, invocations) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (handler_reserves, handler_replays, handler_invocations) = (
            Arc::clone(&reserves),
            Arc::clone(&replays),
            Arc::clone(&invocations),
        );
        let clock = backend.clock.clone();
        let result = LocalRunner::new()
            .run(
                move |order: Value, durable: DurableContext| {
                    let (operation, clock) = (operation.clone(), clock.clone());
                    let (reserves, replays) =
                        (Arc::clone(&handler_reserves), Arc::clone(&handler_replays));
                    if handler_invocations.fetch_add(1, Ordering::SeqCst) > 0 {
                        clock.advance(PAUSE);
                    }
                    async move {
                        let invocation = operation
                            .durable_invocation(&order, &durable)?
                            .with_lease(LONG_LEASE);
                        let execution = operation
                            .engine()
                            .execute(&invocation, |ctx: ExecutionContext| async move {
                                ctx.step("reserve")
                                    .run(|_key| async {
                                        reserves.fetch_add(1, Ordering::SeqCst);
                                        Ok::<_, BoxError>(String::from("rsv-1"))
                                    })
                                    .await
                            })
                            .await?;
                        if execution.is_replay() {
                            replays.fetch_add(1, Ordering::SeqCst);
                        }
                        durable.wait(PAUSE).name("remind-later").await?;
                        Ok::<_, BoxError>(execution.into_value())
                    }
                },
                json!({"order_id": "o-pause"}),
            )
            .await;

        assert!(result.is_success(), "{name}: {:?}", result.error_message());
        assert_eq!(result.output(), Some(&String::from("rsv-1")), "{name}");
        assert_eq!(invocations.load(Ordering::SeqCst), 2, "{name}: one pause");
        assert_eq!(reserves.load(Ordering::SeqCst), 1, "{name}: ran once");
        assert_eq!(
            replays.load(Ordering::SeqCst),
            1,
            "{name}: the replay's answer"
        );
        // Counted as executed, then replayed.
        assert_eq!(
            *ran.decisions.lock().expect("decisions"),
            [Decision::FirstExecution, Decision::Replay],
            "{name}"
        );
    }
}
