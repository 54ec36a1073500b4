//! The simulated world: operations (64-bit ids at the double-rounding anchors and their
//! neighbours, tenants sharing identity strings), workers with their skew and recovery
//! profile (the 0.1 compatibility rule on for half the seeds), and the steps' vocabulary:
//! deliveries (with deploys that change an identity, faults and outages), resumptions, clock
//! jumps, TTL sweeps, operators, step lists rewritten as another build encodes them, and
//! deliveries of a key with a neighbouring amount. Its next step is chosen in schedule.rs,
//! played in steps.rs and judged in invariants.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::actors::{
    Answer, Behaviour, Downstream, Shared, Skewed, lock, silence_simulated_panics,
};
use super::formats::Encoding;
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
use crate::testing::faults::{Existence, Fault, FaultyStore, Primitive};

/// The lease every delivery asks for.
pub(super) const LEASE: Duration = Duration::from_secs(30);
/// Retention choices: shorter than the lease, between one and two leases, longer.
const RETENTIONS: [u64; 5] = [5, 20, 45, 90, 3600];
/// Workers, each with its clock skew and recovery profile.
const WORKERS: usize = 3;
/// Integers that RFC 8785 alone writes alike (each rounds to one double past 2^53), the
/// anchor first where the family has one: the integer whose exact digits are the digits RFC
/// 8785 prints for that double, so that its key (and digest) is the one 0.1 derived for every
/// member. Each tenant's operations take their ids from one family, the first two its anchor
/// and a neighbour.
pub(super) const FAMILIES: [&[i128]; 6] = [
    &[9_007_199_254_740_992, 9_007_199_254_740_993],
    &[
        1_152_921_504_606_847_000,
        1_152_921_504_606_847_001,
        1_152_921_504_606_846_999,
        1 << 60,
    ],
    &[-9_007_199_254_740_992, -9_007_199_254_740_993],
    &[-1_152_921_504_606_847_000, -1_152_921_504_606_847_001],
    // No anchor: 2^64 prints as 18446744073709552000, 2^63 as 9223372036854776000.
    &[18_446_744_073_709_551_000, 18_446_744_073_709_551_615],
    &[-9_223_372_036_854_775_808, -9_223_372_036_854_775_807],
];
/// How long after the run's start the 0.1 compatibility rule's cut-over lies, when a seed
/// turns the rule on: every record of the run is created before it, so only the rule each
/// record names keeps today's records out of it.
const CUT_OVER_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

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
#[non_exhaustive]
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
    /// The step list of an IN_PROGRESS record is rewritten as another build encodes it (the
    /// same steps, other bytes: another zstd level, uncompressed, a field today's build does
    /// not write). On a store that keeps records decoded (the memory store) nothing changes.
    ReEncode(Encoding),
    /// A delivery of `op`'s key with a neighbouring amount (an intent equal to its own above
    /// 2^53 only), while its record stands: a payload conflict, never a replay or a run.
    ChangedAmount(usize),
    /// The outbox relay takes the stream's next records, its first request meeting the fault.
    #[cfg(feature = "relay")]
    Relay(Option<super::PublishFault>),
    /// The outbox's stream gives its next record up (retries ran out, or 24 hours passed).
    #[cfg(feature = "relay")]
    StreamGivesUp,
    /// The outbox sweeper runs, its first request meeting the fault.
    #[cfg(feature = "relay")]
    SweepOutbox(Option<super::PublishFault>),
}

/// Why an operation's record may be missing, in its current life: DESIGN lets a record go
/// only by a release (the retry executes afresh) or by TTL after its expiry; anything else
/// that loses it is a broken store or engine, never a new life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Absence {
    /// Nothing claimed it yet (the run's start).
    Unclaimed,
    /// A fenced release deleted it by design.
    Released,
    /// A TTL sweep ran after it expired.
    Swept,
    /// A record stands: its absence needs one of the causes above.
    Stands,
}

/// A step planned next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Planned {
    /// A delivery of this operation (the rest drawn when it comes).
    Deliver(usize),
    /// The clock moves on.
    Advance(Duration),
}

