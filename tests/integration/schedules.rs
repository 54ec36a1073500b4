//! The real engine under a controlled scheduler (awslabs' shuttle, written to check S3's
//! storage node): two deliveries of one operation run as tasks of shuttle's scheduler through
//! the real door (an `Operation`'s layer over a Lambda handler) and the real `MemoryStore`, every store request a scheduling point where the checker may also fail
//! the request before it applies, lose its answer after it applied, or crash the delivery there
//! (its future dropped, its claim given back by a task on the same scheduler). Then, past the
//! lease, a redelivery comes. After each schedule: the handler ran at most once, every answer
//! is that run's result, and nothing is left IN_PROGRESS without a way forward.
//!
//! Time and tasks go through the engine's injected clock and spawner, so nothing here needs a
//! Tokio runtime. A failing schedule prints shuttle's encoded schedule; `shuttle::replay(case,
//! schedule)` replays it.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures_util::future::{Either, select};
use lambda_idempotency::clock::Clock;
use lambda_idempotency::effects::Checked;
use lambda_idempotency::error::StoreError;
use lambda_idempotency::key::OperationKey;
use lambda_idempotency::lambda::IdempotencyError;
use lambda_idempotency::lambda::current;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};
use lambda_idempotency::store::{Claim, Fence, MemoryStore, Store, Target, TransactionalStore};
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::{
    BoxError, ErrorKind, Execution, Idempotency, KeyPolicy, Operation, OperationScope, Origin,
};
use lambda_runtime::tower::{Layer, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};
use shuttle::rand::{Rng, thread_rng};
use shuttle::scheduler::{DfsScheduler, PctScheduler, RandomScheduler, Scheduler};
use shuttle::{Config, Runner};
use tokio::sync::Notify;

/// What the checker may do to one store request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Faults {
    /// Every request applies and answers.
    None,
    /// A request may fail before it applies or lose its answer after it applied.
    Lossy,
    /// As `Lossy`, and a delivery may crash at a request, before or after it applies.
    Crashing,
}

/// What one exploration did.
#[derive(Debug, Default)]
struct Counts {
    schedules: AtomicUsize,
    /// Give-back tasks that ran to their end (their `shorten` may itself meet a fault).
    give_backs: Arc<AtomicUsize>,
    /// Faults the checker chose (a failed request, a lost answer, a crash).
    faults: Arc<AtomicUsize>,
}

/// What the delivered handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    /// Its effect directly (the default recovery holds a crashed attempt for an operator).
    Direct,
    /// Its effect in a step with a truthful check (`Recovery::Steps`: an uncertain step is
    /// decided by its check, an attempt that recorded no intent runs again).
    Stepped,
}

/// Which operations the two concurrent deliveries are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operations {
    /// Both deliver order o-1.
    One,
    /// Orders o-1 and o-2 (two keys) paying with one payment p-1, the business identity their
    /// key policy declares: one effect between them.
    SharingAnIdentity,
}

/// One case: what the checker may do, what the handler does, which operations meet.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    faults: Faults,
    handler: Handler,
    operations: Operations,
    /// A defect put in for the harness's own check (see [`Scheduled`]).
    steals_live_leases: bool,
}

tokio::task_local! {
    /// The crash signal of the delivery running on this task.
    static CRASH: Arc<Notify>;
}

/// The memory store with every request a scheduling point, and the checker's faults.
#[derive(Debug, Clone)]
struct Scheduled {
    inner: MemoryStore,
    faults: Faults,
    /// A defect put in for the harness's own check: a claim that meets a live claim takes its
    /// lease anyway.
    steals_live_leases: bool,
    /// Faults chosen, counted.
    fired: Arc<AtomicUsize>,
}

