//! What the store was asked to do to each record's existence, seen between the fault injector
//! and the store (so that a write that applied and whose answer was then lost counts): a claim
//! or an adoption that wrote a record, and a release that deleted one by design. The world
//! judges a missing record by it: absent is legitimate only where the operation was never
//! claimed in its life, a release deleted it, or a TTL sweep ran after it expired.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use aws_sdk_dynamodb::types::TransactWriteItem;

use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Evidence, Lease, Record, Settlement, StepRecord};
use crate::store::{Claim, Commit, Committed, Fence, Store, Target};

/// The latest write that changed whether a record exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Existence {
    /// A claim or an adoption wrote the record.
    Written,
    /// A fenced release deleted it (a retryable failure, a give-back before any intent).
    Released,
}

/// A store whose writes that create or delete a record are noted, by key, until taken.
#[derive(Debug, Clone)]
pub(super) struct Observed<S> {
    inner: S,
    marks: Arc<Mutex<HashMap<OperationKey, Existence>>>,
}

impl<S> Observed<S> {
    pub(super) fn new(inner: S) -> Self {
        Self {
            inner,
            marks: Arc::default(),
        }
    }

    /// The store observed.
    pub(super) fn inner(&self) -> &S {
        &self.inner
    }

    /// The latest existence-changing write per key since the last call.
    pub(super) fn take(&self) -> HashMap<OperationKey, Existence> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<OperationKey, Existence>> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn mark(&self, key: &OperationKey, existence: Existence) {
        self.lock().insert(key.clone(), existence);
    }
}

impl<S: Store + Clone> Store for Observed<S> {
    async fn claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        let claim = self.inner.claim(record, now).await;
        if let Ok(Claim::Acquired) = claim {
            self.mark(&record.key, Existence::Written);
        }
        claim
    }

    async fn adopt(
        &self,
        record: &Record,
        orphan: &Evidence,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        let claim = self.inner.adopt(record, orphan, now).await;
        if let Ok(Claim::Acquired) = claim {
            self.mark(&record.key, Existence::Written);
        }
        claim
    }

    async fn take_over(
        &self,
        previous: &Record,
        lease: &Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> Result<Fence, StoreError> {
        self.inner.take_over(previous, lease, expires_at, now).await
    }

    async fn shorten(&self, target: Target<'_>, until: SystemTime) -> Result<Fence, StoreError> {
        self.inner.shorten(target, until).await
    }

    async fn settle(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        self.inner.settle(target, settlement).await
    }

    async fn settle_with(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, StoreError> {
        self.inner
            .settle_with(target, settlement, writes, token)
            .await
    }

    async fn release(&self, target: Target<'_>) -> Result<Fence, StoreError> {
        let released = self.inner.release(target).await;
        if let Ok(Fence::Held) = released {
            self.mark(target.key, Existence::Released);
        }
        released
    }

    async fn record_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
    ) -> Result<Fence, StoreError> {
        self.inner.record_steps(target, steps).await
    }

    async fn commit_steps(
        &self,
        target: Target<'_>,
        commit: Commit<'_>,
    ) -> Result<Committed, StoreError> {
        self.inner.commit_steps(target, commit).await
    }

    async fn release_by_operator(
        &self,
        seen: Option<&Record>,
        evidence: Option<&Evidence>,
        released: &Record,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        // An operator's release writes an expired FAILED record: nothing goes missing.
        self.inner
            .release_by_operator(seen, evidence, released, now)
            .await
    }

    async fn settle_evidence(
        &self,
        seen: &Evidence,
        settlement: &Settlement,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        self.inner.settle_evidence(seen, settlement, now).await
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn evidence(&self, identity: &str) -> Result<Option<Evidence>, StoreError> {
        self.inner.evidence(identity).await
    }

    async fn check_transactional_writes(&self) -> Result<(), StoreError> {
        self.inner.check_transactional_writes().await
    }
}
