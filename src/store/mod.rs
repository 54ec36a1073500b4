//! Where records live: a small trait of storage primitives, and its backends.
//!
//! The [`Store`] trait holds no policy: it does not hash, compare fingerprints or decide what a
//! status means. It offers conditional writes, each atomic, and every backend implements them
//! with the same semantics, which the conformance suite (`tests/`) checks on all of them:
//!
//! - [`StoreExt::claim`] writes an IN_PROGRESS record if its key is absent or its record is
//!   settled (COMPLETED, FAILED) and expired (`expires_at < now`, second resolution): an
//!   IN_PROGRESS or INDETERMINATE record never counts as absent ([`Record::counts_as_absent`]).
//!   Otherwise it returns the existing record, read in the same request. When the record
//!   declares a business identity, the claim also writes the identity's permanent
//!   [`Evidence`], atomically, and fails with the standing evidence if there is one.
//! - [`StoreExt::adopt`] is the claim of an operation whose record TTL deleted while its evidence
//!   still says IN_PROGRESS (a crashed attempt): it re-creates the record if the key is still
//!   absent and the evidence still the orphan's.
//! - [`StoreExt::take_over`] replaces the lease of an IN_PROGRESS record whose lease ran out
//!   (millisecond resolution), conditioned on the expired holder's token (of two takers, one
//!   wins) and on the record holding the steps the taker read (any step write of the expired
//!   holder meanwhile fails the takeover), and moves its retention past the new lease.
//! - [`StoreExt::settle`], [`StoreExt::release`], [`StoreExt::shorten`],
//!   [`StoreExt::record_steps`], and the transactional capability's
//!   [`TransactionalStore::commit`] (of steps or a settlement) are fenced by a [`Guard`]:
//!   the caller's lease, or (for an operator's resolution) the INDETERMINATE status. With an
//!   identity, settle and release update or delete the evidence in the same transaction.
//!
//! A failed condition returns the record as it stands. The engine, not the store, reads it:
//! when it shows the caller's own token in the state the caller was writing, the write had
//! committed and only its answer was lost (an ambiguous write retried by the SDK).
//!
//! Backends: [`MemoryStore`] (in-process) and [`DynamoDbStore`]. [`AnyStore`], the erased
//! store the engine holds, holds either (or a store of your own) behind one type.

mod any;
mod cached;
mod dynamodb;
mod memory;
mod request;

use std::any::Any;
use std::fmt;
use std::time::SystemTime;

pub use any::AnyStore;
pub use cached::CachedStore;
pub(crate) use dynamodb::client::bounded as bounded_timeouts;
#[cfg(feature = "from-env")]
pub use dynamodb::dynamodb_config;
#[cfg(feature = "testing")]
pub(crate) use dynamodb::value_size;
pub use dynamodb::{
    ATTEMPT_TIMEOUT, AttributeNames, DYNAMODB_ITEM_LIMIT, DynamoDbStore, ENDPOINT_VAR,
    OPERATION_TIMEOUT, OutcomeStorage, PART_BYTES, PART_TTL_MARGIN, Replication, SDK_ENDPOINT_VAR,
    SortKey, Stuck, TABLE_VAR, TableProtection, UNIQUENESS_TABLE_VAR, configured_endpoint,
    stuck_since,
};
pub use memory::MemoryStore;
pub use request::{Answer, Request, StoreExt};

use aws_sdk_dynamodb::types::TransactWriteItem;
use futures_util::future::BoxFuture;

use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Evidence, Record, Status, StepRecord};

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the lease.
    Acquired,
    /// The key is held by a live record, returned as it stands.
    Existing(Record),
    /// The key's record is absent or expired, but the declared business identity has standing
    /// evidence (of this or another operation key). Nothing was written.
    IdentityTaken(Evidence),
}

/// The answer to a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// The guard held; the write was applied.
    Held,
    /// The guard no longer holds; nothing was written. `current` is the record as it stands.
    Lost {
        /// The record as it stands, if any. A store that keeps large outcomes apart from the
        /// record may leave the outcome out (`None`) when the caller only needs its state
        /// ([`DynamoDbStore`] after a settlement, a shortening or a release).
        current: Option<Box<Record>>,
    },
}

/// The answer to a transactional commit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Committed {
    /// Committed: the steps (or the settlement) and every write.
    Applied,
    /// The guard no longer holds; nothing was written. `current` as for [`Fence::Lost`].
    LeaseLost {
        /// The record as it stands, if any (its outcome may be left out).
        current: Option<Box<Record>>,
    },
    /// The condition of the handler's write at this index failed; nothing was written.
    Refused {
        /// The index in the writes ([`TransactionalStore::commit`]).
        write: usize,
    },
    /// The handler's writes cannot be sent as built (over DynamoDB's 100 actions or 4 MB, two
    /// actions on one item, a write of no single kind, a store that does not commit DynamoDB
    /// writes, a request that commits no writes); nothing was written, or sent.
    Invalid {
        /// What is wrong with them, for the operator.
        message: String,
    },
}

