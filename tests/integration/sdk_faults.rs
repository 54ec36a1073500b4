//! Faults injected into the DynamoDB client's requests (`testing::interceptor`): the real
//! engine, the real store and the real SDK (with its own retries) against the embedded
//! DynamoDB-compatible server, on every write path of the store, without a business identity
//! (single-item requests) and with one (transactions across both tables).
//!
//! Every case counts real handler executions and reads the stored record (and evidence) back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long a claim given back by a panic still holds (the engine's grace).
const GIVE_BACK_GRACE: Duration = Duration::from_secs(5);

use lambda_idempotency::BoxError;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::failure::Terminal;
use lambda_idempotency::reconcile::{Checked, Recovery, Takeover};
use lambda_idempotency::record::{Evidence, Record, Status};
use lambda_idempotency::store::{DynamoDbStore, StoreExt};
use lambda_idempotency::testing::conformance::{counted, crash_after_claim, operator, start_time};
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::interceptor::{
    FaultInterceptor, SDK_ATTEMPTS, SdkFault, SdkOperation, client_with,
};
use lambda_idempotency::{
    Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope, Origin, Resolution,
    StoreError,
};
use serde_json::json;

/// The lease every invocation holds.
const LEASE: Duration = Duration::from_secs(30);
/// The engine's tries per write made before the handler runs (a claim; src/engine/retry.rs):
/// a fault queued this many times the SDK's attempts outlasts every retry of one such write.
/// Writes after the handler ran are retried until the deadline instead.
const ENGINE_TRIES: usize = 5;
/// Every retry of one claim, the SDK's and the engine's.
const EVERY_RETRY: usize = ENGINE_TRIES * SDK_ATTEMPTS as usize;
/// How long before the deadline (here the lease's end) a settlement stops retrying.
const SETTLE_MARGIN: Duration = Duration::from_secs(1);
/// The largest pause between two of the engine's tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// An operation without a business identity (single-item requests), or with one (every write
/// a `TransactWriteItems` across both tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Single,
    Transaction,
}

impl Path {
    /// The request that carries `single`'s write on this path.
    fn request(self, single: SdkOperation) -> SdkOperation {
        match self {
            Self::Single => single,
            Self::Transaction => SdkOperation::TransactWriteItems,
        }
    }

    /// The claim's request.
    fn claim(self) -> SdkOperation {
        self.request(SdkOperation::PutItem)
    }

    /// The settlement's request.
    fn settle(self) -> SdkOperation {
        self.request(SdkOperation::UpdateItem)
    }

    /// The release's request.
    fn release(self) -> SdkOperation {
        self.request(SdkOperation::DeleteItem)
    }
}

/// One engine over a fresh endpoint, its client's faults and its clock.
struct Rig {
    idem: Idempotency,
    faults: FaultInterceptor,
    clock: ManualClock,
    dynamo: Dynamo,
}

impl Rig {
    async fn new() -> Self {
        Self::with_uniqueness_table(None).await
    }

    /// A rig whose store names `uniqueness` as its uniqueness table (the fresh one if `None`).
    async fn with_uniqueness_table(uniqueness: Option<&str>) -> Self {
        let clock = ManualClock::new(start_time());
        let dynamo = dynamo::start_with_clock(clock.clone()).await;
        let faults = FaultInterceptor::new();
        let store =
            DynamoDbStore::new(client_with(dynamo.endpoint.clone(), &faults), &dynamo.table)
                .with_uniqueness_table(uniqueness.unwrap_or(&dynamo.uniqueness_table));
        // Handlers safe to repeat, as the takeover cases here assume.
        let idem = Idempotency::new(store)
            .with_clock(clock.clone())
            .with_recovery(Recovery::Rerun);
        Self {
            idem,
            faults,
            clock,
            dynamo,
        }
    }

    /// The record of `inv`, if one stands.
    async fn record(&self, inv: &Invocation) -> Option<Record> {
        self.idem.store().get(inv.key()).await.expect("get record")
    }

    /// The evidence of `inv`'s business identity (`None` without one, or when none stands).
    async fn evidence(&self, inv: &Invocation) -> Option<Evidence> {
        let identity = inv.evidence_key()?;
        self.idem
            .store()
            .evidence(&identity)
            .await
            .expect("get evidence")
    }

