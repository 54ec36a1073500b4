//! The simulation catches a store that breaks what it checks: a store that loses a completed
//! record (here, outside the crate, as a store of a user's own would) breaks a seed.

use std::time::SystemTime;

use lambda_idempotency::error::StoreError;
use lambda_idempotency::key::OperationKey;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};
use lambda_idempotency::store::{Claim, Fence, MemoryStore, Store, Target, TransactionalStore};
use lambda_idempotency::testing::simulation::{Budget, memory_fixture, run_seed};

/// A broken store: it acknowledges a completion and loses the record instead (deletes it,
/// without TTL, without a release the engine asked for). Every other call is the memory
/// store's.
#[derive(Debug, Clone)]
struct LosesCompletions(MemoryStore);

impl Store for LosesCompletions {
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
        Box::pin(async move {
            if settlement.status != Status::Completed {
                return self.0.settle(target, settlement).await;
            }
            // The record (alone: its evidence stays) is gone, and the caller told it completed.
            let lost = Target {
                identity: None,
                ..target
            };
            self.0.release(lost).await
        })
    }
    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.release(target)
    }

    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        self.0.record_steps(target, steps)
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
        None
    }
}

/// A store that loses a COMPLETED record (no TTL, no release, no operator) breaks a seed:
/// the missing record is reported, never taken for a new life whose re-run nobody judges.
#[tokio::test]
async fn a_store_that_loses_a_completed_record_breaks_a_seed() {
    let mut broken = 0;
    for seed in 0..20 {
        let fixture = memory_fixture().map_store(LosesCompletions);
        match run_seed(fixture, seed, Budget::default()).await {
            Ok(_) => {}
            Err(violation) => {
                assert!(
                    violation.invariant.contains("its record is missing"),
                    "seed {seed}: another invariant broke first: {violation}"
                );
                broken += 1;
            }
        }
    }
    assert!(
        broken >= 18,
        "only {broken} of 20 seeds caught the lost record"
    );
}
