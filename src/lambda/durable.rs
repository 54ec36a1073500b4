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

use std::future::Future;

use aws_durable_execution_sdk::DurableContext;
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
    /// # Errors
    /// The child context's failure, which carries the handler's error or the engine's
    /// ([`Error`]: a duplicate in progress, a payload conflict, an outcome held for an
    /// operator) by its message alone, never as a type to match: the durable service keeps
    /// the message as the child's outcome, and a replay answers the same failure, so a
    /// handler takes the same branch on either. To match the engine's [`Error`], call
    /// [`Idempotency::execute`](crate::Idempotency::execute) with no durable operation inside.
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
        durable
            .run_in_child_context(move |child: DurableContext| async move {
                // The failure by its message alone (the store's text in the log only): a
                // replay of the failed child gives the message only, and the handler must
                // take the same branch on both.
                engine
                    .execute(&invocation, move |steps| handler(steps, child))
                    .await
                    .map(Execution::into_value)
                    .map_err(|err| BoxError::from(super::diagnostic::caller_message(&err)))
            })
            .name(self.scope.operation())
            .await
            .map_err(BoxError::from)
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
