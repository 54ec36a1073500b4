//! The step builder: a named recovery point of the attempt, built by
//! [`ExecutionContext::step`] and run by the attempt's ledger.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ExecutionContext;
use crate::effects::{StepCheck, StepError, Transaction};
use crate::error::BoxError;

/// A named step, built by [`ExecutionContext::step`] and run by [`Step::run`].
#[must_use = "a step does nothing until it is run"]
#[derive(Debug)]
pub struct Step<'a, C = ()> {
    pub(crate) context: &'a ExecutionContext,
    pub(crate) name: String,
    pub(crate) repeat_safe: bool,
    pub(crate) effect_timeout: Option<std::time::Duration>,
    pub(crate) check: C,
}

impl<'a> Step<'a, ()> {
    /// Asks `check` about this step when an earlier attempt recorded its intent but no result:
    /// [`Checked::Applied`](crate::effects::Checked::Applied) records the result found, [`Checked::NotApplied`](crate::effects::Checked::NotApplied) runs the effect,
    /// [`Checked::Unknown`](crate::effects::Checked::Unknown) (or an error) leaves it to an operator (or the next delivery).
    /// Under [`Recovery::Rerun`](crate::reconcile::Recovery::Rerun), which declares every
    /// effect safe to repeat, the check is not asked: the step runs again. A step cut off in
    /// this same attempt (a timeout around it) is not checked either while its effect may
    /// still land: the claim is given back and the next attempt asks.
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

impl Step<'_, ()> {
    /// Runs a transactional step: `build` (given the step's downstream key) reads what it
    /// needs and returns the step's result with the handler's own DynamoDB writes
    /// ([`Transaction`]); they commit in one `TransactWriteItems` with the
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
        Fut: Future<Output = Result<Transaction<T>, BoxError>>,
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
    /// The claim is never kept past its lease, so an effect is not started less than the
    /// timeout (plus the skew) before the lease's end, where it could land after a takeover
    /// checked it: the step answers [`StepError::Stopped`] instead (a new step's intent is not
    /// written, or withdrawn with the give-back's write when writing it used the time up; an
    /// earlier attempt's uncertain step stays uncertain), and the claim is given back for a
    /// delivery with more time: released when no step is recorded (the caller is answered
    /// [`Error::LeaseLost`](crate::Error::LeaseLost)), else given back with its steps, kept
    /// until an earlier step's effect can have landed.
    /// A Lambda door's lease is the invocation's remaining time plus the skew: a step starts
    /// only while the invocation has at least its timeout left, so keep the function's timeout
    /// above the step's. An owned claim's steps ([`Invocation::with_owner`](crate::Invocation::with_owner))
    /// are not refused: size its lease ([`Invocation::with_lease`](crate::Invocation::with_lease)).
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
    /// operation cannot go on (the step is uncertain and unchecked, the lease was lost or is
    /// too short for the step's [effect timeout](Step::effect_timeout), the steps changed
    /// order): return it, the engine answers the caller;
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
