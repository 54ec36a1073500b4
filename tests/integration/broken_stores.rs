//! Memory stores with one defect put in, for the checks that must catch it: a harness shows
//! that it catches a real defect (the conformance cases, the simulation).

use std::time::SystemTime;

use lambda_idempotency::error::StoreError;
use lambda_idempotency::key::OperationKey;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};
use lambda_idempotency::store::{
    Claim, Fence, Guard, MemoryStore, Store, Target, TransactionalStore,
};

/// The defect a [`Broken`] store has; everything else is the memory store's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// A settlement applies under whatever lease stands: no fence.
    UnfencedSettlements,
    /// Evidence of a business identity is never found.
    LostEvidence,
    /// A completion is acknowledged and its record (alone: its evidence stays) deleted
    /// instead, without TTL, without a release the engine asked for.
    LostCompletions,
}

/// A memory store with one [`Defect`].
#[derive(Debug, Clone)]
pub struct Broken {
    inner: MemoryStore,
    defect: Defect,
}

impl Defect {
    /// Puts the defect into `inner` (for [`Fixture::map_store`](lambda_idempotency::testing::conformance::Fixture::map_store)).
    pub fn put_into(self, inner: MemoryStore) -> Broken {
        Broken {
            inner,
            defect: self,
        }
    }
}

impl Broken {
    async fn settle_broken(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        match self.defect {
            Defect::UnfencedSettlements => {
                // The guard is replaced by the standing record's own token.
                let Some(standing) = self.inner.get(target.key).await? else {
                    return self.inner.settle(target, settlement).await;
                };
                let token = standing.lease.token;
                let unfenced = Target {
                    guard: Guard::Lease(&token),
                    ..target
                };
                self.inner.settle(unfenced, settlement).await
            }
            Defect::LostCompletions if settlement.status == Status::Completed => {
                let lost = Target {
                    identity: None,
                    ..target
                };
                self.inner.release(lost).await
            }
            _ => self.inner.settle(target, settlement).await,
        }
    }
}

impl Store for Broken {
    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.inner.claim(record, now)
    }

    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.inner.adopt(record, orphan, now)
    }

    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.inner.take_over(previous, lease, expires_at, now)
    }

    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.inner.shorten(target, until)
    }

    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        Box::pin(self.settle_broken(target, settlement))
    }

    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.inner.record_steps(target, steps)
    }

    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.inner.release(target)
    }

    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner
            .release_by_operator(seen, evidence, released, now)
    }

    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.settle_evidence(seen, settlement, now)
    }

    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.inner.get(key)
    }

    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>> {
        match self.defect {
            Defect::LostEvidence => Box::pin(async { Ok(None) }),
            _ => self.inner.evidence(identity),
        }
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}
