//! The one state machine: claim → (take over → reconcile) → run → complete, release or retain.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lambda_idempotency::{Config, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope};
//! use lambda_idempotency::store::MemoryStore;
//!
//! let idem = Idempotency::new(MemoryStore::new(), Config::default());
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
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::{Instrument, debug, info_span, warn};

use self::answer::answer_existing;
use self::give_back::GiveBack;
pub use self::operator::{Operator, Resolution};
use self::retry::Patience;
use self::single_flight::SingleFlight;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::{BoxError, Error, StoreError};
use crate::execution::{Execution, ExecutionContext, Invocation, Origin};
use crate::failure::{Classifier, DefaultClassifier, FailureClass, Release};
use crate::key::OperationKey;
use crate::observe::{self, Decision, NoObserver, Observation, Observer};
use crate::reconcile::{BoxFuture, Reconciler, Reconciliation, Recovery, Takeover};
use crate::record::{
    Evidence, Lease, Record, RetainedFailure, Settlement, Status, epoch_millis, retention_expiry,
};
use crate::store::{AnyStore, Claim, Fence, Guard, Store, Target};

mod answer;
mod earlier_key;
mod give_back;
mod operator;
mod retry;
mod single_flight;

/// How long an INDETERMINATE record is kept: it waits for an operator.
const INDETERMINATE_RETENTION: Duration = Duration::from_secs(366 * 24 * 3600);
/// How long a claim given back by a panicking or cancelled handler still holds, so that what
/// the handler left in flight lands before a takeover's reconciler looks.
const GIVE_BACK_GRACE: Duration = Duration::from_secs(5);

/// The idempotency engine over a store; cheap to clone, safe to share across tasks.
pub struct Idempotency<S = AnyStore> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: Config,
    classifier: Arc<dyn Classifier>,
    reconciler: Option<Arc<dyn Reconciler>>,
    recovery: Recovery,
    observer: Arc<dyn Observer>,
    single_flight: Option<Arc<SingleFlight>>,
}

impl<S> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            config: self.config.clone(),
            classifier: Arc::clone(&self.classifier),
            reconciler: self.reconciler.clone(),
            recovery: self.recovery,
            observer: Arc::clone(&self.observer),
            single_flight: self.single_flight.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
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

impl<S: Store> Idempotency<S> {
    /// An engine over `store` reading the system clock; handler errors are classified by the
    /// [`DefaultClassifier`], and a takeover of a crashed attempt re-runs the handler
    /// ([`Recovery::Rerun`]) unless a reconciler is set.
    ///
    /// In a build whose panics abort (`panic = "abort"`), it warns once: a panicking handler's
    /// claim is then held for its whole lease instead of being given back.
    pub fn new(store: S, config: Config) -> Self {
        give_back::warn_once_if_panics_abort();
        Self {
            store: Arc::new(store),
            clock: Arc::new(SystemClock),
            config,
            classifier: Arc::new(DefaultClassifier),
            reconciler: None,
            recovery: Recovery::default(),
            observer: Arc::new(NoObserver),
            single_flight: None,
        }
    }