impl Scheduled {
    async fn request<T>(
        &self,
        operation: &'static str,
        apply: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        shuttle::future::yield_now().await;
        // Each fault the case allows meets one request in ten, chosen by the checker.
        let faults = match self.faults {
            Faults::None => 0,
            Faults::Lossy => 2,
            // A crash only where a delivery can crash (not in a give-back's own task).
            Faults::Crashing if CRASH.try_with(|_| ()).is_ok() => 4,
            Faults::Crashing => 2,
        };
        let unavailable = || StoreError::Unavailable {
            operation,
            source: "the checker's fault".into(),
        };
        let fault = match faults {
            0 => 0,
            _ => Some(thread_rng().gen_range(0..10))
                .filter(|drawn| *drawn <= faults)
                .unwrap_or(0),
        };
        if fault > 0 {
            self.fired.fetch_add(1, Ordering::SeqCst);
        }
        match fault {
            1 => Err(unavailable()),
            2 => {
                let _ = apply.await;
                shuttle::future::yield_now().await;
                Err(unavailable())
            }
            3 => crash().await,
            4 => {
                let _ = apply.await;
                crash().await
            }
            _ => {
                let answer = apply.await;
                shuttle::future::yield_now().await;
                answer
            }
        }
    }
}

/// Crashes the calling delivery: signals it and never returns.
async fn crash<T>() -> T {
    let _ = CRASH.try_with(|crash| crash.notify_one());
    std::future::pending().await
}

impl Store for Scheduled {
    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(self.request("claim", async move {
            match self.inner.claim(record, now).await? {
                Claim::Existing(live) if self.steals_live_leases => {
                    let past_its_end = live.lease.expires_at + Duration::from_secs(1);
                    let stolen =
                        self.inner
                            .take_over(&live, &record.lease, record.expires_at, past_its_end);
                    match stolen.await? {
                        Fence::Held => Ok(Claim::Acquired),
                        Fence::Lost { .. } => Ok(Claim::Existing(live)),
                    }
                }
                claim => Ok(claim),
            }
        }))
    }

    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(self.request("adopt", self.inner.adopt(record, orphan, now)))
    }

    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        let take_over = self.inner.take_over(previous, lease, expires_at, now);
        Box::pin(self.request("take_over", take_over))
    }

    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(self.request("shorten", self.inner.shorten(target, until)))
    }

    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(self.request("settle", self.inner.settle(target, settlement)))
    }

    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(self.request("record_steps", self.inner.record_steps(target, steps)))
    }

    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(self.request("release", self.inner.release(target)))
    }

    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner
            .release_by_operator(seen, evidence, released, now)
    }

    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.settle_evidence(seen, settlement, now)
    }

    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(self.request("get", self.inner.get(key)))
    }

    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>> {
        Box::pin(self.request("evidence", self.inner.evidence(identity)))
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}

/// Time that moves only when a task sleeps (a retry's backoff) or the case moves it, each
/// sleep a scheduling point; a deadline never ends before what it bounds (the cases set none).
#[derive(Debug, Clone)]
struct ScheduledClock(Arc<Mutex<SystemTime>>);

impl ScheduledClock {
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Clock for ScheduledClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.advance(duration);
        Box::pin(shuttle::future::yield_now())
    }

    fn deadline(&self, _: Duration) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        ceiling
    }
}

/// One delivery's answer: the value it was given, or the kind of error.
type Answer = Result<(String, Origin), ErrorKind>;

/// One delivery through the real door (the operation's layer over a Lambda handler, keyed by
/// its key policy) on `idem`: `None` when it crashed.
async fn deliver(
    idem: Idempotency,
    handler: Handler,
    order_id: OrderId,
    runs: Arc<AtomicUsize>,
) -> Option<Answer> {
    let crash = Arc::new(Notify::new());
    let operation = Operation::new(idem, scope(), policy());
    let operation = match handler {
        Handler::Direct => operation,
        Handler::Stepped => operation.with_recovery(Recovery::Steps),
    };
    let service = operation
        .layer()
        .executions()
        .layer(service_fn(move |_: LambdaEvent<Value>| {
            handle(handler, order_id, Arc::clone(&runs))
        }));
    let event = LambdaEvent::new(order(order_id), Context::default());
    let delivery = CRASH.scope(Arc::clone(&crash), service.oneshot(event));
    match select(pin!(delivery), pin!(crash.notified())).await {
        Either::Left((answer, _)) => Some(answered(answer)),
        Either::Right(((), _)) => None,
    }
}