    /// Asserts that `inv`'s record (and evidence) is COMPLETED with `outcome`.
    async fn assert_completed(&self, inv: &Invocation, outcome: &str) -> Record {
        let record = self.record(inv).await.expect("the record stands");
        assert_eq!(record.status, Status::Completed, "record: {record:?}");
        assert_eq!(record.outcome.as_deref(), Some(outcome.as_bytes()));
        if inv.identity().is_some() {
            let evidence = self.evidence(inv).await.expect("the evidence stands");
            assert_eq!(evidence.status, Status::Completed, "evidence: {evidence:?}");
        }
        record
    }

    /// Asserts that `inv`'s record (and evidence) is IN_PROGRESS.
    async fn assert_in_progress(&self, inv: &Invocation) -> Record {
        let record = self.record(inv).await.expect("the record stands");
        assert_eq!(record.status, Status::InProgress, "record: {record:?}");
        if inv.identity().is_some() {
            let evidence = self.evidence(inv).await.expect("the evidence stands");
            assert_eq!(
                evidence.status,
                Status::InProgress,
                "evidence: {evidence:?}"
            );
        }
        record
    }

    /// Asserts that neither a record nor evidence of `inv` stands.
    async fn assert_absent(&self, inv: &Invocation) {
        assert_eq!(self.record(inv).await, None, "no record stands");
        assert_eq!(self.evidence(inv).await, None, "no evidence stands");
    }

    /// An operator released `inv`: its record stays, released and expired, with the trace;
    /// no evidence stands.
    async fn assert_released(&self, inv: &Invocation) {
        let record = self.record(inv).await.expect("the released record stays");
        assert_eq!(record.status, Status::Failed);
        assert!(
            record.expires_at < self.clock.now(),
            "expired: the next delivery runs"
        );
        let audit = record.audit.expect("the operator's trace");
        assert_eq!(audit.action, "released from INDETERMINATE");
        assert_eq!(self.evidence(inv).await, None, "no evidence stands");
    }

    /// Redelivers `inv`: the stored outcome is replayed, the handler does not run.
    async fn assert_replays(&self, inv: &Invocation, runs: &AtomicUsize, value: u32) {
        let before = runs.load(Ordering::SeqCst);
        let replay = self
            .idem
            .execute(inv, |_| counted(runs, 0_u32))
            .await
            .expect("replay");
        assert!(replay.is_replay(), "origin: {:?}", replay.origin());
        assert_eq!(*replay.value(), value);
        assert_eq!(runs.load(Ordering::SeqCst), before, "a replay does not run");
    }
}

/// An invocation of `material` on `path` (with the identity `invoice:<material>:1` on the
/// transactional path).
fn invocation(material: &str, path: Path) -> Invocation {
    let scope = OperationScope::new("sdk-faults", "op").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    let inv = Invocation::new(key, Fingerprint::of(&material).expect("fingerprint"), LEASE);
    match path {
        Path::Single => inv,
        Path::Transaction => inv
            .with_identity(format!("invoice:{material}:1"))
            .expect("a valid identity"),
    }
}

/// A handler error the default classifier finds retryable.
fn retryable() -> std::io::Error {
    std::io::Error::other("downstream said try again")
}

/// A handler that panics.
async fn panicking() -> Result<u32, std::io::Error> {
    panic!("the handler panics")
}

/// A reconciler that always says the effect exists, with `value`.
fn applied(
    value: u32,
) -> impl Fn(Takeover) -> std::future::Ready<Result<Checked, BoxError>> + Send + Sync + 'static {
    move |_| std::future::ready(Ok(Checked::Applied(json!(value))))
}

/// One `#[tokio::test]` per path for each case: `case::single` and `case::transaction`.
macro_rules! on_both_paths {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            use super::Path;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn single() {
                super::$case(Path::Single).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn transaction() {
                super::$case(Path::Transaction).await;
            }
        }
    )*};
}

/// For each case of a dropped answer, one `#[tokio::test]` per path and per number of drops:
/// one (the SDK's own retry meets the write that committed: the failed condition of a single
/// item, or DynamoDB's `ClientRequestToken` replay of a transaction, whose token the SDK keeps
/// across its attempts), and [`SDK_ATTEMPTS`] (every answer of the SDK's attempts is lost, so
/// the engine's own retry, a new request, must recognise the caller's own write in the failed
/// condition's item).
macro_rules! on_both_paths_and_drops {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            use super::{Path, SDK_ATTEMPTS};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn single() {
                super::$case(Path::Single, 1).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn transaction() {
                super::$case(Path::Transaction, 1).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn single_past_sdk_retries() {
                super::$case(Path::Single, SDK_ATTEMPTS as usize).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn transaction_past_sdk_retries() {
                super::$case(Path::Transaction, SDK_ATTEMPTS as usize).await;
            }
        }
    )*};
}

