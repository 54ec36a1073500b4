//! Reconciled takeover: before re-running a crashed attempt, look at downstream evidence.
//!
//! A timeout is not proof of failure: the crashed worker may have charged the card before it
//! died. When a claim takes over an expired lease, the [`Reconciler`] is asked first:
//!
//! - [`Checked::Applied`] — the effect exists; its result is recorded as COMPLETED and
//!   returned, the handler does not run (a result that does not decode as the handler's
//!   output holds the operation INDETERMINATE, as [`Checked::Unknown`] does, the reason in the
//!   log, for an operator to record it typed);
//! - [`Checked::NotApplied`] — no effect; the handler runs as the next attempt;
//! - [`Checked::Unknown`] — cannot tell; the record becomes INDETERMINATE and every
//!   caller gets [`Error::Indeterminate`](crate::Error::Indeterminate) until an operator
//!   resolves it ([`Idempotency::resolve`](crate::Idempotency::resolve)).
//!
//! A reconciler that fails itself gives the claim back at once, so that the next delivery asks
//! again. Without a reconciler, the operation's [`Recovery`] policy decides: hold the
//! operation for an operator (the default), or re-run a handler declared safe to repeat. A
//! crashed attempt that recorded steps ([`crate::effects`]) is decided by its steps where the
//! policy says so, and an attempt that gave its claim back knowingly (its handler's retryable
//! failure after steps) always is: it is continued, not reconciled (the protocol guide's
//! "Recovery" table has every case).
//! Closures implement the trait:
//!
//! ```
//! use lambda_idempotency::reconcile::{Checked, Takeover};
//! use lambda_idempotency::BoxError;
//!
//! let reconciler = |takeover: Takeover| async move {
//!     // e.g. look the payment up by takeover.key.downstream("charge") at the provider
//!     let _ = takeover.attempt;
//!     Ok::<_, BoxError>(Checked::NotApplied)
//! };
//! # let _: &dyn lambda_idempotency::reconcile::Reconciler = &reconciler;
//! ```

use std::future::Future;

use crate::error::BoxError;
use crate::key::OperationKey;
use crate::record::Record;

/// A boxed, sendable future: `futures`' own ([`futures_util::future::BoxFuture`]), the one
/// type every boxed future of the crate is.
pub use futures_util::future::BoxFuture;

/// What a check found downstream about an effect whose fate is unknown: a step's check
/// ([`Step::checked_by`](crate::effects::Step::checked_by), `T` the step's result) about an
/// uncertain step, or a [`Reconciler`] (`Checked` as it stands, `T` the handler's result as
/// JSON) about a crashed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked<T = serde_json::Value> {
    /// The effect exists; this is its result (as the step or the handler would have returned
    /// it), recorded as the step's or replayed as the operation's.
    Applied(T),
    /// The effect does not exist; the step (or the handler) runs, with the same downstream key.
    NotApplied,
    /// It cannot be established; the operation is held INDETERMINATE for an operator.
    Unknown,
}

/// What a takeover of a crashed attempt does: the operation's declared recovery policy
/// ([`Operation::with_recovery`](crate::Operation::with_recovery)). Under `Steps` and
/// `Rerun` the steps the attempt recorded decide ([`crate::effects`]); otherwise, and when it
/// recorded none, a reconciler decides when one is set. (An attempt that gave its claim back
/// after its handler's retryable failure did not crash: its steps decide under every policy.)
///
/// | policy | no step recorded | steps recorded | an uncertain step without a check |
/// |---|---|---|---|
/// | [`Recovery::Indeterminate`] (default) | INDETERMINATE for an operator | INDETERMINATE | INDETERMINATE |
/// | [`Recovery::Steps`] | the handler runs again (it did nothing yet) | the steps replay | INDETERMINATE |
/// | [`Recovery::Rerun`] | the handler runs again | the steps replay | the step runs again |
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recovery {
    /// Never re-run blind (the default): a crashed attempt's takeover, and a refused
    /// completion, hold the operation INDETERMINATE for an operator
    /// ([`Idempotency::resolve`](crate::Idempotency::resolve)), every caller meanwhile getting
    /// [`Error::Indeterminate`](crate::Error::Indeterminate). A crashed attempt that had acted
    /// is not repeated; a handler's own retryable failure is retried, as it asked (after
    /// steps, its steps replay).
    #[default]
    Indeterminate,
    /// Every effect of the handler is a step ([`crate::effects`]): its recorded steps decide a
    /// takeover (results replay, an uncertain step is decided by its check), and an attempt
    /// that recorded no intent did nothing, so the handler runs again.
    Steps,
    /// The whole handler is safe to repeat (every effect behind a downstream key the provider
    /// deduplicates, [`ExecutionContext::downstream_key`](crate::ExecutionContext::downstream_key)):
    /// a takeover runs it again as attempt n + 1, an uncertain step included; recorded steps
    /// still replay.
    Rerun,
}

/// A takeover about to happen: the operation, the new attempt, and the crashed attempt's record.
#[derive(Debug, Clone)]
pub struct Takeover {
    /// The operation key (its downstream keys identify the crashed attempt's calls).
    pub key: OperationKey,
    /// The attempt this takeover is.
    pub attempt: u32,
    /// The crashed attempt's record.
    pub previous: Record,
}

/// Inspects downstream evidence before a takeover re-runs an operation: a one-method strategy.
pub trait Reconciler: Send + Sync {
    /// What the downstream evidence says.
    fn reconcile(&self, takeover: Takeover) -> BoxFuture<'_, Result<Checked, BoxError>>;
}

impl<F, Fut> Reconciler for F
where
    F: Fn(Takeover) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Checked, BoxError>> + Send + 'static,
{
    fn reconcile(&self, takeover: Takeover) -> BoxFuture<'_, Result<Checked, BoxError>> {
        Box::pin(self(takeover))
    }
}
