//! The one state machine: claim → (take over → reconcile) → run → complete, release or retain.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lambda_idempotency::{Fingerprint, Idempotency, Invocation, OperationKey, OperationScope};
//! use lambda_idempotency::store::MemoryStore;
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let scope = OperationScope::new("shop", "charge")?;
//! let key = OperationKey::derive(&scope, None, "order-418")?;
//! let invocation = Invocation::new(key, Fingerprint::of(&42)?, Duration::from_secs(30));
//!
//! let first = idem.execute(&invocation, |_ctx| async { Ok::<_, std::io::Error>(42_u32) }).await?;
//! let again = idem.execute(&invocation, |_ctx| async { Ok::<_, std::io::Error>(0_u32) }).await?;
//! assert!(!first.is_replay());
//! assert!(again.is_replay());
//! assert_eq!(*again.value(), 42); // the stored outcome, the handler did not run
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Instrument, debug, info, info_span, warn};

use self::answer::answer_existing;
use self::attempt::{ExecutionContext, Halt, StepLedger};
use self::decide::Recover;
pub(crate) use self::give_back::LandsBy;
use self::give_back::{GiveBack, HandedOn};
pub use self::operator::{Operator, Resolution};
use self::owned_runs::{OwnedRun, Refused};
use self::settle::{Completion, settle_patience};
use self::single_flight::SingleFlight;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::{BoxError, Error};
use crate::execution::{Execution, Invocation, Origin};
use crate::failure::{Classifier, DefaultClassifier};
use crate::key::OperationKey;
use crate::observe::{self, Decision, Observation, Observer};
use crate::reconcile::{Reconciler, Recovery};
use crate::record::{Record, RetainedFailure};
use crate::store::{AnyStore, Guard, Store, StoreExt, Target};

pub(crate) mod answer;
pub(crate) mod attempt;
mod claim;
pub(crate) mod decide;
mod earlier_key;
#[cfg(feature = "from-env")]
mod from_env;
mod give_back;
mod keyed_by_0_4;
mod operator;
mod owned_runs;
mod reconcile;
pub(crate) mod replayable;
pub(crate) mod retry;
pub(crate) mod settle;
mod single_flight;
mod wait;

/// How long an INDETERMINATE record is kept: it waits for an operator.
pub(crate) const INDETERMINATE_RETENTION: Duration = Duration::from_secs(366 * 24 * 3600);
/// How long a claim given back by a panicking or cancelled handler still holds, so that what
/// the handler left in flight lands before a takeover's reconciler looks.
const GIVE_BACK_GRACE: Duration = Duration::from_secs(5);

/// The idempotency engine over a store; cheap to clone, safe to share across tasks.
///
/// The store is erased once, here ([`AnyStore`]): no type a door or a user names carries it.
#[derive(Clone)]
pub struct Idempotency {
    store: AnyStore,
    clock: Arc<dyn Clock>,
    config: Config,
    classifier: Arc<dyn Classifier>,
    reconciler: Option<Arc<dyn Reconciler>>,
    recovery: Recovery,
    observer: Arc<dyn Observer>,
    single_flight: Option<Arc<SingleFlight>>,
    spawner: Option<Arc<Spawner>>,
}

