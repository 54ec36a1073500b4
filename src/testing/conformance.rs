//! The conformance suite: every case runs against every store (see [`conformance_tests!`](crate::conformance_tests)).
//!
//! Each case takes a fresh, empty store. Time comes from a `ManualClock`; concurrency cases
//! count real handler executions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::key::IdentityScope;
use lambda_idempotency::reconcile::{BoxFuture, Recovery};
use lambda_idempotency::record::{Record, Status};
use lambda_idempotency::store::{MemoryStore, Store, StoreExt};
use lambda_idempotency::{
    Config, Error, Execution, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
    Origin,
};
use tokio::sync::{Barrier, oneshot, watch};

/// Lease used by the cases.
pub const LEASE: Duration = Duration::from_secs(30);
/// Guard against a broken protocol hanging a case forever (never hit when the store is right).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Deletes expired records as TTL eventually does; returns how many.
pub type Sweeper = Arc<dyn Fn() -> BoxFuture<'static, usize> + Send + Sync>;

/// A fresh, empty store, the clock its backend reads, its TTL sweep, and what it can do.
pub struct Fixture<S> {
    /// The store under test, empty.
    pub store: S,
    /// The clock the store's backend reads (the engine gets it too).
    pub clock: ManualClock,
    /// Deletes the records whose retention ran out, as DynamoDB TTL eventually does.
    pub sweep: Sweeper,
    /// What the store offers ([`Capabilities`]): a set-up that lacks something declares it in
    /// `conformance_tests!(.., without [..])`, and the cases that need it are reported ignored.
    pub capabilities: Capabilities,
    /// Tables of the handler's own beside the store's, where its transactional effects land
    /// (the DynamoDB fixture's): the simulation then runs transactional handlers too.
    pub effect_tables: Option<EffectTables>,
}

/// A handler's own DynamoDB tables beside the ledger's, on the store's endpoint: a `local`
/// table its transactions write, and an `outbox` for its events (both `pk`-keyed).
#[derive(Debug, Clone)]
pub struct EffectTables {
    /// A client of the endpoint.
    pub client: aws_sdk_dynamodb::Client,
    /// The handler's own state.
    pub local: String,
    /// The transactional outbox.
    pub outbox: String,
}

impl<S> Fixture<S> {
    /// A fixture for a store that offers everything the suite checks ([`Capabilities::ALL`]).
    pub fn new(store: S, clock: ManualClock, sweep: Sweeper) -> Self {
        Self {
            store,
            clock,
            sweep,
            capabilities: Capabilities::ALL,
            effect_tables: None,
        }
    }

    /// The same fixture with the handler's own tables (see [`Fixture::effect_tables`]).
    pub fn with_effect_tables(mut self, tables: EffectTables) -> Self {
        self.effect_tables = Some(tables);
        self
    }

    /// The same fixture with its store wrapped by `wrap` (a decorator: a cache, a fault
    /// injector), keeping its clock, sweep and capabilities.
    pub fn map_store<T>(self, wrap: impl FnOnce(S) -> T) -> Fixture<T> {
        Fixture {
            store: wrap(self.store),
            clock: self.clock,
            sweep: self.sweep,
            capabilities: self.capabilities,
            effect_tables: self.effect_tables,
        }
    }

    /// The same fixture for a store that offers only `capabilities`.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Whether the store offers `capability`: a case that checks more where it does.
    pub fn offers(&self, capability: Capability) -> bool {
        self.capabilities.has(capability)
    }

    /// Stops a case that needs `capability` on a store that lacks it, as a failure: a set-up
    /// that lacks one declares it in [`conformance_tests!`](crate::conformance_tests)'s
    /// `without [..]`, which reports the cases that need it as ignored, never as passed.
    ///
    /// # Panics
    ///
    /// When the store lacks `capability`.
    pub fn require(&self, capability: Capability) {
        assert!(
            self.offers(capability),
            "the store under test does not offer {capability:?}: declare it in \
             conformance_tests!(fixture(), without [{capability:?}]), which reports the cases \
             that need it as ignored"
        );
    }
}

