//! The store-level conformance cases catch a store that breaks a primitive's contract: a
//! store that applies a settlement whoever holds the lease (no fence) fails the fencing case,
//! and a store that drops its evidence fails the evidence case, while each correct store passes
//! them (the `conformance_tests!` modules).

use std::time::SystemTime;

use lambda_idempotency::error::StoreError;
use lambda_idempotency::key::OperationKey;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::record::{Evidence, Lease, Record, Settlement, StepRecord};
use lambda_idempotency::store::{
    Claim, Fence, Guard, MemoryStore, Store, Target, TransactionalStore,
};
use lambda_idempotency::testing::conformance::{
    Fixture, memory_fixture, start_time, store_fences_settlements_and_releases_on_the_lease,
    store_keeps_evidence_with_the_claim,
};

/// A broken store: its settlement applies under whatever lease stands, and it forgets
/// evidence; everything else is the memory store's.
#[derive(Debug, Clone)]
struct Broken(MemoryStore);

impl Store for Broken {
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
            // The defect: the guard is replaced by the standing record's own token.
            let Some(standing) = self.0.get(target.key).await? else {
                return self.0.settle(target, settlement).await;
            };
            let token = standing.lease.token;
            let unfenced = Target {
                guard: Guard::Lease(&token),
                ..target
            };
            self.0.settle(unfenced, settlement).await
        })
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
        _identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>> {
        Box::pin(async move {
            // The second defect: evidence is never found.
            Ok(None)
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}

fn broken() -> Fixture<Broken> {
    memory_fixture(start_time()).map_store(Broken)
}

#[tokio::test]
async fn an_unfenced_settlement_fails_the_fencing_case() {
    let verdict = tokio::spawn(store_fences_settlements_and_releases_on_the_lease(broken())).await;
    assert!(verdict.is_err(), "the case must fail on an unfenced store");
}

#[tokio::test]
async fn lost_evidence_fails_the_evidence_case() {
    let verdict = tokio::spawn(store_keeps_evidence_with_the_claim(broken())).await;
    assert!(
        verdict.is_err(),
        "the case must fail on a store that loses evidence"
    );
}
