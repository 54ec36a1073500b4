//! A storm of concurrent duplicates on one hot key, across several execution environments that
//! share one table (each its own process in Lambda: its own client, `CachedStore` and single
//! flight), with and without partition throttling injected into every environment's requests.
//! Handler executions and requests are counted, every caller's answer is classified, and the
//! record is read back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::record::Status;
use lambda_idempotency::store::{CachedStore, DynamoDbStore, StoreExt};
use lambda_idempotency::testing::conformance::{invocation, start_time};
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::interceptor::{
    FaultInterceptor, SDK_ATTEMPTS, SdkFault, SdkOperation, client_with,
};
use lambda_idempotency::testing::outcomes::compressible;
use lambda_idempotency::{Error, Idempotency, Invocation, Origin};
use serde_json::Value;
use tokio::sync::oneshot;

/// Execution environments sharing the table.
const ENVIRONMENTS: usize = 4;
/// Concurrent duplicates each environment receives per wave.
const DUPLICATES: usize = 25;
/// Requests the SDK can send for one write: its attempts.
const ATTEMPTS: usize = SDK_ATTEMPTS as usize;

type Engine = Idempotency;
/// A duplicate under way: its environment and its task.
type Duplicate = (
    usize,
    tokio::task::JoinHandle<Result<lambda_idempotency::Execution<Value>, Error>>,
);

/// One execution environment: its engine and its client's faults (which count its requests).
struct Environment {
    idem: Engine,
    faults: FaultInterceptor,
}

impl Environment {
    /// Requests this environment has sent, every SDK attempt counted.
    fn requests(&self) -> usize {
        [
            SdkOperation::PutItem,
            SdkOperation::UpdateItem,
            SdkOperation::DeleteItem,
            SdkOperation::GetItem,
            SdkOperation::TransactWriteItems,
        ]
        .into_iter()
        .map(|operation| self.faults.requests(operation))
        .sum()
    }
}

/// How one caller was answered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Answers {
    executed: usize,
    replayed: usize,
    in_progress: usize,
    transient: usize,
}

impl Answers {
    fn total(self) -> usize {
        self.executed + self.replayed + self.in_progress + self.transient
    }
}

struct Storm {
    environments: Vec<Arc<Environment>>,
    runs: Arc<AtomicUsize>,
    outcome: Value,
    clock: ManualClock,
    dynamo: Dynamo,
}

impl Storm {
    async fn new() -> Self {
        let clock = ManualClock::new(start_time());
        let dynamo = dynamo::start_with_clock(clock.clone()).await;
        let environments = (0..ENVIRONMENTS)
            .map(|_| {
                let faults = FaultInterceptor::new();
                let store = DynamoDbStore::new(
                    client_with(dynamo.endpoint.clone(), &faults),
                    &dynamo.table,
                );
                let idem = Idempotency::new(CachedStore::new(store, 16 << 20))
                    .with_single_flight()
                    .with_clock(clock.clone());
                Arc::new(Environment { idem, faults })
            })
            .collect();
        Self {
            environments,
            runs: Arc::default(),
            // 100 KB of JSON: compressed into a part item beside the record.
            outcome: compressible(100 * 1024),
            clock,
            dynamo,
        }
    }

    fn requests(&self) -> Vec<usize> {
        self.environments.iter().map(|env| env.requests()).collect()
    }

    /// Starts the first execution in environment 0; its handler waits for the returned sender.
    async fn leader(
        &self,
        inv: &Invocation,
    ) -> (
        tokio::task::JoinHandle<Result<Origin, Error>>,
        oneshot::Sender<()>,
    ) {
        let (started_tx, started_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel::<()>();
        let (env, inv, runs, outcome) = (
            Arc::clone(&self.environments[0]),
            inv.clone(),
            Arc::clone(&self.runs),
            self.outcome.clone(),
        );
        let leader = tokio::spawn(async move {
            env.idem
                .execute(&inv, |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = started_tx.send(());
                    let _ = resume_rx.await;
                    Ok::<_, std::io::Error>(outcome)
                })
                .await
                .map(|done| done.origin())
        });
        started_rx.await.expect("the leader runs");
        (leader, resume_tx)
    }

    /// `DUPLICATES` concurrent duplicates of `inv` in each of `environments`, every answer
    /// checked: a replay gives the whole outcome; only a transient error or AlreadyInProgress
    /// may stand in for one.
    async fn wave(&self, inv: &Invocation, environments: std::ops::Range<usize>) -> Vec<Answers> {
        let tasks = self.spawn(inv, environments);
        self.answers(tasks).await
    }

    /// Starts the duplicates of a wave.
    fn spawn(&self, inv: &Invocation, environments: std::ops::Range<usize>) -> Vec<Duplicate> {
        let mut tasks = Vec::new();
        for env in environments {
            for _ in 0..DUPLICATES {
                let (duplicate, _) = duplicate(&self.environments[env].idem, inv, &self.runs);
                tasks.push((env, duplicate));
            }
        }
        tasks
    }

