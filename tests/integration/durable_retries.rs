//! `Operation::durable_execute` keeps a failed try's failure out of the execution when the
//! engine answered "not yet" before the handler ran (the store out, another run holding the
//! operation): the durable SDK would replay such a failure for good, so the try is repeated
//! after a durable wait; a final answer (a payload conflict) fails the child at once. Driven by
//! the durable SDK's own local runner, on both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_durable_execution_sdk::DurableContext;
use aws_durable_execution_sdk::test_util::LocalRunner;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::store::AnyStore;
use lambda_idempotency::testing::faults::{FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Idempotency, KeyPolicy, Operation, OperationScope};
use serde_json::{Value, json};

use super::backends::both;
use super::durable_functions::LONG_LEASE;

/// How far the engine's clock moves before each replay: past any durable wait the tries
/// take, as the durable service's timer would have.
const BETWEEN_INVOCATIONS: Duration = Duration::from_secs(60);

/// What ran, across every invocation of one durable execution.
#[derive(Default)]
struct Counts {
    invocations: AtomicUsize,
    handler_runs: AtomicUsize,
}

fn operation(store: AnyStore, clock: &ManualClock) -> Operation<Value> {
    Operation::new(
        Idempotency::new(store).with_clock(clock.clone()),
        OperationScope::new("durable", "reserve").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("policy"),
    )
}

/// A durable handler running the operation in `durable_execute`; from its second invocation
/// on, the clock moves on by [`BETWEEN_INVOCATIONS`] first.
fn handler(
    operation: Operation<Value>,
    clock: ManualClock,
    counts: Arc<Counts>,
) -> impl Fn(
    Value,
    DurableContext,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>
+ Send
+ Sync
+ 'static {
    move |order: Value, durable: DurableContext| {
        let (operation, clock, counts) = (operation.clone(), clock.clone(), Arc::clone(&counts));
        Box::pin(async move {
            if counts.invocations.fetch_add(1, Ordering::SeqCst) > 0 {
                clock.advance(BETWEEN_INVOCATIONS);
            }
            let invocation = operation
                .durable_invocation(&order, &durable)?
                .with_lease(LONG_LEASE);
            let ran = Arc::clone(&counts);
            let reserved: Value = operation
                .durable_execute(invocation, &durable, move |_steps, _child| async move {
                    ran.handler_runs.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"reserved": order["order_id"]}))
                })
                .await?;
            Ok(reserved)
        })
    }
}

#[tokio::test]
async fn a_claim_that_meets_an_outage_is_tried_again_after_a_durable_wait() {
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        // The store refuses claims for the next 30 seconds: longer than the engine's own
        // tries, shorter than the time to the execution's next invocation.
        faulty.outage(
            &[Primitive::Claim],
            FaultKind::Unavailable,
            backend.clock.now() + Duration::from_secs(30),
            backend.clock.clone(),
        );
        let counts = Arc::new(Counts::default());
        let run = handler(
            operation(AnyStore::new(faulty), &backend.clock),
            backend.clock.clone(),
            Arc::clone(&counts),
        );

        let result = LocalRunner::new()
            .run(run, json!({"order_id": "o-outage"}))
            .await;

        assert!(
            result.is_success(),
            "{name}: the outage is not the execution's answer: {:?}",
            result.error_message()
        );
        assert_eq!(result.output(), Some(&json!({"reserved": "o-outage"})));
        assert_eq!(counts.handler_runs.load(Ordering::SeqCst), 1, "{name}");
        assert!(
            result.invocation_count() >= 2,
            "{name}: the try waited durably"
        );
    }
}

#[tokio::test]
async fn a_payload_conflict_fails_the_child_without_another_try() {
    for backend in both().await {
        let name = backend.name;
        let counts = Arc::new(Counts::default());
        let operation = operation(backend.store.clone(), &backend.clock);
        let first = LocalRunner::new()
            .run(
                handler(
                    operation.clone(),
                    backend.clock.clone(),
                    Arc::clone(&counts),
                ),
                json!({"order_id": "o-conflict", "amount": 30}),
            )
            .await;
        assert!(first.is_success(), "{name}: {:?}", first.error_message());

        let changed = Arc::new(Counts::default());
        let result = LocalRunner::new()
            .run(
                handler(operation, backend.clock.clone(), Arc::clone(&changed)),
                json!({"order_id": "o-conflict", "amount": 31}),
            )
            .await;

        assert!(result.is_failure(), "{name}");
        assert_eq!(
            result.invocation_count(),
            1,
            "{name}: no durable wait for a final answer"
        );
        assert_eq!(changed.handler_runs.load(Ordering::SeqCst), 0, "{name}");
    }
}

/// A handler that runs the durable step `reserve` (counted) and then waits an hour: the
/// execution suspends inside it. From its second invocation on, the clock moves on first, and
/// on the second the store refuses claims for 30 seconds.
fn suspends_inside(
    operation: Operation<Value>,
    clock: ManualClock,
    faulty: FaultyStore<AnyStore>,
    counts: Arc<Counts>,
) -> impl Fn(
    Value,
    DurableContext,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>
+ Send
+ Sync
+ 'static {
    move |order: Value, durable: DurableContext| {
        let (operation, clock, faulty) = (operation.clone(), clock.clone(), faulty.clone());
        let counts = Arc::clone(&counts);
        Box::pin(async move {
            let invocation_number = counts.invocations.fetch_add(1, Ordering::SeqCst);
            if invocation_number > 0 {
                clock.advance(BETWEEN_INVOCATIONS);
            }
            if invocation_number == 1 {
                faulty.outage(
                    &[Primitive::Claim, Primitive::TakeOver],
                    FaultKind::Unavailable,
                    clock.now() + Duration::from_secs(30),
                    clock.clone(),
                );
            }
            let invocation = operation
                .durable_invocation(&order, &durable)?
                .with_lease(LONG_LEASE);
            let ran = Arc::clone(&counts);
            let reserved: Value = operation
                .durable_execute(invocation, &durable, move |_steps, child| async move {
                    let reserved: String = child
                        .step(move |_| {
                            let ran = Arc::clone(&ran);
                            async move {
                                ran.handler_runs.fetch_add(1, Ordering::SeqCst);
                                Ok(String::from("rsv-1"))
                            }
                        })
                        .name("reserve")
                        .await?;
                    child
                        .wait(Duration::from_secs(3600))
                        .name("cool-off")
                        .await?;
                    Ok(json!({"reserved": reserved}))
                })
                .await?;
            Ok(reserved)
        })
    }
}

/// The handler ran in the first invocation (its durable step recorded in the try's child) and
/// suspended; the replay's re-entry meets a throttled store. Another try would run the durable
/// step again in a fresh child: the try's failure ends the child instead, and the step ran once.
#[tokio::test]
async fn a_try_the_handler_ran_in_is_never_tried_again() {
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        let counts = Arc::new(Counts::default());
        let run = suspends_inside(
            operation(AnyStore::new(faulty.clone()), &backend.clock),
            backend.clock.clone(),
            faulty,
            Arc::clone(&counts),
        );

        let result = LocalRunner::new()
            .run(run, json!({"order_id": "o-suspended"}))
            .await;

        assert_eq!(
            counts.handler_runs.load(Ordering::SeqCst),
            1,
            "{name}: the durable step ran once ({:?})",
            result.error_message()
        );
        assert!(
            result.is_failure(),
            "{name}: the try's failure ends the child"
        );
    }
}
