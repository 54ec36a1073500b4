//! Where records live: a small trait of storage primitives, and its backends.
//!
//! The [`Store`] trait holds no policy: it does not hash, compare fingerprints or decide what a
//! status means. It offers conditional writes, each atomic, and every backend implements them
//! with the same semantics, which the conformance suite (`tests/`) checks on all of them:
//!
//! - [`Store::claim`] writes an IN_PROGRESS record if its key is absent or its record is
//!   settled (COMPLETED, FAILED) and expired (`expires_at < now`, second resolution): an
//!   IN_PROGRESS or INDETERMINATE record never counts as absent ([`Record::counts_as_absent`]).
//!   Otherwise it returns the existing record, read in the same request. When the record
//!   declares a business identity, the claim also writes the identity's permanent
//!   [`Evidence`], atomically, and fails with the standing evidence if there is one.
//! - [`Store::adopt`] is the claim of an operation whose record TTL deleted while its evidence
//!   still says IN_PROGRESS (a crashed attempt): it re-creates the record if the key is still
//!   absent and the evidence still the orphan's.
//! - [`Store::take_over`] replaces the lease of an IN_PROGRESS record whose lease ran out
//!   (millisecond resolution), conditioned on the expired holder's token (of two takers, one
//!   wins) and on the record holding the steps the taker read (any step write of the expired
//!   holder meanwhile fails the takeover), and moves its retention past the new lease.
//! - [`Store::settle`], [`Store::settle_with`], [`Store::release`], [`Store::shorten`],
//!   [`Store::record_steps`] and [`Store::commit_steps`] are fenced by a [`Guard`]:
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

use std::fmt;
use std::future::Future;
use std::time::SystemTime;

pub use any::AnyStore;
pub use cached::CachedStore;
#[cfg(feature = "from-env")]
pub use dynamodb::dynamodb_config;
#[cfg(feature = "testing")]
pub(crate) use dynamodb::value_size;
pub use dynamodb::{
    ATTEMPT_TIMEOUT, AttributeNames, DYNAMODB_ITEM_LIMIT, DynamoDbStore, ENDPOINT_VAR,
    OPERATION_TIMEOUT, OutcomeStorage, PART_BYTES, PART_TTL_MARGIN, Replication, SDK_ENDPOINT_VAR,
    ScanCursor, SortKey, Stuck, StuckCounts, TABLE_VAR, TableProtection, UNIQUENESS_TABLE_VAR,
    configured_endpoint, stuck_since,
};
pub use memory::MemoryStore;

use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};

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

/// A transactional step to commit ([`Store::commit_steps`]): the record's steps, with the
/// handler's own DynamoDB writes, all or nothing.
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    /// The record's steps as they are once the transaction commits.
    pub steps: &'a [StepRecord],
    /// The handler's writes (Put, Update, Delete, ConditionCheck on any table), in its order.
    pub writes: &'a [TransactWriteItem],
    /// The request token (1 to 36 characters) that makes a re-sent commit idempotent: the same
    /// on every try of this commit, another for another commit.
    pub token: &'a str,
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
        /// The index in [`Commit::writes`] (or in the writes of [`Store::settle_with`]).
        write: usize,
    },
    /// The handler's writes cannot be sent as built (over DynamoDB's 100 actions or 4 MB, two
    /// actions on one item, a write of no single kind, a store that does not commit DynamoDB
    /// writes); nothing was written, or sent.
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
    /// INDETERMINATE: an operator resolves it.
    Indeterminate,
    /// IN_PROGRESS under this lease token, its lease run out at `now`: an operator resolves a
    /// stuck claim (never a live one).
    Expired {
        /// The token the operator saw.
        token: &'a str,
        /// The operator's time.
        now: SystemTime,
    },
}