/// What a store offers beyond the primitives every store must have (claims, takeovers,
/// fenced settlements, releases, reads), so that a store that has less (a cache, a key-value
/// store without transactions) can run the suite honestly: the cases that need a capability
/// it lacks are reported ignored (`conformance_tests!(fixture(), without [..])`), and every
/// other case still holds it to the contract. The model is
/// object_store's `supports_update`.
///
/// ```
/// use lambda_idempotency::testing::conformance::{Capabilities, Capability};
///
/// let caps = Capabilities::ALL.without(Capability::Evidence);
/// assert!(!caps.has(Capability::Evidence));
/// assert!(caps.has(Capability::LargeOutcomes));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    evidence: bool,
    large_outcomes: bool,
    request_tokens: bool,
}

/// One capability a store may lack ([`Capabilities`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capability {
    /// Business identities' permanent evidence, written atomically with the claim and
    /// settled with the record (a uniqueness table).
    Evidence,
    /// Outcomes up to [`MAX_OUTCOME_BYTES`](crate::config::MAX_OUTCOME_BYTES) (16 MiB), kept
    /// whole whatever the backend's item limit.
    LargeOutcomes,
    /// A `TransactWriteItems` re-sent under its `ClientRequestToken` (the SDK's retry of a
    /// transaction whose answer was lost) is answered as committed and not applied again, as
    /// DynamoDB does for ten minutes. A transaction's unconditioned writes (a handler's own
    /// effects) rely on it; moto's server ignores the token.
    RequestTokens,
}

impl Capabilities {
    /// Everything the suite checks: the memory and DynamoDB stores offer it all.
    pub const ALL: Self = Self {
        evidence: true,
        large_outcomes: true,
        request_tokens: true,
    };

    /// The same, without `capability`.
    pub const fn without(mut self, capability: Capability) -> Self {
        match capability {
            Capability::Evidence => self.evidence = false,
            Capability::LargeOutcomes => self.large_outcomes = false,
            Capability::RequestTokens => self.request_tokens = false,
        }
        self
    }

    /// Whether `capability` is offered.
    pub const fn has(&self, capability: Capability) -> bool {
        match capability {
            Capability::Evidence => self.evidence,
            Capability::LargeOutcomes => self.large_outcomes,
            Capability::RequestTokens => self.request_tokens,
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Fixture<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .field("clock", &self.clock)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

/// An empty in-memory store whose clock starts at `start`.
pub fn memory_fixture(start: SystemTime) -> Fixture<MemoryStore> {
    let clock = ManualClock::new(start);
    let store = MemoryStore::new();
    let sweep: Sweeper = {
        let (store, clock) = (store.clone(), clock.clone());
        Arc::new(move || {
            let swept = store.sweep_expired(clock.now());
            Box::pin(async move { swept })
        })
    };
    Fixture::new(store, clock, sweep)
}

/// Where every case's clock starts.
pub fn start_time() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_790_000_000)
}

/// An engine over the fixture's store and clock.
pub fn engine<S: Store>(fx: Fixture<S>, config: Config) -> (Idempotency, ManualClock, Sweeper) {
    let idem = Idempotency::new(fx.store)
        .with_config(config)
        .with_clock(fx.clock.clone());
    (idem, fx.clock, fx.sweep)
}

/// An engine as [`engine`] builds it, for a handler declared safe to repeat
/// ([`Recovery::Rerun`]): a takeover of a crashed attempt runs it again.
pub fn rerunning<S: Store>(fx: Fixture<S>, config: Config) -> (Idempotency, ManualClock, Sweeper) {
    let (idem, clock, sweep) = engine(fx, config);
    (idem.with_recovery(Recovery::Rerun), clock, sweep)
}

/// An invocation of operation `material` with intent `intent` and the suite's lease.
pub fn invocation(material: &str, intent: &serde_json::Value) -> Invocation {
    let scope = OperationScope::new("conformance", "op").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    Invocation::new(key, Fingerprint::of(intent).expect("fingerprint"), LEASE)
}

/// The evidence key of `identity` for the suite's operations ([`invocation`]'s namespace, no
/// tenant): what [`StoreExt::evidence`] reads.
pub fn evidence_key(identity: &str) -> String {
    let key = invocation("any", &serde_json::json!(0)).key().clone();
    IdentityScope::default().evidence_key(identity, &key)
}

/// The operator every case's resolutions are made by.
pub fn operator() -> lambda_idempotency::Operator {
    lambda_idempotency::Operator::new("conformance-suite").expect("an operator")
}

/// The record of `key`, which must exist.
pub async fn stored(idem: &Idempotency, key: &OperationKey, why: &str) -> Record {
    idem.store().get(key).await.expect("get").expect(why)
}

/// A handler that counts its runs and returns `value`.
pub async fn counted<T>(runs: &AtomicUsize, value: T) -> Result<T, std::io::Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(value)
}

