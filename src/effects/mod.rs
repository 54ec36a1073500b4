//! Effects inside the protocol: recovery points (steps) that the ledger records, so that a
//! takeover of a crashed attempt knows what it did.
//!
//! A handler runs its effects as named steps from its [`ExecutionContext`]. Each step records
//! its *intent* (fenced on the lease) before its effect and its *result* after; the result is
//! written with the next step's intent, or with the settlement. On a later attempt of the same
//! operation (a takeover after a crash, a timeout, a retryable failure) of a handler that
//! declares its effects to be its steps
//! ([`Recovery::Steps`](crate::reconcile::Recovery::Steps); under the default a takeover is
//! held for an operator, steps kept):
//!
//! - a step with a recorded result returns it without running (its exact bytes, decoded);
//! - a step with an intent and no result is *uncertain*: its check decides
//!   ([`Checked::Applied`] records the result, [`Checked::NotApplied`] runs the effect,
//!   [`Checked::Unknown`] holds the operation INDETERMINATE for an operator); without a check
//!   the operation is held INDETERMINATE, never re-run blind;
//! - a step declared [repeat-safe](Step::repeat_safe) (its downstream key makes the provider
//!   deduplicate) runs again with the same key;
//! - a handler that recorded no intent has done nothing yet: under
//!   [`Recovery::Steps`](crate::reconcile::Recovery::Steps) it simply runs again.
//!
//! A *transactional* step ([`Step::transact`]) commits the handler's own DynamoDB writes with
//! its record in one transaction ([`Transaction`]): never uncertain, no check needed. It may
//! also publish follow-on events through a transactional [`Outbox`]: their items commit in the
//! same transaction, each under an [`event_id`] that is the same on every attempt, and a relay
//! publishes each at least once.
//!
//! Step names are deterministic: a name used twice in one attempt, or steps in another order
//! than the record holds, is [`Error::StepMismatch`](crate::Error::StepMismatch) and the
//! operation is held for an operator.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lambda_idempotency::effects::Checked;
//! use lambda_idempotency::reconcile::Recovery;
//! use lambda_idempotency::store::MemoryStore;
//! use lambda_idempotency::{BoxError, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope};
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let key = OperationKey::derive(&OperationScope::new("shop", "checkout")?, None, "order-418")?;
//! // Every effect of this handler is a step: an attempt that recorded none did nothing (an
//! // Operation declares it with the same `with_recovery`).
//! let invocation = Invocation::new(key, Fingerprint::of(&"order-418")?, Duration::from_secs(30))
//!     .with_recovery(Recovery::Steps);
//!
//! let receipt = idem
//!     .execute(&invocation, |ctx| async move {
//!         // The payment provider deduplicates on the key: safe to run again.
//!         let charge: String = ctx
//!             .step("charge")
//!             .repeat_safe()
//!             .run(|key| async move { Ok(format!("ch_{}", &key[..8])) })
//!             .await?;
//!         // An e-mail is not: after a crash its check asks the provider what happened.
//!         let mail: String = ctx
//!             .step("email")
//!             .checked_by(|_key| async { Ok(Checked::NotApplied) })
//!             .run(|_key| async { Ok("msg-1".to_owned()) })
//!             .await?;
//!         Ok::<_, BoxError>(format!("{charge} {mail}"))
//!     })
//!     .await?;
//! assert!(receipt.value().ends_with("msg-1"));
//! # Ok(()) }
//! ```
//!
//! [`ExecutionContext`]: crate::ExecutionContext

pub(crate) mod destinations;
mod envelope;
pub(crate) mod outbox;
pub(crate) mod outbox_marks;
pub(crate) mod pending_index;
mod step;
mod transaction;

/// How a [`StepError`] names the completion when its writes are refused.
pub(crate) const COMPLETION: &str = "(completion)";
/// The step the completion's outbox events name in their ids ([`event_id`]): none.
pub(crate) const COMPLETION_EVENTS: &str = "";
pub use self::destinations::{DESTINATIONS_VAR, Destination, Destinations};
pub use self::outbox::{
    EventOrder, ID_ATTRIBUTE, MAX_EVENT_BYTES, MAX_ORDERING_KEY_BYTES, OUTBOX_RETENTION, Outbox,
    OutboxEvent, OutboxRecord, event_id,
};
pub use self::outbox_marks::{
    Found, MAX_FOUND_BYTES, MAX_PARKED_REASON_BYTES, OutboxError, OutboxMarks, PublishedBy,
    SETTLED_READS,
};
pub use self::pending_index::{PARKED, PENDING_INDEX, PENDING_SHARDS};
pub use self::step::{NotApplied, StepCheck, StepError};
pub use self::transaction::{Transaction, Writes};
/// The step builder lives with the attempt, in the engine; its 0.4 path stays.
pub use crate::engine::attempt::Step;
pub use crate::reconcile::Checked;
pub use crate::record::{MAX_STEP_RESULTS_BYTES, MAX_STEPS};

/// The longest step name accepted, in bytes.
pub const MAX_STEP_NAME_BYTES: usize = 255;