on_both_paths_and_drops!(
    dropped_claim_response_is_recognised,
    dropped_completion_response_is_recognised,
    dropped_release_response_is_recognised,
    dropped_retain_response_is_recognised,
    dropped_takeover_response_is_recognised,
    dropped_shorten_response_gives_the_claim_back,
);

on_both_paths!(
    throttled_completion_is_retried_by_the_engine,
    endless_throttling_on_completion_keeps_the_claim,
    transaction_conflict_on_completion_is_retried,
    server_error_on_claim_is_retried_by_the_sdk,
    server_errors_past_every_retry_on_claim_are_unavailable,
    access_denied_is_access_denied,
);

/// The claim commits and its answer is lost: the retry (the SDK's, or past its attempts the
/// engine's) finds the caller's own claim (its token in the failed condition's item, or the
/// transaction's token replayed), and the caller runs once.
async fn dropped_claim_response_is_recognised(path: Path, drops: usize) {
    let rig = Rig::new().await;
    let inv = invocation("dropped-claim", path);
    let runs = AtomicUsize::new(0);
    rig.faults
        .inject_times(path.claim(), SdkFault::DropResponse, drops);

    let first = rig
        .idem
        .execute(&inv, |_| counted(&runs, 7_u32))
        .await
        .expect("the caller's own claim is recognised");

    assert_eq!(first.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "executed exactly once");
    assert_eq!(
        rig.faults.fired(path.claim(), SdkFault::DropResponse),
        drops
    );
    let completions = usize::from(path == Path::Transaction);
    assert_eq!(
        rig.faults.requests(path.claim()),
        drops + 1 + completions,
        "the claim, each retry of it up to the first answer (and the completion)"
    );
    rig.assert_completed(&inv, "7").await;
    rig.assert_replays(&inv, &runs, 7).await;
}

/// The completion commits and its answer is lost: the retry's failed fence shows this very
/// settlement, so the caller gets its result, not `LeaseLost`.
async fn dropped_completion_response_is_recognised(path: Path, drops: usize) {
    let rig = Rig::new().await;
    let inv = invocation("dropped-completion", path);
    let runs = AtomicUsize::new(0);

    let done = rig
        .idem
        .execute(&inv, |_| {
            // Queued once the claim has gone: it hits the completion.
            rig.faults
                .inject_times(path.settle(), SdkFault::DropResponse, drops);
            counted(&runs, 7_u32)
        })
        .await
        .expect("the completion is recognised, not LeaseLost");

    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(*done.value(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        rig.faults.fired(path.settle(), SdkFault::DropResponse),
        drops
    );
    rig.assert_completed(&inv, "7").await;
    rig.assert_replays(&inv, &runs, 7).await;
}

/// A retryable handler error's release commits and its answer is lost: the caller still gets
/// the handler's error, the record and evidence are gone, a retry executes afresh.
async fn dropped_release_response_is_recognised(path: Path, drops: usize) {
    let rig = Rig::new().await;
    let inv = invocation("dropped-release", path);
    let runs = AtomicUsize::new(0);

    let err = rig
        .idem
        .execute(&inv, |_| {
            rig.faults
                .inject_times(path.release(), SdkFault::DropResponse, drops);
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<u32, _>(retryable()) }
        })
        .await
        .expect_err("the handler failed");

    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    assert_eq!(
        rig.faults.fired(path.release(), SdkFault::DropResponse),
        drops
    );
    rig.assert_absent(&inv).await;

    let retried = rig
        .idem
        .execute(&inv, |_| counted(&runs, 8_u32))
        .await
        .expect("the retry executes");
    assert_eq!(retried.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 2, "executed afresh");
    rig.assert_completed(&inv, "8").await;
}

