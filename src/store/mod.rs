//! Where records live: a small trait of storage primitives, and its backends.
//!
//! The [`Store`] trait holds no policy: it does not hash, validate fingerprints or decide what
//! a status means. It offers conditional writes, each atomic, and every backend implements them
//! with the same semantics, which the conformance suite (`tests/`) checks on all of them:
//!
//! - [`Store::claim`] writes `record` if the key is absent, its record has expired
//!   (`expires_at < now`, second resolution), or it is IN_PROGRESS with an expired lease
//!   (millisecond resolution) *and the same fingerprint*; otherwise it returns the existing
//!   record, read in the same request.
//! - [`Store::settle`], [`Store::release`] and [`Store::set_attempt`] are fenced: they apply only
//!   while the record is IN_PROGRESS under the caller's lease token.
//!
//! Backends: [`MemoryStore`] (in-process) and [`DynamoDbStore`].

mod dynamodb;
mod memory;

use std::fmt;
use std::future::Future;
use std::time::SystemTime;

pub use dynamodb::{AttributeNames, DynamoDbStore, ENDPOINT_VAR, SortKey, TABLE_VAR};
pub use memory::MemoryStore;

use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Record, Settlement};

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the lease. `previous` is the record it replaced, if any: an expired
    /// record, or an IN_PROGRESS record whose lease had run out (a takeover).
    Acquired {
        /// The replaced record.
        previous: Option<Record>,
    },
    /// The key is held by a live record, returned as it stands.
    Existing(Record),
}

/// The answer to a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// The caller still held the lease; the write was applied.
    Held,
    /// The lease is no longer the caller's; nothing was written. `current` is the record as it
    /// stands, if any.
    Lost {
        /// The record as it stands.
        current: Option<Record>,
    },
}

/// Storage primitives for idempotency records.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Writes `record` (IN_PROGRESS, attempt 1) unless a live record holds its key.
    fn claim(
        &self,
        record: &Record,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Sets the attempt number of the caller's claim (after a takeover).
    fn set_attempt(
        &self,
        key: &OperationKey,
        lease_token: &str,
        attempt: u32,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// Moves the caller's claim to COMPLETED or FAILED with its outcome.
    fn settle(
        &self,
        key: &OperationKey,
        lease_token: &str,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// Deletes the caller's claim so that a retry executes afresh.
    fn release(
        &self,
        key: &OperationKey,
        lease_token: &str,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send;

    /// Reads the record of `key` as stored, expired or not.
    fn get(
        &self,
        key: &OperationKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
}
