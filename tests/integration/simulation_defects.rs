//! The simulation catches a store that breaks what it checks: a store that loses a completed
//! record (here, outside the crate, as a store of a user's own would) breaks a seed.

use lambda_idempotency::testing::simulation::{Budget, memory_fixture, run_seed};

use crate::broken_stores::Defect;

/// A store that loses a COMPLETED record (no TTL, no release, no operator) breaks a seed:
/// the missing record is reported, never taken for a new life whose re-run nobody judges.
#[tokio::test]
async fn a_store_that_loses_a_completed_record_breaks_a_seed() {
    let mut broken = 0;
    for seed in 0..20 {
        let fixture = memory_fixture().map_store(|store| Defect::LostCompletions.put_into(store));
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