/// A terminal handler error's retention (a settlement as FAILED) commits and its answer is
/// lost: the caller gets the handler's error, and every later caller the retained failure.
async fn dropped_retain_response_is_recognised(path: Path, drops: usize) {
    let rig = Rig::new().await;
    let inv = invocation("dropped-retain", path);
    let runs = AtomicUsize::new(0);

    let err = rig
        .idem
        .execute(&inv, |_| {
            rig.faults
                .inject_times(path.settle(), SdkFault::DropResponse, drops);
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<u32, _>(Terminal::new("card_declined", "declined")) }
        })
        .await
        .expect_err("the handler failed");

    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    assert_eq!(
        rig.faults.fired(path.settle(), SdkFault::DropResponse),
        drops
    );
    let record = rig.record(&inv).await.expect("the record stands");
    assert_eq!(record.status, Status::Failed, "record: {record:?}");
    let again = rig
        .idem
        .execute(&inv, |_| counted(&runs, 0_u32))
        .await
        .expect_err("the failure is replayed");
    match again {
        Error::Failed { failure, .. } => assert_eq!(failure.kind, "card_declined"),
        other => panic!("expected the retained failure, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not re-run");
}

/// A takeover of a crashed attempt commits and its answer is lost: the retry's failed fence
/// shows the caller's own new lease, and attempt 2 runs once.
async fn dropped_takeover_response_is_recognised(path: Path, drops: usize) {
    let rig = Rig::new().await;
    let inv = invocation("dropped-takeover", path);
    let crashed = crash_after_claim(&rig.idem, &inv).await;
    rig.clock.advance(LEASE + Duration::from_secs(1));
    // Every path takes over with a single UpdateItem (the evidence stays as it is).
    rig.faults
        .inject_times(SdkOperation::UpdateItem, SdkFault::DropResponse, drops);
    let runs = AtomicUsize::new(0);

    let done = rig
        .idem
        .execute(&inv, |_| counted(&runs, 9_u32))
        .await
        .expect("the takeover is recognised");

    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "attempt 2 ran once");
    assert_eq!(
        rig.faults
            .fired(SdkOperation::UpdateItem, SdkFault::DropResponse),
        drops
    );
    let record = rig.assert_completed(&inv, "9").await;
    assert_eq!(record.lease.attempt, 2);
    assert_ne!(record.lease.token, crashed.lease.token);
    rig.assert_replays(&inv, &runs, 9).await;
}

/// A panicking handler's claim is given back (its lease shortened to now); that write commits
/// and its answer is lost: the SDK's retry finds the lease already running out by then (a
/// shortening never lengthens, so its condition fails) and is answered held, the panic reaches
/// the caller, and the next delivery takes over at once.
async fn dropped_shorten_response_gives_the_claim_back(path: Path, drops: usize) {
    let rig = Rig::new().await;
    let inv = invocation("dropped-shorten", path);
    let panicked = tokio::spawn({
        let (idem, faults, inv) = (rig.idem.clone(), rig.faults.clone(), inv.clone());
        async move {
            idem.execute(&inv, |_| {
                // Every path shortens with a single UpdateItem.
                faults.inject_times(SdkOperation::UpdateItem, SdkFault::DropResponse, drops);
                panicking()
            })
            .await
            .map(|done: lambda_idempotency::Execution<u32>| *done.value())
        }
    })
    .await
    .expect_err("the panic reaches the caller");
    assert!(panicked.is_panic());
    assert_eq!(
        rig.faults
            .fired(SdkOperation::UpdateItem, SdkFault::DropResponse),
        drops
    );
    let record = rig.assert_in_progress(&inv).await;
    assert!(
        record.lease.expires_at <= rig.clock.now() + GIVE_BACK_GRACE,
        "the lease was given back: {record:?}"
    );

    rig.clock
        .advance(GIVE_BACK_GRACE + Duration::from_millis(1));
    let runs = AtomicUsize::new(0);
    let done = rig
        .idem
        .execute(&inv, |_| counted(&runs, 10_u32))
        .await
        .expect("taken over");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    rig.assert_completed(&inv, "10").await;
}

/// Throttling that outlasts the SDK's retries of one completion: the engine's own loop sends
/// the same completion again (after a pause on the injected clock), and it lands.
async fn throttled_completion_is_retried_by_the_engine(path: Path) {
    let rig = Rig::new().await;
    let inv = invocation("throttled-completion", path);
    let runs = AtomicUsize::new(0);
    let started = rig.clock.now();

    let done = rig
        .idem
        .execute(&inv, |_| {
            rig.faults
                .inject_times(path.settle(), SdkFault::Throttle, SDK_ATTEMPTS as usize);
            counted(&runs, 11_u32)
        })
        .await
        .expect("the engine's retry lands");

    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "executed once");
    assert_eq!(
        rig.faults.fired(path.settle(), SdkFault::Throttle),
        SDK_ATTEMPTS as usize,
        "the SDK gave up once"
    );
    assert_eq!(rig.faults.pending(), 0);
    assert!(
        rig.clock.now() > started,
        "the engine paused on its clock before the next try"
    );
    rig.assert_completed(&inv, "11").await;
    rig.assert_replays(&inv, &runs, 11).await;
}

