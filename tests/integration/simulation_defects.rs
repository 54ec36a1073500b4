//! The simulation catches a store that breaks what it checks: a store that loses a completed
//! record (here, outside the crate, as a store of a user's own would) breaks a seed.

use lambda_idempotency::defects;
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

/// Historical defects put back into the real engine behind their switches
/// (`lambda_idempotency::defects`), each breaking a seed of the first ten with the invariant
/// named here, on the memory store.
#[test]
fn historical_defects_put_back_in_the_engine_break_seeds() {
    let cases = [
        (
            "a settlement that gives up after two tries",
            defects::SETTLE_GIVES_UP_EARLY,
            "the settlement gave up though its outage ended",
        ),
        (
            "an IN_PROGRESS record that expires into a blind re-run",
            defects::IN_PROGRESS_EXPIRES,
            "re-ran the handler after a run that may have acted",
        ),
        (
            "a give-back without grace",
            defects::GIVE_BACK_WITHOUT_GRACE,
            "took effect 2 times",
        ),
        (
            "a takeover that runs an uncertain step again without its check",
            defects::UNCERTAIN_STEP_RERUN,
            "took effect 2 times",
        ),
    ];
    for (defect, switch, broken) in cases {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let found = (0..10).find_map(|seed| {
            let run = defects::reintroduced(switch, || {
                runtime.block_on(run_seed(memory_fixture(), seed, Budget::default()))
            });
            run.err()
        });
        let violation = found.unwrap_or_else(|| panic!("{defect}: no seed of ten broke"));
        assert!(
            violation.invariant.contains(broken),
            "{defect}: found, but by another invariant than \"{broken}\": {violation}"
        );
        eprintln!("{defect}: {violation}");
    }
}
