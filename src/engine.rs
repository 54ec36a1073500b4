//! The one state machine: claim → run → complete, release or retain.
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
use crate::key::{Fingerprint, OperationKey};
use crate::record::{Lease, Record, RetainedFailure, Settlement, Status};
use crate::store::{Claim, Fence, Store};

/// One request for an idempotent execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    key: OperationKey,
    fingerprint: Fingerprint,
    lease: Duration,
    request_id: Option<String>,
}

impl Invocation {
    /// `key` with intent `fingerprint`, holding a lease of `lease` while the handler runs (set it
    /// to the time the invocation may still run, plus a small margin).
    pub fn new(key: OperationKey, fingerprint: Fingerprint, lease: Duration) -> Self {
        Self {
            key,
            fingerprint,
            lease,
            request_id: None,
        }
    }

    /// Records the invocation's request id with the claim, for correlation.
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// The operation key.
    pub fn key(&self) -> &OperationKey {
        &self.key
    }
}

/// What the handler knows about the execution it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionContext {
    key: OperationKey,
    attempt: u32,
}

impl ExecutionContext {
    /// The operation key.
    pub fn key(&self) -> &OperationKey {
        &self.key
    }

    /// 1 for the first execution; more after a crashed attempt's lease was taken over.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A deterministic key for a downstream call (same on every attempt), e.g. a payment API's
    /// `Idempotency-Key`.
    pub fn downstream_key(&self, step: &str) -> String {
        self.key.downstream(step)
    }
}

/// Where an execution's outcome came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The handler ran, as this attempt.
    Executed {
        /// The attempt number.
        attempt: u32,
    },
    /// The stored outcome was returned; the handler did not run.
    Replayed,
}

/// The outcome of an idempotent execution.
#[derive(Debug)]
pub struct Execution<T> {
    value: T,
    raw: Box<RawValue>,
    origin: Origin,
}

impl<T> Execution<T> {
    /// The handler's result.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The handler's result, owned.
    pub fn into_value(self) -> T {
        self.value
    }

    /// The result's JSON exactly as first serialized: a replay is byte-identical to the original.
    pub fn raw_json(&self) -> &RawValue {
        &self.raw
    }

    /// Where the outcome came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether this is a replay of a stored outcome.
    pub fn is_replay(&self) -> bool {
        self.origin == Origin::Replayed
    }
}

/// The idempotency engine over a store; cheap to clone, safe to share across tasks.
#[derive(Debug)]
pub struct Idempotency<S> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    config: Config,
}

impl<S> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            config: self.config.clone(),
        }
    }
}

impl<S: Store> Idempotency<S> {
    /// An engine over `store` reading the system clock.
    pub fn new(store: S, config: Config) -> Self {
        Self {
            store: Arc::new(store),
            clock: Arc::new(SystemClock),
            config,
        }
    }

    /// Reads time from `clock` instead (tests inject a [`crate::clock::ManualClock`]).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
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