/// An operation as its deliveries name it.
pub(super) struct Spec {
    /// Whether its handler keeps its effect in a step (one operation in three).
    pub(super) stepped: bool,
    /// Whether its handler's effects are transactional (a stepped operation in two, when the
    /// handler has tables of its own).
    pub(super) transactional: bool,
    /// Its id: the key material, and the intent (`{"id": id}`).
    pub(super) id: i128,
    pub(super) key: OperationKey,
    /// The key 0.1 derived for its id, when that was another: the key of the family's anchor.
    pub(super) earlier: Option<OperationKey>,
    /// The operation whose key is `earlier`, when one of the seed's has it.
    pub(super) anchor: Option<usize>,
    pub(super) fingerprint: Fingerprint,
    /// The fingerprint of a neighbouring amount (another member of its id's family, equal to
    /// its own above 2^53 only), when it has one.
    pub(super) neighbouring_amount: Option<Fingerprint>,
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
    /// The far side of their outbox: relay, sweeper, destination, consumer.
    #[cfg(feature = "relay")]
    pub(super) outbox: Option<super::outbox_relay::OutboxWorld>,
    pub(super) specs: Vec<Spec>,
    pub(super) shared: Shared,
    pub(super) retention: Duration,
    pub(super) suspended: Vec<Parked>,
    pub(super) frozen: Vec<JoinHandle<Delivered>>,
    pub(super) last_seen: Vec<Option<Record>>,
    pub(super) completed_seen: Vec<Option<Record>>,
    /// Per operation: the last retained failure (FAILED) a check saw.
    pub(super) failed_seen: Vec<Option<Record>>,
    /// Per operation: why its record may be missing in its current life.
    pub(super) absence: Vec<Absence>,
    /// Per operation: the outcomes recorded (COMPLETED) in its current life, as stored bytes:
    /// what a replay may answer besides the record as it stands.
    pub(super) life_outcomes: Vec<Vec<Vec<u8>>>,
    /// The operations this step delivered, resumed or resolved: only they may see a live
    /// lease disappear (given back by its own holder).
    pub(super) touched: Vec<bool>,
    /// Whether the seed turns the 0.1 compatibility rule on.
    pub(super) compatible: bool,
    /// Per operation: the lease token and attempt of an attempt that gave its claim back
    /// knowingly after a done step (its handler's own retryable failure), until a delivery
    /// meets it.
    pub(super) given_back: Vec<Option<(String, u32)>>,
    /// Per operation: the lease token of the attempt whose step list was rewritten as another
    /// build encodes it, until a delivery takes it over.
    pub(super) re_encoded: Vec<Option<String>>,
    /// Steps planned next (after a delivery left a step's effect in flight: its operation
    /// delivered again at once, or once the clock passed a give-back's short grace).
    pub(super) planned: std::collections::VecDeque<Planned>,
    pub(super) trace: Vec<String>,
    pub(super) stats: Stats,
    takeovers: Arc<AtomicU64>,
    /// Outages that began (the handler reached its effect), over the run.
    pub(super) outages_started: Arc<AtomicU64>,
    pub(super) pending_violation: Option<String>,
}