    /// Starts environment `env`'s duplicates, and returns once each has been polled: while the
    /// leader runs there, each is then queued for the leader's turn in single flight.
    async fn spawn_queued(&self, inv: &Invocation, env: usize) -> Vec<Duplicate> {
        let mut tasks = Vec::new();
        for _ in 0..DUPLICATES {
            let (duplicate, polled) = duplicate(&self.environments[env].idem, inv, &self.runs);
            polled.await.expect("the duplicate was polled");
            tasks.push((env, duplicate));
        }
        tasks
    }

    /// Waits for a wave's duplicates and classifies their answers, per environment.
    async fn answers(&self, tasks: Vec<Duplicate>) -> Vec<Answers> {
        let mut answers = vec![Answers::default(); ENVIRONMENTS];
        for (env, task) in tasks {
            let answer = &mut answers[env];
            match task.await.expect("join") {
                Ok(done) if done.is_replay() => {
                    assert_eq!(done.value(), &self.outcome, "a replay is the whole outcome");
                    answer.replayed += 1;
                }
                Ok(done) => panic!("a duplicate ran: {:?}", done.origin()),
                Err(Error::AlreadyInProgress { .. }) => answer.in_progress += 1,
                Err(Error::Store(err)) if err.is_transient() => answer.transient += 1,
                Err(err) => panic!("a wrong answer to a duplicate: {err:?}"),
            }
        }
        answers
    }
}

/// A duplicate of `inv` on `idem` whose handler counts its runs, and a signal sent once its
/// execution has been polled: with single flight, and the key's turn held in this engine, it
/// is then queued for the turn (the first poll reaches the turn's lock and nothing before it
/// waits).
fn duplicate(
    idem: &Idempotency,
    inv: &Invocation,
    runs: &Arc<AtomicUsize>,
) -> (
    tokio::task::JoinHandle<Result<lambda_idempotency::Execution<Value>, Error>>,
    oneshot::Receiver<()>,
) {
    let (polled_tx, polled_rx) = oneshot::channel();
    let (idem, inv, runs) = (idem.clone(), inv.clone(), Arc::clone(runs));
    let mut execution = Box::pin(async move {
        idem.execute(&inv, |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Value::Null)
        })
        .await
    });
    let mut polled_tx = Some(polled_tx);
    let task = tokio::spawn(std::future::poll_fn(move |cx| {
        let poll = execution.as_mut().poll(cx);
        if let Some(polled) = polled_tx.take() {
            let _ = polled.send(());
        }
        poll
    }));
    (task, polled_rx)
}

