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
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::{Instrument, debug, info_span, warn};

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::error::{BoxError, Error};
use crate::execution::{Execution, ExecutionContext, Invocation, Origin};
use crate::failure::{Classifier, DefaultClassifier, FailureClass};
use crate::key::OperationKey;
use crate::reconcile::{BoxFuture, Reconciler, Reconciliation, Takeover};
use crate::record::{Lease, Record, RetainedFailure, Settlement, Status};
use crate::store::{Claim, Fence, Guard, Store, Target};

/// How long an INDETERMINATE record is kept: it waits for an operator.
const INDETERMINATE_RETENTION: Duration = Duration::from_secs(366 * 24 * 3600);

/// An operator's decision on an INDETERMINATE operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The effect exists: record this result, replayed from now on.
    Completed(serde_json::Value),
    /// The operation failed for good: record this failure, replayed from now on.
    Failed(RetainedFailure),
    /// The effect does not exist: delete the record so that the next delivery executes.
    Release,
}

/// The idempotency engine over a store; cheap to clone, safe to share across tasks.
pub struct Idempotency<S> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: Config,
    classifier: Arc<dyn Classifier>,
    reconciler: Option<Arc<dyn Reconciler>>,
}

impl<S> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            config: self.config.clone(),
            classifier: Arc::clone(&self.classifier),
            reconciler: self.reconciler.clone(),
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
            .finish_non_exhaustive()
    }
}

