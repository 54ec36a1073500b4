//! The simulated world: operations (64-bit ids, tenants sharing identity strings), workers
//! with their skew and recovery profile, and the steps' vocabulary: deliveries (with deploys
//! that change an identity, faults and outages), resumptions, clock jumps, TTL sweeps,
//! operators. Its next step is chosen in schedule.rs, played in steps.rs and judged in
//! invariants.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;

use super::actors::{
    Answer, Behaviour, Downstream, Shared, Skewed, lock, reconciler, silence_simulated_panics,
};
use super::ledger::{Ledger, Profile};
use super::steps::{Delivered, Parked};
use super::{Budget, Stats};
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::engine::Idempotency;
use crate::error::Error;
use crate::key::{Fingerprint, OperationKey, OperationScope};
use crate::observe::{Decision, Observation};
use crate::reconcile::Recovery;
use crate::record::Record;
use crate::store::Store;
use crate::testing::conformance::{EffectTables, Fixture, Sweeper};
use crate::testing::faults::{Fault, FaultyStore, Primitive};

/// The lease every delivery asks for.
pub(super) const LEASE: Duration = Duration::from_secs(30);
/// Retention choices: shorter than the lease, between one and two leases, longer.
const RETENTIONS: [u64; 5] = [5, 20, 45, 90, 3600];
/// Workers, each with its clock skew and recovery profile.
const WORKERS: usize = 3;

/// What a deploy did to the operation's business identity before this delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deploy {
    /// The identity as the operation declares it.
    AsDeclared,
    /// A deploy added one (or declares it on an operation that has none).
    AddsIdentity,
    /// A deploy removed it.
    RemovesIdentity,
    /// A deploy changed its format.
    ChangesIdentity,
}

/// One step of the simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A delivery of `op` to `worker`.
    Deliver {
        /// The operation.
        op: usize,
        /// The worker (its clock skew and recovery profile).
        worker: usize,
        /// What its handler does.
        behaviour: Behaviour,
        /// A fault injected into its next call of a primitive.
        fault: Option<(Primitive, Fault)>,
        /// An outage of settlements and releases that starts right after the handler's effect.
        outage: Option<Duration>,
        /// What a deploy did to the operation's identity.
        deploy: Deploy,
        /// What the reconciler answers if it takes over.
        answer: Answer,
    },
    /// A suspended handler goes on (or, past its deadline, its invocation is killed).
    Resume(usize),
    /// The clock moves on.
    Advance(Duration),
    /// TTL deletes what has expired.
    Sweep,
    /// An operator resolves every INDETERMINATE operation from the downstream truth.
    Resolve,
}

/// An operation as its deliveries name it.
pub(super) struct Spec {
    /// Whether its handler keeps its effect in a step (one operation in three).
    pub(super) stepped: bool,
    /// Whether its handler's effects are transactional (a stepped operation in two, when the
    /// handler has tables of its own).
    pub(super) transactional: bool,
    pub(super) key: OperationKey,
    pub(super) fingerprint: Fingerprint,
    pub(super) identity: Option<String>,
}

pub(super) struct World<S> {
    pub(super) rng: fastrand::Rng,
    pub(super) seed: u64,
    pub(super) clock: ManualClock,
    pub(super) sweep: Sweeper,
    pub(super) store: FaultyStore<S>,
    pub(super) workers: Vec<(Idempotency, Profile)>,
    /// The same workers' engines for the operations whose handler keeps its effect in a step.
    pub(super) stepped: Vec<(Idempotency, Profile)>,
    /// The same for transactional operations: as `stepped`, but none declares the handler
    /// safe to repeat (its transactions are not).
    pub(super) transactional: Vec<(Idempotency, Profile)>,
    /// The handler's own tables, when it has some.
    pub(super) tables: Option<Arc<EffectTables>>,
    /// When the run started, on the world's clock.
    pub(super) started: std::time::SystemTime,
    pub(super) specs: Vec<Spec>,
    pub(super) shared: Shared,
    pub(super) retention: Duration,
    pub(super) suspended: Vec<Parked>,
    pub(super) frozen: Vec<JoinHandle<Delivered>>,
    pub(super) last_seen: Vec<Option<Record>>,
    pub(super) completed_seen: Vec<Option<Record>>,
    /// The operations this step delivered, resumed or resolved: only they may see a live
    /// lease disappear (given back by its own holder).
    pub(super) touched: Vec<bool>,
    pub(super) trace: Vec<String>,
    pub(super) stats: Stats,
    takeovers: Arc<AtomicU64>,
    pub(super) pending_violation: Option<String>,
}

