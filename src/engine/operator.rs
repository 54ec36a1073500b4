//! An operator's way forward from every state the engine leaves to one: an INDETERMINATE
//! record, an IN_PROGRESS record whose lease ran out and that no delivery takes over (stuck),
//! and evidence whose record TTL has deleted while it still says IN_PROGRESS (an orphan) or
//! INDETERMINATE. Each resolution is one conditional write on the state the operator read
//! (nothing changed meanwhile, never a live lease), and leaves an [`Audit`] trace (who, when,
//! what) on the record or evidence it writes. A release never deletes silently: the record
//! stays, FAILED `released` and expired (so the next delivery claims afresh), with the trace
//! until that claim or TTL replaces it; the identity's evidence is deleted with it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use lambda_idempotency::store::MemoryStore;
//! use lambda_idempotency::{Idempotency, OperationKey, OperationScope, Operator, Resolution};
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let key = OperationKey::derive(&OperationScope::new("shop", "charge")?, None, "o-1")?;
//! let operator = Operator::new("alice@ops")?.with_reason("the provider shows no charge");
//! // Nothing held: nothing resolved, nothing written.
//! assert!(!idem.resolve::<serde_json::Value>(&key, Resolution::Release, &operator).await?);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use tracing::warn;

use super::Idempotency;
use super::retry::Patience;
use crate::error::{ConfigError, Error, StoreError, decode_failure};
use crate::key::OperationKey;
use crate::record::MAX_RESULT_REF_BYTES;
use crate::record::{
    Audit, Evidence, FailureKind, Record, RetainedFailure, Settlement, Status, epoch_millis,
};
use crate::store::{Guard, StoreExt, Target};

/// How long an operator's resolution may retry a failing write.
const OPERATOR_DEADLINE: Duration = Duration::from_secs(10);
/// How far in the past a released record's retention ends.
const RELEASED_AGE: Duration = Duration::from_secs(3600);

/// An operator's decision on an operation held for one.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The effect exists: record this result, replayed from now on.
    Completed(serde_json::Value),
    /// The operation failed for good: record this failure, replayed from now on.
    Failed(RetainedFailure),
    /// The effect does not exist: the next delivery executes (the record stays, released and
    /// expired, with the trace; the identity's evidence is deleted).
    Release,
}

impl Resolution {
    fn name(&self) -> &'static str {
        match self {
            Self::Completed(_) => "completed",
            Self::Failed(_) => "failed",
            Self::Release => "released",
        }
    }
}

/// Who resolves, and why: the trace each resolution leaves ([`Audit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    by: String,
    reason: Option<String>,
}

impl Operator {
    /// An operator named `by` (a person or a role; at most 256 bytes).
    pub fn new(by: impl Into<String>) -> Result<Self, ConfigError> {
        let by = by.into();
        if by.trim().is_empty() || by.len() > 256 {
            return Err(ConfigError::InvalidSetting {
                setting: "operator",
                reason: "name who resolves: 1 to 256 bytes".into(),
            });
        }
        Ok(Self { by, reason: None })
    }

    /// Why (kept with the trace; at most 1024 bytes are kept).
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        let mut reason = reason.into();
        let mut end = reason.len().min(1024);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        self.reason = Some(reason);
        self
    }

    fn audit(&self, resolution: &Resolution, from: Status, at: SystemTime) -> Audit {
        Audit {
            by: self.by.clone(),
            at,
            action: format!("{} from {from}", resolution.name()),
            reason: self.reason.clone(),
        }
    }
}

impl Idempotency {
    /// Resolves an operation held for an operator: INDETERMINATE, or IN_PROGRESS with its lease
    /// run out (a stuck claim); `T` is the handler's output type, which a
    /// [`Resolution::Completed`] result must decode as. The record (and its identity's
    /// evidence) is written only if it is still as read, and carries the operator's trace.
    /// `false`, changing nothing: there is no such record (a live lease, a settled record, none:
    /// see [`Idempotency::resolve_evidence`] for evidence whose record is gone), or it changed
    /// meanwhile.
    pub async fn resolve<T: DeserializeOwned>(
        &self,
        key: &OperationKey,
        resolution: Resolution,
        operator: &Operator,
    ) -> Result<bool, Error> {
        match self.store.get(key).await? {
            Some(record) => {
                self.resolve_as_read::<T>(&record, resolution, operator)
                    .await
            }
            None => Ok(false),
        }
    }