    /// Single flight: concurrent callers of one operation key through this engine (and its
    /// clones) take turns, each waiting at most its lease, so that a copy replays the first
    /// one's outcome instead of failing with [`Error::AlreadyInProgress`]. For many invocations
    /// in one process (`lambda_runtime::run_concurrent`, concurrent batches). Callers in other
    /// processes still meet the store's live lease.
    pub fn with_single_flight(mut self) -> Self {
        self.single_flight = Some(Arc::default());
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

    /// Classifies handler errors with `classifier` ([`crate::failure`]).
    pub fn with_classifier(mut self, classifier: impl Classifier + 'static) -> Self {
        self.classifier = Arc::new(classifier);
        self
    }

    /// Asks `reconciler` before a takeover re-runs a crashed attempt ([`crate::reconcile`]).
    pub fn with_reconciler(mut self, reconciler: impl Reconciler + 'static) -> Self {
        self.reconciler = Some(Arc::new(reconciler));
        self
    }

    /// What a takeover of a crashed attempt does when no reconciler is set ([`Recovery`]):
    /// re-run the handler (the default, for handlers safe to repeat) or hold the operation
    /// INDETERMINATE for an operator.
    ///
    /// ```
    /// use lambda_idempotency::reconcile::Recovery;
    /// use lambda_idempotency::store::MemoryStore;
    /// use lambda_idempotency::{Config, Idempotency};
    ///
    /// // A handler whose effects do not deduplicate: never re-run it blind.
    /// let idem = Idempotency::new(MemoryStore::new(), Config::default())
    ///     .with_recovery(Recovery::Indeterminate);
    /// # let _ = idem;
    /// ```
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
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
    /// - a claim whose lease ran out: taken over; the reconciler (if any) is asked, else the
    ///   recovery policy decides: by default the handler runs as the next attempt;
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
                let entered = Instant::now();
                let patience = invocation.lease;
                flight
                    .in_turn(&invocation.key, patience, async {
                        // The lease counts from the invocation's deadline: time spent waiting
                        // for the turn comes off it.
                        let mut invocation = invocation.clone();
                        invocation.lease = invocation.lease.saturating_sub(entered.elapsed());
                        Box::pin(self.run(&invocation, handler)).await
                    })
                    .instrument(span)
                    .await
            }
            // Boxed: the engine's future is deep (claim, retries, SDK requests), and a caller's
            // own future around it must not hit the compiler's layout depth limit.
            None => {
                Box::pin(self.run(invocation, handler))
                    .instrument(span)
                    .await
            }
        };
        let operation = invocation.key.operation();
        for decision in Decision::of(&answer) {
            self.observer.observe(&Observation::Decision {
                operation,
                decision,
            });
        }
        answer
    }

    fn observe_latency(&self, key: &OperationKey, step: observe::Step, started: Instant) {
        self.observer.observe(&Observation::Latency {
            operation: key.operation(),
            step,
            elapsed: started.elapsed(),
        });
    }

    async fn run<T, E, F, Fut>(
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
        let now = self.clock.now();
        let invocation = &*self.under_earlier_key(invocation, now).await?;
        let key = &invocation.key;
        let claim = self.new_claim(invocation, now);
        let deadline = claim.lease.expires_at;
        // Armed from the first write: a cancellation while claiming gives back what committed.
        let mut give_back = GiveBack {
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            key: key.clone(),
            token: claim.lease.token.clone(),
            lease_expires_at: deadline,
            armed: true,
        };
        let claiming = Instant::now();
        let claimed = self.claim(&claim, invocation, now).await;
        self.observe_latency(key, observe::Step::Claim, claiming);
        let held = match claimed {
            Ok(Step::Run(held)) => {
                if let Held::TakenOver { .. } = held {
                    self.observer.observe(&Observation::Decision {
                        operation: key.operation(),
                        decision: Decision::Takeover,
                    });
                }
                held
            }
            Ok(Step::Answer(existing)) => {
                give_back.disarm();
                return answer_existing(*existing, invocation, now);
            }
            Err(err) => {
                give_back.disarm();
                return Err(err);
            }
        };
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
        let answer = self
            .run_held(target, invocation, &claim, held, handler)
            .await;
        give_back.disarm();
        match answer {
            Ok(answer) => answer,
            Err(panic) => {
                warn!("the handler panicked: its claim is given back for a reconciled takeover");
                let _ = self.shorten(target, deadline).await;
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
        handler: F,
    ) -> std::thread::Result<Result<Execution<T>, Error>>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let attempt = match held {
            Held::Fresh => 1,
            Held::TakenOver { attempt, previous } => {
                if let Some(answer) = self
                    .reconcile(target, invocation, claim, attempt, *previous)
                    .await
                {
                    return Ok(answer);
                }
                attempt
            }
        };
        tracing::Span::current().record("attempt", attempt);
        let context = ExecutionContext {
            key: invocation.key.clone(),
            attempt,
        };
        let ran = AssertUnwindSafe(handler(context)).catch_unwind().await?;
        Ok(match ran {
            Ok(value) => {
                let origin = Origin::Executed { attempt };
                self.record(target, invocation, claim, value, origin, attempt)
                    .await
            }
            Err(err) => self
                .fail(
                    target,
                    attempt,
                    err.into(),
                    settle_patience(invocation, claim, self.clock.now()),
                )
                .await
                .and_then(Err),
        })
    }

    /// Claims the key: a fresh claim, a takeover of an expired lease, or the adoption of this
    /// operation's orphaned evidence; `Err` is the answer when the key is not ours to run.
    async fn claim(
        &self,
        claim: &Record,
        invocation: &Invocation,
        now: SystemTime,
    ) -> Result<Step, Error> {
        let key = &invocation.key;
        let deadline = claim.lease.expires_at;
        let target = Target {
            key,
            identity: claim.identity.as_deref(),
            guard: Guard::Lease(&claim.lease.token),
        };
        let claimed = match self
            .retrying(Patience::Brief(deadline), || self.store.claim(claim, now))
            .await
        {
            Ok(claimed) => claimed,
            Err(err) => {
                // A transient failure may hide a claim that committed with its answer lost;
                // nothing ran under it yet, so it is given back whole, as patiently as a
                // settlement (a claim left standing would wait out its lease). Any other
                // failure (refused, missing table, denied) wrote nothing.
                if err.is_transient() {
                    let patience = settle_patience(invocation, claim, self.clock.now());
                    let _ = self.retrying(patience, || self.store.release(target)).await;
                }
                return Err(err.into());
            }
        };
        let existing = match claimed {
            Claim::Acquired => return Ok(Step::Run(Held::Fresh)),
            Claim::Existing(existing) if is_own_claim(&existing, claim) => {
                debug!("the claim committed before its answer was lost");
                return Ok(Step::Run(Held::Fresh));
            }
            Claim::Existing(existing) => existing,
            Claim::IdentityTaken(evidence)
                if evidence.key == *key && evidence.status == Status::InProgress =>
            {
                return self.adopt(claim, invocation, evidence, now).await;
            }
            Claim::IdentityTaken(evidence) => {
                return Err(answer::identity_taken(invocation, evidence));
            }
        };
        if !invocation.fingerprint.matches(&existing.fingerprint) {
            return Err(Error::PayloadConflict { key: key.clone() });
        }
        if !existing.lease_is_takeable(now) {
            return Ok(Step::Answer(Box::new(existing)));
        }
        let lease = Lease {
            attempt: existing.lease.attempt.saturating_add(1),
            ..claim.lease.clone()
        };
        let expires_at = retention_expiry(lease.expires_at, self.config.retention());
        let fence = match self
            .retrying(Patience::Brief(deadline), || {
                self.store.take_over(&existing, &lease, expires_at, now)
            })
            .await
        {
            Ok(fence) => fence,
            Err(err) => {
                // The takeover may have committed with its answer lost. The crashed attempt
                // may have acted, so the record stays for the next takeover: only the lease
                // this one may hold is cut short.
                let _ = erased(self.store.shorten(target, now)).await;
                return Err(err.into());
            }
        };
        match fence {
            Fence::Held => {}
            Fence::Lost {
                current: Some(current),
            } if current.status == Status::InProgress && holds(&current.lease, &lease) => {
                debug!("the takeover committed before its answer was lost");
            }
            Fence::Lost {
                current: Some(current),
            } => return Ok(Step::Answer(current)),
            Fence::Lost { current: None } => {
                return Err(Error::AlreadyInProgress {
                    key: key.clone(),
                    attempt: lease.attempt,
                    retry_after: Duration::ZERO,
                });
            }
        }
        warn!(attempt = lease.attempt, "took over an expired lease");
        Ok(Step::Run(Held::TakenOver {
            attempt: lease.attempt,
            previous: Box::new(existing),
        }))
    }

    /// Re-creates the record of a crashed attempt that TTL deleted while the identity's
    /// evidence still says IN_PROGRESS, as a takeover: the reconciler decides, not a blind run.
    async fn adopt(
        &self,
        claim: &Record,
        invocation: &Invocation,
        orphan: Evidence,
        now: SystemTime,
    ) -> Result<Step, Error> {
        let key = &invocation.key;
        if !invocation.fingerprint.matches(&orphan.fingerprint) {
            return Err(Error::PayloadConflict { key: key.clone() });
        }
        // The orphan's evidence is the operation's, under whatever key it was written.
        let record = Record {
            lease: Lease {
                attempt: 2,
                ..claim.lease.clone()
            },
            identity: Some(orphan.identity.clone()),
            ..claim.clone()
        };
        let adopted = match self
            .retrying(Patience::Brief(claim.lease.expires_at), || {
                self.store.adopt(&record, &orphan, now)
            })
            .await
        {
            Ok(adopted) => adopted,
            Err(err) => {
                // As for a takeover: keep the record, cut the lease this adoption may hold.
                let target = Target {
                    key,
                    identity: None,
                    guard: Guard::Lease(&record.lease.token),
                };
                let _ = erased(self.store.shorten(target, now)).await;
                return Err(err.into());
            }
        };
        match adopted {
            Claim::Acquired => {}
            Claim::Existing(existing) if is_own_claim(&existing, &record) => {}
            Claim::Existing(existing) => {
                return Ok(Step::Answer(Box::new(existing)));
            }
            Claim::IdentityTaken(evidence) => {
                return Err(answer::identity_taken(invocation, evidence));
            }
        }
        warn!("adopted a crashed attempt whose record had expired");
        Ok(Step::Run(Held::TakenOver {
            attempt: 2,
            previous: Box::new(orphaned_record(&record, &orphan)),
        }))
    }

    /// Asks the reconciler about the attempt taken over, or, without one, follows the
    /// recovery policy. `None`: run the handler.
    async fn reconcile<T: Serialize + DeserializeOwned>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        previous: Record,
    ) -> Option<Result<Execution<T>, Error>> {
        let Some(reconciler) = self.reconciler.as_ref() else {
            return match self.recovery {
                Recovery::Rerun => None,
                Recovery::Indeterminate => {
                    warn!(
                        attempt,
                        "took over a crashed attempt with no reconciler: held as indeterminate (Recovery::Indeterminate)"
                    );
                    Some(self.hold(target, invocation, claim, attempt).await)
                }
            };
        };
        let key = &invocation.key;
        let takeover = Takeover {
            key: key.clone(),
            attempt,
            previous,
        };
        let answer = match reconciler.reconcile(takeover).await {
            Ok(Reconciliation::NotApplied) => return None,
            Ok(Reconciliation::Applied(value)) => match serde_json::from_value::<T>(value) {
                Ok(value) => {
                    let origin = Origin::Reconciled { attempt };
                    self.record(target, invocation, claim, value, origin, attempt)
                        .await
                }
                Err(err) => Err(Error::OutcomeMismatch {
                    key: key.clone(),
                    reason: err.to_string(),
                }),
            },
            Ok(Reconciliation::Unknown) => {
                warn!(
                    attempt,
                    "reconciliation unknown: holding the operation as indeterminate"
                );
                self.hold(target, invocation, claim, attempt).await
            }
            Err(source) => Err(Error::ReconcileFailed {
                key: key.clone(),
                source,
            }),
        };
        Some(answer)
    }

    /// Holds the operation INDETERMINATE for an operator; the caller's answer.
    async fn hold<T>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
    ) -> Result<Execution<T>, Error> {
        let now = self.clock.now();
        let settlement = Settlement {
            status: Status::Indeterminate,
            outcome: None,
            result_ref: None,
            expires_at: now + INDETERMINATE_RETENTION,
            completed_at: now,
            audit: None,
        };
        let patience = settle_patience(invocation, claim, now);
        self.settle(target, attempt, &settlement, patience).await?;
        Err(Error::Indeterminate {
            key: invocation.key.clone(),
        })
    }

    fn new_claim(&self, invocation: &Invocation, now: SystemTime) -> Record {
        let lease_expires_at = now + invocation.lease;
        Record {
            key: invocation.key.clone(),
            status: Status::InProgress,
            fingerprint: invocation.fingerprint.clone(),
            lease: Lease {
                token: uuid::Uuid::new_v4().to_string(),
                attempt: 1,
                expires_at: lease_expires_at,
            },
            expires_at: retention_expiry(lease_expires_at, self.config.retention()),
            outcome: None,
            created_at: now,
            completed_at: None,
            request_id: invocation.request_id.clone(),
            identity: invocation.evidence_key(),
            audit: None,
        }
    }

    /// Records `value` (the handler's, or the reconciler's for it) as the operation's outcome.
    async fn record<T: Serialize>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        value: T,
        origin: Origin,
        attempt: u32,
    ) -> Result<Execution<T>, Error> {
        let serialized = serde_json::value::to_raw_value(&value);
        let raw = self
            .complete(target, invocation, claim, attempt, serialized)
            .await?;
        Ok(Execution { value, raw, origin })
    }

    /// Stores a result as COMPLETED; one that cannot be stored is retained as FAILED instead
    /// (the effect happened: it must not run again) and returned as the error.
    async fn complete(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        serialized: serde_json::Result<Box<RawValue>>,
    ) -> Result<Box<RawValue>, Error> {
        let key = target.key;
        let now = self.clock.now();
        let patience = settle_patience(invocation, claim, now);
        let unstorable = match serialized {
            Ok(raw) => {
                let settlement = Settlement {
                    status: Status::Completed,
                    outcome: Some(raw.get().as_bytes().to_vec()),
                    result_ref: answer::result_ref(invocation, &raw),
                    expires_at: now + self.config.retention(),
                    completed_at: now,
                    audit: None,
                };
                let limit = self.config.max_outcome_bytes();
                if raw.get().len() <= limit {
                    let completing = Instant::now();
                    let settled = self.settle(target, attempt, &settlement, patience).await;
                    self.observe_latency(key, observe::Step::Completion, completing);
                    match settled {
                        Err(Error::Store(StoreError::Rejected { message, .. })) => {
                            warn!(attempt, "the store rejected the outcome after the effect");
                            self.retain(target, attempt, "outcome_unstorable", message, patience)
                                .await?;
                            return Err(Error::OutcomeTooLarge {
                                key: key.clone(),
                                size: raw.get().len(),
                                limit,
                            });
                        }
                        settled => settled?,
                    }
                    debug!(attempt, "completed");
                    return Ok(raw);
                }
                Error::OutcomeTooLarge {
                    key: key.clone(),
                    size: raw.get().len(),
                    limit,
                }
            }
            Err(err) => Error::InvalidEvent {
                reason: format!("the handler's result does not serialize to JSON: {err}"),
            },
        };
        let kind = match unstorable {
            Error::OutcomeTooLarge { .. } => "outcome_too_large",
            _ => "outcome_unserializable",
        };
        self.retain(target, attempt, kind, unstorable.to_string(), patience)
            .await?;
        Err(unstorable)
    }

    /// Handles a handler error by its class: release (retryable) or retain (terminal); the
    /// error for the caller.
    async fn fail(
        &self,
        target: Target<'_>,
        attempt: u32,
        source: BoxError,
        patience: Patience,
    ) -> Result<Error, Error> {
        let class = match Release::is(&*source) {
            true => FailureClass::Retryable,
            false => self.classifier.classify(&*source),
        };
        match class {
            FailureClass::Retryable => {
                let fence = self
                    .retrying(patience, || self.store.release(target))
                    .await?;
                // Gone already: this release committed before its answer was lost.
                if let Fence::Lost { current: Some(_) } = fence {
                    warn!(attempt, "handler failed after its lease was taken over");
                }
            }
            FailureClass::Terminal { kind } => {
                warn!(attempt, kind, "terminal failure retained");
                self.retain(target, attempt, &kind, source.to_string(), patience)
                    .await?;
            }
        }
        Ok(Error::Handler { source })
    }

    /// Records a terminal failure, replayed to every later caller.
    async fn retain(
        &self,
        target: Target<'_>,
        attempt: u32,
        kind: &str,
        message: String,
        patience: Patience,
    ) -> Result<(), Error> {
        let failure = RetainedFailure {
            kind: kind.to_owned(),
            message,
        };
        let now = self.clock.now();
        let settlement = Settlement {
            status: Status::Failed,
            outcome: Some(failure.to_json().into_bytes()),
            result_ref: None,
            expires_at: now + self.config.retention(),
            completed_at: now,
            audit: None,
        };
        self.settle(target, attempt, &settlement, patience).await
    }

    /// A fenced settlement, retried while transient; a lost fence is [`Error::LeaseLost`],
    /// unless the record shows this very settlement (it committed before its answer was lost).
    async fn settle(
        &self,
        target: Target<'_>,
        attempt: u32,
        settlement: &Settlement,
        patience: Patience,
    ) -> Result<(), Error> {
        let fence = self
            .retrying(patience, || self.store.settle(target, settlement))
            .await?;
        match fence {
            Fence::Held => Ok(()),
            Fence::Lost {
                current: Some(current),
            } if shows_settlement(&current, target.guard, settlement) => {
                debug!(
                    attempt,
                    "the settlement committed before its answer was lost"
                );
                Ok(())
            }
            Fence::Lost { current } => {
                warn!(
                    attempt,
                    holder = current.map(|r| r.lease.attempt),
                    "lease lost before settling"
                );
                Err(Error::LeaseLost {
                    key: target.key.clone(),
                    attempt,
                })
            }
        }
    }

    /// Gives a held claim back: its lease runs out after a short grace (for what the handler
    /// left in flight), never later than it would have.
    async fn shorten(&self, target: Target<'_>, deadline: SystemTime) -> Result<Fence, Error> {
        let until = given_back_until(self.clock.now(), deadline);
        Ok(self
            .retrying(Patience::Brief(deadline), || {
                self.store.shorten(target, until)
            })
            .await?)
    }
}