fn delta(after: &[usize], before: &[usize]) -> Vec<usize> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_duplicates_runs_once_and_costs_a_request_per_environment_once_settled() {
    let storm = Storm::new().await;
    let inv = invocation("hot", &serde_json::json!({"order": "o-1"}));

    // While the first execution runs: the other environments' duplicates are told it is in
    // progress (one request each, turn by turn); environment 0's wait for its outcome.
    let (leader, resume) = storm.leader(&inv).await;
    let before = storm.requests();
    // Environment 0's duplicates are queued for the leader's turn before the others start.
    let waiting = storm.spawn_queued(&inv, 0).await;
    let in_flight = storm.wave(&inv, 1..ENVIRONMENTS).await;
    let sent = delta(&storm.requests(), &before);
    for env in 1..ENVIRONMENTS {
        assert_eq!(
            in_flight[env],
            Answers {
                in_progress: DUPLICATES,
                ..Answers::default()
            }
        );
        assert_eq!(
            sent[env], DUPLICATES,
            "one failed claim per duplicate in flight"
        );
    }
    assert_eq!(
        sent[0], 0,
        "environment 0's duplicates, queued in single flight, wait without a request"
    );
    let _ = resume.send(());
    let waiting = storm.answers(waiting).await;
    assert_eq!(
        leader.await.expect("join").expect("leader"),
        Origin::Executed { attempt: 1 }
    );
    assert_eq!(
        waiting[0],
        Answers {
            replayed: DUPLICATES,
            ..Answers::default()
        },
        "environment 0's duplicates replay the leader's outcome (from its cache: see \
         a_duplicate_queued_in_single_flight_replays_from_the_store for the store's answer)"
    );

    // A duplicate's failed claim is billed on the record that stands: one write unit, so the
    // partition's 1,000 write units a second take 1,000 duplicates, not 10 (a 100 KB outcome
    // inline would cost 101 units each).
    let record = storm
        .dynamo
        .client
        .get_item()
        .table_name(&storm.dynamo.table)
        .key("pk", AttributeValue::S(inv.key().as_str().to_owned()))
        .send()
        .await
        .expect("get")
        .item
        .expect("the record");
    assert!(
        dynamo::item_size(&record) <= 1024,
        "one write unit per duplicate"
    );

    // Once settled: one request per environment (the claim that finds the record and caches
    // it, plus its part read), then none.
    let before = storm.requests();
    let settled = storm.wave(&inv, 0..ENVIRONMENTS).await;
    let sent = delta(&storm.requests(), &before);
    assert!(settled.iter().all(|answers| answers.replayed == DUPLICATES));
    assert_eq!(sent[0], 0, "environment 0 settled it: all from its cache");
    for sent in &sent[1..] {
        assert_eq!(*sent, 2, "the claim and the outcome's part, once");
    }
    let again = storm.requests();
    storm.wave(&inv, 0..ENVIRONMENTS).await;
    assert_eq!(
        storm.requests(),
        again,
        "every environment answers from its cache"
    );
    assert_eq!(storm.runs.load(Ordering::SeqCst), 1, "one execution in all");
    let total = (ENVIRONMENTS - 1) * DUPLICATES + ENVIRONMENTS * DUPLICATES * 3;
    println!(
        "hot key: {total} duplicates, {} requests",
        storm.requests().iter().sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partition_throttling_backs_off_loses_no_outcome_and_runs_nothing_twice() {
    let storm = Storm::new().await;
    let inv = invocation("throttled", &serde_json::json!({"order": "o-2"}));
    // The partition is over its 1,000 write units a second: every environment's next writes
    // are refused (ProvisionedThroughputExceeded) past the SDK's own retries, the leader's
    // settlement too, and reads are throttled as well.
    for env in &storm.environments {
        env.faults.inject_times(
            SdkOperation::PutItem,
            SdkFault::ThroughputExceeded,
            4 * ATTEMPTS,
        );
        env.faults
            .inject_times(SdkOperation::GetItem, SdkFault::Throttle, ATTEMPTS);
    }
    storm.environments[0].faults.inject_times(
        SdkOperation::UpdateItem,
        SdkFault::Throttle,
        2 * ATTEMPTS,
    );
    let start = storm.clock.now();

    // The leader's own claim backs off through its throttles before it acquires.
    let (leader, resume) = storm.leader(&inv).await;
    let in_flight = storm.wave(&inv, 1..ENVIRONMENTS).await;
    let _ = resume.send(());
    let origin = leader.await.expect("join").expect("the leader completes");
    assert_eq!(origin, Origin::Executed { attempt: 1 });
    let backed_off = storm
        .clock
        .now()
        .duration_since(start)
        .expect("time moves on");
    assert!(
        backed_off >= Duration::from_millis(50 + 100),
        "the engine paused between tries: {backed_off:?}"
    );
    for answers in &in_flight[1..] {
        assert_eq!(answers.total(), DUPLICATES);
        assert_eq!(
            answers.replayed + answers.executed,
            0,
            "nothing settled yet"
        );
    }

    let settled = storm.wave(&inv, 0..ENVIRONMENTS).await;
    for answers in &settled {
        assert_eq!(answers.executed, 0);
        assert_eq!(answers.in_progress, 0, "settled: no one waits");
    }
    for env in &storm.environments {
        env.faults.clear();
    }
    let last = storm.wave(&inv, 0..ENVIRONMENTS).await;
    assert!(last.iter().all(|answers| answers.replayed == DUPLICATES));
    let record = storm.environments[1]
        .idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("stands");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(
        serde_json::from_slice::<Value>(record.outcome.as_deref().expect("outcome")).expect("json"),
        storm.outcome,
        "the outcome, whole"
    );
    assert_eq!(storm.runs.load(Ordering::SeqCst), 1, "one execution in all");
    let fired: usize = storm
        .environments
        .iter()
        .map(|env| {
            env.faults
                .fired(SdkOperation::PutItem, SdkFault::ThroughputExceeded)
                + env.faults.fired(SdkOperation::GetItem, SdkFault::Throttle)
                + env
                    .faults
                    .fired(SdkOperation::UpdateItem, SdkFault::Throttle)
        })
        .sum();
    assert!(
        fired >= ENVIRONMENTS * 4 * ATTEMPTS,
        "the throttles met requests: {fired}"
    );
}

/// Single flight without the in-process cache: a duplicate queued behind the leader sends
/// nothing while it waits, then claims once and replays the stored outcome from the table
/// (not from a cache, which this engine has none of). Without single flight it would have been
/// answered `AlreadyInProgress` while the leader ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_queued_in_single_flight_replays_from_the_store() {
    let clock = ManualClock::new(start_time());
    let dynamo = dynamo::start_with_clock(clock.clone()).await;
    let faults = FaultInterceptor::new();
    let store = DynamoDbStore::new(client_with(dynamo.endpoint.clone(), &faults), &dynamo.table);
    let idem = Idempotency::new(store.clone())
        .with_single_flight()
        .with_clock(clock.clone());
    let inv = invocation("queued", &serde_json::json!({"order": "o-3"}));
    let runs = Arc::new(AtomicUsize::new(0));
    let sent = |operation| faults.requests(operation);

    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let leader = tokio::spawn({
        let (idem, inv) = (idem.clone(), inv.clone());
        async move {
            idem.execute(&inv, |_| async move {
                let _ = started_tx.send(());
                let _ = resume_rx.await;
                Ok::<_, std::io::Error>(serde_json::json!({"charged": "o-3"}))
            })
            .await
        }
    });
    started_rx.await.expect("the leader runs");
    let claims = sent(SdkOperation::PutItem);
    let mut queued = Vec::new();
    for _ in 0..DUPLICATES {
        let (task, polled) = duplicate(&idem, &inv, &runs);
        polled.await.expect("polled");
        queued.push(task);
    }
    // The leader's claim is live: an engine without single flight is told so at once.
    let plain = Idempotency::new(store).with_clock(clock.clone());
    let err = plain
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(Value::Null) })
        .await
        .expect_err("in progress");
    assert!(
        matches!(err, Error::AlreadyInProgress { attempt: 1, .. }),
        "got {err:?}"
    );
    assert_eq!(
        sent(SdkOperation::PutItem),
        claims + 1,
        "the queued duplicates sent no claim, only the engine without single flight did"
    );
    assert!(
        queued.iter().all(|task| !task.is_finished()),
        "still queued"
    );

    // The leader settles with an UpdateItem: every claim and read from here is a duplicate's.
    let (claims, reads) = (sent(SdkOperation::PutItem), sent(SdkOperation::GetItem));
    let _ = resume_tx.send(());
    let leader = leader.await.expect("join").expect("the leader completes");
    assert_eq!(leader.origin(), Origin::Executed { attempt: 1 });
    for task in queued {
        let done = task
            .await
            .expect("join")
            .expect("the queued duplicate is answered");
        assert!(
            done.is_replay(),
            "waited, then replayed: {:?}",
            done.origin()
        );
        assert_eq!(done.raw_json().get(), leader.raw_json().get());
    }
    assert_eq!(
        (
            sent(SdkOperation::PutItem) - claims,
            sent(SdkOperation::GetItem) - reads
        ),
        (DUPLICATES, 0),
        "each queued duplicate claimed once in its turn and met the stored record"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no duplicate ran");
    let record = dynamo
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("stands");
    assert_eq!(
        (record.status, record.lease.attempt),
        (Status::Completed, 1)
    );
}