/// Runs a task beside the caller ([`Idempotency::with_spawner`]).
type Spawner = dyn Fn(BoxFuture<'static, ()>) + Send + Sync;

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.store)
            .field("clock", &self.clock)
            .field("config", &self.config)
            .field("reconciler", &self.reconciler.is_some())
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl Idempotency {
    /// An engine over `store` with the default [`Config`] (24 h retention, 6 MiB outcomes),
    /// reading the system clock; a handler error is retryable unless it is (or wraps) a
    /// [`Terminal`](crate::failure::Terminal) (the default classifier), and a takeover of a crashed attempt that recorded no step holds the operation for an
    /// operator ([`Recovery::Indeterminate`]) unless a reconciler is set or another
    /// [`Recovery`] is declared. The store is boxed once ([`AnyStore`]; an `AnyStore` is taken as it
    /// is).
    ///
    /// In a build whose panics abort (`panic = "abort"`), it warns once: a panicking handler's
    /// claim is then held for its whole lease instead of being given back.
    ///
    /// ```
    /// use lambda_idempotency::Idempotency;
    /// use lambda_idempotency::store::MemoryStore;
    ///
    /// let idem = Idempotency::new(MemoryStore::new()); // DynamoDB: Idempotency::from_env().await?
    /// # let _ = idem;
    /// ```
    pub fn new(store: impl Store) -> Self {
        give_back::warn_once_if_panics_abort();
        Self {
            store: AnyStore::new(store),
            clock: Arc::new(SystemClock),
            config: Config::default(),
            classifier: Arc::new(DefaultClassifier),
            reconciler: None,
            recovery: Recovery::default(),
            observer: Arc::new(()),
            single_flight: None,
            spawner: None,
        }
    }

    /// Uses `config` (retention, outcome size limit) instead of the default; an operation may
    /// declare its own retention and outcome limit
    /// ([`Operation::with_retention`](crate::Operation::with_retention)).
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Single flight: concurrent callers of one operation key through this engine (and its
    /// clones) take turns, each waiting at most its lease (and never past 1 s before its
    /// invocation's deadline), so that a copy replays the first
    /// one's outcome instead of failing with [`Error::AlreadyInProgress`]. A copy whose turn
    /// comes with under 2 s left before its deadline answers from the record as it stands (in
    /// progress when the turn before released its claim) rather than start the handler for
    /// Lambda to cut off. For many invocations
    /// in one process (`lambda_runtime::run_concurrent`, concurrent batches). Callers in other
    /// processes still meet the store's live lease.
    pub fn with_single_flight(mut self) -> Self {
        self.single_flight = Some(Arc::default());
        self
    }

    /// Runs the tasks that outlive a call (a claim given back after its caller was cancelled)
    /// with `spawn` instead of on the current Tokio runtime: for an executor of another kind
    /// (a model checker's scheduler). Without it, a cancelled call outside a Tokio runtime
    /// leaves its claim to wait out its lease.
    ///
    /// ```
    /// use lambda_idempotency::Idempotency;
    /// use lambda_idempotency::store::MemoryStore;
    ///
    /// let idem = Idempotency::new(MemoryStore::new()).with_spawner(|task| {
    ///     tokio::spawn(task);
    /// });
    /// # let _ = idem;
    /// ```
    pub fn with_spawner(
        mut self,
        spawn: impl Fn(BoxFuture<'static, ()>) + Send + Sync + 'static,
    ) -> Self {
        self.spawner = Some(Arc::new(spawn));
        self
    }

    /// Reports every decision and the claim and completion latencies to `observer`
    /// ([`crate::observe`]).
    pub fn with_observer(mut self, observer: impl Observer + 'static) -> Self {
        self.observer = Arc::new(observer);
        self
    }

    /// Reads time from `clock` instead (tests inject a [`crate::clock::ManualClock`]).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Classifies handler errors with `classifier` ([`crate::failure`]) in every operation
    /// that declares none of its own ([`Operation::with_classifier`](crate::Operation::with_classifier)).
    pub fn with_classifier(mut self, classifier: impl Classifier + 'static) -> Self {
        self.classifier = Arc::new(classifier);
        self
    }

    /// Asks `reconciler` before a takeover re-runs a crashed attempt ([`crate::reconcile`]) of
    /// every operation that declares none of its own. A reconciler checks one operation's
    /// downstream: set it on that operation
    /// ([`Operation::with_reconciler`](crate::Operation::with_reconciler)).
    pub fn with_reconciler(mut self, reconciler: impl Reconciler + 'static) -> Self {
        self.reconciler = Some(Arc::new(reconciler));
        self
    }

    /// The recovery policy ([`Recovery`]) of every operation that declares none of its own:
    /// what a takeover of a crashed attempt that recorded no step does when no reconciler is
    /// set. A recovery policy is a declaration about one handler's effects: declare it on
    /// that operation ([`Operation::with_recovery`](crate::Operation::with_recovery)); set
    /// here, `Rerun` re-runs every operation of the engine that is not safe to repeat too.
    ///
    /// ```
    /// use lambda_idempotency::reconcile::Recovery;
    /// use lambda_idempotency::store::MemoryStore;
    /// use lambda_idempotency::Idempotency;
    ///
    /// // Every operation of this engine records each of its effects as a step.
    /// let idem = Idempotency::new(MemoryStore::new())
    ///     .with_recovery(Recovery::Steps);
    /// # let _ = idem;
    /// ```
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }

    /// The store, erased ([`AnyStore`] implements [`Store`]); bring
    /// [`StoreExt`] into scope to read or write through it.
    ///
    /// ```
    /// # async fn run() -> Result<(), lambda_idempotency::StoreError> {
    /// use lambda_idempotency::store::{MemoryStore, StoreExt};
    /// use lambda_idempotency::{Idempotency, OperationKey, OperationScope};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let scope = OperationScope::new("orders", "charge").unwrap();
    /// let key = OperationKey::derive(&scope, None, &"o-1").unwrap();
    /// assert!(idem.store().get(&key).await?.is_none());
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
    /// ```
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The recovery policy ([`Idempotency::with_recovery`]).
    pub(crate) fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The current time, from the engine's clock.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Runs `handler` at most once per operation, or answers from the stored record.
    ///
    /// - first time: claims the key, runs the handler, stores the serialized result;
    /// - completed before (same fingerprint): returns the stored result, handler not run;
    /// - another fingerprint under the key: [`Error::PayloadConflict`];
    /// - a live claim elsewhere: [`Error::AlreadyInProgress`];
    /// - a claim whose lease ran out: taken over; its recorded steps replay
    ///   ([`crate::effects`]); without steps the reconciler (if any) is asked, else the
    ///   recovery policy decides: by default the operation is held INDETERMINATE;
    /// - the handler fails: retryable → the claim is released; terminal → the failure is
    ///   retained and replayed ([`Error::Failed`]); either way the caller gets [`Error::Handler`];
    /// - the record expired but the business identity's evidence stands:
    ///   [`Error::KeyExpiredConflict`];
    /// - the lease was taken over meanwhile: [`Error::LeaseLost`], nothing overwritten.
    pub async fn execute<T, E, F, Fut>(
        &self,
        invocation: &Invocation,
        handler: F,
    ) -> Result<Execution<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // The operation's own policy (recovery, reconciler, classifier, retention, outcome
        // limit) over the engine's defaults, for this execution only.
        let declared;
        let idem = match invocation.policy.is_default() && invocation.owner.is_none() {
            true => self,
            false => {
                declared = self.under(invocation);
                &declared
            }
        };
        idem.execute_declared(invocation, handler).await
    }

    /// This engine with the settings `invocation`'s operation declares in place of its defaults.
    fn under(&self, invocation: &Invocation) -> Self {
        let policy = &invocation.policy;
        let mut idem = self.clone();
        if let Some(recovery) = policy.recovery {
            idem.recovery = recovery;
        }
        if let Some(reconciler) = &policy.reconciler {
            idem.reconciler = Some(Arc::clone(reconciler));
        }
        if let Some(classifier) = &policy.classifier {
            idem.classifier = Arc::clone(classifier);
        }
        let mut retention = policy.retention;
        if invocation.owner.is_some() {
            // An owned claim's record outlives the owner's longest pause (its lease), settled
            // too: the execution's replay after a pause that follows the operation finds its
            // outcome, not a key to run afresh.
            let declared = retention.unwrap_or(self.config.retention());
            retention = Some(declared.max(invocation.lease));
        }
        idem.config = self
            .config
            .for_operation(retention, policy.max_outcome_bytes);
        idem
    }

    /// [`Self::execute`] under the policy in place.
    async fn execute_declared<T, E, F, Fut>(
        &self,
        invocation: &Invocation,
        handler: F,
    ) -> Result<Execution<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = info_span!(
            "idempotency.execute",
            operation = invocation.key.operation(),
            key = invocation.key.short(),
            request_id = invocation.request_id.as_deref(),
            message_id = invocation.message_id.as_deref(),
            attempt = tracing::field::Empty,
        );
        let answer = match &self.single_flight {
            Some(flight) => {
                let entered = self.clock.now();
                let patience =
                    decide::single_flight_patience(invocation.lease, invocation.deadline, entered);
                // A caller that waits for results waits at most that long, its turn included.
                let patience = invocation
                    .wait_for_result
                    .map_or(patience, |max| patience.min(max));
                flight
                    .in_turn(
                        &invocation.key,
                        &*self.clock,
                        patience,
                        |waited| async move {
                            // The lease counts from the invocation's deadline: time spent waiting
                            // for the turn comes off it.
                            let waited_for =
                                self.clock.now().duration_since(entered).unwrap_or_default();
                            let mut invocation = invocation.clone();
                            invocation.lease = invocation.lease.saturating_sub(waited_for);
                            invocation.wait_for_result = invocation
                                .wait_for_result
                                .map(|max| max.saturating_sub(waited_for));
                            invocation.turn_came_late = waited;
                            Box::pin(self.run_or_wait(&invocation, handler)).await
                        },
                    )
                    .instrument(span)
                    .await
            }
            // Boxed: the engine's future is deep (claim, retries, SDK requests), and a caller's
            // own future around it must not hit the compiler's layout depth limit.
            None => {
                Box::pin(self.run_or_wait(invocation, handler))
                    .instrument(span)
                    .await
            }
        };
        let (answer, counted) = answer;
        let operation = invocation.key.operation();
        let decision = match counted {
            Counted::ByAnswer => Decision::of_answer(&answer),
            Counted::AsRun(decision) => decision,
        };
        if let Some(decision) = decision {
            self.observer.observe(&Observation::Decision {
                operation,
                decision,
            });
        }
        answer
    }

    /// Counts a call refused before it reached the engine (no key, an unreadable event, no
    /// tenant): [`Decision::Other`] of the error's kind; a key policy that panicked as a
    /// handler that failed.
    pub(crate) fn observe_refusal(&self, operation: &str, err: &Error) {
        let decision = match err {
            Error::Handler { .. } => Decision::HandlerFailed,
            other => Decision::Other(other.kind().name()),
        };
        self.observer.observe(&Observation::Decision {
            operation,
            decision,
        });
    }

    fn observe_latency(&self, key: &OperationKey, step: observe::Phase, started: Instant) {
        self.observer.observe(&Observation::Latency {
            operation: key.operation(),
            step,
            elapsed: started.elapsed(),
        });
    }

    /// The answer of a caller that must not run the handler (a sibling of an owned run in
    /// flight in this process: a durable `map` or `parallel` branch of the same execution,
    /// with the same operation; a caller whose turn came too late to run): the record as it
    /// stands, as any duplicate is answered; in progress when there is none yet.
    async fn answer_as_it_stands<T: DeserializeOwned>(
        &self,
        invocation: &Invocation,
        now: SystemTime,
    ) -> Result<Execution<T>, Error> {
        match self
            .read_before(&invocation.key, invocation.deadline)
            .await?
        {
            Some(record) if !record.counts_as_absent(now) => {
                answer_existing(record, invocation, self.clock.now())
            }
            // None stands yet (or none that answers): the run in flight is making it.
            _ => Err(Error::AlreadyInProgress {
                key: invocation.key.clone(),
                attempt: 1,
                retry_after: Duration::ZERO,
            }),
        }
    }

    /// Whether a record of `key` stands (one that answers); a read that fails says it does.
    async fn record_stands(&self, key: &OperationKey, now: SystemTime) -> bool {
        match self.store.get(key).await {
            Ok(record) => record.is_some_and(|record| !record.counts_as_absent(now)),
            Err(_) => true,
        }
    }

    /// Claims and runs, or answers; `Busy` gives the handler back, unrun, when another
    /// environment holds a live claim and the invocation waits for results
    /// ([`Invocation::with_wait_for_result`]).
    async fn run<T, E, F, Fut>(&self, invocation: &Invocation, handler: F) -> Ran<T, F>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let now = self.clock.now();
        let asked = invocation;
        let invocation = match self.under_earlier_key(invocation, now).await {
            Ok(invocation) => invocation,
            Err(err) => return Ran::Answered(Err(err)),
        };
        let invocation = &*invocation;
        if let Err(err) = self.check_keyed_by_0_4(invocation, now).await {
            return Ran::Answered(Err(err));
        }
        let key = &invocation.key;
        if invocation.turn_came_late && self.too_late_to_run(invocation) {
            let answer = self.answer_as_it_stands(invocation, now).await;
            return Ran::unrun(answer, invocation, handler);
        }
        // One run of an owner's operation at a time in this process: a second is a sibling.
        let owned_run = match &invocation.owner {
            None => None,
            Some(owner) => {
                let (token, branch) = (owner.token(), owner.branch());
                let mut started = OwnedRun::start(key, token, branch);
                // A run parked in another branch whose claim went meanwhile parks nothing.
                if started.as_ref().err() == Some(&Refused::ParkedInAnotherBranch)
                    && !self.record_stands(key, now).await
                {
                    started = OwnedRun::start_unparked(key, token, branch);
                }
                match started {
                    Ok(run) => Some(run),
                    Err(_) => {
                        let answer = self.answer_as_it_stands(invocation, now).await;
                        return Ran::unrun(answer, invocation, handler);
                    }
                }
            }
        };
        let ran = self.claim_and_run(invocation, asked, now, handler).await;
        // Dropped before this (the durable SDK parks the handler), an owned run stays parked.
        if let Some(run) = owned_run {
            run.finish();
        }
        ran
    }

    /// Claims `invocation` (`asked`, perhaps under an earlier version's key) and runs, or
    /// answers.
    async fn claim_and_run<T, E, F, Fut>(
        &self,
        invocation: &Invocation,
        asked: &Invocation,
        now: SystemTime,
        handler: F,
    ) -> Ran<T, F>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let key = &invocation.key;
        let claim = self.new_claim(invocation, now);
        let deadline = claim.lease.expires_at;
        // Armed from the first write: a cancellation while claiming gives back what committed.
        // An owned claim is kept for its owner's return: the durable SDK cancels its handler at
        // every suspension.
        let lands_by = LandsBy::default();
        let unstarted = AtomicBool::new(true);
        let handed_on = HandedOn::default();
        let mut give_back = GiveBack {
            store: &self.store,
            clock: &*self.clock,
            spawner: self.spawner.as_deref(),
            key,
            token: &claim.lease.token,
            lease_expires_at: deadline,
            lands_by: &lands_by,
            armed: invocation.owner.is_none(),
            identity: claim.identity.as_deref(),
            unstarted: &unstarted,
            handed_on: &handed_on,
        };
        let claiming = Instant::now();
        let mut claimed = self
            .claim(&claim, invocation, now, &unstarted, &handed_on)
            .await;
        // A record that went, or whose retention has run out, answers nothing: one that stood
        // in the claim's way and was released meanwhile (by its own cancelled claimer, by an
        // operator, whose release is written already expired) is claimed again, once.
        let again = match &claimed {
            Ok(AfterClaim::Answer(existing)) => existing.counts_as_absent(now),
            Ok(AfterClaim::Gone { .. }) => true,
            _ => false,
        };
        if again {
            debug!("the record in the claim's way went meanwhile: claimed again");
            // No write of ours stands (a takeover that committed answers `Held`): the claim
            // starts afresh, and a cancellation before the handler releases it whole.
            unstarted.store(true, Ordering::SeqCst);
            claimed = self
                .claim(&claim, invocation, now, &unstarted, &handed_on)
                .await;
        }
        // At the key 0.1 derived, only what 0.1 wrote is continued. Gone meanwhile (an operator
        // released it, TTL deleted it), a claim there would start the operation afresh under
        // today's rule, where no later duplicate looks (they read 0.1's records only): it is
        // given back whole, and the operation is claimed under today's key.
        if invocation.key != asked.key
            && matches!(
                claimed,
                Ok(AfterClaim::Run(Held::Fresh) | AfterClaim::Gone { .. })
            )
        {
            if let Ok(AfterClaim::Run(Held::Fresh)) = claimed {
                let target = Target {
                    key,
                    identity: claim.identity.as_deref(),
                    guard: Guard::Lease(&claim.lease.token),
                };
                let patience = settle_patience(invocation, &claim, self.clock.now());
                if let Err(err) = self.release_claim(target, 1, patience).await {
                    // Left armed: the guard gives the unstarted claim back whole as it drops.
                    return Ran::unrun(Err(err), invocation, handler);
                }
            }
            give_back.disarm();
            debug!("0.1's record went meanwhile: claimed under today's key");
            // The lease and the wait count from the invocation's deadline: the time spent at
            // 0.1's key comes off them.
            let spent = self.clock.now().duration_since(now).unwrap_or_default();
            let mut today = asked.clone();
            today.earlier_key = None;
            today.lease = today.lease.saturating_sub(spent);
            today.wait_for_result = today.wait_for_result.map(|max| max.saturating_sub(spent));
            return Box::pin(self.run(&today, handler)).await;
        }
        self.observe_latency(key, observe::Phase::Claim, claiming);
        let held = match claimed {
            Ok(AfterClaim::Run(held)) => {
                if let Held::TakenOver {
                    reentered: false, ..
                } = held
                {
                    self.observer.observe(&Observation::Decision {
                        operation: key.operation(),
                        decision: Decision::Takeover,
                    });
                }
                held
            }
            Ok(AfterClaim::Answer(existing)) => {
                give_back.disarm();
                // What is left of the holder's lease now, after the claim's tries.
                let answer = answer_existing(*existing, invocation, self.clock.now());
                return Ran::unrun(answer, invocation, handler);
            }
            // Gone twice: another caller is at work on it.
            Ok(AfterClaim::Gone { attempt }) => {
                give_back.disarm();
                let busy = Error::AlreadyInProgress {
                    key: key.clone(),
                    attempt,
                    retry_after: Duration::ZERO,
                };
                return Ran::unrun(Err(busy), invocation, handler);
            }
            Err(err) => {
                give_back.disarm();
                return Ran::unrun(Err(err), invocation, handler);
            }
        };
        // A claim that committed as its lease ran out (its tries, or a wait for the turn, took
        // the lease; an invocation with no deadline has no cut before it) leaves the handler no
        // time under it: another caller may take it over at once and run beside it. Not
        // started: the guard gives back what this claim wrote as it drops (a fresh claim
        // whole, a takeover shortened with the crashed attempt's mark handed on), an owner's
        // claim too; only an owner's re-entered claim stays as it was for the owner's return.
        if self.clock.now() >= deadline {
            let (attempt, reentered) = match &held {
                Held::Fresh => (1, false),
                Held::TakenOver {
                    attempt, reentered, ..
                } => (*attempt, *reentered),
            };
            give_back.armed = !reentered;
            warn!(
                key = key.short(),
                "the claim committed as its lease ran out: the handler is not started, and the claim is given back"
            );
            let lost = Error::LeaseLost {
                key: key.clone(),
                attempt,
            };
            return Ran::unrun(Err(lost), invocation, handler);
        }
        // Every write from here settles the identity the operation recorded at its claim,
        // whatever this deployment declares.
        let identity = held.identity(&claim).map(str::to_owned);
        if identity != claim.identity {
            warn!(
                "this deployment declares another business identity than the operation recorded when it was claimed: the recorded one is kept"
            );
        }
        let target = Target {
            key,
            identity: identity.as_deref(),
            guard: Guard::Lease(&claim.lease.token),
        };
        // From here a cancellation gives the claim back: the handler may run.
        unstarted.store(false, Ordering::SeqCst);
        handed_on.set(None);
        // A failure this run retains (its outcome could not be kept) is its own execution's,
        // not a replay, and a result too large to keep is one that ran: counted as the run it
        // was (a takeover is counted when taken).
        let counted = match held {
            Held::Fresh
            | Held::TakenOver {
                reentered: true, ..
            } => Some(Decision::FirstExecution),
            Held::TakenOver { .. } => None,
        };
        let answer = self
            .run_held(target, invocation, &claim, held, &lands_by, handler)
            .await;
        give_back.disarm();
        match answer {
            Ok(answer @ Err(Error::Failed { .. } | Error::OutcomeTooLarge { .. })) => {
                Ran::Executed { answer, counted }
            }
            Ok(answer) => Ran::Answered(answer),
            Err(panic) => {
                warn!("the handler panicked: its claim is given back for a reconciled takeover");
                // Counted before the panic goes on: it never reaches the answer's count.
                self.observer.observe(&Observation::Decision {
                    operation: key.operation(),
                    decision: Decision::HandlerFailed,
                });
                let _ = self
                    .shorten(target, deadline, invocation.deadline, lands_by.get())
                    .await;
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Runs the handler (or reconciles) under a held lease; `Err` is the handler's panic.
    async fn run_held<T, E, F, Fut>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        held: Held,
        lands_by: &LandsBy,
        handler: F,
    ) -> std::thread::Result<Result<Execution<T>, Error>>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let reentered_own = matches!(
            held,
            Held::TakenOver {
                reentered: true,
                ..
            }
        );
        let (attempt, recorded, created_at) = match held {
            Held::Fresh => (1, Vec::new(), claim.created_at),
            Held::TakenOver {
                attempt,
                previous,
                adopted,
                reentered,
            } => {
                // An adopted orphan's steps went with its record: nothing says they were none,
                // now (this adoption) or on any later takeover of the record it re-created.
                let inherited = decide::inherited(&previous);
                let created_at = previous.created_at;
                // The steps of an attempt that gave its claim back, or of a crashed one whose
                // handler declares its effects to be its steps (or safe to repeat), decide;
                // otherwise a reconciler or an operator does, and recorded results still
                // replay if the handler runs.
                let recover = decide::recover(
                    self.recovery,
                    adopted,
                    reentered,
                    &inherited,
                    self.reconciler.is_some(),
                );
                let given_back = inherited.given_back;
                let recorded = inherited.steps;
                if recover == Recover::Steps {
                    info!(
                        attempt,
                        steps = recorded.len(),
                        given_back,
                        "took over an earlier attempt: its recorded steps replay"
                    );
                } else if let Some(answer) = self
                    .reconcile(
                        target,
                        invocation,
                        claim,
                        attempt,
                        Record {
                            steps: recorded.clone(),
                            ..*previous
                        },
                        recover,
                    )
                    .await
                {
                    return Ok(answer);
                }
                (attempt, recorded, created_at)
            }
        };
        tracing::Span::current().record("attempt", attempt);
        let steps = Arc::new(StepLedger::new(
            self.clone(),
            invocation,
            claim,
            attempt,
            recorded,
            created_at,
            lands_by.clone(),
        ));
        let context = ExecutionContext {
            key: invocation.key.clone(),
            attempt,
            steps: Arc::clone(&steps),
        };
        // The handler is called inside the guard too: a panic before its future's first poll
        // (in a closure's synchronous part) is the handler's panic like any other.
        let ran = AssertUnwindSafe(async move { handler(context).await })
            .catch_unwind()
            .await;
        steps.close();
        let ran = match ran {
            Ok(ran) => ran,
            Err(panic) => {
                // A stop is acted on (a handler that unwrapped its StepError), else what the
                // steps came to is kept for the takeover.
                // A stop that gives the claim back is not acted on: a panic is no knowing
                // give-back, so the steps are saved unmarked and the claim is given back as
                // a crash's.
                match steps.take_halt() {
                    Some(Halt::GiveBack(_)) | None => steps.save().await,
                    Some(halt) => {
                        let _ = self
                            .halted::<T>(target, invocation, claim, attempt, halt, &steps)
                            .await;
                    }
                }
                return Err(panic);
            }
        };
        let patience = settle_patience(invocation, claim, self.clock.now());
        if let Some(halt) = steps.take_halt() {
            return Ok(self
                .halted(target, invocation, claim, attempt, halt, &steps)
                .await);
        }
        Ok(match ran {
            Ok(value) => {
                let origin = Origin::Executed { attempt };
                let completion = Completion {
                    steps: Some(&steps),
                };
                self.record(target, invocation, claim, value, origin, completion)
                    .await
                    .map(|mut execution| {
                        execution.reentered = reentered_own;
                        execution
                    })
            }
            Err(err) => self
                .fail(target, attempt, err.into(), patience, Some(&steps))
                .await
                .and_then(Err),
        })
    }

    /// Acts on an attempt that stopped at a step; the caller's answer.
    async fn halted<T>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        halt: Halt,
        steps: &StepLedger,
    ) -> Result<Execution<T>, Error> {
        match halt {
            Halt::Hold(err) => {
                self.hold(target, invocation, claim, attempt, steps.pending())
                    .await?;
                Err(err)
            }
            // Nothing of the operation's steps is in the store: nothing happened, it is
            // released for the next delivery to run afresh.
            Halt::GiveBack(err) if !steps.has_recorded() => {
                let patience = settle_patience(invocation, claim, self.clock.now());
                self.release_claim(target, attempt, patience).await?;
                Err(err)
            }
            Halt::GiveBack(err) => {
                steps.give_back().await?;
                Err(err)
            }
            Halt::Lost(err) => Err(err),
            Halt::Retain(kind, err) => {
                let patience = settle_patience(invocation, claim, self.clock.now());
                let message = match &err {
                    Error::InvalidEvent { reason } => reason.clone(),
                    other => other.to_string(),
                };
                self.retain(
                    target,
                    attempt,
                    kind.clone(),
                    message.clone(),
                    patience,
                    steps.pending(),
                )
                .await?;
                match err {
                    // The effect happened and its result cannot be kept: the caller is told
                    // what every later caller is, never that its event was invalid.
                    Error::InvalidEvent { .. } => Err(Error::Failed {
                        key: invocation.key.clone(),
                        failure: RetainedFailure { kind, message }.bounded(),
                    }),
                    err => Err(err),
                }
            }
        }
    }
}