/// What a claim leads to.
enum Step {
    /// The caller holds the lease: run (or reconcile).
    Run(Held),
    /// Another record stands: answer from it (replay, retained failure, wait).
    Answer(Box<Record>),
}

/// How long a write after the handler ran (a settlement, a release) is retried: until the
/// invocation's deadline, or the lease's end when sooner (or when there is no deadline), less
/// [`retry::SETTLE_MARGIN`], each try cut at the deadline.
fn settle_patience(invocation: &Invocation, claim: &Record, now: SystemTime) -> Patience {
    let lease_end = claim.lease.expires_at;
    let end = invocation
        .deadline
        .map_or(lease_end, |deadline| deadline.min(lease_end));
    Patience::until(end, invocation.deadline, now)
}

/// When a claim given back at `now` (a panic, a cancellation) may be taken over: after
/// [`GIVE_BACK_GRACE`], for what the handler left in flight, and never later than its lease.
fn given_back_until(now: SystemTime, lease_expires_at: SystemTime) -> SystemTime {
    (now + GIVE_BACK_GRACE).min(lease_expires_at)
}

/// How the caller came to hold the lease.
enum Held {
    /// A fresh claim: attempt 1.
    Fresh,
    /// A takeover of a crashed attempt (or the adoption of its orphaned evidence).
    TakenOver { attempt: u32, previous: Box<Record> },
}