/// A delivery's answer as the case judges it.
fn answered(answer: Result<Execution<String>, IdempotencyError<BoxError>>) -> Answer {
    match answer {
        Ok(execution) => {
            let origin = execution.origin();
            Ok((execution.into_value(), origin))
        }
        Err(IdempotencyError::Idempotency(err)) => Err(err.kind()),
        Err(_) => Err(ErrorKind::Handler),
    }
}

/// The Lambda handler: its effect directly, or in a step with a truthful check.
async fn handle(
    handler: Handler,
    order_id: OrderId,
    runs: Arc<AtomicUsize>,
) -> Result<String, BoxError> {
    let Handler::Stepped = handler else {
        return Ok(effect(order_id, &runs).await);
    };
    let ctx = current().ok_or("no execution context in the handler")?;
    let landed = Arc::clone(&runs);
    let charged = ctx
        .step("charge")
        .checked_by(move |_key: String| {
            let found = match landed.load(Ordering::SeqCst) {
                0 => Checked::NotApplied,
                run => Checked::Applied(format!("{order_id}#{run}")),
            };
            async move { Ok::<_, BoxError>(found) }
        })
        .run(|_key| async move { Ok::<_, BoxError>(effect(order_id, &runs).await) })
        .await?;
    Ok(charged)
}

/// The operation's scope, key policy and event.
fn scope() -> OperationScope {
    OperationScope::new("shuttle", "charge").expect("a scope")
}

/// Keyed by the order, with the payment as its business identity (one effect per payment).
fn policy() -> KeyPolicy<Value> {
    KeyPolicy::pointer("/order_id")
        .expect("a key policy")
        .with_identity(|order: &Value| order["payment_id"].as_str().map(str::to_owned))
}

/// An order (o-1, o-2), all paying with payment p-1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OrderId(u8);

impl std::fmt::Display for OrderId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "o-{}", self.0)
    }
}

fn order(order_id: OrderId) -> Value {
    json!({"order_id": order_id.to_string(), "payment_id": "p-1", "amount": 1})
}

/// The effect (one per payment): counted, its order and count the result (a second run
/// would answer `#2`, another order's run its own order).
async fn effect(order_id: OrderId, runs: &AtomicUsize) -> String {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    shuttle::future::yield_now().await;
    format!("{order_id}#{run}")
}

/// One schedule: two concurrent deliveries, then one past the lease, then the invariants.
fn case(scenario: Scenario, counts: &Counts) {
    let Scenario {
        faults,
        handler,
        operations,
        steals_live_leases,
    } = scenario;
    counts.schedules.fetch_add(1, Ordering::SeqCst);
    let give_backs = Arc::clone(&counts.give_backs);
    let fired = Arc::clone(&counts.faults);
    shuttle::future::block_on(async move {
        let clock = ScheduledClock(Arc::new(Mutex::new(start_time())));
        let store = Scheduled {
            inner: MemoryStore::new(),
            faults,
            steals_live_leases,
            fired,
        };
        let idem = Idempotency::new(store.clone())
            .with_clock(clock.clone())
            .with_spawner(move |task| {
                let given_back = Arc::clone(&give_backs);
                drop(shuttle::future::spawn(async move {
                    task.await;
                    given_back.fetch_add(1, Ordering::SeqCst);
                }));
            });
        let runs = Arc::new(AtomicUsize::new(0));
        let other = match operations {
            Operations::One => OrderId(1),
            Operations::SharingAnIdentity => OrderId(2),
        };
        let first = shuttle::future::spawn(deliver(
            idem.clone(),
            handler,
            OrderId(1),
            Arc::clone(&runs),
        ));
        let second = shuttle::future::spawn(deliver(idem, handler, other, Arc::clone(&runs)));
        let mut answers = vec![
            first.await.expect("the first delivery's task"),
            second.await.expect("the second delivery's task"),
        ];
        // Past any lease (a Lambda invocation's longest) and a give-back's grace, within the
        // retention: a redelivery meets whatever stands.
        clock.advance(Duration::from_secs(20 * 60));
        let quiet = Idempotency::new(store.inner.clone()).with_clock(clock.clone());
        answers.push(deliver(quiet, handler, OrderId(1), Arc::clone(&runs)).await);
        check(
            scenario,
            &store.inner,
            &runs,
            [OrderId(1), other, OrderId(1)],
            &answers,
        )
        .await;
    });
}

