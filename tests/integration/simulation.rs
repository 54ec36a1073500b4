//! The seeded simulation on both stores, with CI's small budget. `SIM_SEED=n` replays one seed;
//! `SIM_SEEDS=n` runs more. The long run is `cargo bench --bench simulation --features testing`.

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
        match run_seed(
            dynamo::fixture(sim_start_time()).await,
            seed,
            Budget::default(),
        )
        .await
        {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("DynamoDB store: {total}");
    assert!(total.checks > 0);
}

#[tokio::test]
async fn simulation_keeps_the_invariants_through_the_in_process_cache() {
    let mut total = Stats::default();
    for seed in seeds(200) {
        let fixture = memory_fixture();
        let cached = lambda_idempotency::testing::conformance::Fixture {
            store: lambda_idempotency::store::CachedStore::new(fixture.store, 1 << 20),
            clock: fixture.clock,
            sweep: fixture.sweep,
        };
        match run_seed(cached, seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    assert!(total.checks > 0);
}
