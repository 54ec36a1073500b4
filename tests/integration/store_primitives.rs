//! The store-level conformance cases catch a store that breaks a primitive's contract: a
//! store that applies a settlement whoever holds the lease (no fence) fails the fencing case,
//! and a store that drops its evidence fails the evidence case, while each correct store passes
//! them (the `conformance_tests!` modules).

use lambda_idempotency::testing::conformance::{
    Fixture, memory_fixture, start_time, store_fences_settlements_and_releases_on_the_lease,
    store_keeps_evidence_with_the_claim,
};

use crate::broken_stores::{Broken, Defect};

fn broken(defect: Defect) -> Fixture<Broken> {
    memory_fixture(start_time()).map_store(|store| defect.put_into(store))
}

#[tokio::test]
async fn an_unfenced_settlement_fails_the_fencing_case() {
    let verdict = tokio::spawn(store_fences_settlements_and_releases_on_the_lease(broken(
        Defect::UnfencedSettlements,
    )))
    .await;
    assert!(verdict.is_err(), "the case must fail on an unfenced store");
}

#[tokio::test]
async fn lost_evidence_fails_the_evidence_case() {
    let verdict = tokio::spawn(store_keeps_evidence_with_the_claim(broken(
        Defect::LostEvidence,
    )))
    .await;
    assert!(
        verdict.is_err(),
        "the case must fail on a store that loses evidence"
    );
}