/// The invariants after one schedule: `answers` to the deliveries of `orders`.
async fn check(
    scenario: Scenario,
    store: &MemoryStore,
    runs: &AtomicUsize,
    orders: [OrderId; 3],
    answers: &[Option<Answer>],
) {
    let runs = runs.load(Ordering::SeqCst);
    // A crashed direct run is held for an operator, never run again blind; a step's effect
    // is decided by its check; one payment pays once.
    assert!(runs <= 1, "the effect ran {runs} times: {answers:?}");
    for (order_id, answer) in orders.iter().zip(answers) {
        match answer {
            // Crashed: no answer.
            None => {}
            // Its own order's one run, never another's.
            Some(Ok((value, _))) => assert_eq!(
                *value,
                format!("{order_id}#1"),
                "{order_id} was answered another run's result: {answers:?}"
            ),
            // An error only where the scenario explains it.
            Some(Err(kind)) => assert!(
                explained(scenario, *kind),
                "{order_id} was refused with {kind:?}, which {scenario:?} never explains: {answers:?}"
            ),
        }
    }
    let key = |order_id| {
        policy()
            .derive(&scope(), &order(order_id))
            .expect("a key")
            .0
    };
    let status = |record: Option<Record>| record.map(|record| record.status);
    let first = status(
        store
            .get(&key(OrderId(1)))
            .await
            .expect("the memory store answers"),
    );
    let other = status(
        store
            .get(&key(OrderId(2)))
            .await
            .expect("the memory store answers"),
    );
    // o-1 was redelivered past every lease: it left IN_PROGRESS (o-2, if it won the payment
    // and crashed, was never redelivered here).
    assert_ne!(
        first,
        Some(Status::InProgress),
        "o-1 left IN_PROGRESS: {answers:?}"
    );
    assert!(
        first != Some(Status::Completed) || other != Some(Status::Completed),
        "two orders completed on one payment: {answers:?}"
    );
    // The last delivery, with no fault, answers a completed o-1 with its one result.
    if first == Some(Status::Completed) {
        assert!(
            matches!(&answers[2], Some(Ok((value, _))) if value == "o-1#1"),
            "a completed operation was answered otherwise: {answers:?}"
        );
    }
    // Without faults nothing excuses a missing effect: the payment was made, by the order
    // that completed, and the last delivery of o-1 was answered (its result, or the other
    // order's standing payment).
    if scenario.faults == Faults::None {
        assert_eq!(runs, 1, "no fault, and the effect never ran: {answers:?}");
        let completed = [first, other]
            .iter()
            .filter(|status| **status == Some(Status::Completed))
            .count();
        assert_eq!(
            completed, 1,
            "no fault, and no order completed: {answers:?}"
        );
        assert!(
            answers.iter().all(Option::is_some),
            "no fault, and a delivery crashed: {answers:?}"
        );
    }
}

/// Whether `scenario` explains a refusal of `kind`: a duplicate meeting a live claim, the
/// payment standing for the other order, and with faults a store error that outlasted the
/// retries, a lease lost to a give-back's takeover, a crashed direct run held for an operator.
fn explained(scenario: Scenario, kind: ErrorKind) -> bool {
    match kind {
        ErrorKind::AlreadyInProgress => true,
        ErrorKind::KeyExpiredConflict => scenario.operations == Operations::SharingAnIdentity,
        ErrorKind::Store | ErrorKind::LeaseLost => scenario.faults != Faults::None,
        ErrorKind::Indeterminate => scenario.faults == Faults::Crashing,
        _ => false,
    }
}

