//! The erased store: [`AnyStore`] holds any [`Store`] as `dyn Store`. The engine holds its
//! store as one ([`Idempotency::new`](crate::Idempotency::new) erases it once), so that no type
//! a user names carries a store parameter; decorators ([`CachedStore<S>`](super::CachedStore))
//! stay generic, and erase with the store they wrap.

use std::any::Any;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::future::BoxFuture;

use super::{Claim, DynamoDbStore, Fence, MemoryStore, Store, Target, TransactionalStore};
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Evidence, Lease, Record, Settlement, StepRecord};

/// Any store, erased; cheap to clone. What the engine holds ([`Idempotency::store`](crate::Idempotency::store)).
///
/// ```
/// use lambda_idempotency::store::{AnyStore, MemoryStore};
/// use lambda_idempotency::Idempotency;
///
/// // A store chosen at run time (DynamoDB in Lambda, memory in a handler's own tests):
/// let store = AnyStore::new(MemoryStore::new());
/// let idem = Idempotency::new(store); // taken as it is, not erased again
/// assert!(idem.store().downcast_ref::<MemoryStore>().is_some());
/// ```
#[derive(Debug, Clone)]
pub struct AnyStore(Arc<dyn Store>);

impl AnyStore {
    /// `store`, erased (an `AnyStore` is taken as it is, not wrapped again).
    pub fn new(store: impl Store) -> Self {
        let erased: Arc<dyn Store> = Arc::new(store);
        match (&*erased as &dyn Any).downcast_ref::<Self>() {
            Some(already) => already.clone(),
            None => Self(erased),
        }
    }

    /// The store behind the one type, if it is an `S`: for what only that backend offers
    /// (a [`DynamoDbStore`]'s scans, a [`CachedStore`](super::CachedStore)'s figures).
    ///
    /// ```
    /// use lambda_idempotency::Idempotency;
    /// use lambda_idempotency::store::MemoryStore;
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// assert!(idem.store().downcast_ref::<MemoryStore>().is_some());
    /// ```
    pub fn downcast_ref<S: Store>(&self) -> Option<&S> {
        (&*self.0 as &dyn Any).downcast_ref::<S>()
    }
}

impl From<DynamoDbStore> for AnyStore {
    fn from(store: DynamoDbStore) -> Self {
        Self::new(store)
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        Self::new(store)
    }
}

/// The one forwarding point: each method hands on the erased store's own future, boxed once
/// by that store, never again here.
impl Store for AnyStore {
    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.0.claim(record, now)
    }

    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.0.adopt(record, orphan, now)
    }

    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.take_over(previous, lease, expires_at, now)
    }

    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.shorten(target, until)
    }

    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.settle(target, settlement)
    }

    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.record_steps(target, steps)
    }

    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.release(target)
    }

    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.0.release_by_operator(seen, evidence, released, now)
    }

    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.0.settle_evidence(seen, settlement, now)
    }

    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.0.get(key)
    }

    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>> {
        self.0.evidence(identity)
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.0.transactional()
    }
}