/// What a run came to: an answer, or a live claim elsewhere that the invocation waits out.
enum Ran<T, F> {
    /// The answer for the caller.
    Answered(Result<Execution<T>, Error>),
    /// The answer of a run this call executed that is not counted by its answer (a failure it
    /// retained reads as a replayed one): counted as `counted`.
    Executed {
        answer: Result<Execution<T>, Error>,
        counted: Option<Decision>,
    },
    /// Another environment holds a live claim on `key`; the handler did not run.
    Busy {
        handler: F,
        key: OperationKey,
        busy: Error,
    },
}

impl<T, F> Ran<T, F> {
    /// `answer`, for an invocation whose handler did not run: in progress elsewhere gives the
    /// handler back when the invocation waits for results.
    fn unrun(answer: Result<Execution<T>, Error>, invocation: &Invocation, handler: F) -> Self {
        match answer {
            Err(busy @ Error::AlreadyInProgress { .. }) if invocation.wait_for_result.is_some() => {
                Ran::Busy {
                    handler,
                    key: invocation.key.clone(),
                    busy,
                }
            }
            answer => Ran::Answered(answer),
        }
    }
}

/// How a call's answer is counted.
enum Counted {
    /// By [`Decision::of_answer`].
    ByAnswer,
    /// As the run this call executed (none: counted when its lease was taken).
    AsRun(Option<Decision>),
}