/// Case: First run executes and stores.
pub async fn first_run_executes_and_stores<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invocation("order-1", &serde_json::json!({"amount": 10}));
    let runs = AtomicUsize::new(0);

    let done = idem
        .execute(&inv, |_| counted(&runs, "created".to_owned()))
        .await
        .expect("first run");

    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(done.value(), "created");
    let record = stored(&idem, inv.key(), "record stored").await;
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.outcome.as_deref(), Some(br#""created""#.as_slice()));
    assert_eq!(record.lease.attempt, 1);
    assert!(record.completed_at.is_some());
    assert_eq!(
        record.fingerprint.rule(),
        crate::key::KeyRule::CURRENT,
        "the record keeps the rule that derived its key (read it back with Fingerprint::from_stored_under)"
    );
}

/// Case: Duplicate replays without running.
pub async fn duplicate_replays_without_running<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invocation("order-2", &serde_json::json!({"amount": 10}));
    let runs = AtomicUsize::new(0);
    let outcome: BTreeMap<String, u32> = (0..50).map(|i| (format!("line-{i}"), i)).collect();

    let first = idem
        .execute(&inv, |_| counted(&runs, outcome.clone()))
        .await
        .expect("first");
    for _ in 0..3 {
        let again = idem
            .execute(&inv, |_| counted(&runs, BTreeMap::<String, u32>::new()))
            .await
            .expect("replay");
        assert!(again.is_replay());
        assert_eq!(again.value(), &outcome);
        assert_eq!(
            again.raw_json().get(),
            first.raw_json().get(),
            "replay is byte-identical"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Case: Payload conflict is refused.
pub async fn payload_conflict_is_refused<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let original = invocation("order-3", &serde_json::json!({"amount": 10}));
    let changed = invocation("order-3", &serde_json::json!({"amount": 99}));
    let runs = AtomicUsize::new(0);

    idem.execute(&original, |_| counted(&runs, 10))
        .await
        .expect("first");
    let err = idem
        .execute(&changed, |_| counted(&runs, 99))
        .await
        .expect_err("conflict");

    assert!(matches!(err, Error::PayloadConflict { .. }), "got {err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = stored(&idem, original.key(), "record").await;
    assert_eq!(
        record.outcome.as_deref(),
        Some(b"10".as_slice()),
        "the original outcome stands"
    );
}

/// Case: Payload conflict is checked before in progress.
pub async fn payload_conflict_is_checked_before_in_progress<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let original = invocation("order-4", &serde_json::json!({"amount": 10}));
    let changed = invocation("order-4", &serde_json::json!({"amount": 99}));
    let (holder, resume) = blocked_worker(&idem, &original, Ok("held".into())).await;

    let err = idem
        .execute(&changed, |_| async {
            Ok::<_, std::io::Error>(String::new())
        })
        .await
        .expect_err("conflict");

    assert!(matches!(err, Error::PayloadConflict { .. }), "got {err:?}");
    let _ = resume.send(());
    assert_eq!(
        holder.await.expect("join").expect("holder completes"),
        "held"
    );
}

/// Case: Changed payload does not take over expired lease.
pub async fn changed_payload_does_not_take_over_expired_lease<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    let original = invocation("order-5", &serde_json::json!({"amount": 10}));
    let changed = invocation("order-5", &serde_json::json!({"amount": 99}));
    let crashed = crash_after_claim(&idem, &original).await;

    clock.advance(LEASE + Duration::from_secs(1));
    let runs = AtomicUsize::new(0);
    let err = idem
        .execute(&changed, |_| counted(&runs, 99))
        .await
        .expect_err("conflict");

    assert!(matches!(err, Error::PayloadConflict { .. }), "got {err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let record = stored(&idem, original.key(), "record").await;
    assert_eq!(
        record.lease.token, crashed.lease.token,
        "the crashed claim was not replaced"
    );
}

/// Starts one caller per invocation at the same moment. The handler that gets to run holds its
/// claim until every other caller has answered, so each loser must have met the live claim:
/// none can slip in after completion. Returns every answer and how many handlers ran.
pub async fn race(
    idem: &Idempotency,
    invocations: Vec<Invocation>,
) -> (Vec<Result<Execution<String>, Error>>, usize) {
    let callers = invocations.len();
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(callers));
    let (answered_tx, answered_rx) = watch::channel(0_usize);
    let answered_tx = Arc::new(answered_tx);
    let tasks: Vec<_> = invocations
        .into_iter()
        .map(|inv| {
            let (idem, runs, barrier) = (idem.clone(), Arc::clone(&runs), Arc::clone(&barrier));
            let (answered_tx, mut answered_rx) = (Arc::clone(&answered_tx), answered_rx.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let result = idem
                    .execute(&inv, |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let _ = answered_rx.wait_for(|n| *n == callers - 1).await;
                        Ok::<_, std::io::Error>(String::from("done"))
                    })
                    .await;
                if result.is_err() {
                    answered_tx.send_modify(|n| *n += 1);
                }
                result
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(callers);
    for task in tasks {
        answers.push(
            tokio::time::timeout(HANG_GUARD, task)
                .await
                .expect("no caller hangs")
                .expect("join"),
        );
    }
    (answers, runs.load(Ordering::SeqCst))
}

/// Case: Concurrent callers execute once.
pub async fn concurrent_callers_execute_once<S: Store>(fx: Fixture<S>) {
    const CALLERS: usize = 16;
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invocation("order-6", &serde_json::json!({"amount": 10}));

    let (answers, runs) = race(&idem, vec![inv.clone(); CALLERS]).await;

    let mut executed = 0;
    let mut in_progress = 0;
    for answer in answers {
        match answer {
            Ok(done) if done.origin() == (Origin::Executed { attempt: 1 }) => executed += 1,
            Err(Error::AlreadyInProgress { attempt: 1, .. }) => in_progress += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(runs, 1, "exactly one handler execution");
    assert_eq!((executed, in_progress), (1, CALLERS - 1));
    let replay = idem
        .execute(&inv, |_| async {
            Ok::<_, std::io::Error>(String::from("again"))
        })
        .await
        .expect("replay");
    assert_eq!(replay.value(), "done");
}

/// Case: Expired record executes again.
pub async fn expired_record_executes_again<S: Store>(fx: Fixture<S>) {
    let retention = Duration::from_secs(3600);
    let (idem, clock, _) = engine(
        fx,
        Config::builder()
            .retention(retention)
            .build()
            .expect("config"),
    );
    let inv = invocation("order-7", &serde_json::json!({"amount": 10}));
    let runs = AtomicUsize::new(0);

    idem.execute(&inv, |_| counted(&runs, 1))
        .await
        .expect("first");
    clock.advance(retention);
    let still = idem
        .execute(&inv, |_| counted(&runs, 2))
        .await
        .expect("at the boundary");
    assert!(
        still.is_replay(),
        "a record is live until its expiry second has passed"
    );

    clock.advance(Duration::from_secs(1));
    let again = idem
        .execute(&inv, |_| counted(&runs, 2))
        .await
        .expect("after expiry");
    assert_eq!(again.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(*again.value(), 2);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the expired record, still present, counts as absent"
    );
}

/// A worker on `inv` whose handler has started and never finishes: its claim is held.
pub async fn stalled_worker(
    idem: &Idempotency,
    inv: &Invocation,
) -> tokio::task::JoinHandle<Result<Execution<u32>, Error>> {
    stalled_run(idem, inv, Arc::default()).await
}

/// [`stalled_worker`], its handler's run counted in `runs`.
async fn stalled_run(
    idem: &Idempotency,
    inv: &Invocation,
    runs: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Result<Execution<u32>, Error>> {
    let (started_tx, started_rx) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv) = (idem.clone(), inv.clone());
        async move {
            idem.execute(&inv, |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started_tx.send(());
                std::future::pending::<Result<u32, std::io::Error>>().await
            })
            .await
        }
    });
    started_rx.await.expect("worker started");
    worker
}

/// Claims `inv` with a handler that never finishes and is never polled again: a worker whose
/// process died after its claim (nothing of it runs, not even its drop guards). Returns the
/// claim left behind.
pub async fn crash_after_claim(idem: &Idempotency, inv: &Invocation) -> Record {
    crash_after_run(idem, inv, &Arc::default()).await
}

/// [`crash_after_claim`], the crashed attempt's run counted in `runs`: it may have acted, so
/// every takeover case counts it.
pub async fn crash_after_run(
    idem: &Idempotency,
    inv: &Invocation,
    runs: &Arc<AtomicUsize>,
) -> Record {
    let worker = stalled_run(idem, inv, Arc::clone(runs)).await;
    drop(worker); // detached, pending for ever: a crash, not a cancellation
    let record = stored(idem, inv.key(), "claim left behind").await;
    assert_eq!(record.status, Status::InProgress);
    record
}

/// Case: Expired lease is taken over.
pub async fn expired_lease_is_taken_over<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = engine(fx, Config::default());
    // Without a reconciler, the declared policy of a handler safe to repeat.
    let idem = idem.with_recovery(Recovery::Rerun);
    let inv = invocation("order-8", &serde_json::json!({"amount": 10}));
    let runs = Arc::new(AtomicUsize::new(0));
    crash_after_run(&idem, &inv, &runs).await;

    let err = idem
        .execute(&inv, |_| counted(&runs, 0))
        .await
        .expect_err("lease still live");
    match err {
        Error::AlreadyInProgress {
            attempt,
            retry_after,
            ..
        } => {
            assert_eq!(attempt, 1);
            assert_eq!(retry_after, LEASE);
        }
        other => panic!("expected AlreadyInProgress, got {other:?}"),
    }

    clock.advance(LEASE + Duration::from_millis(1));
    let done = idem
        .execute(&inv, |ctx| counted(&runs, ctx.attempt()))
        .await
        .expect("takeover");

    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(*done.value(), 2, "the handler was told it is attempt 2");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the crashed run, and the one declared re-run"
    );
    let record = stored(&idem, inv.key(), "record").await;
    assert_eq!(
        (record.status, record.lease.attempt),
        (Status::Completed, 2)
    );
}

