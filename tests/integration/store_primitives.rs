//! The store-level conformance cases catch a store that breaks a primitive's contract: a
//! store that applies a settlement whoever holds the lease (no fence) fails the fencing case,
//! and a store that drops its evidence fails the evidence case, while each correct store passes
//! them (the `conformance_tests!` modules).

use std::time::SystemTime;

use lambda_idempotency::error::StoreError;
use lambda_idempotency::key::OperationKey;
use lambda_idempotency::record::{Evidence, Lease, Record, Settlement};
use lambda_idempotency::store::{Claim, Fence, Guard, MemoryStore, Store, Target};
use lambda_idempotency::testing::conformance::{
    Fixture, memory_fixture, start_time, store_fences_settlements_and_releases_on_the_lease,
    store_keeps_evidence_with_the_claim,
};

/// A broken store: its settlement applies under whatever lease stands, and it forgets
/// evidence; everything else is the memory store's.
#[derive(Debug, Clone)]
struct Broken(MemoryStore);

impl Store for Broken {
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
    }

    async fn release(&self, target: Target<'_>) -> Result<Fence, StoreError> {
        self.0.release(target).await
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

    async fn evidence(&self, _identity: &str) -> Result<Option<Evidence>, StoreError> {
        // The second defect: evidence is never found.
        Ok(None)
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
