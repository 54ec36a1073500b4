//! Durable `map` branches of one execution that run the same operation: they share the
//! execution's ARN, so the first branch runs it and every other one is a duplicate, even one
//! that starts after the first parked on a durable wait (the SDK drops a parked branch and goes
//! on with its siblings in the same invocation), on both stores.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_durable_execution_sdk::DurableContext;
use aws_durable_execution_sdk::test_util::LocalRunner;
use lambda_idempotency::store::{Guard, StoreExt, Target};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Operation};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::backends::both;
use super::durable_functions::{LONG_LEASE, Ran, fulfil};

/// What the branches did.
#[derive(Debug, Default)]
struct Branches {
    /// The branch indexes whose operation body ran, once per run (replays included).
    bodies: Mutex<Vec<usize>>,
    /// The durable step `charge`, run in any branch.
    charges: AtomicUsize,
    /// The first branch parked (its future dropped by the SDK).
    parked: AtomicBool,
    parked_signal: Notify,
    /// Once the first branch parked, its claim is given back (as a failed replay elsewhere
    /// would): the second branch finds no claim standing.
    give_back_the_parked_claim: bool,
}

/// Sets `parked` as the branch's future is dropped.
struct OnDrop(Arc<Branches>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.parked.store(true, Ordering::SeqCst);
        self.0.parked_signal.notify_waiters();
    }
}

/// One branch: the operation for `order` reserves (a crate step), waits an hour (the branch
/// parks), then charges (a durable step). Branch 1 starts only once branch 0 has parked.
async fn branch(
    operation: Operation<Value>,
    branches: Arc<Branches>,
    durable: DurableContext,
    order: Value,
    index: usize,
) -> Result<Value, BoxError> {
    if index == 0 {
        let _parks = OnDrop(Arc::clone(&branches));
        return run(&operation, &branches, &durable, &order, index).await;
    }
    while !branches.parked.load(Ordering::SeqCst) {
        let notified = branches.parked_signal.notified();
        if branches.parked.load(Ordering::SeqCst) {
            break;
        }
        notified.await;
    }
    if branches.give_back_the_parked_claim {
        let invocation = operation.durable_invocation(&order, &durable)?;
        let store = operation.engine().store();
        if let Some(record) = store.get(invocation.key()).await? {
            let target = Target {
                key: invocation.key(),
                identity: None,
                guard: Guard::Lease(&record.lease.token),
            };
            store.release(target).await?;
        }
    }
    run(&operation, &branches, &durable, &order, index).await
}

async fn run(
    operation: &Operation<Value>,
    branches: &Arc<Branches>,
    durable: &DurableContext,
    order: &Value,
    index: usize,
) -> Result<Value, BoxError> {
    let invocation = operation
        .durable_invocation(order, durable)?
        .with_lease(LONG_LEASE);
    let charged_by = Arc::clone(branches);
    let answer = operation
        .engine()
        .execute(&invocation, |ctx: ExecutionContext| async move {
            branches.bodies.lock().expect("bodies").push(index);
            let reserved: String = ctx
                .step("reserve")
                .run(|_key| async { Ok::<_, BoxError>(String::from("rsv-1")) })
                .await?;
            durable
                .wait(Duration::from_secs(3600))
                .name("cool-off")
                .await?;
            let charged: String = durable
                .step(move |_| {
                    let branches = Arc::clone(&charged_by);
                    async move {
                        branches.charges.fetch_add(1, Ordering::SeqCst);
                        Ok(String::from("ch-1"))
                    }
                })
                .name("charge")
                .await?;
            Ok::<_, BoxError>(json!({"reserved": reserved, "charged": charged}))
        })
        .await;
    match answer {
        Ok(execution) => Ok(execution.into_value()),
        // The order is another branch's: this one reports it and ends.
        Err(Error::AlreadyInProgress { .. }) => Ok(json!({"in_progress": true})),
        Err(err) => Err(err.into()),
    }
}

/// Runs the map of two branches over `order` on `operation` to its end.
async fn run_map(
    operation: &Operation<Value>,
    branches: &Arc<Branches>,
    order: Value,
) -> aws_durable_execution_sdk::test_util::TestResult<Value> {
    let (handler_operation, handler_branches) = (operation.clone(), Arc::clone(branches));
    LocalRunner::new()
        .run(
            move |order: Value, durable: DurableContext| {
                let (operation, branches) =
                    (handler_operation.clone(), Arc::clone(&handler_branches));
                async move {
                    let results: Vec<Value> = durable
                        .map(vec![order.clone(), order], move |child, order, index| {
                            branch(
                                operation.clone(),
                                Arc::clone(&branches),
                                child,
                                order,
                                index,
                            )
                        })
                        .name("fulfil-each")
                        .max_concurrency(2)
                        .await?;
                    Ok::<_, BoxError>(json!(results))
                }
            },
            order,
        )
        .await
}

