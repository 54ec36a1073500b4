//! Lambda durable functions (feature `durable`, over `aws-durable-execution-sdk` 0.1): the
//! invocation of an operation inside a durable handler, owned by its durable execution.
//!
//! The durable SDK drops the handler's future at every suspension (a `ctx.wait`, a callback,
//! a chained invoke) and runs the handler again from the start on the next invocation, replaying
//! what it checkpointed. An operation claimed inside it for the execution
//! ([`Operation::durable_invocation`]) is re-entered by every replay of the *same* execution
//! (its ARN owns the claim, [`Invocation::with_owner`]) and answered as a duplicate for any other
//! (a second execution started for the same order: in progress, then its stored outcome). A
//! plain invocation would instead give its claim back at the first suspension and meet its own
//! claim on the replay as another caller's.
//!
//! Run the operation with [`Operation::durable_execute`], which runs it inside one durable child
//! context: the durable SDK numbers a handler's operations by their place in it, and an
//! operation the engine answers from its record (settled before the replay) runs none of its
//! handler's durable operations, which would shift every later one onto another's checkpoint.
//!
//! To start durable executions exactly once from a queue or an API instead, run the crate in a
//! plain dispatcher function and start the execution under
//! [`ExecutionContext::durable_execution_name`](crate::ExecutionContext::durable_execution_name):
//! see the guide's durable functions section.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use aws_durable_execution_sdk::{self as durable, DurableContext};
//! use lambda_idempotency::{BoxError, Idempotency, KeyPolicy};
//! use serde_json::{Value, json};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::from_env().await?;
//!     let fulfil = idem.operation("fulfil", KeyPolicy::pointer("/order_id")?)?;
//!     durable::run(move |order: Value, ctx: DurableContext| {
//!         let fulfil = fulfil.clone();
//!         async move {
//!             // A lease that covers the execution's longest wait.
//!             let invocation = fulfil
//!                 .durable_invocation(&order, &ctx)?
//!                 .with_lease(Duration::from_secs(2 * 3600));
//!             // One durable child context: the handler's durable operations live in it.
//!             let reserved = fulfil
//!                 .durable_execute(invocation, &ctx, |_steps, child| async move {
//!                     let reserved = child
//!                         .step(|_| async { Ok(json!({"reserved": true})) })
//!                         .name("reserve")
//!                         .await?;
//!                     child.wait(Duration::from_secs(3600)).name("cool-off").await?;
//!                     Ok::<_, BoxError>(reserved)
//!                 })
//!                 .await?;
//!             // Durable operations after it replay in their places.
//!             ctx.wait(Duration::from_secs(60)).name("follow-up").await?;
//!             Ok(reserved)
//!         }
//!     })
//!     .await
//! }
//! ```

