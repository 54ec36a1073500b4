//! The step a handler runs: its name, whether it may run again, its check, its effect.

use std::future::{Future, Ready};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{BoxError, ErrorKind};
use crate::execution::ExecutionContext;
use crate::reconcile::Checked;

/// A step's check: asked, with the step's downstream key, what became of an uncertain step.
/// Closures `FnOnce(String) -> impl Future<Output = Result<Checked<T>, BoxError>>` implement
/// it (their future `Send`, as a Lambda handler's is); [`NoCheck`] is the absence of one.
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

/// A step without a check: uncertain, it holds the operation for an operator.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCheck;

impl<T> StepCheck<T> for NoCheck {
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
    /// [`ExecutionContext::complete_with`]), `write` indexes every write queued.
    #[error("step `{step}`: the condition of write {write} failed; nothing was committed")]
    Refused {
        /// The step's name.
        step: String,
        /// The index of the write whose condition failed.
        write: usize,
    },
    /// A transactional step's transaction cannot be sent as built (over DynamoDB's 100
    /// actions or 4 MB, two actions on one item, an invalid expression, a store that does not
    /// commit DynamoDB writes): nothing was committed.
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

/// A named step, built by [`ExecutionContext::step`] and run by [`Step::run`].
#[must_use = "a step does nothing until it is run"]
#[derive(Debug)]
pub struct Step<'a, C = NoCheck> {
    pub(crate) context: &'a ExecutionContext,
    pub(crate) name: String,
    pub(crate) repeat_safe: bool,
    pub(crate) effect_timeout: Option<std::time::Duration>,
    pub(crate) check: C,
}

impl<'a> Step<'a, NoCheck> {
    /// Asks `check` about this step when an earlier attempt recorded its intent but no result:
    /// [`Checked::Applied`] records the result found, [`Checked::NotApplied`] runs the effect,
    /// [`Checked::Unknown`] (or an error) leaves it to an operator (or the next delivery).
    pub fn checked_by<C>(self, check: C) -> Step<'a, C> {
        Step {
            context: self.context,
            name: self.name,
            repeat_safe: self.repeat_safe,
            effect_timeout: self.effect_timeout,
            check,
        }
    }
}

impl Step<'_, NoCheck> {
    /// Runs a transactional step: `build` (given the step's downstream key) reads what it
    /// needs and returns the step's result with the handler's own DynamoDB writes
    /// ([`Transaction`](super::Transaction)); they commit in one `TransactWriteItems` with the
    /// step's record, fenced on the lease, or not at all. No intent is recorded first, so the
    /// step is never uncertain: a later attempt finds its result (the writes committed, once)
    /// or nothing (they did not). `build` must have no effect of its own. A commit whose
    /// answer was lost is re-sent with the same request token, which DynamoDB answers as the
    /// first for ten minutes.
    ///
    /// # Errors
    /// [`StepError::Refused`] when a write's condition fails, [`StepError::Rejected`] when the
    /// transaction cannot be sent; [`StepError::Effect`] with `build`'s own error;
    /// [`StepError::Stopped`] as for [`Step::run`].
    pub async fn transact<T, F, Fut>(self, build: F) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<super::Transaction<T>, BoxError>>,
    {
        let ledger = std::sync::Arc::clone(&self.context.steps);
        ledger.transact(self.name, build).await
    }
}

impl<C> Step<'_, C> {
    /// Declares the step safe to run again: its effect passes its downstream key (the one
    /// [`Step::run`] gives it) to a provider that deduplicates on it, such as a payment API's
    /// `Idempotency-Key`. An uncertain repeat-safe step runs again instead of being checked.
    pub fn repeat_safe(mut self) -> Self {
        self.repeat_safe = true;
        self
    }

    /// Declares how long the step's effect can take to land after it starts: the longest a
    /// request it sends can still take effect downstream (its client's timeout, with retries).
    /// When the effect ends without a result (an error, a timeout) and the attempt then gives its
    /// claim back, the claim is not taken over before that time has passed since the effect
    /// began, plus the lease policy's clock skew (the next attempt's clock may run ahead), so
    /// that the next attempt's check sees an effect that lands late. Without one the
    /// claim is kept until its lease runs out (the invocation's remaining time bounds the effect).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn charge(ctx: lambda_idempotency::ExecutionContext) -> Result<String, lambda_idempotency::effects::StepError> {
    /// ctx.step("charge")
    ///     .effect_timeout(Duration::from_secs(10))
    ///     .run(|key| async move { Ok(format!("charged under {key}")) })
    ///     .await
    /// # }
    /// ```
    pub fn effect_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.effect_timeout = Some(timeout);
        self
    }

    /// Runs the step: returns its recorded result if an earlier attempt recorded one, else
    /// records its intent, runs `effect` with the step's downstream key (the same on every
    /// attempt) and records its result.
    ///
    /// # Errors
    /// [`StepError::Effect`] with the effect's own error; [`StepError::Stopped`] when the
    /// operation cannot go on (the step is uncertain and unchecked, the lease was lost, the
    /// steps changed order): return it, the engine answers the caller;
    /// [`StepError::Invalid`] for a bad name or overlapping steps.
    pub async fn run<T, F, Fut>(self, effect: F) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<T, BoxError>>,
        C: StepCheck<T>,
        C::Future: Send,
    {
        let ledger = std::sync::Arc::clone(&self.context.steps);
        ledger
            .run(
                self.name,
                self.repeat_safe,
                self.effect_timeout,
                self.check,
                effect,
            )
            .await
    }
}
