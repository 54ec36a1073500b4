//! The long run of the seeded simulation: `cargo bench --bench simulation --features testing --
//! [--seeds N] [--from SEED] [--steps N] [--store memory|dynamodb]` (default: 100,000 seeds on the
//! memory store). Prints seeds explored, steps, deliveries, invariant checks, handler behaviours
//! and faults injected per store primitive; a broken invariant prints its seed and steps and
//! exits with status 1 (replay it with `SIM_SEED=n cargo test --features testing simulation`).

use std::time::Instant;

use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::simulation::{
    Budget, Stats, memory_fixture, run_seed, sim_start_time,
};

struct Args {
    seeds: u64,
    from: u64,
    steps: usize,
    dynamodb: bool,
}

fn args() -> Args {
    let mut args = Args {
        seeds: 100_000,
        from: 0,
        steps: Budget::default().steps,
        dynamodb: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().unwrap_or_default();
        match flag.as_str() {
            "--seeds" => args.seeds = value().parse().unwrap_or(args.seeds),
            "--from" => args.from = value().parse().unwrap_or(args.from),
            "--steps" => args.steps = value().parse().unwrap_or(args.steps),
            "--store" => args.dynamodb = value() == "dynamodb",
            _ => {} // cargo bench passes --bench
        }
    }
    args
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = args();
    let budget = Budget {
        steps: args.steps,
        ..Budget::default()
    };
    let store = if args.dynamodb {
        "DynamoDB (embedded server)"
    } else {
        "memory"
    };
    println!(
        "simulation: {} seeds from {} on the {store} store, {} steps each",
        args.seeds, args.from, budget.steps
    );
    let started = Instant::now();
    let mut total = Stats::default();
    for seed in args.from..args.from + args.seeds {
        let outcome = if args.dynamodb {
            let fixture = dynamo::fixture(sim_start_time()).await;
            run_seed(fixture, seed, budget).await
        } else {
            run_seed(memory_fixture(), seed, budget).await
        };
        match outcome {
            Ok(stats) => total.absorb(stats),
            Err(violation) => {
                println!("{violation}");
                std::process::exit(1);
            }
        }
    }
    let elapsed = started.elapsed();
    print!("{total}");
    println!(
        "no invariant broken; {:.1} s, {:.0} seeds/s",
        elapsed.as_secs_f64(),
        total.seeds as f64 / elapsed.as_secs_f64()
    );
}
