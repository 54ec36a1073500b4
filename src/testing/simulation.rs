//! A seeded, deterministic simulation of the protocol: many workers and redeliveries of a few
//! operations; crashes, panics and suspensions at every boundary; clock jumps past leases and
//! retention; worker clocks skewed within the lease margin; TTL sweeps at random moments;
//! ambiguous and failing writes, and store outages of 1, 5 and 30 s after an effect; workers
//! with a reconciler (answering each way) and workers without one, each with its declared
//! recovery policy; ids past 2^53 at the double-rounding anchors and their neighbours (two
//! operations of one seed that RFC 8785 alone would make one key), the 0.1 compatibility rule
//! on for half the seeds, and deliveries of a key with a neighbouring amount; tenants sharing
//! identity strings, deploys that add, change or remove an identity between attempts; step
//! lists rewritten as another build encodes them; step effects whose answer times out and that
//! land seconds later (the handler then failing or cancelled); handlers failing after a done
//! step; completions refused by their condition; an operator resolving what is held.
//!
//! The simulation judges by the contract, not by the code under test: its ledger counts every
//! run of a handler (crashed, killed or failed ones too) and excuses a re-run only by the
//! previous run's retryable failure, an operator's release, a reconciler's `NotApplied` or the
//! worker's declared [`Recovery::Rerun`](crate::reconcile::Recovery::Rerun). An operation
//! starts a new life only where the contract forgets it: its record settled and expired, or
//! gone where a release deleted it or a TTL sweep ran after its expiry; a record missing
//! otherwise is a broken invariant. Every answer a worker gets, value or error of any variant,
//! is judged in one place against the ledger and the store (a replay against an outcome of
//! this life, `AlreadyInProgress` against a live lease, `Indeterminate` against a hold,
//! `KeyExpiredConflict` against standing evidence, a store error against a fault fired in its
//! step), and a settlement that gave up with its deadline still ahead is a broken contract.
//! Injected faults are counted per primitive and kind, outages' failures apart. Where the protocol guide's decision table names the path, the answer is
//! checked against the table: a knowing give-back after a done step is replayed, a refused
//! completion without steps is held under the default, an attempt whose step list another
//! build encoded is taken over. DESIGN's invariants are checked after every step; a broken one reports its
//! seed, and [`run_seed`] with that seed replays the same run.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lambda_idempotency::testing::simulation::{run_seed, memory_fixture, Budget};
//!
//! let stats = run_seed(memory_fixture(), 42, Budget::default()).await.unwrap_or_else(|v| panic!("{v}"));
//! println!("{} steps, {} invariant checks", stats.steps, stats.checks);
//! # }
//! ```

mod actors;
mod formats;
mod invariants;
mod ledger;
#[cfg(feature = "relay")]
mod outbox_relay;
mod schedule;
mod steps;
mod transactional;
mod world;

use std::collections::BTreeMap;
use std::fmt;

use crate::store::{MemoryStore, Store};
use crate::testing::conformance::{Fixture, start_time};

pub use actors::{AfterTimeout, Answer, Behaviour};
pub use formats::Encoding;
#[cfg(feature = "relay")]
pub use outbox_relay::PublishFault;
use world::World;
pub use world::{Action, Deploy};

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
#[non_exhaustive]
pub struct Stats {
    /// Seeds run.
    pub seeds: u64,
    /// Steps taken.
    pub steps: u64,
    /// Deliveries made.
    pub deliveries: u64,
    /// Invariant checks made.
    pub checks: u64,
    /// Faults injected into one call, by store primitive and fault (`claim FailBefore(Throttled)`);
    /// the failures outages made are counted apart, in `outage_failures`.
    pub faults: BTreeMap<String, u64>,
    /// Calls an outage failed, by store primitive and kind (`settle Throttled`).
    pub outage_failures: BTreeMap<String, u64>,
    /// Handler behaviours played, by name.
    pub behaviours: BTreeMap<String, u64>,
    /// Deliveries by what a deploy did to the identity, by name.
    pub deploys: BTreeMap<String, u64>,
    /// Reconciler answers, by name (`Applied`, `NotApplied`, `Unknown`, `Fails`).
    pub reconciles: BTreeMap<String, u64>,
    /// Leases of crashed attempts taken over.
    pub takeovers: u64,
    /// Re-runs the workers' declared recovery policy excused.
    pub declared_reruns: u64,
    /// Store outages that began (a handler reached its effect with one planned).
    pub outages: u64,
    /// What transactional operations committed, as their tables show at the end of each
    /// seed: `reservations` (a transactional step's write), `events` (its outbox event),
    /// `completions` (a write carried by the settlement).
    pub transactions: BTreeMap<String, u64>,
    /// Seeds run with the 0.1 compatibility rule on (a cut-over after every record of the run).
    pub compatible_seeds: u64,
    /// Deliveries, under the 0.1 compatibility rule, of an id whose 0.1 key is another
    /// operation's (its anchor's) while that operation's record stood.
    pub anchors: u64,
    /// Deliveries of a key with a neighbouring amount refused as payload conflicts.
    pub changed_amounts: u64,
    /// Step lists of IN_PROGRESS records rewritten as another build encodes them.
    pub re_encoded: u64,
    /// Takeovers of an attempt whose step list another build encoded.
    pub re_encoded_takeovers: u64,
    /// Step effects whose answer timed out that landed downstream later.
    pub late_effects: u64,
    /// Deliveries answered `AlreadyInProgress` while a given-back step's effect was in flight.
    pub graces: u64,
    /// First takeovers of a knowing give-back after a done step that replayed its steps.
    pub give_backs_replayed: u64,
    /// Completions refused by their condition without steps, held or released.
    pub refused_completions: u64,
    /// What the outbox's relay, sweeper, stream and consumer did (feature `relay`, on a store
    /// beside which the handler has tables of its own), by name.
    pub outbox: BTreeMap<String, u64>,
}

