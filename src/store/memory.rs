//! An in-process store with the same semantics as the DynamoDB store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Record, Settlement, Status};
use crate::store::{Claim, Fence, Store};

/// Records in a map behind a mutex; clones share the map.
///
/// For unit tests, the demo and single-process use. It never forgets a record by itself:
/// like DynamoDB before TTL deletion, it keeps expired records and treats them as absent.
/// [`MemoryStore::sweep_expired`] deletes them, as TTL eventually does.
///
/// ```
/// use lambda_idempotency::store::MemoryStore;
/// let store = MemoryStore::new();
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<OperationKey, Record>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records it holds, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Deletes the records expired at `now`, as DynamoDB TTL eventually does; returns how many.
    pub fn sweep_expired(&self, now: SystemTime) -> usize {
        let mut records = self.lock();
        let before = records.len();
        records.retain(|_, record| !record.is_expired(now));
        before - records.len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<OperationKey, Record>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `write` to the record of `key` if the caller holds its IN_PROGRESS lease.
    fn fenced(
        &self,
        key: &OperationKey,
        lease_token: &str,
        write: impl FnOnce(&mut HashMap<OperationKey, Record>),
    ) -> Fence {
        let mut records = self.lock();
        match records.get(key) {
            Some(record)
                if record.status == Status::InProgress && record.lease.token == lease_token =>
            {
                write(&mut records);
                Fence::Held
            }
            current => Fence::Lost {
                current: current.cloned(),
            },
        }
    }
}

impl Store for MemoryStore {
    async fn claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        let mut records = self.lock();
        match records.get(&record.key) {
            Some(existing) if !existing.yields_to(record, now) => {
                Ok(Claim::Existing(existing.clone()))
            }
            _ => Ok(Claim::Acquired {
                previous: records.insert(record.key.clone(), record.clone()),
            }),
        }
    }

    async fn set_attempt(
        &self,
        key: &OperationKey,
        lease_token: &str,
        attempt: u32,
    ) -> Result<Fence, StoreError> {
        Ok(self.fenced(key, lease_token, |records| {
            if let Some(record) = records.get_mut(key) {
                record.lease.attempt = attempt;
            }
        }))
    }

    async fn settle(
        &self,
        key: &OperationKey,
        lease_token: &str,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        Ok(self.fenced(key, lease_token, |records| {
            if let Some(record) = records.get_mut(key) {
                record.status = settlement.status;
                record.outcome = Some(settlement.outcome.clone());
                record.expires_at = settlement.expires_at;
                record.completed_at = Some(settlement.completed_at);
            }
        }))
    }

    async fn release(&self, key: &OperationKey, lease_token: &str) -> Result<Fence, StoreError> {
        Ok(self.fenced(key, lease_token, |records| {
            records.remove(key);
        }))
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(key).cloned())
    }
}