/// A caller queued for its key's turn has the time it waited taken off its lease, measured on
/// the engine's clock: the leader's handler moves the clock 20 s and fails for a retryable
/// reason, and the queued caller, which then claims and runs, holds the key until its deadline,
/// not 20 s past it (the real clock, which barely moved, took nothing off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_waited_for_comes_off_the_lease_on_the_engines_clock() {
    for backend in crate::backends::both().await {
        let (name, store, clock, idem) = backend.parts();
        let idem = idem.with_single_flight();
        let deadline = start_time() + Duration::from_secs(60);
        let inv = invocation("late-turn", &serde_json::json!({"order": "o-9"}))
            .with_lease(Duration::from_secs(60))
            .with_deadline(deadline);
        let (started_tx, started_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel::<()>();
        let leader = tokio::spawn({
            let (idem, inv, clock) = (idem.clone(), inv.clone(), clock.clone());
            async move {
                idem.execute(&inv, |_| async move {
                    let _ = started_tx.send(());
                    let _ = resume_rx.await;
                    clock.advance(Duration::from_secs(20));
                    Err::<Value, _>(std::io::Error::other("the payment service timed out"))
                })
                .await
            }
        });
        started_rx.await.expect("the leader runs");
        let runs = Arc::new(AtomicUsize::new(0));
        let (queued, polled) = duplicate(&idem, &inv, &runs);
        polled.await.expect("queued for the turn");
        let _ = resume_tx.send(());
        let err = leader.await.expect("join").expect_err("the leader failed");
        assert!(matches!(err, Error::Handler { .. }), "{name}: got {err:?}");
        let done = queued.await.expect("join").expect("the queued caller runs");
        assert_eq!(done.origin(), Origin::Executed { attempt: 1 }, "{name}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: ran once, in its turn"
        );
        let record = store.get(inv.key()).await.expect("read").expect("settled");
        assert!(
            record.lease.expires_at <= deadline,
            "{name}: the queued caller's claim holds until {:?}, past its deadline {deadline:?}",
            record.lease.expires_at
        );
    }
}