/// What a fenced write requires of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard<'a> {
    /// IN_PROGRESS under this lease token: the caller still holds the claim.
    Lease(&'a str),
    /// INDETERMINATE under this lease token and attempt: an operator resolves the attempt it
    /// read (never one a redelivery claimed, after a release, and that was held again
    /// meanwhile; a durable execution's attempts share one token, so the attempt tells them
    /// apart).
    Indeterminate {
        /// The token the operator saw.
        token: &'a str,
        /// The attempt the operator saw ([`Lease::attempt`](crate::record::Lease::attempt)).
        attempt: u32,
    },
    /// IN_PROGRESS under this lease token, its lease run out at `now`, its steps as the
    /// operator saw them: an operator resolves a stuck claim (never a live one, nor one whose
    /// holder recorded a step since).
    Expired {
        /// The token the operator saw.
        token: &'a str,
        /// The attempt the operator saw: an owner that re-entered its claim since (a durable
        /// execution's replay, under the same token) holds another.
        attempt: u32,
        /// The operator's time.
        now: SystemTime,
        /// How often the record's steps had been written when the operator saw it
        /// ([`Record::steps_version`](crate::record::Record::steps_version)).
        steps_version: u64,
        /// The step list the operator saw: a list a version before 0.5 wrote counts none of
        /// its writes, so its length and its pending steps are what a store checks.
        steps: &'a [StepRecord],
    },
}

impl Guard<'_> {
    /// Whether `record` satisfies the guard.
    pub fn admits(&self, record: &Record) -> bool {
        match self {
            Self::Lease(token) => {
                record.status == Status::InProgress && record.lease.token == *token
            }
            Self::Indeterminate { token, attempt } => {
                record.status == Status::Indeterminate
                    && record.lease.token == *token
                    && record.lease.attempt == *attempt
            }
            Self::Expired {
                token,
                attempt,
                now,
                steps_version,
                steps,
            } => {
                record.status == Status::InProgress
                    && record.lease.token == *token
                    && record.lease.attempt == *attempt
                    && record.lease.is_expired(*now)
                    && record.steps_version == *steps_version
                    && record.steps == *steps
            }
        }
    }
}

/// The record a fenced write targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// The operation key.
    pub key: &'a OperationKey,
    /// The business identity whose evidence is written alongside, if any.
    pub identity: Option<&'a str>,
    /// What the record must satisfy.
    pub guard: Guard<'a>,
}

/// Storage primitives for idempotency records: the protocol's core, dyn-compatible (the engine
/// holds one as `dyn Store` in an [`AnyStore`]), with no DynamoDB type in it.
///
/// A store answers every core [`Request`] at one point, [`Store::call`]; [`StoreExt`] gives
/// each request its typed method (`store.claim(..)`, `store.get(..)`), for every store. A
/// decorator matches the requests it changes and hands every other on to the store it wraps
/// as it is (a decorator that changes nothing boxes nothing more), so that nothing reaches
/// the wrapped store around it. Do a call's work inside its future, not when `call` is
/// called: a caller may drop the future unpolled (a fault injected before the call applies).
/// [`Store::transactional`] is required too, so that a decorator states what it does with the
/// transactional capability.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use lambda_idempotency::reconcile::BoxFuture;
/// use lambda_idempotency::store::{Answer, MemoryStore, Request, Store, TransactionalStore};
/// use lambda_idempotency::StoreError;
///
/// /// Counts claims, and hands every request on to the store it wraps.
/// #[derive(Debug, Default)]
/// struct Counted {
///     inner: MemoryStore,
///     claims: AtomicU64,
/// }
///
/// impl Store for Counted {
///     fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
///         match request {
///             // Counted when the claim is sent (its future polled), not when it is made.
///             Request::Claim { .. } => Box::pin(async move {
///                 self.claims.fetch_add(1, Ordering::Relaxed);
///                 self.inner.call(request).await
///             }),
///             // Every other request: the wrapped store's own future, boxed nothing more.
///             _ => self.inner.call(request),
///         }
///     }
///     // A plain memory store commits no DynamoDB writes; a decorator of a store that does
///     // implements `TransactionalStore` too and answers `Some(self)`.
///     fn transactional(&self) -> Option<&dyn TransactionalStore> {
///         None
///     }
/// }
///
/// let idem = lambda_idempotency::Idempotency::new(Counted::default());
/// assert!(idem.store().downcast_ref::<Counted>().is_some());
/// ```
pub trait Store: Any + Send + Sync + fmt::Debug {
    /// Answers `request` with the [`Answer`] of its kind ([`StoreExt`] says what each request
    /// asks): write `Box::pin(async move { .. })`, or hand on the wrapped store's future as it
    /// is.
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>>;