impl Guard<'_> {
    /// Whether `record` satisfies the guard.
    pub fn admits(&self, record: &Record) -> bool {
        match self {
            Self::Lease(token) => {
                record.status == Status::InProgress && record.lease.token == *token
            }
            Self::Indeterminate => record.status == Status::Indeterminate,
            Self::Expired { token, now } => {
                record.status == Status::InProgress
                    && record.lease.token == *token
                    && record.lease.is_expired(*now)
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

/// Storage primitives for idempotency records.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Writes `record` (IN_PROGRESS, with its identity's evidence) unless a live record holds
    /// its key or its identity has evidence.
    fn claim(
        &self,
        record: &Record,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Writes `record` (IN_PROGRESS, a takeover of a crashed attempt) if its key is absent or
    /// its record settled and expired, and the identity's evidence is still `orphan` (this
    /// operation's, IN_PROGRESS, created when `orphan` was).
    fn adopt(
        &self,
        record: &Record,
        orphan: &Evidence,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Gives `previous`'s record the new `lease` and the retention `expires_at` if it is still
    /// IN_PROGRESS under `previous.lease.token`, that lease has run out at `now`, and it holds
    /// the very steps `previous` holds (none when the attribute is absent). Compare the lease
    /// with `now` as given, never the store's own clock: an owner re-entering its own live
    /// claim ([`Invocation::with_owner`](crate::Invocation::with_owner)) passes a time past
    /// the lease's end.
    fn take_over(
        &self,
        previous: &Record,
        lease: &Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// Moves the target's lease expiry to `until` (a claim given back early: a panicking or
    /// cancelled handler), so that the next delivery takes over without waiting out the lease.
    fn shorten(
        &self,
        target: Target<'_>,
        until: SystemTime,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// Moves the target record to `settlement.status` with its outcome (and its evidence too:
    /// settled alike, or deleted when the settlement [releases the identity](Settlement::releases_identity)).
    /// Outcomes up to [`Config::max_outcome_bytes`](crate::Config::max_outcome_bytes) come
    /// here, whatever the backend's item limit: a store keeps a large one its own way (the
    /// DynamoDB store compresses it and keeps it in part items, [`OutcomeStorage`]) and never
    /// lets a reader see part of one. A store that cannot keep it answers
    /// [`StoreError::Rejected`]; the engine then retains the operation as FAILED.
    fn settle(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// Writes the target record's steps as `steps` ([`crate::effects`]), fenced by the target's
    /// guard (the record alone: the evidence is not touched). A store that does not keep steps
    /// answers [`StoreError::Rejected`], as this default does; the engine then halts a handler
    /// at its first step (a plain step, before its effect).
    fn record_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send {
        let _ = (target, steps);
        async {
            Err(StoreError::Rejected {
                operation: "record_steps",
                message: "this store does not record steps".into(),
            })
        }
    }

    /// Commits `commit.steps` on the target record (fenced by its guard) together with the
    /// handler's own writes, in one transaction ([`crate::effects`]). A store that cannot
    /// answers [`Committed::Invalid`], as this default does: only the DynamoDB store commits
    /// DynamoDB writes.
    fn commit_steps(
        &self,
        target: Target<'_>,
        commit: Commit<'_>,
    ) -> impl Future<Output = Result<Committed, StoreError>> + Send {
        let _ = (target, commit);
        async {
            Ok(Committed::Invalid {
                message: "this store cannot commit DynamoDB writes: a transactional step needs the DynamoDB store".into(),
            })
        }
    }

    /// [`Store::settle`] together with the handler's own DynamoDB `writes`, in one
    /// transaction sent under request `token` (1 to 36 characters, the same on every try of
    /// this settlement): the settlement and every write commit, or nothing does
    /// ([`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with)). The answer
    /// is as for [`Store::commit_steps`]: [`Committed::Refused`] names the write (an index in
    /// `writes`) whose condition failed, [`Committed::Invalid`] refuses writes that cannot be
    /// sent. The engine calls it only with writes (else [`Store::settle`]); this default
    /// settles when there are none and answers [`Committed::Invalid`] when there are: only the
    /// DynamoDB store commits DynamoDB writes.
    fn settle_with(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
        writes: &[TransactWriteItem],
        token: &str,
    ) -> impl Future<Output = Result<Committed, StoreError>> + Send {
        let _ = token;
        let empty = writes.is_empty();
        async move {
            if !empty {
                return Ok(Committed::Invalid {
                    message: "this store cannot commit DynamoDB writes: writes committed with the completion need the DynamoDB store".into(),
                });
            }
            Ok(match self.settle(target, settlement).await? {
                Fence::Held => Committed::Applied,
                Fence::Lost { current } => Committed::LeaseLost { current },
            })
        }
    }

    /// Deletes the target record (and its evidence) so that a retry executes afresh.
    fn release(&self, target: Target<'_>)
    -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// An operator's release: writes `released` (an expired FAILED record carrying the
    /// operator's audit, so that the next delivery claims afresh) where the record is still as
    /// `seen` (the same status and lease token, and, IN_PROGRESS, its lease run out at `now`;
    /// `None`: absent, or settled and expired), and
    /// deletes `evidence` (as seen: the same operation, status and creation) in the same write.
    /// `false`: one of them had changed; nothing was written.
    fn release_by_operator(
        &self,
        seen: Option<&Record>,
        evidence: Option<&Evidence>,
        released: &Record,
        now: SystemTime,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// An operator's settlement of evidence whose record is gone: `seen` (the same operation,
    /// status and creation) takes `settlement`'s status, result reference, time and audit, if
    /// its operation's record is still absent, or settled and expired at `now` (a redelivery
    /// that adopted the evidence meanwhile holds a live claim). `false`: either had changed;
    /// nothing was written.
    fn settle_evidence(
        &self,
        seen: &Evidence,
        settlement: &Settlement,
        now: SystemTime,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads the record of `key` as stored, expired or not.
    fn get(
        &self,
        key: &OperationKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Reads the permanent evidence of a business identity.
    fn evidence(
        &self,
        identity: &str,
    ) -> impl Future<Output = Result<Option<Evidence>, StoreError>> + Send;

    /// `Err` when this store's tables refuse the handler's own transactional writes
    /// (transactional steps, [`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with),
    /// an outbox), found by asking them: the DynamoDB store's idempotency table refuses them
    /// when it has multi-Region strong consistency, which accepts no `TransactWriteItems`
    /// ([`StoreError::TransactionalWritesUnsupported`]). [`Operation::prime`](crate::lambda::Operation::prime)
    /// asks it at init for an operation that declares such writes. This default accepts: a store
    /// that cannot commit DynamoDB writes refuses them at each write instead.
    fn check_transactional_writes(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// This store behind the one erased type the engine holds ([`AnyStore::new`]): boxed
    /// once. Leave it as it is; [`AnyStore`] itself answers `self`, so that erasing twice
    /// boxes nothing more.
    #[doc(hidden)]
    fn into_any_store(self) -> AnyStore
    where
        Self: Sized,
    {
        AnyStore::boxing(self)
    }
}