/// Starts a worker whose handler waits for the returned sender, then lets its lease run out and
/// has a second worker take over and complete with `"second"`. Returns the first worker.
async fn zombie_after_takeover(
    idem: &Idempotency,
    clock: &ManualClock,
    inv: &Invocation,
    zombie_result: Result<String, std::io::Error>,
) -> (
    tokio::task::JoinHandle<Result<String, Error>>,
    oneshot::Sender<()>,
) {
    let (zombie, resume_tx) = blocked_worker(idem, inv, zombie_result).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let second = idem
        .execute(inv, |_| async {
            Ok::<_, std::io::Error>(String::from("second"))
        })
        .await
        .expect("takeover completes");
    assert_eq!(second.origin(), Origin::Executed { attempt: 2 });
    (zombie, resume_tx)
}

/// Case: Zombie completion is fenced.
pub async fn zombie_completion_is_fenced<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = rerunning(fx, Config::default());
    let inv = invocation("order-9", &serde_json::json!({"amount": 10}));
    let (zombie, resume) = zombie_after_takeover(&idem, &clock, &inv, Ok("zombie".into())).await;

    let _ = resume.send(());
    let err = zombie.await.expect("join").expect_err("zombie is fenced");

    assert!(
        matches!(err, Error::LeaseLost { attempt: 1, .. }),
        "got {err:?}"
    );
    let replay = idem
        .execute(&inv, |_| async {
            Ok::<_, std::io::Error>(String::from("third"))
        })
        .await
        .expect("replay");
    assert_eq!(replay.value(), "second", "the zombie did not overwrite");
}