#[tokio::test]
async fn a_branch_started_beside_a_parked_one_is_a_duplicate() {
    for backend in both().await {
        let name = backend.name;
        let operation = fulfil(&backend, &Arc::new(Ran::default()));
        let branches = Arc::new(Branches::default());
        let order = json!({"order_id": "o-map", "amount": 30});

        let result = run_map(&operation, &branches, order).await;

        assert!(result.is_success(), "{name}: {:?}", result.error_message());
        assert_eq!(
            result.output(),
            Some(&json!([
                {"reserved": "rsv-1", "charged": "ch-1"},
                {"in_progress": true}
            ])),
            "{name}"
        );
        let bodies = branches.bodies.lock().expect("bodies").clone();
        assert!(
            !bodies.is_empty() && bodies.iter().all(|index| *index == 0),
            "{name}: only the first branch runs the operation: {bodies:?}"
        );
        assert_eq!(branches.charges.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_branch_started_after_the_parked_claim_went_claims_afresh() {
    // The parked run's claim was given back meanwhile: nothing runs it, so the next branch
    // claims and runs instead of being told it is in progress; the parked branch's replay
    // then reads its outcome.
    for backend in both().await {
        let name = backend.name;
        let operation = fulfil(&backend, &Arc::new(Ran::default()));
        let branches = Arc::new(Branches {
            give_back_the_parked_claim: true,
            ..Branches::default()
        });
        let order = json!({"order_id": "o-map-gone", "amount": 30});

        let result = run_map(&operation, &branches, order).await;

        assert!(result.is_success(), "{name}: {:?}", result.error_message());
        let bodies = branches.bodies.lock().expect("bodies").clone();
        assert!(
            bodies.contains(&1),
            "{name}: the second branch ran the operation: {bodies:?}"
        );
        // The parked branch, replayed, is the duplicate now: in progress while the second
        // branch's run stands parked, its outcome once it completed.
        let outcome = json!({"reserved": "rsv-1", "charged": "ch-1"});
        let output = result.output().cloned().unwrap_or_default();
        assert_eq!(output[1], outcome, "{name}: {output}");
        assert!(
            output[0] == outcome || output[0] == json!({"in_progress": true}),
            "{name}: {output}"
        );
        assert_eq!(branches.charges.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_replay_takes_its_parked_run_back_whatever_its_context_replays() {
    // The wait the operation parks on is created before the invocation: on the replay the
    // durable context is not replaying yet when the invocation is made (its next operation
    // has no record), and the run is still the execution's own, taken back.
    for backend in both().await {
        let name = backend.name;
        let operation = fulfil(&backend, &Arc::new(Ran::default()));
        let (reserves, invocations) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (handler_reserves, handler_invocations) =
            (Arc::clone(&reserves), Arc::clone(&invocations));
        let result = LocalRunner::new()
            .run(
                move |order: Value, durable: DurableContext| {
                    let (operation, reserves) = (operation.clone(), Arc::clone(&handler_reserves));
                    handler_invocations.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let cool_off = durable
                            .wait(Duration::from_secs(3600))
                            .name("cool-off")
                            .future();
                        let invocation = operation
                            .durable_invocation(&order, &durable)?
                            .with_lease(LONG_LEASE);
                        let execution = operation
                            .engine()
                            .execute(&invocation, |ctx: ExecutionContext| async move {
                                let reserved: String = ctx
                                    .step("reserve")
                                    .run(|_key| async {
                                        reserves.fetch_add(1, Ordering::SeqCst);
                                        Ok::<_, BoxError>(String::from("rsv-1"))
                                    })
                                    .await?;
                                cool_off.await?;
                                Ok::<_, BoxError>(reserved)
                            })
                            .await?;
                        Ok::<_, BoxError>(execution.into_value())
                    }
                },
                json!({"order_id": "o-early-wait"}),
            )
            .await;

        assert!(result.is_success(), "{name}: {:?}", result.error_message());
        assert_eq!(result.output(), Some(&String::from("rsv-1")), "{name}");
        assert_eq!(
            invocations.load(Ordering::SeqCst),
            2,
            "{name}: one suspension"
        );
        assert_eq!(reserves.load(Ordering::SeqCst), 1, "{name}");
    }
}