impl Stats {
    /// The injected fault kinds that fired, whatever the primitive (e.g.
    /// `FailBefore(Throttled)`); outages' failures are not among them.
    pub fn fault_kinds(&self) -> BTreeMap<String, u64> {
        let mut kinds = BTreeMap::new();
        for (name, count) in &self.faults {
            let kind = name.split_once(' ').map_or(name.as_str(), |(_, kind)| kind);
            *kinds.entry(kind.to_owned()).or_default() += count;
        }
        kinds
    }

    /// The injected fault kinds that fired on one primitive (by its name, e.g. `claim`).
    pub fn faults_on(&self, primitive: &str) -> BTreeMap<String, u64> {
        self.faults
            .iter()
            .filter_map(|(name, count)| {
                let (on, kind) = name.split_once(' ')?;
                (on == primitive).then(|| (kind.to_owned(), *count))
            })
            .collect()
    }
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
        for (name, count) in other.outage_failures {
            *self.outage_failures.entry(name).or_default() += count;
        }
        for (name, count) in other.behaviours {
            *self.behaviours.entry(name).or_default() += count;
        }
        for (name, count) in other.deploys {
            *self.deploys.entry(name).or_default() += count;
        }
        for (name, count) in other.reconciles {
            *self.reconciles.entry(name).or_default() += count;
        }
        self.takeovers += other.takeovers;
        self.declared_reruns += other.declared_reruns;
        self.outages += other.outages;
        for (name, count) in other.transactions {
            *self.transactions.entry(name).or_default() += count;
        }
        self.compatible_seeds += other.compatible_seeds;
        self.anchors += other.anchors;
        self.changed_amounts += other.changed_amounts;
        self.re_encoded += other.re_encoded;
        self.re_encoded_takeovers += other.re_encoded_takeovers;
        self.late_effects += other.late_effects;
        self.graces += other.graces;
        self.give_backs_replayed += other.give_backs_replayed;
        self.refused_completions += other.refused_completions;
        for (name, count) in other.outbox {
            *self.outbox.entry(name).or_default() += count;
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
        writeln!(
            f,
            "  takeovers {}, declared re-runs {}, outages begun {}",
            self.takeovers, self.declared_reruns, self.outages
        )?;
        writeln!(
            f,
            "  0.1 rule on {} seeds, anchors met {}, changed amounts refused {}",
            self.compatible_seeds, self.anchors, self.changed_amounts
        )?;
        writeln!(
            f,
            "  re-encoded step lists {} (taken over {}), late effects {} (graces kept {}), give-backs replayed {}, refused completions {}",
            self.re_encoded,
            self.re_encoded_takeovers,
            self.late_effects,
            self.graces,
            self.give_backs_replayed,
            self.refused_completions
        )?;
        for (name, count) in &self.behaviours {
            writeln!(f, "  handler {name}: {count}")?;
        }
        for (name, count) in &self.deploys {
            writeln!(f, "  deploy {name}: {count}")?;
        }
        for (name, count) in &self.reconciles {
            writeln!(f, "  reconciler {name}: {count}")?;
        }
        for (name, count) in &self.transactions {
            writeln!(f, "  transactional {name}: {count}")?;
        }
        for (name, count) in &self.outbox {
            writeln!(f, "  outbox {name}: {count}")?;
        }
        for (name, count) in &self.faults {
            writeln!(f, "  fault {name}: {count}")?;
        }
        for (name, count) in &self.outage_failures {
            writeln!(f, "  outage failed {name}: {count}")?;
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
    world.count_transactions().await;
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