/// Starts a worker on `inv` whose handler returns `result` once the returned sender fires.
pub async fn blocked_worker(
    idem: &Idempotency,
    inv: &Invocation,
    result: Result<String, std::io::Error>,
) -> (
    tokio::task::JoinHandle<Result<String, Error>>,
    oneshot::Sender<()>,
) {
    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let worker = tokio::spawn({
        let (idem, inv) = (idem.clone(), inv.clone());
        async move {
            idem.execute(&inv, |_| async move {
                let _ = started_tx.send(());
                let _ = resume_rx.await;
                result
            })
            .await
            .map(|done| done.into_value())
        }
    });
    started_rx.await.expect("worker started");
    (worker, resume_tx)
}

/// Case: Zombie cannot complete over a live takeover.
pub async fn zombie_cannot_complete_over_a_live_takeover<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = rerunning(fx, Config::default());
    let inv = invocation("order-15", &serde_json::json!({"amount": 10}));
    let (zombie, resume_zombie) = blocked_worker(&idem, &inv, Ok("zombie".into())).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let (owner, resume_owner) = blocked_worker(&idem, &inv, Ok("owner".into())).await;

    let _ = resume_zombie.send(());
    let err = zombie
        .await
        .expect("join")
        .expect_err("zombie is fenced while the owner runs");
    assert!(
        matches!(err, Error::LeaseLost { attempt: 1, .. }),
        "got {err:?}"
    );
    let record = stored(&idem, inv.key(), "record").await;
    assert_eq!(
        (record.status, record.lease.attempt),
        (Status::InProgress, 2)
    );

    let _ = resume_owner.send(());
    assert_eq!(
        owner.await.expect("join").expect("owner completes"),
        "owner"
    );
    let replay = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(String::new()) })
        .await
        .expect("replay");
    assert_eq!(replay.value(), "owner");
}

