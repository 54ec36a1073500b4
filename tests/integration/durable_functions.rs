//! Lambda durable functions, driven by the durable SDK's own local runner
//! (`aws_durable_execution_sdk::test_util::LocalRunner`: the production service function, its
//! envelope, suspension and replay), on both stores:
//! - inside a durable handler, the operation's claim is owned by the durable execution
//!   (`Operation::durable_invocation`): every replay re-enters it, its recorded steps replay, and
//!   any other execution is answered as a duplicate; without an owner the replay meets its own
//!   claim as another caller's;
//! - transactional steps commit on either side of a suspension (DynamoDB);
//! - in front of one, a dispatcher starts the execution under the operation's
//!   `durable_execution_name`, the same on every delivery.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_durable_execution_sdk::DurableContext;
use aws_durable_execution_sdk::test_util::LocalRunner;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::observe::{Decision, Observation};
use lambda_idempotency::record::{Record, Status};
use lambda_idempotency::store::{AnyStore, CachedStore, StoreExt};
use lambda_idempotency::testing::faults::{FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{
    BoxError, Error, ExecutionContext, Idempotency, Invocation, KeyPolicy, Operation,
    OperationScope,
};
use serde_json::{Value, json};

use super::backends::{Backend, both};
use super::held_runs::HeldRun;
use super::transactions::Shop;

/// The lease of an owned claim in these tests: a week, past the retention (24 hours).
pub(super) const LONG_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Another durable execution's ARN.
const OTHER_EXECUTION: &str =
    "arn:aws:lambda:us-east-1:123456789012:function:fulfil:$LATEST/durable-execution/other/1";

type DurableFuture = Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>;

/// What ran, across every invocation of a durable execution.
#[derive(Debug, Default)]
pub(super) struct Ran {
    /// Invocations of the durable handler (the first and every replay).
    invocations: AtomicUsize,
    /// The crate's step `reserve` (before the durable wait).
    reserves: AtomicUsize,
    /// The durable step `charge` (after it).
    charges: AtomicUsize,
    /// Takeovers the engine reported.
    takeovers: AtomicUsize,
    /// Every decision the engine reported, in order.
    pub(super) decisions: Mutex<Vec<Decision>>,
    /// The errors the engine answered the handler with.
    errors: Mutex<Vec<Error>>,
    /// Another execution of the same order arrives while this one is suspended (just before
    /// each replay).
    intrude: bool,
    /// What the engine answered it (`Ok(is_replay)`).
    intruders: Mutex<Vec<Result<bool, Error>>>,
    /// Claims fail (the store unavailable) from each replay's start, through this store.
    failing_claims: Option<FaultyStore<AnyStore>>,
    /// The record as the replay finds it after the wait, re-entered.
    probes: Mutex<Vec<Record>>,
}

impl Ran {
    fn count(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

/// The `fulfil` operation on `backend`, its takeovers counted in `ran`.
pub(super) fn fulfil(backend: &Backend, ran: &Arc<Ran>) -> Operation<Value> {
    fulfil_on(backend.store.clone(), backend, ran)
}

/// The `fulfil` operation on `store` (`backend`'s, perhaps wrapped), on `backend`'s clock.
fn fulfil_on(store: AnyStore, backend: &Backend, ran: &Arc<Ran>) -> Operation<Value> {
    let seen = Arc::clone(ran);
    let engine = Idempotency::new(store)
        .with_clock(backend.clock.clone())
        .with_observer(move |observation: &Observation<'_>| {
            if let Observation::Decision { decision, .. } = observation {
                if *decision == Decision::Takeover {
                    seen.takeovers.fetch_add(1, Ordering::SeqCst);
                }
                seen.decisions.lock().expect("decisions").push(*decision);
            }
        });
    Operation::new(
        engine,
        OperationScope::new("durable", "fulfil").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("policy"),
    )
}

/// The durable handler: the operation (owned by the execution when `owned`) runs the crate's
/// step `reserve`, waits an hour (the execution suspends: the SDK drops this future and
/// invokes again), then the durable step `charge`. Each replay first moves the engine's clock
/// on by `between`.
fn durable_handler(
    operation: Operation<Value>,
    owned: bool,
    ran: Arc<Ran>,
    clock: ManualClock,
    between: Duration,
) -> impl Fn(Value, DurableContext) -> DurableFuture + Send + Sync + 'static {
    move |order: Value, durable: DurableContext| {
        let (operation, ran, clock) = (operation.clone(), Arc::clone(&ran), clock.clone());
        Box::pin(async move {
            if ran.invocations.fetch_add(1, Ordering::SeqCst) > 0 {
                clock.advance(between);
                if let Some(faulty) = &ran.failing_claims {
                    let until = clock.now() + Duration::from_secs(3600);
                    faulty.outage(
                        &[Primitive::Claim],
                        FaultKind::Unavailable,
                        until,
                        clock.clone(),
                    );
                }
                if ran.intrude {
                    // Whatever the suspension left to run (a give-back) runs first.
                    for _ in 0..100 {
                        tokio::task::yield_now().await;
                    }
                    let other = operation
                        .invocation(&order, durable.lambda_context())?
                        .with_owner(OTHER_EXECUTION);
                    let answer = operation
                        .engine()
                        .execute(&other, |_ctx| async {
                            Ok::<_, BoxError>(json!({"reserved": "intruder"}))
                        })
                        .await;
                    ran.intruders
                        .lock()
                        .expect("intruders")
                        .push(answer.map(|execution| execution.is_replay()));
                }
            }
            // A lease that covers the execution's longest wait.
            let invocation = match owned {
                true => operation
                    .durable_invocation(&order, &durable)?
                    .with_lease(LONG_LEASE),
                false => operation.invocation(&order, durable.lambda_context())?,
            };
            let (store, key) = (operation.engine().store().clone(), invocation.key().clone());
            let (durable, counters, charged_by) = (&durable, &ran, Arc::clone(&ran));
            let answer = operation
                .engine()
                .execute(&invocation, |ctx: ExecutionContext| async move {
                    let reserved: String = ctx
                        .step("reserve")
                        .run(|_key| async move {
                            counters.reserves.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, BoxError>(String::from("rsv-1"))
                        })
                        .await?;
                    durable
                        .wait(Duration::from_secs(3600))
                        .name("cool-off")
                        .await?;
                    if let Some(record) = store.get(&key).await? {
                        counters.probes.lock().expect("probes").push(record);
                    }
                    let charged: String = durable
                        .step(move |_| {
                            let ran = Arc::clone(&charged_by);
                            async move {
                                ran.charges.fetch_add(1, Ordering::SeqCst);
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
                Err(err) => {
                    let message = err.to_string();
                    ran.errors.lock().expect("errors").push(err);
                    Err(message.into())
                }
            }
        })
    }
}

/// Runs the durable execution of `order` to its end with the SDK's local runner.
async fn run_execution(
    operation: &Operation<Value>,
    owned: bool,
    ran: &Arc<Ran>,
    clock: &ManualClock,
    between: Duration,
    order: Value,
) -> aws_durable_execution_sdk::test_util::TestResult<Value> {
    let handler = durable_handler(
        operation.clone(),
        owned,
        Arc::clone(ran),
        clock.clone(),
        between,
    );
    LocalRunner::new().run(handler, order).await
}

#[tokio::test]
async fn a_replay_of_the_same_execution_re_enters_its_claim_and_its_steps_replay() {
    // A replay within the lease, and one after it ran out: either way taken back by the owner.
    for between in [
        Duration::from_secs(10),
        LONG_LEASE + Duration::from_secs(3600),
    ] {
        for backend in both().await {
            let name = backend.name;
            let ran = Arc::new(Ran::default());
            let operation = fulfil(&backend, &ran);
            let order = json!({"order_id": "o-1", "amount": 30});

            let result = run_execution(
                &operation,
                true,
                &ran,
                &backend.clock,
                between,
                order.clone(),
            )
            .await;

            assert!(
                result.is_success(),
                "{name}, {between:?}: {:?}",
                result.error_message()
            );
            assert_eq!(
                result.output(),
                Some(&json!({"reserved": "rsv-1", "charged": "ch-1"})),
                "{name}"
            );
            assert_eq!(result.invocation_count(), 2, "{name}: one suspension");
            assert_eq!(Ran::count(&ran.invocations), 2, "{name}");
            assert_eq!(
                Ran::count(&ran.reserves),
                1,
                "{name}: the crate's step replayed"
            );
            assert_eq!(Ran::count(&ran.charges), 1, "{name}");
            assert_eq!(
                Ran::count(&ran.takeovers),
                0,
                "{name}: the owner's return is no takeover of a crashed attempt"
            );
            assert!(ran.errors.lock().expect("errors").is_empty(), "{name}");
            // Taken back as the next attempt, its retention past its new lease (TTL never
            // deletes a record whose lease is live).
            let probes = ran.probes.lock().expect("probes").clone();
            let [reentered] = probes.as_slice() else {
                panic!("{name}: one replay after the wait: {probes:?}");
            };
            assert_eq!(reentered.lease.attempt, 2, "{name}");
            assert!(
                reentered.expires_at > reentered.lease.expires_at,
                "{name}: retention {:?} ends before the lease {:?}",
                reentered.expires_at,
                reentered.lease.expires_at
            );

            // The operation completed: any later caller is answered from its stored outcome.
            let later = operation
                .engine()
                .execute(
                    &operation
                        .invocation(&order, &lambda_runtime::Context::default())
                        .expect("invocation"),
                    |_ctx| async { Ok::<_, BoxError>(json!("ran again")) },
                )
                .await
                .expect("replayed");
            assert!(later.is_replay(), "{name}");
            assert_eq!(
                later.value(),
                &json!({"reserved": "rsv-1", "charged": "ch-1"}),
                "{name}"
            );
            // Counted once as executed (its completion after the re-entry), the later caller
            // as a replay.
            assert_eq!(
                *ran.decisions.lock().expect("decisions"),
                [Decision::FirstExecution, Decision::Replay],
                "{name}"
            );
        }
    }
}

#[tokio::test]
async fn another_execution_is_answered_as_a_duplicate() {
    for backend in both().await {
        let name = backend.name;
        let ran = Arc::new(Ran::default());
        let operation = fulfil(&backend, &ran);
        let order = json!({"order_id": "o-2", "amount": 30});

        // Another durable execution of the same order holds the claim.
        let other = HeldRun::start(
            operation.engine().clone(),
            operation
                .invocation(&order, &lambda_runtime::Context::default())
                .expect("invocation")
                .with_owner(OTHER_EXECUTION),
            json!({"reserved": "by the other", "charged": "ch-0"}),
        )
        .await;

        let busy = run_execution(
            &operation,
            true,
            &ran,
            &backend.clock,
            Duration::ZERO,
            order.clone(),
        )
        .await;
        assert!(busy.is_failure(), "{name}");
        assert!(
            matches!(
                ran.errors.lock().expect("errors").as_slice(),
                [Error::AlreadyInProgress { .. }]
            ),
            "{name}: {:?}",
            ran.errors
        );
        assert_eq!(Ran::count(&ran.reserves), 0, "{name}");

        let settled = other.finish().await.expect("the other execution");
        assert!(!settled.is_replay(), "{name}");

        // Once the other execution completed, this one gets its outcome without running.
        let ran = Arc::new(Ran::default());
        let replayed = run_execution(
            &operation,
            true,
            &ran,
            &backend.clock,
            Duration::ZERO,
            order,
        )
        .await;
        assert!(replayed.is_success(), "{name}");
        assert_eq!(
            replayed.output(),
            Some(&json!({"reserved": "by the other", "charged": "ch-0"})),
            "{name}"
        );
        assert_eq!(Ran::count(&ran.reserves), 0, "{name}");
        assert_eq!(Ran::count(&ran.charges), 0, "{name}");
    }
}

#[tokio::test]
async fn a_suspended_execution_keeps_its_claim_from_another_execution() {
    // The SDK drops the handler at the suspension: the claim is not given back, so another
    // execution arriving during the wait (10 s on, past the give-back's grace) is a duplicate.
    for backend in both().await {
        let name = backend.name;
        let ran = Arc::new(Ran {
            intrude: true,
            ..Ran::default()
        });
        let operation = fulfil(&backend, &ran);
        let order = json!({"order_id": "o-6", "amount": 30});

        let result = run_execution(
            &operation,
            true,
            &ran,
            &backend.clock,
            Duration::from_secs(10),
            order,
        )
        .await;

        assert!(result.is_success(), "{name}: {:?}", result.error_message());
        assert!(
            matches!(
                ran.intruders.lock().expect("intruders").as_slice(),
                [Err(Error::AlreadyInProgress { .. })]
            ),
            "{name}: {:?}",
            ran.intruders
        );
        assert_eq!(Ran::count(&ran.takeovers), 0, "{name}");
        assert_eq!(Ran::count(&ran.reserves), 1, "{name}");
        assert_eq!(Ran::count(&ran.charges), 1, "{name}");
    }
}

#[tokio::test]
async fn without_its_execution_as_owner_the_replay_meets_its_own_claim() {
    // What `durable_invocation` is for: a plain invocation inside a durable handler gives its
    // claim back when the SDK suspends, and the replay finds it held as another caller's.
    for backend in both().await {
        let name = backend.name;
        let ran = Arc::new(Ran::default());
        let operation = fulfil(&backend, &ran);
        let order = json!({"order_id": "o-3", "amount": 30});

        let result = run_execution(
            &operation,
            false,
            &ran,
            &backend.clock,
            Duration::ZERO,
            order,
        )
        .await;

        assert!(!result.is_success(), "{name}");
        assert!(
            matches!(
                ran.errors.lock().expect("errors").first(),
                Some(Error::AlreadyInProgress { .. })
            ),
            "{name}: {:?}",
            ran.errors
        );
        assert_eq!(Ran::count(&ran.charges), 0, "{name}");
    }
}

#[tokio::test]
async fn a_dispatcher_starts_each_operation_under_one_execution_name() {
    for backend in both().await {
        let name = backend.name;
        let ran = Arc::new(Ran::default());
        let fulfilment = fulfil(&backend, &ran);
        let dispatch = Operation::new(
            Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone()),
            OperationScope::new("durable", "dispatch").expect("scope"),
            KeyPolicy::pointer("/order_id").expect("policy"),
        );
        // The names the dispatcher started executions under; its first run fails after the
        // start (as a crash would), so the delivery is retried.
        let starts = Arc::new(Mutex::new(Vec::<String>::new()));
        let deliver = |order: Value, fail_after_start: bool| {
            let (dispatch, fulfilment, starts) =
                (dispatch.clone(), fulfilment.clone(), Arc::clone(&starts));
            let (ran, clock) = (Arc::clone(&ran), backend.clock.clone());
            async move {
                let invocation = dispatch
                    .invocation(&order, &lambda_runtime::Context::default())
                    .expect("invocation");
                dispatch
                    .engine()
                    .execute(&invocation, |ctx: ExecutionContext| async move {
                        let execution = ctx.durable_execution_name();
                        starts.lock().expect("starts").push(execution.clone());
                        let started =
                            run_execution(&fulfilment, true, &ran, &clock, Duration::ZERO, order)
                                .await;
                        if fail_after_start {
                            return Err::<Value, BoxError>("lost the answer to Invoke".into());
                        }
                        Ok(json!({"execution": execution, "output": started.output()}))
                    })
                    .await
            }
        };

        let order = json!({"order_id": "o-4", "amount": 30});
        assert!(deliver(order.clone(), true).await.is_err(), "{name}");
        let first = deliver(order.clone(), false).await.expect("dispatched");
        let again = deliver(order.clone(), false).await.expect("replayed");
        let other = deliver(json!({"order_id": "o-5", "amount": 30}), false)
            .await
            .expect("dispatched");

        let starts = starts.lock().expect("starts").clone();
        assert_eq!(
            starts.len(),
            3,
            "{name}: a retry after a failure starts again"
        );
        assert_eq!(
            starts[0], starts[1],
            "{name}: under the same name, which Lambda answers with the running execution"
        );
        assert_ne!(starts[0], starts[2], "{name}: another order, another name");
        for execution in &starts {
            assert_eq!(execution.len(), 64, "{name}: Lambda's longest name");
            assert!(
                execution
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{name}: {execution}"
            );
        }
        assert!(again.is_replay(), "{name}");
        assert_eq!(again.value(), first.value(), "{name}");
        assert_eq!(first.value()["execution"], json!(starts[0]), "{name}");
        assert_eq!(
            first.value()["output"],
            json!({"reserved": "rsv-1", "charged": "ch-1"}),
            "{name}"
        );
        assert!(!other.is_replay(), "{name}");
        // The fulfilment ran once per order (its own operation answered the rest).
        assert_eq!(Ran::count(&ran.charges), 2, "{name}");
    }
}

#[tokio::test]
async fn transactional_steps_commit_on_either_side_of_a_suspension() {
    // Every run of an owned claim sends its commits under request tokens of its own: the
    // owner's lease token is the same on every replay, and DynamoDB answers a token it saw
    // with other writes (within ten minutes) as a mismatch, or as the first commit.
    let shop = Arc::new(Shop::open().await);
    let operation = Operation::new(
        shop.engine(shop.db.store()),
        OperationScope::new("durable", "place").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("policy"),
    );
    let handler = {
        let (operation, shop) = (operation.clone(), Arc::clone(&shop));
        move |order: Value, durable: DurableContext| -> DurableFuture {
            let (operation, shop) = (operation.clone(), Arc::clone(&shop));
            Box::pin(async move {
                let invocation = operation.durable_invocation(&order, &durable)?;
                let (durable, shop) = (&durable, &*shop);
                let execution = operation
                    .engine()
                    .execute(&invocation, |ctx: ExecutionContext| async move {
                        let seen = shop.stock_item("version").await;
                        let first: String = ctx
                            .step("place-a")
                            .transact(|_key| async move {
                                Ok::<_, BoxError>(shop.place("order-a", seen))
                            })
                            .await?;
                        durable.wait(Duration::from_secs(60)).name("pause").await?;
                        let seen = shop.stock_item("version").await;
                        let second: String = ctx
                            .step("place-b")
                            .transact(|_key| async move {
                                Ok::<_, BoxError>(shop.place("order-b", seen))
                            })
                            .await?;
                        Ok::<_, BoxError>(json!([first, second]))
                    })
                    .await?;
                Ok(execution.into_value())
            })
        }
    };

    let result = LocalRunner::new()
        .run(handler, json!({"order_id": "o-7"}))
        .await;

    assert!(result.is_success(), "{:?}", result.error_message());
    assert_eq!(result.invocation_count(), 2);
    assert_eq!(
        result.output(),
        Some(&json!(["placed order-a", "placed order-b"]))
    );
    assert!(shop.has_order("order-a").await);
    assert!(shop.has_order("order-b").await);
    assert_eq!(shop.reserved().await, 2, "each placed once");
}

#[tokio::test]
async fn a_replay_whose_claim_fails_leaves_the_owners_record_and_steps() {
    // The replay's claim meets an unavailable store: its record (the owner's, with the step
    // the first invocation ran) stays, and the execution's next run goes on from it.
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        let ran = Arc::new(Ran {
            failing_claims: Some(faulty.clone()),
            ..Ran::default()
        });
        let operation = fulfil_on(AnyStore::new(faulty.clone()), &backend, &ran);
        let order = json!({"order_id": "o-8", "amount": 30});

        let failed = run_execution(
            &operation,
            true,
            &ran,
            &backend.clock,
            Duration::from_secs(10),
            order.clone(),
        )
        .await;
        assert!(failed.is_failure(), "{name}");
        assert_eq!(Ran::count(&ran.reserves), 1, "{name}");
        let key = operation
            .invocation(&order, &lambda_runtime::Context::default())
            .expect("invocation")
            .key()
            .clone();
        let standing = backend
            .store
            .get(&key)
            .await
            .expect("read")
            .expect("the owner's record stands");
        assert_eq!(standing.status, Status::InProgress, "{name}");
        assert_eq!(standing.steps.len(), 1, "{name}: the reserve step kept");

        faulty.clear();
        let again = Arc::new(Ran::default());
        let resumed = run_execution(
            &fulfil(&backend, &again),
            true,
            &again,
            &backend.clock,
            Duration::from_secs(10),
            order,
        )
        .await;
        assert!(
            resumed.is_success(),
            "{name}: {:?}",
            resumed.error_message()
        );
        assert_eq!(Ran::count(&again.reserves), 0, "{name}: the step replayed");
        assert_eq!(Ran::count(&again.charges), 1, "{name}");
    }
}

/// An invocation of `order` for `owner` on `operation`.
fn owned(operation: &Operation<Value>, order: &Value, owner: &str) -> Invocation {
    operation
        .invocation(order, &lambda_runtime::Context::default())
        .expect("invocation")
        .with_owner(owner)
}

#[tokio::test]
async fn two_runs_of_one_owner_at_once_run_the_operation_once() {
    // Durable `map` and `parallel` branches share their execution's ARN: a second run of the
    // owner's operation while the first is in flight is a duplicate, not a replay.
    for backend in both().await {
        let name = backend.name;
        let operation = fulfil(&backend, &Arc::new(Ran::default()));
        let order = json!({"order_id": "o-9", "amount": 30});
        let first = HeldRun::start(
            operation.engine().clone(),
            owned(&operation, &order, OTHER_EXECUTION),
            json!("first branch"),
        )
        .await;

        let sibling = operation
            .engine()
            .execute(&owned(&operation, &order, OTHER_EXECUTION), |_ctx| async {
                Ok::<_, BoxError>(json!("second branch"))
            })
            .await;
        assert!(
            matches!(sibling, Err(Error::AlreadyInProgress { .. })),
            "{name}: {sibling:?}"
        );

        let runs = Arc::clone(&first.runs);
        let first = first.finish().await.expect("the first branch");
        assert_eq!(first.value(), &json!("first branch"), "{name}");
        let later = operation
            .engine()
            .execute(&owned(&operation, &order, OTHER_EXECUTION), |_ctx| async {
                Ok::<_, BoxError>(json!("second branch"))
            })
            .await
            .expect("replayed");
        assert!(later.is_replay(), "{name}");
        assert_eq!(later.value(), &json!("first branch"), "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_cached_store_keeps_one_owners_operations_apart() {
    // One owner holds two operations at once (one lease token): the cache must settle each
    // under its own key, never one's outcome as the other's.
    for backend in both().await {
        let name = backend.name;
        let engine = Idempotency::new(CachedStore::new(backend.store.clone(), 1 << 20))
            .with_clock(backend.clock.clone());
        let operation = Operation::new(
            engine,
            OperationScope::new("durable", "cached").expect("scope"),
            KeyPolicy::pointer("/order_id").expect("policy"),
        );
        let (a, b) = (json!({"order_id": "o-a"}), json!({"order_id": "o-b"}));
        // A claims, then B (its claim the cache's latest under the owner's token); A settles
        // first.
        let hold = |order: &Value, result: &'static str| {
            HeldRun::start(
                operation.engine().clone(),
                owned(&operation, order, OTHER_EXECUTION),
                json!(result),
            )
        };
        let holder_a = hold(&a, "A-result").await;
        let holder_b = hold(&b, "B-result").await;
        let settled_a = holder_a.finish().await.expect("A ran");
        assert_eq!(settled_a.value(), &json!("A-result"), "{name}");

        // B is still in flight: another caller is told so, not handed A's result.
        let duplicate_of_b = operation
            .engine()
            .execute(
                &operation
                    .invocation(&b, &lambda_runtime::Context::default())
                    .expect("invocation"),
                |_ctx| async { Ok::<_, BoxError>(json!("ran again")) },
            )
            .await;
        assert!(
            matches!(duplicate_of_b, Err(Error::AlreadyInProgress { .. })),
            "{name}: {duplicate_of_b:?}"
        );
        let settled_b = holder_b.finish().await.expect("B ran");
        assert_eq!(settled_b.value(), &json!("B-result"), "{name}");
    }
}

/// A handler whose operation settles before the execution suspends again: the operation (the
/// crate's step `reserve`, then a durable wait) runs in a durable child context
/// (`Operation::durable_execute`) when `in_child`, else straight on the handler's context;
/// after it, the durable step `notify` and the wait `follow-up`.
fn settled_then_suspended(
    operation: Operation<Value>,
    in_child: bool,
    ran: Arc<Ran>,
) -> impl Fn(Value, DurableContext) -> DurableFuture + Send + Sync + 'static {
    move |order: Value, durable: DurableContext| {
        let (operation, ran) = (operation.clone(), Arc::clone(&ran));
        Box::pin(async move {
            ran.invocations.fetch_add(1, Ordering::SeqCst);
            let invocation = operation
                .durable_invocation(&order, &durable)?
                .with_lease(LONG_LEASE);
            let counted = Arc::clone(&ran);
            let reserve = move |steps: ExecutionContext| async move {
                steps
                    .step("reserve")
                    .run(|_key| async move {
                        counted.reserves.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(String::from("rsv-1"))
                    })
                    .await
            };
            let reserved: String = match in_child {
                true => {
                    operation
                        .durable_execute(invocation, &durable, |steps, child| async move {
                            let reserved = reserve(steps).await?;
                            child
                                .wait(Duration::from_secs(3600))
                                .name("cool-off")
                                .await?;
                            Ok(reserved)
                        })
                        .await?
                }
                false => operation
                    .engine()
                    .execute(&invocation, |steps| async {
                        let reserved = reserve(steps).await?;
                        durable
                            .wait(Duration::from_secs(3600))
                            .name("cool-off")
                            .await?;
                        Ok::<_, BoxError>(reserved)
                    })
                    .await?
                    .into_value(),
            };
            let notified: String = durable
                .step(|_| async { Ok(String::from("sent")) })
                .name("notify")
                .await?;
            durable
                .wait(Duration::from_secs(3600))
                .name("follow-up")
                .await?;
            Ok(json!({"reserved": reserved, "notified": notified}))
        })
    }
}

/// The durable SDK numbers a handler's durable operations by their place. Once the operation
/// settled, a replay is answered from its record without running its handler: inside a child
/// context (`durable_execute`) that changes no place, and the durable operations after it
/// replay in theirs; straight on the handler's context, the handler's durable operations are
/// missing from the count and the next one meets another's checkpoint.
#[tokio::test]
async fn an_operation_settled_before_a_later_suspension_keeps_the_replay_deterministic() {
    for backend in both().await {
        for in_child in [true, false] {
            let name = format!("{} (in a child context: {in_child})", backend.name);
            let ran = Arc::new(Ran::default());
            let operation = fulfil(&backend, &ran);
            let order = json!({"order_id": format!("o-settled-{in_child}"), "amount": 30});

            let handler = settled_then_suspended(operation, in_child, Arc::clone(&ran));
            let result = LocalRunner::new().run(handler, order).await;

            assert_eq!(
                Ran::count(&ran.reserves),
                1,
                "{name}: the crate's step replayed"
            );
            if in_child {
                assert!(result.is_success(), "{name}: {:?}", result.error_message());
                assert_eq!(
                    result.output(),
                    Some(&json!({"reserved": "rsv-1", "notified": "sent"})),
                    "{name}"
                );
                assert_eq!(result.invocation_count(), 3, "{name}: two suspensions");
            } else {
                assert!(
                    result.is_failure(),
                    "{name}: the plain form replays out of place"
                );
                assert!(
                    result
                        .error_message()
                        .is_some_and(|message| message.contains("non_deterministic")),
                    "{name}: {:?}",
                    result.error_message()
                );
            }
        }
    }
}
