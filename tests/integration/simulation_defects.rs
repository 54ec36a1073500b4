//! The simulation catches a store that breaks what it checks: a store that loses a completed
//! record (here, outside the crate, as a store of a user's own would) breaks a seed.

use lambda_idempotency::defects;
use lambda_idempotency::testing::dynamo::{self, memory_fixture_with_tables};
use lambda_idempotency::testing::simulation::{Budget, memory_fixture, run_seed, sim_start_time};

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

/// Where a case's seeds run: the memory store alone, or with the handler's tables (its
/// transactional handlers, their outbox and its relay and sweeper, on an embedded server).
#[derive(Debug, Clone, Copy)]
enum Store {
    Memory,
    MemoryWithTables,
    /// The DynamoDB store on the embedded server (or `DYNAMODB_ENDPOINT`), whose step lists
    /// the simulation rewrites in another build's bytes.
    DynamoDb,
}

/// Historical defects put back into the real engine behind their switches
/// (`lambda_idempotency::defects`), each breaking a seed of the range named here with the
/// invariant named here (the first seeds that show each, on this simulation).
#[test]
fn historical_defects_put_back_in_the_engine_break_seeds() {
    let cases = [
        (
            "a settlement that gives up after two tries",
            defects::SETTLE_GIVES_UP_EARLY,
            Store::Memory,
            0..10,
            "the settlement gave up though its outage ended",
        ),
        (
            "an IN_PROGRESS record that expires into a blind re-run",
            defects::IN_PROGRESS_EXPIRES,
            Store::Memory,
            0..10,
            "re-ran the handler after a run that may have acted",
        ),
        (
            "a give-back without grace",
            defects::GIVE_BACK_WITHOUT_GRACE,
            Store::Memory,
            0..10,
            "took effect 2 times",
        ),
        (
            "a takeover that runs an uncertain step again without its check",
            defects::UNCERTAIN_STEP_RERUN,
            Store::Memory,
            0..10,
            "took effect 2 times",
        ),
        (
            "a takeover that ignores a knowing give-back's mark",
            defects::GIVEN_BACK_HELD,
            Store::Memory,
            10..20,
            "held it INDETERMINATE instead of replaying its steps",
        ),
        (
            "a settlement of the identity the deployment declares",
            defects::IDENTITY_FROM_DEPLOYMENT,
            Store::MemoryWithTables,
            0..10,
            "but the evidence of its identity is",
        ),
        (
            "a refused completion released under the default recovery",
            defects::REFUSED_COMPLETION_RELEASED,
            Store::MemoryWithTables,
            10..20,
            "released for a blind re-run instead of held",
        ),
        (
            "an outbox event id without its execution",
            defects::EVENT_ID_WITHOUT_EXECUTION,
            Store::MemoryWithTables,
            0..10,
            "an outbox event and its write disagree",
        ),
        (
            "an outbox without a sweeper (0.4's)",
            defects::NO_SWEEPER,
            Store::MemoryWithTables,
            14..24,
            "still pending after the relay and the sweeper drained",
        ),
        (
            "a takeover conditioned on the step list's re-encoded bytes",
            defects::TAKEOVER_ON_REENCODED_BYTES,
            Store::DynamoDb,
            4..14,
            "but no live lease of that attempt stands",
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    for (defect, switch, store, seeds, broken) in cases {
        let found = seeds.clone().find_map(|seed| {
            let run = defects::reintroduced(switch, || {
                runtime.block_on(async {
                    match store {
                        Store::Memory => run_seed(memory_fixture(), seed, Budget::default()).await,
                        Store::MemoryWithTables => {
                            let fixture = memory_fixture_with_tables(sim_start_time()).await;
                            run_seed(fixture, seed, Budget::default()).await
                        }
                        Store::DynamoDb => {
                            let fixture = dynamo::fixture(sim_start_time()).await;
                            run_seed(fixture, seed, Budget::default()).await
                        }
                    }
                })
            });
            run.err()
        });
        let violation =
            found.unwrap_or_else(|| panic!("{defect}: no seed of {seeds:?} broke ({store:?})"));
        assert!(
            violation.invariant.contains(broken),
            "{defect}: found, but by another invariant than \"{broken}\": {violation}"
        );
        eprintln!("{defect}: {violation}");
    }
}
