//! The seeded simulation on both stores, with CI's small budget. `SIM_SEED=n` replays one seed;
//! `SIM_SEEDS=n` runs more. The long run is `cargo bench --bench simulation --features testing`.

use std::sync::Arc;

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::testing::conformance::{Fixture, Sweeper};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::simulation::{
    Budget, Stats, memory_fixture, run_seed, sim_start_time,
};

fn seeds(default: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        return vec![seed.parse().expect("SIM_SEED is a number")];
    }
    let count =
        std::env::var("SIM_SEEDS").map_or(default, |n| n.parse().expect("SIM_SEEDS is a number"));
    (0..count).collect()
}

async fn dynamodb_fixture() -> Fixture<DynamoDbStore> {
    let clock = ManualClock::new(sim_start_time());
    let dynamo = Arc::new(dynamo::start_with_clock(clock.clone()).await);
    let store = dynamo.store();
    let sweep: Sweeper = Arc::new(move || {
        let dynamo = Arc::clone(&dynamo);
        Box::pin(async move { dynamo.sweep().await })
    });
    Fixture {
        store,
        clock,
        sweep,
    }
}

#[tokio::test]
async fn simulation_keeps_the_invariants_on_the_memory_store() {
    let mut total = Stats::default();
    for seed in seeds(300) {
        match run_seed(memory_fixture(), seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("memory store: {total}");
    assert!(total.checks > 0);
}

#[tokio::test]
async fn simulation_keeps_the_invariants_on_the_dynamodb_store() {
    let mut total = Stats::default();
    for seed in seeds(25) {
        match run_seed(dynamodb_fixture().await, seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("DynamoDB store: {total}");
    assert!(total.checks > 0);
}