    /// Runs `handler` at most once per operation key, or answers from the stored record.
    ///
    /// - first time: claims the key, runs the handler, stores the serialized result;
    /// - completed before (same fingerprint): returns the stored result, handler not run;
    /// - another fingerprint under the key: [`Error::PayloadConflict`];
    /// - a live claim elsewhere: [`Error::AlreadyInProgress`];
    /// - a claim whose lease ran out: taken over, the handler runs as the next attempt;
    /// - the handler fails: the claim is released so a retry runs ([`Error::Handler`]);
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
        let now = self.clock.now();
        let claim = self.new_claim(invocation, now);
        let previous = match self.store.claim(&claim, now).await? {
            Claim::Existing(existing) => return answer_existing(existing, invocation, now),
            Claim::Acquired { previous } => previous,
        };
        let key = &invocation.key;
        let token = &claim.lease.token;
        let attempt =
            match previous.filter(|p| p.status == Status::InProgress && !p.is_expired(now)) {
                Some(taken_over) => {
                    let attempt = taken_over.lease.attempt.saturating_add(1);
                    warn!(attempt, "took over an expired lease");
                    if let Fence::Lost { .. } = self.store.set_attempt(key, token, attempt).await? {
                        return Err(Error::LeaseLost {
                            key: key.clone(),
                            attempt,
                        });
                    }
                    attempt
                }
                None => 1,
            };
        tracing::Span::current().record("attempt", attempt);
        let context = ExecutionContext {
            key: key.clone(),
            attempt,
        };
        match handler(context).await {
            Ok(value) => self.complete(key, token, attempt, value).await,
            Err(err) => {
                if let Fence::Lost { .. } = self.store.release(key, token).await? {
                    warn!(attempt, "handler failed after its lease was taken over");
                }
                Err(Error::Handler { source: err.into() })
            }
        }
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
        }
    }

    /// Stores the handler's result, or retains a failure when it cannot be stored.
    async fn complete<T: Serialize>(
        &self,
        key: &OperationKey,
        token: &str,
        attempt: u32,
        value: T,
    ) -> Result<Execution<T>, Error> {
        let limit = self.config.max_outcome_bytes();
        let prepared = match serde_json::value::to_raw_value(&value) {
            Ok(raw) if raw.get().len() <= limit => Prepared::Stored(raw),
            Ok(raw) => Prepared::Retained(
                "outcome_too_large",
                Error::OutcomeTooLarge {
                    key: key.clone(),
                    size: raw.get().len(),
                    limit,
                },
            ),
            Err(err) => Prepared::Retained(
                "outcome_unserializable",
                Error::InvalidEvent {
                    reason: format!("the handler's result does not serialize to JSON: {err}"),
                },
            ),
        };
        let now = self.clock.now();
        let settlement = Settlement {
            status: prepared.status(),
            outcome: prepared.bytes(),
            expires_at: now + self.config.retention(),
            completed_at: now,
        };
        if let Fence::Lost { current } = self.store.settle(key, token, &settlement).await? {
            warn!(
                attempt,
                holder = current.map(|r| r.lease.attempt),
                "lease lost before completion"
            );
            return Err(Error::LeaseLost {
                key: key.clone(),
                attempt,
            });
        }
        match prepared {
            Prepared::Stored(raw) => {
                debug!(attempt, "completed");
                Ok(Execution {
                    value,
                    raw,
                    origin: Origin::Executed { attempt },
                })
            }
            Prepared::Retained(_, err) => Err(err),
        }
    }
}

/// A handler's result made ready to store: its JSON, or the failure to retain instead.
enum Prepared {
    Stored(Box<RawValue>),
    Retained(&'static str, Error),
}

impl Prepared {
    fn status(&self) -> Status {
        match self {
            Self::Stored(_) => Status::Completed,
            Self::Retained(..) => Status::Failed,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            Self::Stored(raw) => raw.get().as_bytes().to_vec(),
            Self::Retained(kind, err) => RetainedFailure {
                kind: (*kind).to_owned(),
                message: err.to_string(),
            }
            .to_json()
            .into_bytes(),
        }
    }
}

/// The answer for a key held by a live record: conflict, replay, or wait.
fn answer_existing<T: DeserializeOwned>(
    existing: Record,
    invocation: &Invocation,
    now: SystemTime,
) -> Result<Execution<T>, Error> {
    let key = invocation.key.clone();
    if existing.fingerprint != invocation.fingerprint {
        return Err(Error::PayloadConflict { key });
    }
    match existing.status {
        Status::Completed => {
            let bytes = existing.outcome.unwrap_or_default();
            let unreadable = |reason: String| Error::StoredOutcomeUnreadable {
                key: key.clone(),
                reason,
            };
            let json = String::from_utf8(bytes).map_err(|err| unreadable(err.to_string()))?;
            let raw = RawValue::from_string(json).map_err(|err| unreadable(err.to_string()))?;
            let value =
                serde_json::from_str(raw.get()).map_err(|err| unreadable(err.to_string()))?;
            debug!("replayed");
            Ok(Execution {
                value,
                raw,
                origin: Origin::Replayed,
            })
        }
        Status::Failed => {
            let failure = serde_json::from_slice(existing.outcome.as_deref().unwrap_or_default())
                .map_err(|err| Error::StoredOutcomeUnreadable {
                key: key.clone(),
                reason: err.to_string(),
            })?;
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
