//! What the handler holds while it runs: the execution's key and attempt, and the ledger its
//! steps and completion writes go through.

use std::sync::Arc;

use super::{Step, StepLedger};
use crate::effects::{StepError, Writes};
use crate::key::OperationKey;

/// What the handler knows about the execution it runs, and where it runs its steps
/// ([`crate::effects`]).
#[derive(Debug, Clone)]
pub struct ExecutionContext {
    pub(crate) key: OperationKey,
    pub(crate) attempt: u32,
    pub(crate) steps: Arc<StepLedger>,
}

impl ExecutionContext {
    /// The step `name`: a recovery point whose intent and result the operation's record keeps
    /// ([`crate::effects`]). Names are unique within the operation and run in the same order
    /// on every attempt.
    pub fn step(&self, name: impl Into<String>) -> Step<'_> {
        Step {
            context: self,
            name: name.into(),
            repeat_safe: false,
            effect_timeout: None,
            check: (),
        }
    }

    /// Commits `writes` (the handler's own DynamoDB writes and outbox events,
    /// [`Writes::default()`](Writes)) with the operation's completion: the record
    /// turns COMPLETED with the handler's result in the same `TransactWriteItems`, fenced on the
    /// lease, or nothing is written. Exactly once for local state, in the completion's own
    /// request (a large outcome's part items are written before it, as without writes), and
    /// never uncertain: a takeover finds the operation COMPLETED (the writes committed) or still
    /// claimed (they did not). Call it once or more before the handler returns its result; the
    /// events' ids take the step `""` ([`crate::effects::event_id`]).
    ///
    /// When a write's condition fails, nothing commits and the handler's result is not
    /// stored: the operation fails with [`StepError::Refused`] as the handler's error
    /// (`write` indexes every write queued, each call's writes then its events' items),
    /// classified as any. Retryable (the default), the claim is released for the next delivery
    /// to run the handler again, or, when the handler recorded steps, given back for a
    /// takeover (which the recovery policy decides, [`crate::effects`]). Writes that cannot be
    /// sent (over DynamoDB's limits, or a store that does not commit DynamoDB writes, such as
    /// the memory store) are retained as a failure of kind `completion_rejected`, whatever the
    /// classifier says: the same handler would send them again.
    ///
    /// ```no_run
    /// # async fn demo(idem: lambda_idempotency::Idempotency, invocation: lambda_idempotency::Invocation) -> Result<(), Box<dyn std::error::Error>> {
    /// use aws_sdk_dynamodb::types::{AttributeValue, Put};
    /// use lambda_idempotency::BoxError;
    /// use lambda_idempotency::effects::Writes;
    ///
    /// let placed = idem
    ///     .execute(&invocation, |ctx| async move {
    ///         let order = Put::builder()
    ///             .table_name("orders")
    ///             .item("pk", AttributeValue::S("order-418".into()))
    ///             .build()?;
    ///         ctx.complete_with(Writes::default().put(order))?;
    ///         Ok::<_, BoxError>("order-418 placed".to_owned())
    ///     })
    ///     .await?;
    /// assert_eq!(placed.value(), "order-418 placed");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StepError::Rejected`] for two events of one name; [`StepError::Stopped`] once the
    /// operation stopped at a step; [`StepError::Invalid`] after the handler returned.
    pub fn complete_with(&self, writes: Writes) -> Result<(), StepError> {
        self.steps.complete_with(writes)
    }

    /// Declares the result the handler is about to return a refusal: the application turned
    /// the request down (a validation error, an HTTP 4xx) and nothing took effect. The result
    /// is stored and replayed under the operation key like any other, but it never settles the
    /// business identity's permanent evidence: the evidence is deleted with the settlement, so
    /// that a corrected request (another key, the same identity) may still run. Only a stored
    /// success holds an identity. The HTTP door declares every 4xx response it stores a
    /// refusal.
    ///
    /// A refusal that recorded a step or queued writes with the completion
    /// ([`Self::complete_with`]) may have taken effect: its identity is settled as usual.
    ///
    /// ```no_run
    /// # async fn demo(idem: lambda_idempotency::Idempotency, invocation: lambda_idempotency::Invocation) -> Result<(), Box<dyn std::error::Error>> {
    /// let answer = idem
    ///     .execute(&invocation, |ctx| async move {
    ///         let amount_valid = false;
    ///         if !amount_valid {
    ///             ctx.refuse();
    ///             return Ok::<_, std::io::Error>(serde_json::json!({"refused": "amount"}));
    ///         }
    ///         Ok(serde_json::json!({"invoice": "i-1"}))
    ///     })
    ///     .await?;
    /// # let _ = answer;
    /// # Ok(()) }
    /// ```
    pub fn refuse(&self) {
        self.steps.refuse();
    }

    /// The operation key.
    pub fn key(&self) -> &OperationKey {
        &self.key
    }

    /// 1 for the first execution; more after a crashed attempt's lease was taken over.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A deterministic key for a downstream call (the same on every attempt), e.g. a payment
    /// API's `Idempotency-Key` or an SQS FIFO deduplication id.
    pub fn downstream_key(&self, step: &str) -> String {
        self.key.downstream(step)
    }

    /// The name to start a Lambda durable execution under (`DurableExecutionName` of Lambda's
    /// `Invoke`): the operation's downstream key for starting one, 64 hex digits, as Lambda
    /// allows (1 to 64 of `[a-zA-Z0-9-_]`). Lambda starts one execution per name and answers a
    /// repeated start with the same payload with that execution, so a dispatcher that starts
    /// the execution under this name, and is run again after a crash, never starts two.
    pub fn durable_execution_name(&self) -> String {
        self.key.downstream("durable-execution")
    }
}