/// Throttling that outlasts the invocation: the completion is retried until shortly before
/// the deadline (here the lease's end), far past a claim's few tries, then fails with a typed
/// `Throttled`; the claim stays (IN_PROGRESS: not lost, not re-run while its lease lives), and
/// after the lease a reconciled takeover records the effect without running the handler again.
async fn endless_throttling_on_completion_keeps_the_claim(path: Path) {
    let rig = Rig::new().await;
    let inv = invocation("endless-throttling", path);
    let runs = AtomicUsize::new(0);
    let started = rig.clock.now();

    let err = rig
        .idem
        .execute(&inv, |_| {
            rig.faults
                .inject_times(path.settle(), SdkFault::Throttle, 100_000);
            counted(&runs, 12_u32)
        })
        .await
        .expect_err("the completion could not be stored");

    assert!(
        matches!(err, Error::Store(StoreError::Throttled { .. })),
        "got {err:?}"
    );
    let sent = rig.faults.fired(path.settle(), SdkFault::Throttle);
    assert!(sent > EVERY_RETRY, "{sent} tries: more than a claim's");
    let waited = rig.clock.now().duration_since(started).expect("time moved");
    assert!(
        waited <= LEASE - SETTLE_MARGIN && waited + MAX_BACKOFF > LEASE - SETTLE_MARGIN,
        "retried until shortly before the lease's end: {waited:?}"
    );
    rig.faults.clear();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let held = rig.assert_in_progress(&inv).await;
    assert_eq!(held.lease.attempt, 1);

    let busy = rig
        .idem
        .execute(&inv, |_| counted(&runs, 0_u32))
        .await
        .expect_err("the lease lives");
    assert!(
        matches!(busy, Error::AlreadyInProgress { .. }),
        "got {busy:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "not re-run while the lease lives"
    );

    rig.clock.advance(LEASE + Duration::from_secs(1));
    let reconciled = rig.idem.clone().with_reconciler(applied(12));
    let done = reconciled
        .execute(&inv, |_| counted(&runs, 0_u32))
        .await
        .expect("reconciled takeover");
    assert_eq!(done.origin(), Origin::Reconciled { attempt: 2 });
    assert_eq!(*done.value(), 12);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );
    rig.assert_completed(&inv, "12").await;
    rig.assert_replays(&inv, &runs, 12).await;
}

/// A transaction conflict on the completion (a cancelled transaction, or a single item's
/// `TransactionConflictException`), which the SDK does not retry: the engine does.
async fn transaction_conflict_on_completion_is_retried(path: Path) {
    let rig = Rig::new().await;
    let inv = invocation("conflicted-completion", path);
    let runs = AtomicUsize::new(0);

    let done = rig
        .idem
        .execute(&inv, |_| {
            rig.faults
                .inject(path.settle(), SdkFault::TransactionConflict);
            counted(&runs, 13_u32)
        })
        .await
        .expect("the engine's retry lands");

    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        rig.faults
            .fired(path.settle(), SdkFault::TransactionConflict),
        1
    );
    rig.assert_completed(&inv, "13").await;
}

/// A 500 on the claim before it applies: the SDK retries it (500 is transient to its
/// classifier), the retry claims, and the caller succeeds without seeing the fault.
async fn server_error_on_claim_is_retried_by_the_sdk(path: Path) {
    let rig = Rig::new().await;
    let inv = invocation("server-error-claim", path);
    let runs = AtomicUsize::new(0);
    rig.faults.inject(path.claim(), SdkFault::ServerError);
    let started = rig.clock.now();

    let done = rig
        .idem
        .execute(&inv, |_| counted(&runs, 14_u32))
        .await
        .expect("the SDK's retry claims");

    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rig.faults.fired(path.claim(), SdkFault::ServerError), 1);
    assert_eq!(rig.clock.now(), started, "the SDK retried, not the engine");
    rig.assert_completed(&inv, "14").await;
}