/// What a claim leads to.
enum AfterClaim {
    /// The caller holds the lease: run (or reconcile).
    Run(Held),
    /// Another record stands: answer from it (replay, retained failure, wait).
    Answer(Box<Record>),
    /// The record a takeover (of `attempt`) was for went meanwhile: claim again.
    Gone {
        /// The attempt the takeover would have been.
        attempt: u32,
    },
}

/// How the caller came to hold the lease.
enum Held {
    /// A fresh claim: attempt 1.
    Fresh,
    /// A takeover of a crashed attempt (or, `adopted`, of its orphaned evidence: its record,
    /// and whatever steps it held, deleted by TTL), or (`reentered`) the owner's own claim
    /// re-entered ([`Invocation::with_owner`]).
    TakenOver {
        attempt: u32,
        previous: Box<Record>,
        adopted: bool,
        reentered: bool,
    },
}

impl Held {
    /// The business identity (its evidence key) of the operation held: what `claim` wrote for a
    /// fresh claim, what the crashed attempt's record holds for a takeover.
    fn identity<'a>(&'a self, claim: &'a Record) -> Option<&'a str> {
        let previous = match self {
            Self::Fresh => None,
            Self::TakenOver { previous, .. } => Some(&**previous),
        };
        decide::settled_identity(claim, previous)
    }
}