    /// This store's transactional capability ([`TransactionalStore`]: the handler's own
    /// DynamoDB writes committed with a step or the settlement), or `None` when it has none.
    /// The engine answers a handler's writes on a store without it with
    /// [`Committed::Invalid`], before anything is sent.
    fn transactional(&self) -> Option<&dyn TransactionalStore>;
}

/// The transactional capability a store offers or not ([`Store::transactional`]): the
/// handler's own DynamoDB writes (transactional steps, writes carried by the completion, an
/// outbox) committed in one transaction with the fenced record write. [`DynamoDbStore`]
/// has it, a [`MemoryStore`] built with the handler's tables (`MemoryStore::with_tables`,
/// feature `testing`) has it, and decorators hand on their store's.
pub trait TransactionalStore: Store {
    /// `request` together with the handler's own `writes` (Put, Update, Delete,
    /// ConditionCheck on any table, in its order), in one transaction sent under request
    /// `token` (1 to 36 characters, the same on every try of this commit, another for another
    /// commit): all or nothing ([`crate::effects`]). Two requests commit so:
    ///
    /// - [`Request::RecordSteps`]: a transactional step, its step list written as the
    ///   request's `steps` (fenced by its guard, the record alone) with its writes; a re-send
    ///   after it applied (the step it adds already in the list) is recognised, never applied
    ///   twice;
    /// - [`Request::Settle`]: [`StoreExt::settle`] with the completion's writes
    ///   ([`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with)); the
    ///   engine sends it only with writes (else [`StoreExt::settle`]).
    ///
    /// [`Committed::Refused`] names the write (an index in `writes`) whose condition failed;
    /// [`Committed::Invalid`] refuses writes that cannot be sent, and any other request.
    fn commit<'a>(
        &'a self,
        request: Request<'a>,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>>;

    /// `Err` when this store's tables refuse the handler's own transactional writes, found by
    /// asking them: the DynamoDB store's idempotency table refuses them when it has
    /// multi-Region strong consistency, which accepts no `TransactWriteItems`
    /// ([`StoreError::TransactionalWritesUnsupported`]).
    /// [`Operation::prime`](crate::lambda::Operation::prime) asks it at init for an operation
    /// that declares such writes.
    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// What a store answers for the handler's writes it cannot commit with `request`, refused
/// before anything is sent: a request that commits no writes ([`TransactionalStore::commit`]),
/// or, for a step list or a settlement, a store without the transactional capability.
pub(crate) fn writes_refused(request: Request<'_>) -> Committed {
    let message = match request {
        Request::RecordSteps { .. } => {
            "this store cannot commit DynamoDB writes: a transactional step needs the DynamoDB store".to_owned()
        }
        Request::Settle { .. } => {
            "this store cannot commit DynamoDB writes: writes committed with the completion need the DynamoDB store".to_owned()
        }
        other => format!(
            "only a step list or a settlement commits with the handler's writes, not `{}`",
            other.name()
        ),
    };
    Committed::Invalid { message }
}

/// The most actions one `TransactWriteItems` holds.
pub(crate) const MAX_TRANSACTION_ACTIONS: usize = 100;

/// Why a transaction of the handler's `writes` and the operation's `own` writes cannot be
/// sent, if it takes more actions than DynamoDB takes in one.
pub(crate) fn too_many_actions(own: usize, writes: usize) -> Option<String> {
    (own + writes > MAX_TRANSACTION_ACTIONS).then(|| {
        format!(
            "the handler's {writes} writes and outbox events, with the operation's own {own}, pass the {MAX_TRANSACTION_ACTIONS} actions DynamoDB takes in one transaction"
        )
    })
}

/// Whether `current` (the record a failed commit's condition returned) is the record as the
/// commit of `steps` under `target`'s lease left it: the same lease, and the step it adds
/// recorded at its place with its result.
pub(crate) fn shows_commit(current: &Record, target: Target<'_>, steps: &[StepRecord]) -> bool {
    let Guard::Lease(token) = target.guard else {
        return false;
    };
    let Some(adding) = steps.last() else {
        return false;
    };
    current.status == Status::InProgress
        && current.lease.token == token
        && current.steps.get(steps.len() - 1) == Some(adding)
}
