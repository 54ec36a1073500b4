//! The erased store: [`AnyStore`] holds any [`Store`] as `dyn Store`. The engine holds its
//! store as one ([`Idempotency::new`](crate::Idempotency::new) erases it once), so that no type
//! a user names carries a store parameter; decorators ([`CachedStore<S>`](super::CachedStore))
//! stay generic, and erase with the store they wrap.

use futures_util::future::BoxFuture;
use std::any::Any;
use std::sync::Arc;

use super::{Answer, DynamoDbStore, MemoryStore, Request, Store, TransactionalStore};
use crate::error::StoreError;

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

/// Hands each request on to the erased store's own future, boxed once by that store, never
/// again here.
impl Store for AnyStore {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        self.0.call(request)
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.0.transactional()
    }
}
