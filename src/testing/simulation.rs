//! A seeded, deterministic simulation of the protocol: many workers and redeliveries of a few
//! operations; crashes, panics and suspensions at every boundary; clock jumps past leases and
//! retention; worker clocks skewed within the lease margin; TTL sweeps at random moments;
//! ambiguous and failing writes; reconcilers answering each way; an operator resolving what is
//! held. DESIGN's invariants are checked after every step; a broken one reports its seed, and
//! [`run_seed`] with that seed replays the same run.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lambda_idempotency::testing::simulation::{run_seed, memory_fixture, Budget};
//!
//! let stats = run_seed(memory_fixture(), 42, Budget::default()).await.unwrap_or_else(|v| panic!("{v}"));
//! println!("{} steps, {} invariant checks", stats.steps, stats.checks);
//! # }
//! ```

mod world;

use std::collections::BTreeMap;
use std::fmt;

use crate::store::{MemoryStore, Store};
use crate::testing::conformance::{Fixture, start_time};

use world::World;
pub use world::{Action, Answer, Behaviour};

/// How long one seed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Steps (deliveries, resumptions, clock jumps, sweeps, operator decisions) per seed.
    pub steps: usize,
    /// Operations the workers share.
    pub operations: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            steps: 60,
            operations: 3,
        }
    }
}

/// What a run explored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Seeds run.
    pub seeds: u64,
    /// Steps taken.
    pub steps: u64,
    /// Deliveries made.
    pub deliveries: u64,
    /// Invariant checks made.
    pub checks: u64,
    /// Faults injected, by store primitive and fault.
    pub faults: BTreeMap<String, u64>,
    /// Handler behaviours played, by name.
    pub behaviours: BTreeMap<String, u64>,
}

impl Stats {
    /// Adds `other`'s figures to these.
    pub fn absorb(&mut self, other: Stats) {
        self.seeds += other.seeds;
        self.steps += other.steps;
        self.deliveries += other.deliveries;
        self.checks += other.checks;
        for (name, count) in other.faults {
            *self.faults.entry(name).or_default() += count;
        }
        for (name, count) in other.behaviours {
            *self.behaviours.entry(name).or_default() += count;
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seeds {}, steps {}, deliveries {}, invariant checks {}",
            self.seeds, self.steps, self.deliveries, self.checks
        )?;
        for (name, count) in &self.behaviours {
            writeln!(f, "  handler {name}: {count}")?;
        }
        for (name, count) in &self.faults {
            writeln!(f, "  fault {name}: {count}")?;
        }
        Ok(())
    }
}

/// A broken invariant, with the seed that replays it and the steps that led there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The seed: `run_seed(fixture, seed, budget)` replays the run.
    pub seed: u64,
    /// The step at which the invariant broke.
    pub step: usize,
    /// Which invariant, and how.
    pub invariant: String,
    /// The steps taken, in order.
    pub trace: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} broke an invariant at step {}: {}",
            self.seed, self.step, self.invariant
        )?;
        writeln!(f, "replay it with SIM_SEED={}; the steps:", self.seed)?;
        for (index, step) in self.trace.iter().enumerate() {
            writeln!(f, "  {index:>3}. {step}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

/// Runs one seed on the fixture's (empty) store; `Err` names the broken invariant.
pub async fn run_seed<S: Store + Clone>(
    fixture: Fixture<S>,
    seed: u64,
    budget: Budget,
) -> Result<Stats, Violation> {
    let mut world = World::new(fixture, seed, budget);
    for step in 0..budget.steps {
        let action = world.choose();
        world.play(action).await;
        world.check(step).await?;
    }
    world.settle_everything(budget.steps).await?;
    Ok(world.stats())
}

/// Where a simulation's clock starts: off the whole second and the millisecond, as a real
/// clock is, so that times a store keeps at a coarser resolution are exercised.
pub fn sim_start_time() -> std::time::SystemTime {
    start_time() + std::time::Duration::from_nanos(1_234_567)
}

/// An empty in-memory store whose clock starts at [`sim_start_time`].
pub fn memory_fixture() -> Fixture<MemoryStore> {
    crate::testing::conformance::memory_fixture(sim_start_time())
}