    /// Resolves the operation as the operator read it (`read`, the record shown to them, as
    /// [`StoreExt::get`] returned it): the write is conditional on that attempt (its lease
    /// token, and its steps while IN_PROGRESS), so that an attempt that took over or recorded a
    /// step after the operator looked is never resolved on what they saw. Otherwise as
    /// [`Idempotency::resolve`], which resolves the record as it reads it itself.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use lambda_idempotency::store::{MemoryStore, StoreExt};
    /// use lambda_idempotency::{Idempotency, OperationKey, OperationScope, Operator, Resolution};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let key = OperationKey::derive(&OperationScope::new("shop", "charge")?, None, "o-1")?;
    /// let operator = Operator::new("alice@ops")?;
    /// if let Some(shown) = idem.store().get(&key).await? {
    ///     // ... shown to the operator, who decides ...
    ///     idem.resolve_as_read::<serde_json::Value>(&shown, Resolution::Release, &operator)
    ///         .await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Store`] when the store fails (a write that may have applied is looked for
    /// first); [`Error::OutcomeMismatch`] or [`Error::OutcomeTooLarge`] for a
    /// [`Resolution::Completed`] result that does not decode as `T` or exceeds the outcome
    /// limit.
    pub async fn resolve_as_read<T: DeserializeOwned>(
        &self,
        read: &Record,
        resolution: Resolution,
        operator: &Operator,
    ) -> Result<bool, Error> {
        let (key, record) = (&read.key, read);
        let now = self.clock.now();
        let guard = match record.status {
            Status::Indeterminate => Guard::Indeterminate {
                token: &record.lease.token,
                attempt: record.lease.attempt,
            },
            Status::InProgress if record.lease.is_expired(now) => Guard::Expired {
                token: &record.lease.token,
                attempt: record.lease.attempt,
                now,
                steps_version: record.steps_version,
                steps: &record.steps,
            },
            _ => return Ok(false),
        };
        let audit = operator.audit(&resolution, record.status, now);
        warn!(key = key.short(), action = %audit.action, "an operator resolves the operation");
        let patience = Patience::until(now + OPERATOR_DEADLINE, None, now);
        let settlement = match resolution {
            Resolution::Release => {
                let evidence = match &record.identity {
                    Some(identity) => self
                        .store
                        .evidence(identity)
                        .await?
                        .filter(|evidence| evidence.key == *key),
                    None => None,
                };
                let released = released(record, audit, now);
                let seen = Some(record);
                let written = self
                    .noting_lost_answers(patience, || {
                        self.store
                            .release_by_operator(seen, evidence.as_ref(), &released, now)
                    })
                    .await?;
                return self.or_own_release(written, &released).await;
            }
            resolution => {
                // An IN_PROGRESS record is kept until its lease's end plus its operation's
                // retention; an INDETERMINATE one for a year, whatever its operation's.
                let kept_until = match record.status {
                    Status::InProgress => record.expires_at,
                    _ => now,
                };
                self.resolved::<T>(key, resolution, audit, now, kept_until)?
            }
        };
        let target = Target {
            key,
            identity: record.identity.as_deref(),
            guard,
        };
        match self
            .settle(target, record.lease.attempt, &settlement, patience)
            .await
        {
            Ok(()) => Ok(true),
            Err(Error::LeaseLost { .. }) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Resolves the evidence of a business identity (its key in the uniqueness table,
    /// [`Evidence::identity`]) whose record is gone or settled and expired, while the evidence
    /// still says IN_PROGRESS (its attempt crashed and TTL deleted the record) or
    /// INDETERMINATE. [`Resolution::Completed`]'s value becomes the evidence's result
    /// reference (when it is a string, or its JSON text, up to 1024 bytes); a
    /// [`Resolution::Release`] deletes the evidence and leaves a released record with the
    /// trace. `false`, changing nothing: no such evidence, its record still stands (resolve
    /// that with [`Idempotency::resolve`]), or it changed meanwhile.
    pub async fn resolve_evidence<T: DeserializeOwned>(
        &self,
        evidence_key: &str,
        resolution: Resolution,
        operator: &Operator,
    ) -> Result<bool, Error> {
        let Some(evidence) = self.store.evidence(evidence_key).await? else {
            return Ok(false);
        };
        if !matches!(evidence.status, Status::InProgress | Status::Indeterminate) {
            return Ok(false);
        }
        let now = self.clock.now();
        let record = self.store.get(&evidence.key).await?;
        if record.is_some_and(|record| !record.counts_as_absent(now)) {
            return Ok(false);
        }
        let audit = operator.audit(&resolution, evidence.status, now);
        warn!(key = evidence.key.short(), action = %audit.action, "an operator resolves the evidence");
        let patience = Patience::until(now + OPERATOR_DEADLINE, None, now);
        let settlement = match resolution {
            Resolution::Release => {
                let released = released(&orphan_record(&evidence), audit, now);
                let written = self
                    .noting_lost_answers(patience, || {
                        self.store
                            .release_by_operator(None, Some(&evidence), &released, now)
                    })
                    .await?;
                return self.or_own_release(written, &released).await;
            }
            Resolution::Completed(value) => {
                let mut settlement = self.resolved::<T>(
                    &evidence.key,
                    Resolution::Completed(value.clone()),
                    audit,
                    now,
                    now,
                )?;
                settlement.result_ref = reference(&value);
                settlement
            }
            resolution => self.resolved::<T>(&evidence.key, resolution, audit, now, now)?,
        };
        let written = self
            .noting_lost_answers(patience, || {
                self.store.settle_evidence(&evidence, &settlement, now)
            })
            .await?;
        if written.applied {
            return Ok(true);
        }
        // A write that committed and lost its answer meets its own result on the retry.
        let current = self.store.evidence(evidence_key).await?;
        let own = current.is_some_and(|current| {
            current.status == settlement.status && same_audit(&current.audit, &settlement.audit)
        });
        written.or_own(own, "settle_evidence")
    }

    /// Whether the release was written, or the record shows this very release (it committed
    /// before its answer was lost, and the retry's condition met it).
    async fn or_own_release(&self, written: Written, released: &Record) -> Result<bool, Error> {
        if written.applied {
            return Ok(true);
        }
        let current = self.store.get(&released.key).await?;
        let own = current.is_some_and(|current| {
            current.status == released.status
                && current.lease.token == released.lease.token
                && same_audit(&current.audit, &released.audit)
        });
        written.or_own(own, "release_by_operator")
    }

    /// An operator's conditional `write`, retried as a settlement is, noting whether a try went
    /// unanswered (lost, or cut at the deadline): it may have applied.
    async fn noting_lost_answers<'a, Fut>(
        &'a self,
        patience: Patience,
        write: impl Fn() -> Fut,
    ) -> Result<Written, StoreError>
    where
        Fut: Future<Output = Result<bool, StoreError>> + Send + 'a,
    {
        let unanswered = Arc::new(AtomicBool::new(false));
        let applied = self
            .retrying(patience, || {
                let tried = write();
                let unanswered = Arc::clone(&unanswered);
                async move {
                    let before = unanswered.swap(true, Ordering::SeqCst);
                    let answer = tried.await;
                    if !matches!(answer, Err(StoreError::Unavailable { .. })) {
                        unanswered.store(before, Ordering::SeqCst);
                    }
                    answer
                }
            })
            .await?;
        Ok(Written {
            applied,
            lost: unanswered.load(Ordering::SeqCst),
        })
    }

    /// The settlement of a COMPLETED or FAILED resolution, checked: a result decodes as `T`
    /// and fits the outcome limit. It is kept as long as the engine's retention says, and at
    /// least until `kept_until`: a crashed claim resolved was kept until then by its
    /// operation's own retention, which may be longer (to outlast a dead-letter queue).
    fn resolved<T: DeserializeOwned>(
        &self,
        key: &OperationKey,
        resolution: Resolution,
        audit: Audit,
        now: SystemTime,
        kept_until: SystemTime,
    ) -> Result<Settlement, Error> {
        let kept_for = kept_until.duration_since(now).unwrap_or_default();
        let retention = self.config.retention().max(kept_for);
        let settlement = match resolution {
            Resolution::Completed(value) => {
                if let Err(err) = serde_json::from_value::<T>(value.clone()) {
                    return Err(Error::OutcomeMismatch {
                        key: key.clone(),
                        reason: decode_failure(&err),
                    });
                }
                Settlement::completed(value.to_string().into_bytes(), None, now, retention)
            }
            Resolution::Failed(failure) => Settlement::failed(&failure.bounded(), now, retention),
            Resolution::Release => Settlement::failed(&released_failure(), now, retention),
        };
        let size = settlement.outcome.as_ref().map_or(0, Vec::len);
        let limit = self.config.max_outcome_bytes();
        if size > limit {
            return Err(Error::OutcomeTooLarge {
                key: key.clone(),
                size,
                limit,
            });
        }
        Ok(settlement.with_audit(audit))
    }
}

/// What an operator's conditional write came to.
#[derive(Debug, Clone, Copy)]
struct Written {
    /// Whether the last try applied.
    applied: bool,
    /// Whether an earlier try went unanswered: it may have applied.
    lost: bool,
}

impl Written {
    /// Resolved when `own` (the store shows this very write), else not: never "nothing
    /// changed" after a lost answer, since that try may have applied and been replaced since
    /// (a delivery claimed what it released).
    fn or_own(self, own: bool, operation: &'static str) -> Result<bool, Error> {
        match (own, self.lost) {
            (true, _) => Ok(true),
            (false, false) => Ok(false),
            (false, true) => Err(Error::Store(StoreError::Unavailable {
                operation,
                source: "an earlier try's answer was lost and what it wrote has changed since: it may have applied; look at the record again before acting".into(),
            })),
        }
    }
}

/// The failure a released record keeps.
fn released_failure() -> RetainedFailure {
    RetainedFailure {
        kind: FailureKind::Released,
        message: "released by an operator: the effect did not happen; the next delivery runs"
            .into(),
    }
}

/// `record` as an operator's release leaves it: FAILED `released`, already expired (the next
/// delivery claims afresh), its identity's evidence gone, the trace kept.
fn released(record: &Record, audit: Audit, now: SystemTime) -> Record {
    Record {
        status: Status::Failed,
        outcome: Some(released_failure().to_json().into_bytes()),
        // Well in the past: a reader whose clock runs behind the operator's must not see a
        // live FAILED record (seconds of skew), yet recent enough for TTL to delete it.
        expires_at: now
            .checked_sub(RELEASED_AGE)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        completed_at: Some(now),
        identity: None,
        audit: Some(audit),
        steps: Vec::new(),
        ..record.clone()
    }
}

/// The record an orphaned evidence stands for, as far as the evidence tells.
fn orphan_record(evidence: &Evidence) -> Record {
    Record {
        key: evidence.key.clone(),
        status: evidence.status,
        fingerprint: evidence.fingerprint.clone(),
        lease: crate::record::Lease {
            token: String::new(),
            attempt: 1,
            expires_at: evidence.created_at,
        },
        expires_at: evidence.created_at,
        outcome: None,
        created_at: evidence.created_at,
        completed_at: None,
        request_id: None,
        identity: Some(evidence.identity.clone()),
        audit: None,
        steps: Vec::new(),
        steps_version: 0,
    }
}

/// A resolved result as an evidence's reference: a string as it is, anything else as its JSON
/// text; none past [`MAX_RESULT_REF_BYTES`].
fn reference(value: &serde_json::Value) -> Option<String> {
    let text = match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    (text.len() <= MAX_RESULT_REF_BYTES).then_some(text)
}

/// Whether two traces are one, at the millisecond resolution stores keep.
fn same_audit(stored: &Option<Audit>, written: &Option<Audit>) -> bool {
    match (stored, written) {
        (Some(stored), Some(written)) => {
            stored.by == written.by
                && stored.action == written.action
                && stored.reason == written.reason
                && epoch_millis(stored.at) == epoch_millis(written.at)
        }
        _ => false,
    }
}