/// 5xx answers (not applied) on every attempt of the claim, past the SDK's and the engine's
/// retries: the caller gets a typed `Unavailable`, the handler never runs, nothing stands, and
/// the next delivery executes.
async fn server_errors_past_every_retry_on_claim_are_unavailable(path: Path) {
    let rig = Rig::new().await;
    let inv = invocation("server-errors-claim", path);
    let runs = AtomicUsize::new(0);
    rig.faults
        .inject_times(path.claim(), SdkFault::ServiceUnavailable, EVERY_RETRY);

    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, 15_u32))
        .await
        .expect_err("the store stays unavailable");

    assert!(
        matches!(err, Error::Store(StoreError::Unavailable { .. })),
        "got {err:?}"
    );
    assert_eq!(
        rig.faults.fired(path.claim(), SdkFault::ServiceUnavailable),
        EVERY_RETRY
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "never ran");
    rig.assert_absent(&inv).await;

    let done = rig
        .idem
        .execute(&inv, |_| counted(&runs, 15_u32))
        .await
        .expect("the next delivery executes");
    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    rig.assert_completed(&inv, "15").await;
}

/// An IAM refusal of the claim is `AccessDenied` (not retried, not `Unavailable`).
async fn access_denied_is_access_denied(path: Path) {
    let rig = Rig::new().await;
    let inv = invocation("access-denied", path);
    let runs = AtomicUsize::new(0);
    let denied = SdkFault::Error {
        status: 400,
        code: "AccessDeniedException",
    };
    rig.faults.inject(path.claim(), denied);

    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, 16_u32))
        .await
        .expect_err("refused");

    match &err {
        Error::Store(StoreError::AccessDenied { code, .. }) => {
            assert_eq!(code, "AccessDeniedException");
        }
        other => panic!("expected AccessDenied, got {other:?}"),
    }
    assert_eq!(
        rig.faults.fired(path.claim(), denied),
        1,
        "neither the SDK nor the engine retries it"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    rig.assert_absent(&inv).await;
}

/// A takeover's adoption of orphaned evidence (its record deleted by TTL while the evidence
/// says IN_PROGRESS) commits and its answer is lost: the retry finds the caller's own record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_adoption_response_is_recognised() {
    for drops in [1, SDK_ATTEMPTS as usize] {
        let rig = Rig::new().await;
        let inv = invocation("dropped-adoption", Path::Transaction);
        let crashed = crash_after_claim(&rig.idem, &inv).await;
        rig.clock.set(crashed.expires_at + Duration::from_secs(1));
        assert_eq!(rig.dynamo.sweep().await, 1, "TTL deleted the record");
        // The claim (cancelled by the evidence) passes; the adoption's answers are lost.
        rig.faults.pass(SdkOperation::TransactWriteItems, 1);
        rig.faults.inject_times(
            SdkOperation::TransactWriteItems,
            SdkFault::DropResponse,
            drops,
        );
        let runs = AtomicUsize::new(0);

        let done = rig
            .idem
            .execute(&inv, |_| counted(&runs, 17_u32))
            .await
            .expect("the adoption is recognised");

        assert_eq!(
            rig.faults
                .fired(SdkOperation::TransactWriteItems, SdkFault::DropResponse),
            drops
        );
        assert_eq!(
            done.origin(),
            Origin::Executed { attempt: 2 },
            "{drops} drops"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{drops} drops");
        rig.assert_completed(&inv, "17").await;
    }
}

/// An operator's resolution of an INDETERMINATE operation (recording a result, or releasing
/// the record) commits and its answer is lost: `resolve` still reports it done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_resolution_response_is_recognised() {
    for path in [Path::Single, Path::Transaction] {
        for drops in [1, SDK_ATTEMPTS as usize] {
            for release in [false, true] {
                let case = format!("{path:?}, {drops} drops, release: {release}");
                let rig = Rig::new().await;
                let inv = invocation("dropped-resolution", path);
                crash_after_claim(&rig.idem, &inv).await;
                rig.clock.advance(LEASE + Duration::from_secs(1));
                let unknown = rig.idem.clone().with_reconciler(|_: Takeover| {
                    std::future::ready(Ok::<_, BoxError>(Checked::Unknown))
                });
                let runs = AtomicUsize::new(0);
                let held = unknown
                    .execute(&inv, |_| counted(&runs, 0_u32))
                    .await
                    .expect_err("indeterminate");
                assert!(
                    matches!(held, Error::Indeterminate { .. }),
                    "{case}: {held:?}"
                );

                let (request, resolution) = match release {
                    false => (path.settle(), Resolution::Completed(json!(18))),
                    // An operator's release rewrites the record (released, with its trace).
                    true => (path.claim(), Resolution::Release),
                };
                rig.faults
                    .inject_times(request, SdkFault::DropResponse, drops);
                let resolved = rig
                    .idem
                    .resolve::<u32>(inv.key(), resolution, &operator())
                    .await
                    .expect("resolved");

                assert!(
                    resolved,
                    "{case}: the lost answer is the operator's own write"
                );
                assert_eq!(
                    rig.faults.fired(request, SdkFault::DropResponse),
                    drops,
                    "{case}"
                );
                if release {
                    rig.assert_released(&inv).await;
                } else {
                    rig.assert_completed(&inv, "18").await;
                    rig.assert_replays(&inv, &runs, 18).await;
                }
                assert_eq!(runs.load(Ordering::SeqCst), 0, "{case}");
            }
        }
    }
}