/// Case: Zombie release is fenced, and told so (`LeaseLost`).
pub async fn zombie_release_is_fenced<S: Store>(fx: Fixture<S>) {
    let (idem, clock, _) = rerunning(fx, Config::default());
    let inv = invocation("order-10", &serde_json::json!({"amount": 10}));
    let (zombie, resume) = zombie_after_takeover(
        &idem,
        &clock,
        &inv,
        Err(std::io::Error::other("late failure")),
    )
    .await;

    let _ = resume.send(());
    let err = zombie.await.expect("join").expect_err("zombie failed");

    // A lost fence is never silent: the zombie is told its lease was lost, not its own error.
    assert!(
        matches!(err, Error::LeaseLost { attempt: 1, .. }),
        "got {err:?}"
    );
    let record = stored(&idem, inv.key(), "the new owner's record survives").await;
    assert_eq!(record.status, Status::Completed);
}

/// Case: Failure releases for retry.
pub async fn failure_releases_for_retry<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invocation("order-11", &serde_json::json!({"amount": 10}));
    let runs = AtomicUsize::new(0);

    let err = idem
        .execute(&inv, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<u32, _>(std::io::Error::other("downstream timed out"))
        })
        .await
        .expect_err("handler error");
    let Error::Handler { source } = err else {
        panic!("expected Error::Handler, got {err:?}");
    };
    assert!(
        source.downcast_ref::<std::io::Error>().is_some(),
        "the handler's own error is kept"
    );
    assert_eq!(
        idem.store().get(inv.key()).await.expect("get"),
        None,
        "claim released"
    );

    let retry = idem
        .execute(&inv, |_| counted(&runs, 7))
        .await
        .expect("retry runs");
    assert_eq!(retry.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Case: Unreadable outcome is a typed error.
pub async fn unreadable_outcome_is_a_typed_error<S: Store>(fx: Fixture<S>) {
    let (idem, _, _) = engine(fx, Config::default());
    let inv = invocation("order-12", &serde_json::json!({"amount": 10}));

    idem.execute(&inv, |_| async {
        Ok::<_, std::io::Error>(String::from("not a number"))
    })
    .await
    .expect("first");
    let err = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(1_u32) })
        .await
        .expect_err("stored string does not decode as u32");

    assert!(
        matches!(err, Error::StoredOutcomeUnreadable { .. }),
        "got {err:?}"
    );
}

pub use super::durability::*;
pub use super::edges::*;
pub use super::identities::*;
pub use super::operators::*;
pub use super::outages::*;
pub use super::outcomes::*;
pub use super::primitives::*;
pub use super::recovery::*;
pub use super::steps::*;
