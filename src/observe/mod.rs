//! Seeing what the engine decides: an [`Observer`] hook (one method, no-op by default) that
//! receives every decision and the claim and completion latencies, and, with the `emf`
//! feature, [`MetricsObserver`](emf::MetricsObserver), which turns them into CloudWatch
//! Embedded Metric Format documents through the `metrics` facade.
//!
//! ```
//! use lambda_idempotency::observe::{Decision, Observation};
//! use lambda_idempotency::store::MemoryStore;
//! use lambda_idempotency::Idempotency;
//!
//! let idem = Idempotency::new(MemoryStore::new()).with_observer(
//!     |observation: &Observation<'_>| {
//!         if let Observation::Decision { decision: Decision::PayloadConflict, operation } = observation {
//!             eprintln!("payload conflict on {operation}");
//!         }
//!     },
//! );
//! # let _ = idem;
//! ```

#[cfg(feature = "emf")]
#[cfg_attr(docsrs, doc(cfg(feature = "emf")))]
pub mod emf;

use std::time::Duration;

use crate::error::{Error, StoreError};
use crate::execution::{Execution, Origin};

/// What the engine decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// The handler ran as attempt 1, or an owner's run ([`Invocation::with_owner`]: a
    /// durable execution's replay) re-entered its own claim and completed it.
    ///
    /// [`Invocation::with_owner`]: crate::Invocation::with_owner
    FirstExecution,
    /// A stored outcome was replayed; the handler did not run.
    Replay,
    /// The key was used before with another payload.
    PayloadConflict,
    /// Another invocation held a live lease.
    InProgressCollision,
    /// A crashed attempt's expired lease was taken over (the handler or the reconciler ran).
    Takeover,
    /// A takeover's reconciler found the effect and recorded it.
    Reconciled,
    /// The operation is held for an operator.
    Indeterminate,
    /// The record expired but the business identity's evidence stands.
    KeyExpiredConflict,
    /// The lease was taken over before this worker settled.
    LeaseLost,
    /// The handler failed (released or retained by its class), or panicked (its claim given
    /// back; in a build with `panic = "abort"` the process ends first, uncounted).
    HandlerFailed,
    /// A retained failure was replayed.
    FailureReplayed,
    /// The store failed; the kind is [`StoreError::kind_name`].
    StoreError(&'static str),
    /// Anything else the caller was told ([`crate::ErrorKind::name`]).
    Other(&'static str),
}

impl Decision {
    /// The decisions one call's answer stands for. A takeover is reported apart, when the
    /// lease is taken, whatever the call's answer then.
    pub fn of<T>(answer: &Result<Execution<T>, Error>) -> Vec<Self> {
        Self::of_answer(answer).into_iter().collect()
    }

    /// [`Self::of`] without a vector: one answer stands for at most one decision.
    pub(crate) fn of_answer<T>(answer: &Result<Execution<T>, Error>) -> Option<Self> {
        match answer {
            Ok(done) => match done.origin() {
                Origin::Executed { attempt: 1 } => Some(Self::FirstExecution),
                // An owner's run that re-entered its own claim (a durable execution's replay
                // after a suspension) completes the operation's execution.
                Origin::Executed { .. } if done.reentered => Some(Self::FirstExecution),
                // The takeover itself is reported when the lease is taken.
                Origin::Executed { .. } => None,
                Origin::Reconciled { .. } => Some(Self::Reconciled),
                Origin::Replayed => Some(Self::Replay),
            },
            Err(err) => Some(match err {
                Error::PayloadConflict { .. } => Self::PayloadConflict,
                Error::AlreadyInProgress { .. } => Self::InProgressCollision,
                Error::Indeterminate { .. } => Self::Indeterminate,
                Error::KeyExpiredConflict { .. } => Self::KeyExpiredConflict,
                Error::LeaseLost { .. } => Self::LeaseLost,
                Error::Handler { .. } => Self::HandlerFailed,
                Error::Failed { .. } => Self::FailureReplayed,
                Error::Store(store) => Self::StoreError(store.kind_name()),
                other => Self::Other(other.kind().name()),
            }),
        }
    }

    /// The metric's name, e.g. `first_execution`, `store_error.throttled`.
    pub fn metric_name(&self) -> String {
        match self {
            Self::FirstExecution => "first_execution".into(),
            Self::Replay => "replay".into(),
            Self::PayloadConflict => "payload_conflict".into(),
            Self::InProgressCollision => "in_progress_collision".into(),
            Self::Takeover => "takeover".into(),
            Self::Reconciled => "reconciled".into(),
            Self::Indeterminate => "indeterminate".into(),
            Self::KeyExpiredConflict => "key_expired_conflict".into(),
            Self::LeaseLost => "lease_lost".into(),
            Self::HandlerFailed => "handler_failed".into(),
            Self::FailureReplayed => "failure_replayed".into(),
            Self::StoreError(kind) => format!("store_error.{kind}"),
            Self::Other(kind) => format!("other.{kind}"),
        }
    }
}

/// A phase of the protocol whose latency is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Claiming the key (with takeover or adoption), up to the answer or the handler's start.
    Claim,
    /// Storing the outcome, or after a failure keeping it, releasing the claim or holding it
    /// for an operator, retries included.
    Completion,
}

