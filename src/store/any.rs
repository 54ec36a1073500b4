//! The erased store: [`AnyStore`] holds any [`Store`] behind one type. The engine holds its
//! store as one ([`Idempotency::new`](crate::Idempotency::new) erases it once), so that no type
//! a user names carries a store parameter; decorators ([`CachedStore<S>`](super::CachedStore))
//! stay generic, and erase with the store they wrap.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use aws_sdk_dynamodb::types::TransactWriteItem;

use super::{Claim, Commit, Committed, DynamoDbStore, Fence, MemoryStore, Store, Target};
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::reconcile::BoxFuture;
use crate::record::{Evidence, Lease, Record, Settlement, StepRecord};

/// Any store, erased; cheap to clone. What the engine holds ([`Idempotency::store`](crate::Idempotency::store)).
///
/// ```
/// use lambda_idempotency::store::{AnyStore, MemoryStore};
/// use lambda_idempotency::Idempotency;
///
/// // A store chosen at run time (DynamoDB in Lambda, memory in a handler's own tests):
/// let store = AnyStore::new(MemoryStore::new());
/// let idem = Idempotency::new(store); // taken as it is, not boxed again
/// assert!(idem.store().downcast_ref::<MemoryStore>().is_some());
/// ```
#[derive(Clone)]
pub struct AnyStore(Arc<dyn DynStore>);

impl AnyStore {
    /// `store`, behind the one type (an `AnyStore` is taken as it is, not boxed again).
    pub fn new(store: impl Store) -> Self {
        store.into_any_store()
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
        self.0.as_any().downcast_ref::<S>()
    }

    /// `store` behind the one type: the boxing every other store gets.
    pub(crate) fn boxing(store: impl Store) -> Self {
        Self(Arc::new(store))
    }
}

impl fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AnyStore").field(&self.0).finish()
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

/// [`Store`] with boxed futures: usable as a trait object.
trait DynStore: Send + Sync + fmt::Debug + 'static {
    fn as_any(&self) -> &dyn Any;
    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>>;
    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>>;
    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>>;
    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>>;
    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<Fence, StoreError>>;
    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>>;
    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>>;
    fn commit_steps<'a>(
        &'a self,
        target: Target<'a>,
        commit: Commit<'a>,
    ) -> BoxFuture<'a, Result<Committed, StoreError>>;
    fn settle_with<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>>;
    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;
    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>>;
    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

impl<S: Store> DynStore for S {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(Store::claim(self, record, now))
    }

    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(Store::adopt(self, record, orphan, now))
    }

    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(Store::take_over(self, previous, lease, expires_at, now))
    }

    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(Store::shorten(self, target, until))
    }

    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(Store::settle(self, target, settlement))
    }

    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(Store::release(self, target))
    }

    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(Store::record_steps(self, target, steps))
    }

    fn commit_steps<'a>(
        &'a self,
        target: Target<'a>,
        commit: Commit<'a>,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(Store::commit_steps(self, target, commit))
    }

    fn settle_with<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(Store::settle_with(self, target, settlement, writes, token))
    }

    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::release_by_operator(
            self, seen, evidence, released, now,
        ))
    }

    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::settle_evidence(self, seen, settlement, now))
    }

    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(Store::get(self, key))
    }

    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>> {
        Box::pin(Store::evidence(self, identity))
    }

    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(Store::check_transactional_writes(self))
    }
}

/// Each method awaits the erased store's one boxed future: the engine boxes nothing again.
impl Store for AnyStore {
    fn into_any_store(self) -> AnyStore {
        self
    }

    async fn claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        self.0.claim(record, now).await
    }

    async fn adopt(
        &self,
        record: &Record,
        orphan: &Evidence,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        self.0.adopt(record, orphan, now).await
    }

    async fn take_over(
        &self,
        previous: &Record,
        lease: &Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> Result<Fence, StoreError> {
        self.0.take_over(previous, lease, expires_at, now).await
    }

    async fn shorten(&self, target: Target<'_>, until: SystemTime) -> Result<Fence, StoreError> {
        self.0.shorten(target, until).await
    }

    async fn settle(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        self.0.settle(target, settlement).await
    }

    async fn release(&self, target: Target<'_>) -> Result<Fence, StoreError> {
        self.0.release(target).await
    }

    async fn record_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
    ) -> Result<Fence, StoreError> {
        self.0.record_steps(target, steps).await
    }

    async fn commit_steps(
        &self,
        target: Target<'_>,
        commit: Commit<'_>,
    ) -> Result<Committed, StoreError> {
        self.0.commit_steps(target, commit).await
    }

    async fn settle_with(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, StoreError> {
        self.0.settle_with(target, settlement, writes, token).await
    }

    async fn release_by_operator(
        &self,
        seen: Option<&Record>,
        evidence: Option<&Evidence>,
        released: &Record,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        self.0
            .release_by_operator(seen, evidence, released, now)
            .await
    }

    async fn settle_evidence(
        &self,
        seen: &Evidence,
        settlement: &Settlement,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        self.0.settle_evidence(seen, settlement, now).await
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }

    async fn evidence(&self, identity: &str) -> Result<Option<Evidence>, StoreError> {
        self.0.evidence(identity).await
    }

    async fn check_transactional_writes(&self) -> Result<(), StoreError> {
        self.0.check_transactional_writes().await
    }
}