/// Throttling reported inside a cancelled transaction is `Throttled` (retried by the engine,
/// then typed), not `Unavailable`; so is a single item's throughput error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_maps_to_throttled() {
    let rig = Rig::new().await;
    for (index, code) in [
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
    ]
    .into_iter()
    .enumerate()
    {
        let inv = invocation(&format!("cancelled-throttled-{index}"), Path::Transaction);
        let fault = SdkFault::Cancelled(code);
        // The SDK does not retry a cancelled transaction: one fault per engine try.
        rig.faults
            .inject_times(SdkOperation::TransactWriteItems, fault, ENGINE_TRIES);
        let err = rig
            .idem
            .execute(&inv, |_| async { Ok::<_, std::io::Error>(0_u32) })
            .await
            .expect_err("throttled");
        assert!(
            matches!(err, Error::Store(StoreError::Throttled { .. })),
            "{code}: got {err:?}"
        );
        assert_eq!(
            rig.faults.fired(SdkOperation::TransactWriteItems, fault),
            ENGINE_TRIES,
            "{code}: the engine retried it"
        );
        rig.assert_absent(&inv).await;
    }

    let inv = invocation("single-throughput", Path::Single);
    rig.faults.inject_times(
        SdkOperation::PutItem,
        SdkFault::ThroughputExceeded,
        EVERY_RETRY,
    );
    let err = rig
        .idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect_err("throttled");
    assert!(
        matches!(err, Error::Store(StoreError::Throttled { .. })),
        "got {err:?}"
    );
    assert_eq!(
        rig.faults
            .fired(SdkOperation::PutItem, SdkFault::ThroughputExceeded),
        EVERY_RETRY
    );
    rig.assert_absent(&inv).await;
}

/// A `ValidationError` cancellation reason is `Rejected`: not transient, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_cancellation_maps_to_rejected() {
    let rig = Rig::new().await;
    let inv = invocation("cancelled-validation", Path::Transaction);
    let fault = SdkFault::Cancelled("ValidationError");
    rig.faults.inject(SdkOperation::TransactWriteItems, fault);
    let runs = AtomicUsize::new(0);

    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, 0_u32))
        .await
        .expect_err("rejected");

    assert!(
        matches!(err, Error::Store(StoreError::Rejected { .. })),
        "got {err:?}"
    );
    assert_eq!(
        rig.faults.fired(SdkOperation::TransactWriteItems, fault),
        1,
        "not retried"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    rig.assert_absent(&inv).await;
}

/// Runs `inv` against `TransactionConflict` on every engine try of its claim (neither a
/// cancelled transaction nor a single item's `TransactionConflictException` is retried by the
/// SDK) and returns the caller's error.
async fn conflicted_claim(rig: &Rig, inv: &Invocation, path: Path) -> Error {
    rig.faults
        .inject_times(path.claim(), SdkFault::TransactionConflict, ENGINE_TRIES);
    let err = rig
        .idem
        .execute(inv, |_| async { Ok::<_, std::io::Error>(0_u32) })
        .await
        .expect_err("contention");
    assert_eq!(
        rig.faults
            .fired(path.claim(), SdkFault::TransactionConflict),
        ENGINE_TRIES,
        "the engine retried it"
    );
    rig.assert_absent(inv).await;
    err
}

/// A cancelled transaction's `TransactionConflict` is `Contention` (retried by the engine,
/// then typed), not `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_conflict_cancellation_maps_to_contention() {
    let rig = Rig::new().await;
    let inv = invocation("contention-transaction", Path::Transaction);

    let err = conflicted_claim(&rig, &inv, Path::Transaction).await;

    assert!(
        matches!(err, Error::Store(StoreError::Contention { .. })),
        "got {err:?}"
    );
}