impl<S: Store> Idempotency<S> {
    /// An engine over `store` reading the system clock; handler errors are classified by the
    /// [`DefaultClassifier`] and takeovers re-run without reconciliation.
    pub fn new(store: S, config: Config) -> Self {
        Self {
            store: Arc::new(store),
            clock: Arc::new(SystemClock),
            config,
            classifier: Arc::new(DefaultClassifier),
            reconciler: None,
        }
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
    /// - a claim whose lease ran out: taken over; the reconciler (if any) is asked, then the
    ///   handler runs as the next attempt;
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
            key = invocation.key.short(),
            request_id = invocation.request_id.as_deref(),
            attempt = tracing::field::Empty,
        );
        self.run(invocation, handler).instrument(span).await
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
        let key = &invocation.key;
        let now = self.clock.now();
        let claim = self.new_claim(invocation, now);
        let target = Target {
            key,
            identity: invocation.identity.as_deref(),
            guard: Guard::Lease(&claim.lease.token),
        };
        let attempt = match erased(self.store.claim(&claim, now)).await? {
            Claim::Acquired => 1,
            Claim::IdentityTaken(evidence) => {
                warn!(evidence_status = %evidence.status, "business identity already executed");
                return Err(Error::KeyExpiredConflict {
                    key: key.clone(),
                    evidence: Box::new(evidence),
                });
            }
            Claim::Existing(existing) => {
                if existing.fingerprint != invocation.fingerprint {
                    return Err(Error::PayloadConflict { key: key.clone() });
                }
                if !existing.lease_is_takeable(now) {
                    return answer_existing(existing, invocation, now);
                }
                let attempt = existing.lease.attempt.saturating_add(1);
                let lease = Lease {
                    attempt,
                    ..claim.lease.clone()
                };
                match erased(self.store.take_over(&existing, &lease, now)).await? {
                    Fence::Held => warn!(attempt, "took over an expired lease"),
                    Fence::Lost {
                        current: Some(current),
                    } => return answer_existing(*current, invocation, now),
                    Fence::Lost { current: None } => {
                        return Err(Error::AlreadyInProgress {
                            key: key.clone(),
                            attempt,
                            retry_after: Duration::ZERO,
                        });
                    }
                }
                if let Some(answer) = self.reconcile(target, invocation, attempt, existing).await {
                    return answer;
                }
                attempt
            }
        };
        tracing::Span::current().record("attempt", attempt);
        let context = ExecutionContext {
            key: key.clone(),
            attempt,
        };
        match handler(context).await {
            Ok(value) => {
                let raw = self
                    .complete(
                        target,
                        invocation,
                        attempt,
                        serde_json::value::to_raw_value(&value),
                    )
                    .await?;
                Ok(Execution {
                    value,
                    raw,
                    origin: Origin::Executed { attempt },
                })
            }
            Err(err) => Err(self.fail(target, attempt, err.into()).await?),
        }
    }

    /// Asks the reconciler (if any) about the attempt taken over. `None`: run the handler.
    async fn reconcile<T: DeserializeOwned>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        attempt: u32,
        previous: Record,
    ) -> Option<Result<Execution<T>, Error>> {
        let reconciler = self.reconciler.as_ref()?;
        let key = &invocation.key;
        let takeover = Takeover {
            key: key.clone(),
            attempt,
            previous,
        };
        let answer = match reconciler.reconcile(takeover).await {
            Ok(Reconciliation::NotApplied) => return None,
            Ok(Reconciliation::Applied(value)) => self
                .complete(
                    target,
                    invocation,
                    attempt,
                    serde_json::value::to_raw_value(&value),
                )
                .await
                .and_then(|raw| {
                    decode_outcome(key, raw).map(|(value, raw)| Execution {
                        value,
                        raw,
                        origin: Origin::Reconciled { attempt },
                    })
                }),
            Ok(Reconciliation::Unknown) => {
                warn!(
                    attempt,
                    "reconciliation unknown: holding the operation as indeterminate"
                );
                let now = self.clock.now();
                let settlement = Settlement {
                    status: Status::Indeterminate,
                    outcome: None,
                    result_ref: None,
                    expires_at: now + INDETERMINATE_RETENTION,
                    completed_at: now,
                };
                self.settle(target, attempt, &settlement)
                    .await
                    .and(Err(Error::Indeterminate { key: key.clone() }))
            }
            Err(source) => Err(Error::ReconcileFailed {
                key: key.clone(),
                source,
            }),
        };
        Some(answer)
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
            expires_at: (now + self.config.retention()).max(lease_expires_at),
            outcome: None,
            created_at: now,
            completed_at: None,
            request_id: invocation.request_id.clone(),
            identity: invocation.identity.clone(),
        }
    }

    /// Stores a result as COMPLETED; one that cannot be stored is retained as FAILED instead
    /// (the effect happened: it must not run again) and returned as the error.
    async fn complete(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        attempt: u32,
        serialized: serde_json::Result<Box<RawValue>>,
    ) -> Result<Box<RawValue>, Error> {
        let key = target.key;
        let limit = self.config.max_outcome_bytes();
        let unstorable = match serialized {
            Ok(raw) if raw.get().len() <= limit => {
                let now = self.clock.now();
                let settlement = Settlement {
                    status: Status::Completed,
                    outcome: Some(raw.get().as_bytes().to_vec()),
                    result_ref: result_ref(invocation, &raw),
                    expires_at: now + self.config.retention(),
                    completed_at: now,
                };
                self.settle(target, attempt, &settlement).await?;
                debug!(attempt, "completed");
                return Ok(raw);
            }
            Ok(raw) => Error::OutcomeTooLarge {
                key: key.clone(),
                size: raw.get().len(),
                limit,
            },
            Err(err) => Error::InvalidEvent {
                reason: format!("the handler's result does not serialize to JSON: {err}"),
            },
        };
        let kind = match unstorable {
            Error::OutcomeTooLarge { .. } => "outcome_too_large",
            _ => "outcome_unserializable",
        };
        self.retain(target, attempt, kind, unstorable.to_string())
            .await?;
        Err(unstorable)
    }

    /// Handles a handler error by its class: release (retryable) or retain (terminal).
    async fn fail(
        &self,
        target: Target<'_>,
        attempt: u32,
        source: BoxError,
    ) -> Result<Error, Error> {
        match self.classifier.classify(&*source) {
            FailureClass::Retryable => {
                if let Fence::Lost { .. } = erased(self.store.release(target)).await? {
                    warn!(attempt, "handler failed after its lease was taken over");
                }
            }
            FailureClass::Terminal { kind } => {
                warn!(attempt, kind, "terminal failure retained");
                self.retain(target, attempt, &kind, source.to_string())
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
        };
        self.settle(target, attempt, &settlement).await
    }

    /// A fenced settlement; a lost fence is [`Error::LeaseLost`].
    async fn settle(
        &self,
        target: Target<'_>,
        attempt: u32,
        settlement: &Settlement,
    ) -> Result<(), Error> {
        match erased(self.store.settle(target, settlement)).await? {
            Fence::Held => Ok(()),
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

    /// Resolves an INDETERMINATE operation (an operator's decision). Returns `false`, changing
    /// nothing, when the operation is not INDETERMINATE.
    pub async fn resolve(&self, key: &OperationKey, resolution: Resolution) -> Result<bool, Error> {
        let Some(record) = erased(self.store.get(key)).await? else {
            return Ok(false);
        };
        let target = Target {
            key,
            identity: record.identity.as_deref(),
            guard: Guard::Indeterminate,
        };
        let now = self.clock.now();
        let (status, outcome) = match resolution {
            Resolution::Release => {
                return Ok(erased(self.store.release(target)).await? == Fence::Held);
            }
            Resolution::Completed(value) => (Status::Completed, value.to_string()),
            Resolution::Failed(failure) => (Status::Failed, failure.to_json()),
        };
        let settlement = Settlement {
            status,
            outcome: Some(outcome.into_bytes()),
            result_ref: None,
            expires_at: now + self.config.retention(),
            completed_at: now,
        };
        Ok(erased(self.store.settle(target, &settlement)).await? == Fence::Held)
    }
}

/// Erases a store future's type: the auto-trait checks of deeply nested SDK futures then
/// happen once, here, instead of in every caller's crate (where they overflow the default
/// recursion limit).
fn erased<'a, T>(future: impl Future<Output = T> + Send + 'a) -> BoxFuture<'a, T> {
    Box::pin(future)
}