/// Runs `case` under `scheduler` with stacks deep enough for the engine's futures (shuttle's
/// default, 32 KiB, is not), and answers what it did.
fn explore(scheduler: impl Scheduler + 'static, scenario: Scenario) -> Explored {
    let counts = Arc::new(Counts::default());
    let mut config = Config::new();
    config.stack_size = 1 << 20;
    let explored = Arc::clone(&counts);
    Runner::new(scheduler, config).run(move || case(scenario, &explored));
    let explored = Explored {
        schedules: counts.schedules.load(Ordering::SeqCst),
        give_backs: counts.give_backs.load(Ordering::SeqCst),
        faults: counts.faults.load(Ordering::SeqCst),
    };
    eprintln!("{scenario:?}: {explored:?}");
    explored
}

/// What an exploration did: schedules run, give-back tasks run to their end, faults chosen.
#[derive(Debug)]
struct Explored {
    schedules: usize,
    give_backs: usize,
    faults: usize,
}

/// Every handler and pair of operations, with the checker's `faults`.
fn scenarios(faults: Faults) -> impl Iterator<Item = Scenario> {
    [Handler::Direct, Handler::Stepped]
        .into_iter()
        .flat_map(move |handler| {
            [Operations::One, Operations::SharingAnIdentity]
                .into_iter()
                .map(move |operations| Scenario {
                    faults,
                    handler,
                    operations,
                    steals_live_leases: false,
                })
        })
}

/// Every interleaving of the two deliveries' store requests, no fault: exhaustive at this
/// size.
#[test]
fn every_interleaving_of_two_deliveries_runs_the_effect_once() {
    for scenario in scenarios(Faults::None) {
        let explored = explore(DfsScheduler::new(None, false), scenario);
        assert!(explored.schedules > 100, "{scenario:?}: only {explored:?}");
    }
}

/// Random schedules per case: `SHUTTLE_SCHEDULES` (CI's exhaustive step runs more), else 1000.
fn random_schedules() -> usize {
    std::env::var("SHUTTLE_SCHEDULES")
        .map_or(1000, |n| n.parse().expect("SHUTTLE_SCHEDULES is a number"))
}

/// Random schedules with requests failing before they apply and answers lost after.
#[test]
fn lost_answers_and_failed_requests_never_run_the_effect_twice() {
    for scenario in scenarios(Faults::Lossy) {
        let explored = explore(RandomScheduler::new(random_schedules()), scenario);
        // About 2 faults in 10 requests, several requests a schedule.
        assert!(
            explored.faults > explored.schedules / 2,
            "{scenario:?}: only {explored:?}"
        );
    }
}

/// Random and PCT schedules with deliveries crashing at any request as well.
#[test]
fn crashes_at_any_request_never_run_the_effect_twice() {
    for scenario in scenarios(Faults::Crashing) {
        let random = explore(RandomScheduler::new(random_schedules()), scenario);
        let pct = explore(PctScheduler::new(3, random_schedules() / 2), scenario);
        assert!(
            random.give_backs > 0 && pct.give_backs > 0,
            "{scenario:?}: no crashed delivery's claim was given back: {random:?}, {pct:?}"
        );
    }
}

/// The harness catches a store whose claim takes a live lease: some interleaving has both
/// deliveries claim before either settles, and the handler runs twice.
#[test]
#[should_panic(expected = "the effect ran 2 times")]
fn a_claim_that_takes_a_live_lease_is_caught() {
    let scenario = Scenario {
        faults: Faults::None,
        handler: Handler::Direct,
        operations: Operations::One,
        steals_live_leases: true,
    };
    explore(DfsScheduler::new(None, false), scenario);
}
