//! Memory stores with one defect put in, for the checks that must catch it: a harness shows
//! that it catches a real defect (the conformance cases, the simulation).

use lambda_idempotency::error::StoreError;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::record::{Settlement, Status};
use lambda_idempotency::store::{
    Answer, Fence, Guard, MemoryStore, Request, Store, StoreExt, Target, TransactionalStore,
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
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        match (request, self.defect) {
            (Request::Settle { target, settlement }, _) => Box::pin(async move {
                self.settle_broken(target, settlement)
                    .await
                    .map(Answer::Fence)
            }),
            (Request::Evidence { .. }, Defect::LostEvidence) => {
                Box::pin(async { Ok(Answer::Evidence(None)) })
            }
            _ => self.inner.call(request),
        }
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}