/// The evidence's result reference: the part of the result at the invocation's pointer.
fn result_ref(invocation: &Invocation, raw: &RawValue) -> Option<String> {
    let pointer = invocation.result_ref.as_ref()?;
    let value: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
    match pointer.find(&value)? {
        serde_json::Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

/// Decodes stored JSON into the handler's output type.
fn decode_outcome<T: DeserializeOwned>(
    key: &OperationKey,
    raw: Box<RawValue>,
) -> Result<(T, Box<RawValue>), Error> {
    match serde_json::from_str(raw.get()) {
        Ok(value) => Ok((value, raw)),
        Err(err) => Err(Error::StoredOutcomeUnreadable {
            key: key.clone(),
            reason: err.to_string(),
        }),
    }
}

/// The answer for a key held by a live record of the same intent: replay or wait.
fn answer_existing<T: DeserializeOwned>(
    existing: Record,
    invocation: &Invocation,
    now: SystemTime,
) -> Result<Execution<T>, Error> {
    let key = invocation.key.clone();
    if existing.fingerprint != invocation.fingerprint {
        return Err(Error::PayloadConflict { key });
    }
    let unreadable = |reason: String| Error::StoredOutcomeUnreadable {
        key: key.clone(),
        reason,
    };
    match existing.status {
        Status::Completed => {
            let json = String::from_utf8(existing.outcome.unwrap_or_default())
                .map_err(|err| unreadable(err.to_string()))?;
            let raw = RawValue::from_string(json).map_err(|err| unreadable(err.to_string()))?;
            let (value, raw) = decode_outcome(&key, raw)?;
            debug!("replayed");
            Ok(Execution {
                value,
                raw,
                origin: Origin::Replayed,
            })
        }
        Status::Failed => {
            let failure = serde_json::from_slice(existing.outcome.as_deref().unwrap_or_default())
                .map_err(|err| unreadable(err.to_string()))?;
            Err(Error::Failed { key, failure })
        }
        Status::InProgress => Err(Error::AlreadyInProgress {
            key,
            attempt: existing.lease.attempt,
            retry_after: existing.lease.remaining(now),
        }),
        Status::Indeterminate => Err(Error::Indeterminate { key }),
    }
}