impl<S: Store + Clone> World<S> {
    pub(super) fn new(fixture: Fixture<S>, seed: u64, budget: Budget) -> Self {
        silence_simulated_panics();
        let mut rng = fastrand::Rng::with_seed(seed);
        let retention = Duration::from_secs(RETENTIONS[rng.usize(..RETENTIONS.len())]);
        let config = Config::builder()
            .retention(retention)
            .build()
            .unwrap_or_default();
        let tables = fixture.effect_tables.clone().map(Arc::new);
        let specs = operations(&mut rng, seed, budget.operations, tables.is_some());
        let shared = Arc::new(std::sync::Mutex::new(Downstream {
            ledger: Ledger::new(specs.len()),
            keys: specs.iter().map(|spec| spec.key.clone()).collect(),
            answer: Answer::Truthful,
            violations: Vec::new(),
            reconciles: Default::default(),
        }));
        let store = FaultyStore::new(fixture.store);
        let takeovers = Arc::new(AtomicU64::new(0));
        let mut stepped = Vec::new();
        let mut transactional = Vec::new();
        let workers = (0..WORKERS)
            .map(|worker| {
                let profile = Profile {
                    reconciler: rng.u32(..3) > 0,
                    recovery: match rng.bool() {
                        true => Recovery::Rerun,
                        false => Recovery::Indeterminate,
                    },
                    stepped: false,
                };
                // For stepped handlers each worker declares one of the three policies.
                let stepped_profile = Profile {
                    recovery: [Recovery::Steps, Recovery::Rerun, Recovery::Indeterminate]
                        [rng.usize(..3)],
                    stepped: true,
                    ..profile
                };
                let counted = Arc::clone(&takeovers);
                let idem = Idempotency::new(store.clone())
                    .with_config(config.clone())
                    .with_clock(Skewed::of(&fixture.clock, worker))
                    .with_recovery(profile.recovery)
                    .with_observer(move |observation: &Observation<'_>| {
                        if let Observation::Decision {
                            decision: Decision::Takeover,
                            ..
                        } = observation
                        {
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                let idem = match profile.reconciler {
                    true => idem.with_reconciler(reconciler(Arc::clone(&shared))),
                    false => idem,
                };
                let transactional_profile = Profile {
                    recovery: match stepped_profile.recovery {
                        Recovery::Rerun => Recovery::Steps,
                        recovery => recovery,
                    },
                    ..stepped_profile
                };
                transactional.push((
                    idem.clone().with_recovery(transactional_profile.recovery),
                    transactional_profile,
                ));
                stepped.push((
                    idem.clone().with_recovery(stepped_profile.recovery),
                    stepped_profile,
                ));
                (idem, profile)
            })
            .collect::<Vec<_>>();
        let operations = specs.len();
        let profiles: Vec<String> = workers
            .iter()
            .chain(&stepped)
            .map(|(_, profile)| format!("{profile:?}"))
            .collect();
        let stepped_ops: Vec<usize> = (0..specs.len()).filter(|op| specs[*op].stepped).collect();
        let transactional_ops: Vec<usize> = (0..specs.len())
            .filter(|op| specs[*op].transactional)
            .collect();
        let started = fixture.clock.now();
        Self {
            rng,
            seed,
            clock: fixture.clock,
            sweep: fixture.sweep,
            store,
            workers,
            stepped,
            transactional,
            tables,
            started,
            specs,
            shared,
            retention,
            suspended: Vec::new(),
            frozen: Vec::new(),
            last_seen: vec![None; operations],
            completed_seen: vec![None; operations],
            touched: vec![false; operations],
            trace: vec![format!(
                "retention {retention:?}, lease {LEASE:?}, workers {profiles:?}, stepped operations {stepped_ops:?} (transactional {transactional_ops:?})"
            )],
            stats: Stats {
                seeds: 1,
                ..Stats::default()
            },
            takeovers,
            pending_violation: None,
        }
    }

    pub(super) fn stats(mut self) -> Stats {
        for ((primitive, fault), count) in self.store.fired() {
            *self
                .stats
                .faults
                .entry(format!("{} {fault:?}", primitive.name()))
                .or_default() += count;
        }
        let downstream = lock(&self.shared);
        self.stats.reconciles = downstream.reconciles.clone();
        self.stats.declared_reruns = downstream.ledger.declared_reruns;
        drop(downstream);
        self.stats.takeovers = self.takeovers.load(Ordering::Relaxed);
        for parked in self.suspended.drain(..) {
            parked.task.abort();
        }
        for task in self.frozen.drain(..) {
            task.abort();
        }
        self.stats
    }

    pub(super) fn note(&mut self, line: String) {
        self.trace.push(format!("    {line}"));
    }
}

/// The operations one seed shares: key material past 2^53 (ids that RFC 8785 alone would make
/// one key), operations 0 and 2 in tenant `t0` and operation 1 in `t1`, and, for those that
/// declare one, the same identity string in both tenants.
fn operations(rng: &mut fastrand::Rng, seed: u64, count: usize, transactions: bool) -> Vec<Spec> {
    let scope = OperationScope::new("simulation", "op").ok();
    let mut specs = Vec::new();
    for op in 0..count {
        let material = json!((1_u64 << 60) + op as u64);
        let tenant = format!("t{}", op % 2);
        let key = scope
            .as_ref()
            .and_then(|scope| OperationKey::derive(scope, Some(&tenant), &material).ok());
        let (Some(key), Ok(fingerprint)) = (key, Fingerprint::of(&json!({"op": op}))) else {
            continue;
        };
        let identity = rng.bool().then(|| format!("sim:{seed}:invoice:{}", op / 2));
        let stepped = rng.u32(..3) == 0;
        specs.push(Spec {
            stepped,
            transactional: stepped && transactions && rng.bool(),
            key,
            fingerprint,
            identity,
        });
    }
    specs
}

/// An error's variant name, for the trace.
pub(super) fn error_name(err: &Error) -> String {
    let debug = format!("{err:?}");
    debug
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}