/// A single item's `TransactionConflictException` (a write meeting an ongoing transaction on
/// the item) is the same contention as a cancelled transaction's `TransactionConflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_item_transaction_conflict_maps_to_contention() {
    let rig = Rig::new().await;
    let inv = invocation("contention-single", Path::Single);

    let err = conflicted_claim(&rig, &inv, Path::Single).await;

    assert!(
        matches!(err, Error::Store(StoreError::Contention { .. })),
        "got {err:?}"
    );
}

/// A transaction on a uniqueness table that does not exist names that table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_uniqueness_table_is_named() {
    let rig = Rig::with_uniqueness_table(Some("no-such-table")).await;
    let inv = invocation("missing-uniqueness", Path::Transaction);
    let runs = AtomicUsize::new(0);

    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, 0_u32))
        .await
        .expect_err("no uniqueness table");

    match &err {
        Error::Store(StoreError::UniquenessTableNotFound { table }) => {
            assert_eq!(table, "no-such-table");
        }
        other => panic!("expected UniquenessTableNotFound, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(rig.record(&inv).await, None, "nothing claimed");
}

/// Reads go through the interceptor too: a 500 is retried by the SDK; throttling past its
/// retries is `Throttled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulted_reads_are_retried_or_typed() {
    let rig = Rig::new().await;
    let inv = invocation("faulted-read", Path::Single);
    rig.idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(19_u32) })
        .await
        .expect("first");

    rig.faults
        .inject(SdkOperation::GetItem, SdkFault::ServerError);
    let record = rig.record(&inv).await.expect("read after the SDK's retry");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(
        rig.faults
            .fired(SdkOperation::GetItem, SdkFault::ServerError),
        1
    );

    rig.faults.inject_times(
        SdkOperation::GetItem,
        SdkFault::Throttle,
        SDK_ATTEMPTS as usize,
    );
    let err = rig
        .idem
        .store()
        .get(inv.key())
        .await
        .expect_err("throttled");
    assert!(matches!(err, StoreError::Throttled { .. }), "got {err:?}");
    assert_eq!(
        rig.faults.fired(SdkOperation::GetItem, SdkFault::Throttle),
        SDK_ATTEMPTS as usize
    );
    assert_eq!(
        rig.faults.requests(SdkOperation::GetItem),
        2 + SDK_ATTEMPTS as usize
    );
}

/// The interceptor's own bookkeeping: passes let requests through, faults fire in order and
/// only on their operation, and `clear` drops what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_fire_in_order_on_their_operation() {
    let rig = Rig::new().await;
    rig.faults
        .inject(SdkOperation::DeleteItem, SdkFault::Throttle);
    rig.faults.pass(SdkOperation::UpdateItem, 1);
    rig.faults
        .inject(SdkOperation::UpdateItem, SdkFault::ServerError);
    assert_eq!(rig.faults.pending(), 2);
    let inv = invocation("bookkeeping", Path::Single);

    rig.idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(20_u32) })
        .await
        .expect("first");

    assert_eq!(rig.faults.fired_total(), 0, "the completion was passed");
    assert_eq!(rig.faults.pending_for(SdkOperation::UpdateItem), 1);
    assert_eq!(rig.faults.pending_for(SdkOperation::DeleteItem), 1);
    assert_eq!(rig.faults.requests(SdkOperation::PutItem), 1);
    assert_eq!(rig.faults.requests(SdkOperation::UpdateItem), 1);
    rig.faults.clear();
    assert_eq!(rig.faults.pending(), 0);
}

#[tokio::test]
async fn priming_throttled_past_the_sdk_retries_is_transient() {
    let dynamo = dynamo::start().await;
    let faults = FaultInterceptor::new();
    let store = DynamoDbStore::new(client_with(dynamo.endpoint.clone(), &faults), &dynamo.table);
    faults.inject_times(
        SdkOperation::GetItem,
        SdkFault::Throttle,
        SDK_ATTEMPTS as usize,
    );

    let err = store
        .prime()
        .await
        .expect_err("throttled past the SDK's retries");

    assert!(matches!(err, StoreError::Throttled { .. }), "got {err:?}");
    assert!(
        err.is_transient(),
        "a throttled prime leaves the first event to retry, it does not fail the init"
    );
    assert_eq!(
        faults.fired(SdkOperation::GetItem, SdkFault::Throttle),
        SDK_ATTEMPTS as usize
    );
    store
        .prime()
        .await
        .expect("primes once the throttling ends");
}