impl Held {
    /// The business identity (its evidence key) of the operation held: what `claim` wrote for a
    /// fresh claim, what the crashed attempt's record holds for a takeover.
    fn identity<'a>(&'a self, claim: &'a Record) -> Option<&'a str> {
        match self {
            Self::Fresh => claim.identity.as_deref(),
            Self::TakenOver { previous, .. } => previous.identity.as_deref(),
        }
    }
}

/// Whether `existing` is the caller's own `claim`: it committed before its answer was lost and
/// the SDK's retry found it standing.
fn is_own_claim(existing: &Record, claim: &Record) -> bool {
    existing.status == Status::InProgress && holds(&existing.lease, &claim.lease)
}

/// Whether `stored` is `mine` as a store gives it back: the same random token and attempt
/// (times come back at the store's resolution, milliseconds on DynamoDB).
fn holds(stored: &Lease, mine: &Lease) -> bool {
    stored.token == mine.token && stored.attempt == mine.attempt
}

/// Whether `current` is the record as `settlement` left it under `guard`.
fn shows_settlement(current: &Record, guard: Guard<'_>, settlement: &Settlement) -> bool {
    let same_write = current.status == settlement.status
        && current.outcome == settlement.outcome
        && current.completed_at.map(epoch_millis) == Some(epoch_millis(settlement.completed_at));
    match guard {
        Guard::Lease(token) | Guard::Expired { token, .. } => {
            same_write && current.lease.token == token
        }
        Guard::Indeterminate => same_write,
    }
}

/// The crashed attempt of an orphaned evidence, as the reconciler sees it.
fn orphaned_record(adopted: &Record, orphan: &Evidence) -> Record {
    Record {
        lease: Lease {
            token: String::new(),
            attempt: 1,
            expires_at: orphan.created_at,
        },
        expires_at: orphan.created_at,
        created_at: orphan.created_at,
        request_id: None,
        ..adopted.clone()
    }
}

/// Erases a store future's type: the auto-trait checks of deeply nested SDK futures then
/// happen once, here, instead of in every caller's crate (where they overflow the default
/// recursion limit).
fn erased<'a, T>(future: impl Future<Output = T> + Send + 'a) -> BoxFuture<'a, T> {
    Box::pin(future)
}