use std::error::Error as _;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_durable_execution_sdk::{
    DurableContext, OperationError, RetryDecision, StepError, TypedError, WireError,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Operation;
use crate::error::{BoxError, Error};
use crate::execution::{Execution, ExecutionContext, Invocation};

impl<E> Operation<E> {
    /// The invocation for `payload` inside a durable handler: as [`Operation::invocation`] for
    /// the durable invocation's Lambda context, owned by the durable execution
    /// ([`Invocation::with_owner`] of [`DurableContext::execution_arn`]), so that every replay
    /// of the execution re-enters its claim and no other execution runs the operation.
    ///
    /// The lease still fences completion: a suspension longer than the lease lets another
    /// execution take the operation over (after the usual checks of its steps). Give the
    /// invocation a lease that covers the longest wait between two of the execution's
    /// invocations ([`Invocation::with_lease`]: the operation's lease policy counts from the
    /// invocation's deadline), or run the operation inside one durable step, which never
    /// suspends. Branches of one execution (`map`, `parallel`, child contexts) share its ARN:
    /// two of them running the same operation at once are one run and a duplicate, and so is a
    /// branch that starts after the first parked on a wait (the SDK drops a parked branch and
    /// goes on with its siblings): only the execution's replay of the parked branch takes the
    /// run back. Branches are told apart in one process (where one invocation's branches run);
    /// `map` items with flat nesting share their parent's namespace and are not: keep one
    /// operation key to one branch there.
    ///
    /// # Errors
    /// As [`Operation::invocation`]: the payload does not give the operation key.
    pub fn durable_invocation(
        &self,
        payload: &E,
        durable: &DurableContext,
    ) -> Result<Invocation, Error> {
        Ok(self
            .invocation(payload, durable.lambda_context())?
            .with_durable_owner(durable.execution_arn(), branch_of(durable)))
    }

    /// Runs `invocation` (from [`Operation::durable_invocation`]) inside one durable child
    /// context named after the operation, and answers the handler's value: `handler` gets the
    /// operation's [`ExecutionContext`] (the crate's steps) and the child's [`DurableContext`],
    /// on which its durable operations (steps, waits, callbacks) belong.
    ///
    /// The durable SDK numbers a handler's durable operations by their place, and checks each
    /// against what it checkpointed there on every replay. Once the operation settled, the
    /// engine answers a replay from its record without running `handler`: durable operations
    /// made inside it on the handler's own context would then be missing from the count, and
    /// every one after the operation would meet another's checkpoint (the execution fails as
    /// non-deterministic). In a child context they are the child's: the child counts as one
    /// operation whether `handler` ran or not, and once it completed the SDK replays its value
    /// (one larger than the SDK checkpoints whole runs the child again, which reads the
    /// record: keep the operation's retention longer than the execution).
    ///
    /// The durable SDK keeps a failed child's failure for good (every replay answers it), so
    /// an answer that only says "not yet" must not end the child: when the engine answers,
    /// before `handler` ran, that the operation is in progress elsewhere
    /// ([`Error::AlreadyInProgress`]), that the lease was lost, or that the store failed for a
    /// transient reason (throttled, unavailable), the child is tried again after a durable
    /// wait (the execution suspends; [`DURABLE_RETRIES`] tries, waits of 2 s doubling up to 5
    /// minutes, about 45 minutes in all), in a fresh child of its own, so a later try meets
    /// the other execution's outcome or the store back. Once `handler` ran in a try (in this
    /// invocation, or in an earlier one whose durable operations the try's child recorded), no
    /// other try runs it: an answer after that, a "not yet" included, ends the child.
    ///
    /// # Errors
    /// The child context's failure, which carries the handler's error or the engine's
    /// ([`Error`]: a payload conflict, an outcome held for an operator, a duplicate still in
    /// progress after the last try) by its message alone, never as a type to match: the
    /// durable service keeps the message as the child's outcome, and a replay answers the same
    /// failure, so a handler takes the same branch on either. To match the engine's [`Error`],
    /// call [`Idempotency::execute`](crate::Idempotency::execute) with no durable operation
    /// inside.
    pub async fn durable_execute<T, F, Fut>(
        &self,
        invocation: Invocation,
        durable: &DurableContext,
        handler: F,
    ) -> Result<T, BoxError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        F: FnOnce(ExecutionContext, DurableContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
    {
        let engine = self.idem.clone();
        // The handler runs at most once in this invocation: a try that ran it is never retried.
        let handler = Arc::new(Mutex::new(Some(handler)));
        durable
            .with_retry(move |child: DurableContext| {
                let (engine, invocation) = (engine.clone(), invocation.clone());
                let handler = Arc::clone(&handler);
                async move {
                    // A try an earlier invocation ran the handler in (its durable operations
                    // recorded in this try's child) is never tried again: a fresh try would run
                    // them again.
                    let replaying = child.is_replaying();
                    let started = Arc::new(AtomicBool::new(false));
                    let ran = Arc::clone(&started);
                    let answer = engine
                        .execute(&invocation, move |steps| {
                            ran.store(true, Ordering::SeqCst);
                            let handler = handler.lock().ok().and_then(|mut slot| slot.take());
                            async move {
                                match handler {
                                    Some(handler) => handler(steps, child).await,
                                    None => Err(BoxError::from(HANDLER_RAN)),
                                }
                            }
                        })
                        .await;
                    answer.map(Execution::into_value).map_err(|err| {
                        // The failure by its message alone (the store's text in the log only):
                        // a replay of the failed child gives the message only, and the handler
                        // must take the same branch on both.
                        let message = super::diagnostic::caller_message(&err);
                        match !replaying && !started.load(Ordering::SeqCst) && not_yet(&err) {
                            true => BoxError::from(TypedError::with_type(NOT_YET, message)),
                            false => BoxError::from(message),
                        }
                    })
                }
            })
            .name(self.scope.operation())
            .retry_strategy(retry_not_yet)
            .await
            .map_err(BoxError::from)
    }
}

/// How many times [`Operation::durable_execute`] tries an operation the engine answered "not
/// yet" before its child fails with the last answer.
pub const DURABLE_RETRIES: u32 = 16;

/// The longest durable wait between two tries.
const LONGEST_WAIT: Duration = Duration::from_secs(300);

/// The error type a try's failure is recorded under when the engine answered "not yet"
/// before the handler ran: the retry strategy reads it back, live or replayed.
const NOT_YET: &str = "LambdaIdempotency.NotYet";

/// The error of a try whose handler an earlier try in this invocation took (never reached: a
/// try that ran the handler is not retried).
const HANDLER_RAN: &str = "the operation's handler already ran in this invocation";

/// Whether the engine's answer, before the handler ran, only says "not yet": another run holds
/// the operation, the lease went, or the store failed for a transient reason.
fn not_yet(err: &Error) -> bool {
    match err {
        Error::AlreadyInProgress { .. } | Error::LeaseLost { .. } => true,
        Error::Store(store) => store.is_transient(),
        _ => false,
    }
}

/// The retry strategy of [`Operation::durable_execute`]: a try recorded as [`NOT_YET`] is
/// tried again after 2 s doubling up to [`LONGEST_WAIT`], up to [`DURABLE_RETRIES`] tries;
/// any other failure ends the child. A function of the recorded failure and the try alone, so
/// every replay decides as the first run did.
fn retry_not_yet(failure: &StepError, attempt: u32) -> RetryDecision {
    let recorded = failure
        .source()
        .and_then(|source| source.downcast_ref::<OperationError>())
        .and_then(OperationError::wire)
        .and_then(WireError::error_type);
    match recorded == Some(NOT_YET) && attempt < DURABLE_RETRIES {
        true => RetryDecision::Retry {
            delay: Duration::from_secs(2_u64 << attempt.saturating_sub(1).min(16))
                .min(LONGEST_WAIT),
        },
        false => RetryDecision::Stop,
    }
}

/// What `DurableContext`'s `Debug` form shows of the branch a context runs in.
const BRANCH_SHOWN_AS: &str = "parent_wire_id: Some(\"";

/// The branch of its execution `durable` runs in: the wire id of the operation whose child
/// context it is (a `map` item, a `parallel` branch, a child context), the same on every replay;
/// `""` for the handler's own context. The SDK (pinned at 0.1.0) keeps it private but shows it
/// in its `Debug` form; a form it does not recognise reads as the handler's own context, where
/// any branch may take a parked run back (as before branches were told apart).
fn branch_of(durable: &DurableContext) -> String {
    let shown = format!("{durable:?}");
    shown
        .rfind(BRANCH_SHOWN_AS)
        .and_then(|at| shown[at + BRANCH_SHOWN_AS.len()..].split('"').next())
        .unwrap_or_default()
        .to_owned()
}