impl<S: Store + Clone> World<S> {
    pub(super) fn new(fixture: Fixture<S>, seed: u64, budget: Budget) -> Self {
        silence_simulated_panics();
        let mut rng = fastrand::Rng::with_seed(seed);
        let retention = Duration::from_secs(RETENTIONS[rng.usize(..RETENTIONS.len())]);
        let compatible = rng.bool();
        let mut config = Config::builder().retention(retention);
        if compatible {
            config = config.rfc8785_records_before(fixture.clock.now() + CUT_OVER_AFTER);
        }
        let config = config.build().unwrap_or_default();
        let tables = fixture.effect_tables.clone().map(Arc::new);
        let specs = operations(&mut rng, seed, budget.operations, tables.is_some());
        let shared = Arc::new(std::sync::Mutex::new(Downstream::new(
            Ledger::new(specs.len()),
            specs.iter().map(|spec| spec.key.clone()).collect(),
            fixture.clock.clone(),
        )));
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
                    .with_observer(move |observation: &Observation<'_>| {
                        if let Observation::Decision {
                            decision: Decision::Takeover,
                            ..
                        } = observation
                        {
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                let transactional_profile = Profile {
                    recovery: match stepped_profile.recovery {
                        Recovery::Rerun => Recovery::Steps,
                        recovery => recovery,
                    },
                    ..stepped_profile
                };
                // One engine per worker; each profile is the operation's own policy, declared
                // on the invocations the worker makes ([`Profile::declared_on`]).
                transactional.push((idem.clone(), transactional_profile));
                stepped.push((idem.clone(), stepped_profile));
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
        let ids: Vec<String> = specs.iter().map(|spec| spec.id.to_string()).collect();
        #[cfg(feature = "relay")]
        let outbox = tables.as_ref().and_then(|tables| {
            super::outbox_relay::OutboxWorld::new(tables, fixture.clock.clone()).ok()
        });
        Self {
            rng,
            seed,
            clock: fixture.clock,
            sweep: fixture.sweep,
            store,
            workers,
            stepped,
            transactional,
            #[cfg(feature = "relay")]
            outbox,
            tables,
            specs,
            shared,
            retention,
            suspended: Vec::new(),
            frozen: Vec::new(),
            last_seen: vec![None; operations],
            completed_seen: vec![None; operations],
            failed_seen: vec![None; operations],
            absence: vec![Absence::Unclaimed; operations],
            life_outcomes: vec![Vec::new(); operations],
            touched: vec![false; operations],
            compatible,
            given_back: vec![None; operations],
            re_encoded: vec![None; operations],
            planned: std::collections::VecDeque::new(),
            trace: vec![format!(
                "retention {retention:?}, lease {LEASE:?}, workers {profiles:?}, stepped operations {stepped_ops:?} (transactional {transactional_ops:?}), ids {ids:?}, 0.1 rule {}",
                if compatible { "on" } else { "off" }
            )],
            stats: Stats {
                seeds: 1,
                compatible_seeds: u64::from(compatible),
                ..Stats::default()
            },
            takeovers,
            outages_started: Arc::new(AtomicU64::new(0)),
            pending_violation: None,
        }
    }

    pub(super) fn stats(mut self) -> Stats {
        // Injected faults apart from the failures outages made (each a `FailBefore` of the
        // outage's kind, counted by the store apart).
        let in_outages = self.store.fired_in_outages();
        for ((primitive, fault), count) in self.store.fired() {
            let of_outages = match fault {
                Fault::FailBefore(kind) => in_outages.get(&(primitive, kind)).copied(),
                _ => None,
            };
            let injected = count - of_outages.unwrap_or(0);
            if injected > 0 {
                *self
                    .stats
                    .faults
                    .entry(format!("{} {fault:?}", primitive.name()))
                    .or_default() += injected;
            }
        }
        for ((primitive, kind), count) in in_outages {
            *self
                .stats
                .outage_failures
                .entry(format!("{} {kind:?}", primitive.name()))
                .or_default() += count;
        }
        self.stats.outages = self.outages_started.load(Ordering::Relaxed);
        let downstream = lock(&self.shared);
        self.stats.reconciles = downstream.reconciles.clone();
        self.stats.declared_reruns = downstream.ledger.declared_reruns;
        self.stats.late_effects = downstream.landed;
        drop(downstream);
        self.stats.takeovers = self.takeovers.load(Ordering::Relaxed);
        #[cfg(feature = "relay")]
        if let Some(outbox) = self.outbox.take() {
            self.stats.outbox = outbox.counts;
        }
        for parked in self.suspended.drain(..) {
            parked.task.abort();
        }
        for task in self.frozen.drain(..) {
            task.abort();
        }
        self.stats
    }

    /// Takes the store's account of the writes that created or deleted a record since the
    /// last call: a claim or adoption makes a record stand, a release excuses its absence.
    pub(super) fn observe_existence(&mut self) {
        for (key, existence) in self.store.existence_changes() {
            if let Some(op) = self.specs.iter().position(|spec| spec.key == key) {
                self.absence[op] = match existence {
                    Existence::Written => Absence::Stands,
                    Existence::Released => Absence::Released,
                };
            }
        }
    }

    /// `op` starts a new life: nothing remembers it by design.
    pub(super) fn new_life(&mut self, op: usize) {
        lock(&self.shared).ledger.new_life(op);
        self.life_outcomes[op].clear();
    }

    /// Notes `outcome` as recorded for `op` in its current life.
    pub(super) fn outcome_recorded(&mut self, op: usize, outcome: &[u8]) {
        let outcomes = &mut self.life_outcomes[op];
        if !outcomes.iter().any(|seen| seen.as_slice() == outcome) {
            outcomes.push(outcome.to_vec());
        }
    }

    pub(super) fn note(&mut self, line: String) {
        self.trace.push(format!("    {line}"));
    }
}

/// The operations one seed shares: ids past 2^53 that RFC 8785 alone would make one key
/// (operations 0 and 2 in tenant `t0` take an anchor and its neighbour, in either order;
/// operation 1 in `t1` takes an id of another family), and, for those that declare one, the
/// same identity string in both tenants.
fn operations(rng: &mut fastrand::Rng, seed: u64, count: usize, transactions: bool) -> Vec<Spec> {
    let scope = OperationScope::new("simulation", "op").ok();
    // Each tenant's ids: its family's anchor (or first member) and a neighbour, in either
    // order, then the family's other members.
    let families: Vec<Vec<i128>> = (0..2)
        .map(|_| {
            let mut members = FAMILIES[rng.usize(..FAMILIES.len())].to_vec();
            let first = members.remove(0);
            let second = members.remove(rng.usize(..members.len()));
            let mut ids = match rng.bool() {
                true => vec![first, second],
                false => vec![second, first],
            };
            ids.extend(members);
            ids
        })
        .collect();
    let mut specs = Vec::new();
    for op in 0..count {
        let family = &families[op % 2];
        let index = op / 2;
        // Past the family: ids of their own, still past 2^53.
        let id = family.get(index).copied().unwrap_or((1 << 62) + op as i128);
        let neighbour = match index {
            0 | 1 => family.get(1 - index).copied(),
            _ => None,
        };
        let tenant = format!("t{}", op % 2);
        let keys = scope
            .as_ref()
            .and_then(|scope| OperationKey::with_earlier(scope, Some(&tenant), &integer(id)).ok());
        let (Some((key, earlier)), Ok(fingerprint)) = (keys, Fingerprint::of(&intent(id))) else {
            continue;
        };
        let identity = rng.bool().then(|| format!("sim:{seed}:invoice:{}", op / 2));
        let stepped = rng.u32(..3) == 0;
        specs.push(Spec {
            stepped,
            transactional: stepped && transactions && rng.bool(),
            id,
            key,
            earlier,
            anchor: None,
            fingerprint,
            neighbouring_amount: neighbour.and_then(|amount| Fingerprint::of(&intent(amount)).ok()),
            identity,
        });
    }
    for op in 0..specs.len() {
        specs[op].anchor = specs[op]
            .earlier
            .as_ref()
            .and_then(|earlier| specs.iter().position(|spec| spec.key == *earlier));
    }
    specs
}

/// An integer as JSON (`serde_json` holds it as an `i64` or a `u64`, exactly).
pub(super) fn integer(id: i128) -> Value {
    match u64::try_from(id) {
        Ok(unsigned) => json!(unsigned),
        Err(_) => i64::try_from(id).map_or(Value::Null, |signed| json!(signed)),
    }
}

/// The intent of the operation of `id` (or of a delivery naming it as its amount).
pub(super) fn intent(id: i128) -> Value {
    json!({ "id": integer(id) })
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

#[cfg(test)]
mod tests {
    use super::{FAMILIES, integer};
    use crate::key::{OperationKey, OperationScope};

    /// Every family is one key under RFC 8785 alone and one key per member under today's rule:
    /// an anchor's key is the one 0.1 derived for each of its neighbours.
    #[test]
    fn each_family_is_one_key_under_rfc_8785_and_many_under_todays_rule() {
        let scope = OperationScope::new("simulation", "op").expect("scope");
        for (index, family) in FAMILIES.iter().enumerate() {
            let keys: Vec<(OperationKey, Option<OperationKey>)> = family
                .iter()
                .map(|id| {
                    OperationKey::with_earlier(&scope, Some("t0"), &integer(*id)).expect("a key")
                })
                .collect();
            for (a, (key, _)) in keys.iter().enumerate() {
                for (other, _) in &keys[a + 1..] {
                    assert_ne!(key, other, "family {index}: two ids, two keys");
                }
            }
            let anchored = index < 4;
            assert_eq!(keys[0].1.is_none(), anchored, "family {index}'s anchor");
            let rfc8785 = |(key, earlier): &(OperationKey, Option<OperationKey>)| {
                earlier.clone().unwrap_or_else(|| key.clone())
            };
            for member in &keys[1..] {
                assert_eq!(rfc8785(member), rfc8785(&keys[0]), "family {index}");
            }
        }
    }
}
