//! What a handler says about its steps: how an uncertain step is checked ([`StepCheck`]; `()`
//! for none), an effect that did not happen ([`NotApplied`]), and why a step gave no
//! result ([`StepError`]). The step builder lives with the attempt, in the engine.

use std::future::{Future, Ready};

use crate::error::{BoxError, ErrorKind};
use crate::reconcile::Checked;

/// A step's check: asked, with the step's downstream key, what became of an uncertain step.
/// Closures `FnOnce(String) -> impl Future<Output = Result<Checked<T>, BoxError>>` implement
/// it (their future `Send`, as a Lambda handler's is); `()` is the absence of one.
pub trait StepCheck<T> {
    /// The check's future.
    type Future: Future<Output = Result<Checked<T>, BoxError>>;

    /// The check for the step whose downstream key is `downstream_key`; `None`: no check.
    fn check(self, downstream_key: String) -> Option<Self::Future>;
}

impl<T, F, Fut> StepCheck<T> for F
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<Checked<T>, BoxError>>,
{
    type Future = Fut;

    fn check(self, downstream_key: String) -> Option<Fut> {
        Some(self(downstream_key))
    }
}

/// No check (a step's default): uncertain, the step holds the operation for an operator.
impl<T> StepCheck<T> for () {
    type Future = Ready<Result<Checked<T>, BoxError>>;

    fn check(self, _: String) -> Option<Self::Future> {
        None
    }
}

/// An effect's error that says the effect did not happen (a provider's 4xx, a connection
/// refused before sending): the step's intent is withdrawn, so a later attempt runs the step
/// again instead of treating it as uncertain.
///
/// ```
/// use lambda_idempotency::effects::NotApplied;
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let err: Result<(), NotApplied> = Err(NotApplied::new(refused));
/// assert!(err.is_err());
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotApplied(pub BoxError);

impl NotApplied {
    /// Wraps the effect's error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self(source.into())
    }
}

/// Why a step did not return a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The step's effect failed with `source`. The step stays *uncertain* (a later attempt asks
    /// its check), unless the error is a [`NotApplied`].
    #[error("step `{step}` failed: {source}")]
    Effect {
        /// The step's name.
        step: String,
        /// The effect's error.
        source: BoxError,
    },
    /// The operation stopped at this step: the engine answers the caller itself (with an error
    /// of this kind), whatever the handler returns next. Return this error.
    #[error(
        "the operation stopped at step `{step}` ({}): the engine answers the caller",
        kind.name()
    )]
    Stopped {
        /// The step's name.
        step: String,
        /// The kind of the error the caller gets.
        kind: ErrorKind,
    },
    /// A transactional step's transaction was refused: the condition of the handler's write at
    /// index `write` ([`Transaction::writes`](super::Transaction::writes)) failed. Nothing was
    /// committed and the step is not recorded: the handler may read again and run it again.
    /// For the completion's writes (step `(completion)`,
    /// [`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with)), `write` indexes every write queued.
    #[error("step `{step}`: the condition of write {write} failed; nothing was committed")]
    Refused {
        /// The step's name.
        step: String,
        /// The index of the write whose condition failed.
        write: usize,
    },
    /// A transactional step's transaction cannot be sent as built (over DynamoDB's 100
    /// actions or 4 MB, two actions on one item, an invalid expression, a store that does not
    /// commit DynamoDB writes): nothing was committed. A handler that returns it has its
    /// operation retained FAILED `step_rejected`, whatever its classifier says: the same
    /// handler would build the same writes again.
    #[error("step `{step}`: the transaction was not sent: {message}")]
    Rejected {
        /// The step's name.
        step: String,
        /// What DynamoDB's limits (or the store) refuse.
        message: String,
    },
    /// The step cannot run: its name is blank or too long, or another step is still running
    /// (steps run one after the other, so that their order is the same on every attempt).
    #[error("step `{step}` cannot run: {reason}")]
    Invalid {
        /// The step's name.
        step: String,
        /// Why.
        reason: &'static str,
    },
}