/// The name 0.4 gave [`Phase`] (a handler's steps are `effects::Step`).
#[deprecated(since = "0.5.0", note = "renamed `observe::Phase`")]
pub type Step = Phase;

/// One thing the engine reports. Keys never appear: only the operation's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observation<'a> {
    /// A decision for a call of `operation`.
    Decision {
        /// The operation name.
        operation: &'a str,
        /// What was decided.
        decision: Decision,
    },
    /// How long a phase took (wall time, whatever clock the engine reads).
    Latency {
        /// The operation name.
        operation: &'a str,
        /// The phase.
        step: Phase,
        /// Its duration.
        elapsed: Duration,
    },
    /// A duplicate waited for another environment's claim to settle
    /// ([`Invocation::with_wait_for_result`](crate::Invocation::with_wait_for_result)).
    Waited {
        /// The operation name.
        operation: &'a str,
        /// The reads of the held record it took (the waiting's extra cost).
        reads: u32,
        /// How long it waited (wall time).
        elapsed: Duration,
    },
}

/// Receives what the engine decides: a one-method strategy; closures implement it.
pub trait Observer: Send + Sync {
    /// Called once per observation, on the calling task: keep it quick.
    fn observe(&self, observation: &Observation<'_>);
}

impl<F> Observer for F
where
    F: Fn(&Observation<'_>) + Send + Sync,
{
    fn observe(&self, observation: &Observation<'_>) {
        self(observation);
    }
}

/// The default observer, `()`: sees nothing (`with_observer(())` puts it back).
impl Observer for () {
    fn observe(&self, _: &Observation<'_>) {}
}

impl StoreError {
    /// A stable name of the error's kind, for metrics: `table_not_found`, `throttled`, ….
    pub const fn kind_name(&self) -> &'static str {
        match self {
            Self::TableNotFound { .. } => "table_not_found",
            Self::UniquenessTableNotFound { .. } => "uniqueness_table_not_found",
            Self::AccessDenied { .. } => "access_denied",
            Self::Throttled { .. } => "throttled",
            Self::Unavailable { .. } => "unavailable",
            Self::Contention { .. } => "contention",
            Self::NoUniquenessTable => "no_uniqueness_table",
            Self::Rejected { .. } => "rejected",
            Self::EventuallyConsistentReplicas { .. } => "eventually_consistent_replicas",
            Self::TransactionsUnsupported { .. } => "transactions_unsupported",
            Self::TransactionalWritesUnsupported { .. } => "transactional_writes_unsupported",
            Self::EvidenceNotOwned { .. } => "evidence_not_owned",
            Self::CorruptRecord { .. } => "corrupt_record",
            Self::WrongAnswer { .. } => "wrong_answer",
        }
    }
}
