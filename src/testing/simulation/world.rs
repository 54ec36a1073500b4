//! The simulated world: operations (64-bit ids, tenants sharing identity strings), workers
//! with their skew and recovery profile, and the steps: deliveries (with deploys that change
//! an identity, faults and outages), resumptions, clock jumps, TTL sweeps, operators.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::actors::{
    Answer, Behaviour, Downstream, MAX_SKEW, Run, Shared, Skewed, handler, lock, reconciler,
    silence_simulated_panics,
};
use super::ledger::{Ledger, Profile};
use super::{Budget, Stats, Violation};
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::engine::{Idempotency, Operator, Resolution};
use crate::error::Error;
use crate::execution::{Execution, Invocation};
use crate::key::{Fingerprint, JsonPointer, OperationKey, OperationScope};
use crate::observe::{Decision, Observation};
use crate::reconcile::Recovery;
use crate::record::{Record, Status, epoch_secs};
use crate::store::Store;
use crate::testing::conformance::{Fixture, Sweeper};
use crate::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};

/// The lease every delivery asks for.
pub(super) const LEASE: Duration = Duration::from_secs(30);
/// How long before its lease runs out a worker's invocation is killed (the lease policy's skew).
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);
/// Retention choices: shorter than the lease, between one and two leases, longer.
const RETENTIONS: [u64; 5] = [5, 20, 45, 90, 3600];
/// Workers, each with its clock skew and recovery profile.
const WORKERS: usize = 3;
/// How many deliveries the final sweep makes per operation before calling it stuck.
const SETTLE_ROUNDS: usize = 6;
/// Outages of the store after an effect, in seconds: short, a few seconds, past the deadline.
const OUTAGES: [u64; 3] = [1, 5, 30];
/// How late after an outage's end a settlement may still land: the largest back-off pause,
/// the workers' skew, and the settlement's margin before the deadline.
const OUTAGE_SLACK: Duration = Duration::from_secs(2 + 2 + 1);

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
struct Spec {
    key: OperationKey,
    fingerprint: Fingerprint,
    identity: Option<String>,
}

/// A handler stopped at a point of its choosing.
struct Parked {
    task: JoinHandle<Delivered>,
    resume: Option<oneshot::Sender<()>>,
    deadline: SystemTime,
    op: usize,
}

/// How a delivery ended for its caller.
pub(super) enum Delivered {
    Answered(Result<Execution<Value>, Error>),
    Cancelled,
}

/// What a delivery's answer is judged against.
#[derive(Clone, Copy)]
struct Judged {
    op: usize,
    behaviour: Behaviour,
    /// The invocation's deadline, on the world's clock.
    deadline: SystemTime,
    /// When the outage the handler started ends, on the world's clock.
    outage_end: Option<SystemTime>,
}

pub(super) struct World<S> {
    rng: fastrand::Rng,
    seed: u64,
    pub(super) clock: ManualClock,
    sweep: Sweeper,
    pub(super) store: FaultyStore<S>,
    workers: Vec<(Idempotency, Profile)>,
    specs: Vec<Spec>,
    pub(super) shared: Shared,
    retention: Duration,
    suspended: Vec<Parked>,
    frozen: Vec<JoinHandle<Delivered>>,
    pub(super) last_seen: Vec<Option<Record>>,
    pub(super) completed_seen: Vec<Option<Record>>,
    /// The operations this step delivered, resumed or resolved: only they may see a live
    /// lease disappear (given back by its own holder).
    pub(super) touched: Vec<bool>,
    pub(super) trace: Vec<String>,
    stats: Stats,
    takeovers: Arc<AtomicU64>,
    pending_violation: Option<String>,
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
        let specs = operations(&mut rng, seed, budget.operations);
        let shared = Arc::new(std::sync::Mutex::new(Downstream {
            ledger: Ledger::new(specs.len()),
            keys: specs.iter().map(|spec| spec.key.clone()).collect(),
            answer: Answer::Truthful,
            violations: Vec::new(),
            reconciles: Default::default(),
        }));
        let store = FaultyStore::new(fixture.store);
        let takeovers = Arc::new(AtomicU64::new(0));
        let workers = (0..WORKERS)
            .map(|worker| {
                let profile = Profile {
                    reconciler: rng.u32(..3) > 0,
                    recovery: match rng.bool() {
                        true => Recovery::Rerun,
                        false => Recovery::Indeterminate,
                    },
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
                (idem, profile)
            })
            .collect::<Vec<_>>();
        let operations = specs.len();
        let profiles: Vec<String> = workers
            .iter()
            .map(|(_, profile)| format!("{profile:?}"))
            .collect();
        Self {
            rng,
            seed,
            clock: fixture.clock,
            sweep: fixture.sweep,
            store,
            workers,
            specs,
            shared,
            retention,
            suspended: Vec::new(),
            frozen: Vec::new(),
            last_seen: vec![None; operations],
            completed_seen: vec![None; operations],
            touched: vec![false; operations],
            trace: vec![format!(
                "retention {retention:?}, lease {LEASE:?}, workers {profiles:?}"
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

    /// Picks the next step.
    pub(super) fn choose(&mut self) -> Action {
        let operations = self.specs.len().max(1);
        match self.rng.u32(..100) {
            0..55 => Action::Deliver {
                op: self.rng.usize(..operations),
                worker: self.rng.usize(..self.workers.len()),
                behaviour: self.behaviour(),
                fault: self.fault(),
                outage: (self.rng.u32(..100) < 12)
                    .then(|| Duration::from_secs(OUTAGES[self.rng.usize(..OUTAGES.len())])),
                deploy: match self.rng.u32(..100) {
                    0..82 => Deploy::AsDeclared,
                    82..88 => Deploy::AddsIdentity,
                    88..94 => Deploy::RemovesIdentity,
                    _ => Deploy::ChangesIdentity,
                },
                answer: match self.rng.u32(..100) {
                    0..75 => Answer::Truthful,
                    75..90 => Answer::Unknown,
                    _ => Answer::Fails,
                },
            },
            55..70 if !self.suspended.is_empty() => {
                Action::Resume(self.rng.usize(..self.suspended.len()))
            }
            55..88 => Action::Advance(match self.rng.u32(..4) {
                0 => Duration::from_secs(1),
                1 => Duration::from_secs(10),
                2 => LEASE + Duration::from_secs(1),
                _ => self.retention + Duration::from_secs(1),
            }),
            88..94 => Action::Sweep,
            _ => Action::Resolve,
        }
    }

    fn behaviour(&mut self) -> Behaviour {
        let total = Behaviour::WEIGHTED.iter().map(|(_, w)| w).sum::<u32>();
        let mut roll = self.rng.u32(..total);
        for (behaviour, weight) in Behaviour::WEIGHTED {
            if roll < weight {
                return behaviour;
            }
            roll -= weight;
        }
        Behaviour::Complete
    }

    fn fault(&mut self) -> Option<(Primitive, Fault)> {
        if self.rng.u32(..100) >= 25 {
            return None;
        }
        let writes = [
            Primitive::Claim,
            Primitive::TakeOver,
            Primitive::Settle,
            Primitive::Release,
        ];
        let primitive = writes[self.rng.usize(..writes.len())];
        let fault = match self.rng.u32(..7) {
            0 => Fault::FailBefore(FaultKind::Throttled),
            1 => Fault::FailBefore(FaultKind::Unavailable),
            2 => Fault::FailBefore(FaultKind::Contention),
            3 | 4 => Fault::FailAfter(FaultKind::Unavailable),
            5 => Fault::CancelBefore,
            _ => Fault::CancelAfter,
        };
        Some((primitive, fault))
    }

    /// Plays one step.
    pub(super) async fn play(&mut self, action: Action) {
        self.trace.push(format!("{action:?}"));
        self.stats.steps += 1;
        self.touched.iter_mut().for_each(|touched| *touched = false);
        match action {
            Action::Deliver {
                op,
                worker,
                behaviour,
                fault,
                outage,
                deploy,
                answer,
            } => {
                lock(&self.shared).answer = answer;
                if let Some((primitive, fault)) = fault {
                    self.store.inject(primitive, fault);
                }
                *self.stats.deploys.entry(format!("{deploy:?}")).or_default() += 1;
                self.deliver(op, worker, behaviour, outage, deploy).await;
                self.store.clear();
            }
            Action::Resume(index) => self.resume(index).await,
            Action::Advance(by) => self.clock.advance(by),
            Action::Sweep => {
                let swept = (self.sweep)().await;
                self.note(format!("swept {swept}"));
            }
            Action::Resolve => self.resolve_indeterminate().await,
        }
    }

    /// The invocation a delivery of `op` makes after `deploy`, with `deadline`.
    fn invocation(&self, op: usize, deploy: Deploy, deadline: SystemTime) -> Invocation {
        let spec = &self.specs[op];
        let added = || format!("sim:{}:{op}:added", self.seed);
        let identity = match deploy {
            Deploy::AsDeclared => spec.identity.clone(),
            Deploy::AddsIdentity => Some(spec.identity.clone().unwrap_or_else(added)),
            Deploy::RemovesIdentity => None,
            Deploy::ChangesIdentity => Some(
                spec.identity
                    .as_ref()
                    .map_or_else(added, |identity| format!("{identity}:v2")),
            ),
        };
        let invocation = Invocation::new(spec.key.clone(), spec.fingerprint.clone(), LEASE)
            .with_deadline(deadline);
        match (identity, JsonPointer::new("/op")) {
            (Some(identity), Ok(pointer)) => {
                invocation.with_identity(identity).with_result_ref(pointer)
            }
            _ => invocation,
        }
    }

    /// Before a delivery: whether nothing remembers the operation by design, so that its next
    /// run is a new life. By the contract: its record is gone, or settled (COMPLETED, FAILED)
    /// with its retention passed (second resolution, on the worker's clock), and no evidence
    /// stands for the identity this delivery declares.
    async fn is_forgotten(&self, invocation: &Invocation, worker: usize) -> bool {
        let Ok(record) = self.store.inner().get(invocation.key()).await else {
            return false;
        };
        let now = Skewed::of(&self.clock, worker).now();
        let record_forgotten = record.is_none_or(|record| {
            matches!(record.status, Status::Completed | Status::Failed)
                && epoch_secs(record.expires_at) < epoch_secs(now)
        });
        let Some(evidence_key) = invocation.evidence_key() else {
            return record_forgotten;
        };
        let evidence = self.store.inner().evidence(&evidence_key).await;
        record_forgotten && matches!(evidence, Ok(None))
    }

    pub(super) fn note(&mut self, line: String) {
        self.trace.push(format!("    {line}"));
    }

    /// Delivers `op` to `worker`; the answer, when the caller got one in this step.
    async fn deliver(
        &mut self,
        op: usize,
        worker: usize,
        behaviour: Behaviour,
        outage: Option<Duration>,
        deploy: Deploy,
    ) -> Option<Result<Execution<Value>, Error>> {
        self.touched[op] = true;
        let worker_clock = Skewed::of(&self.clock, worker);
        let deadline_on_worker = worker_clock.now() + LEASE - DEADLINE_MARGIN;
        let invocation = self.invocation(op, deploy, deadline_on_worker);
        if self.is_forgotten(&invocation, worker).await {
            lock(&self.shared).ledger.new_life(op);
        }
        self.stats.deliveries += 1;
        *self
            .stats
            .behaviours
            .entry(format!("{behaviour:?}"))
            .or_default() += 1;
        let (parked_tx, mut parked_rx) = mpsc::unbounded_channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        let (idem, profile) = self.workers[worker].clone();
        let outage_end = Arc::new(std::sync::Mutex::new(None));
        let after_effect: Box<dyn FnOnce() + Send> = match outage {
            Some(length) => {
                self.stats.outages += 1;
                let (store, clock, end) = (
                    self.store.clone(),
                    self.clock.clone(),
                    Arc::clone(&outage_end),
                );
                Box::new(move || {
                    let until = clock.now() + length;
                    let primitives = [Primitive::Settle, Primitive::Release];
                    store.outage(&primitives, FaultKind::Throttled, until, clock);
                    *end.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(until);
                })
            }
            None => Box::new(|| {}),
        };
        let run = Run {
            shared: Arc::clone(&self.shared),
            op,
            profile,
            behaviour,
            after_effect,
            parked: parked_tx,
            resume: resume_rx,
        };
        let store = self.store.clone();
        let deadline = self.clock.now() + LEASE - DEADLINE_MARGIN;
        let mut task = tokio::spawn(async move {
            let execution = idem.execute(&invocation, move |ctx| handler(run, ctx.attempt()));
            match store.cancellable(execution).await {
                Some(answer) => Delivered::Answered(answer),
                None => Delivered::Cancelled,
            }
        });
        tokio::select! {
            joined = &mut task => {
                let outage_end = *outage_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let judged = Judged { op, behaviour, deadline, outage_end };
                self.answered(judged, joined).await
            }
            Some(()) = parked_rx.recv() => {
                match behaviour {
                    Behaviour::CancelAfterEffect => {
                        task.abort();
                        let _ = task.await;
                        self.note("cancelled after the effect".into());
                    }
                    Behaviour::SuspendBeforeEffect | Behaviour::SuspendAfterEffect => {
                        self.note(format!("suspended as #{}", self.suspended.len()));
                        self.suspended.push(Parked { task, resume: Some(resume_tx), deadline, op });
                    }
                    _ => {
                        self.note("crashed".into());
                        self.frozen.push(task);
                    }
                }
                None
            }
        }
    }

    async fn resume(&mut self, index: usize) {
        if index >= self.suspended.len() {
            return;
        }
        let mut parked = self.suspended.remove(index);
        self.touched[parked.op] = true;
        if self.clock.now() > parked.deadline {
            self.note("past its deadline: the invocation was killed".into());
            self.frozen.push(parked.task);
            return;
        }
        if let Some(resume) = parked.resume.take() {
            let _ = resume.send(());
        }
        let joined = (&mut parked.task).await;
        let judged = Judged {
            op: parked.op,
            behaviour: Behaviour::Complete,
            deadline: parked.deadline,
            outage_end: None,
        };
        self.answered(judged, joined).await;
    }

    /// Notes what the caller was told and checks it against the downstream truth and the
    /// store; the answer, when there was one.
    async fn answered(
        &mut self,
        judged: Judged,
        joined: Result<Delivered, tokio::task::JoinError>,
    ) -> Option<Result<Execution<Value>, Error>> {
        let answer = match joined {
            Ok(Delivered::Answered(answer)) => answer,
            Ok(Delivered::Cancelled) => {
                self.note("cancelled by a store fault".into());
                return None;
            }
            Err(err) if err.is_panic() => {
                self.note("the handler panicked".into());
                return None;
            }
            Err(_) => {
                self.note("aborted".into());
                return None;
            }
        };
        let line = match &answer {
            Ok(done) => format!("answered {:?}", done.origin()),
            Err(err) => format!("answered {}", error_name(err)),
        };
        self.note(line);
        if let Some(untruthful) = self.untruthful(judged, &answer).await {
            self.pending_violation.get_or_insert(untruthful);
        }
        Some(answer)
    }

    async fn resolve_indeterminate(&mut self) {
        for op in 0..self.specs.len() {
            let key = self.specs[op].key.clone();
            let Ok(Some(record)) = self.store.inner().get(&key).await else {
                continue;
            };
            if record.status != Status::Indeterminate {
                continue;
            }
            self.touched[op] = true;
            let applied = lock(&self.shared).ledger.effects(op) > 0;
            let resolution = match applied {
                true => Resolution::Completed(json!({"op": op, "resolved": true})),
                false => Resolution::Release,
            };
            let operator = Operator::new("simulation").expect("an operator");
            let resolved = self.workers[0]
                .0
                .resolve::<Value>(&key, resolution, &operator)
                .await;
            if !applied && matches!(resolved, Ok(true)) {
                lock(&self.shared).ledger.operator_released(op);
            }
            self.note(format!("operator resolved op {op}: {resolved:?}"));
        }
    }

    /// Checks DESIGN's invariants after a step.
    pub(super) async fn check(&mut self, step: usize) -> Result<(), Violation> {
        if let Some(invariant) = self.pending_violation.take() {
            return Err(self.violation(step, invariant));
        }
        if let Some(blind) = lock(&self.shared).violations.first().cloned() {
            return Err(self.violation(step, blind));
        }
        let now = self.clock.now();
        for op in 0..self.specs.len() {
            self.stats.checks += 1;
            let record = self
                .store
                .inner()
                .get(&self.specs[op].key)
                .await
                .ok()
                .flatten();
            let counted = lock(&self.shared).ledger.check(op);
            let broken = counted
                .err()
                .or_else(|| self.lease_overwritten(op, record.as_ref(), now))
                .or_else(|| self.outcome_lost(op, record.as_ref(), now));
            let broken = match broken {
                Some(broken) => Some(broken),
                None => self.evidence_disagrees(op, record.as_ref(), now).await,
            };
            if let Some(invariant) = broken {
                return Err(self.violation(step, invariant));
            }
            if let Some(record) = record.as_ref().filter(|r| r.status == Status::Completed) {
                self.completed_seen[op] = Some(record.clone());
            }
            self.last_seen[op] = record;
        }
        Ok(())
    }

    pub(super) fn violation(&self, step: usize, invariant: String) -> Violation {
        Violation {
            seed: self.seed,
            step,
            invariant,
            trace: self.trace.clone(),
        }
    }

    /// The end of a run: every operation must reach a settled answer (a way forward exists for
    /// whatever was left in progress), with the reconciler truthful and an operator at hand.
    pub(super) async fn settle_everything(&mut self, step: usize) -> Result<(), Violation> {
        self.trace.push("-- settle everything".into());
        lock(&self.shared).answer = Answer::Truthful;
        for op in 0..self.specs.len() {
            let mut last = String::new();
            let mut settled = false;
            for _ in 0..SETTLE_ROUNDS {
                self.clock
                    .advance(LEASE + MAX_SKEW + Duration::from_secs(1));
                self.touched.iter_mut().for_each(|touched| *touched = false);
                self.trace
                    .push(format!("Deliver {{ op: {op}, behaviour: Complete }}"));
                let answer = self
                    .deliver(op, 0, Behaviour::Complete, None, Deploy::AsDeclared)
                    .await;
                let outcome = match &answer {
                    Some(Ok(_)) => true,
                    Some(Err(err)) => {
                        last = error_name(err);
                        match err {
                            Error::Failed { .. } => true,
                            Error::KeyExpiredConflict { evidence, .. } => {
                                matches!(evidence.status, Status::Completed | Status::Failed)
                            }
                            _ => false,
                        }
                    }
                    None => false,
                };
                self.check(step).await?;
                if outcome {
                    settled = true;
                    break;
                }
                self.resolve_indeterminate().await;
            }
            if !settled {
                return Err(self.violation(
                    step,
                    format!("operation {op} has no way forward: deliveries keep answering {last}"),
                ));
            }
        }
        Ok(())
    }
}

/// The operations one seed shares: key material past 2^53 (ids that RFC 8785 alone would make
/// one key), operations 0 and 2 in tenant `t0` and operation 1 in `t1`, and, for those that
/// declare one, the same identity string in both tenants.
fn operations(rng: &mut fastrand::Rng, seed: u64, count: usize) -> Vec<Spec> {
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
        specs.push(Spec {
            key,
            fingerprint,
            identity,
        });
    }
    specs
}

/// Whether a consumer acknowledges the message on this error (as the batch processor does).
pub(super) fn acknowledges(err: &Error) -> bool {
    err.already_took_effect()
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

impl Judged {
    /// Whether a settlement that gave up with a transient error still had time: the outage the
    /// handler met ended well before the deadline (DESIGN: a completion is retried until the
    /// invocation's deadline minus a margin).
    fn gave_up_early(&self, err: &Error) -> bool {
        let transient = matches!(err, Error::Store(store) if store.is_transient());
        let effect_returned = self.behaviour == Behaviour::Complete;
        let ended_in_time = self
            .outage_end
            .is_some_and(|end| end + OUTAGE_SLACK < self.deadline);
        transient && effect_returned && ended_in_time
    }
}

impl<S: Store + Clone> World<S> {
    /// A lie in the caller's answer, if any: told it took effect when the downstream shows
    /// none, told another operation's outcome, a replay that is not the recorded outcome, or a
    /// settlement given up with time left.
    async fn untruthful(
        &self,
        judged: Judged,
        answer: &Result<Execution<Value>, Error>,
    ) -> Option<String> {
        let op = judged.op;
        let (effects, ever) = {
            let downstream = lock(&self.shared);
            (
                downstream.ledger.effects(op),
                downstream.ledger.effects_ever(op),
            )
        };
        match answer {
            Ok(done) => {
                if done.value().get("op") != Some(&json!(op)) {
                    return Some(format!(
                        "operation {op}: the caller was answered another operation's outcome: {}",
                        done.raw_json().get().chars().take(80).collect::<String>()
                    ));
                }
                match done.origin() {
                    crate::Origin::Executed { .. } => matches!(
                        judged.behaviour,
                        Behaviour::TerminalFailure | Behaviour::RetryableFailure
                    )
                    .then(|| format!("operation {op}: a failed handler was answered as executed")),
                    // A replay may outlive the record's life (a cache, a clock behind): an
                    // effect of any life vouches for it; a reconciler answers for this one.
                    crate::Origin::Replayed if ever == 0 => Some(format!(
                        "operation {op}: the caller was told it took effect, but the downstream shows none"
                    )),
                    crate::Origin::Reconciled { .. } if effects == 0 => Some(format!(
                        "operation {op}: the reconciler's answer was recorded, but the downstream shows no effect"
                    )),
                    crate::Origin::Replayed => {
                        // The outcome as recorded: the record's, or, once TTL deleted it (a
                        // cache or a skewed clock may still replay it), the last one seen.
                        let record = self.store.inner().get(&self.specs[op].key).await.ok()?;
                        let recorded = record
                            .filter(|record| record.status == Status::Completed)
                            .or_else(|| self.completed_seen[op].clone())
                            .and_then(|record| record.outcome);
                        (recorded.as_deref() != Some(done.raw_json().get().as_bytes())).then(|| {
                            format!("operation {op}: a replay that is not the recorded outcome")
                        })
                    }
                    crate::Origin::Reconciled { .. } => None,
                }
            }
            // Evidence outlives a life: it vouches for an effect of any of them.
            Err(err) if acknowledges(err) && ever == 0 => Some(format!(
                "operation {op}: the caller was told it took effect ({}), but the downstream shows none",
                error_name(err)
            )),
            Err(Error::Failed { failure, .. }) if failure.kind == "released" => Some(format!(
                "operation {op}: an operator released it, yet it was answered as a retained failure"
            )),
            Err(err) if judged.gave_up_early(err) => Some(format!(
                "operation {op}: the settlement gave up ({}) though its outage ended well before the deadline",
                error_name(err)
            )),
            Err(_) => None,
        }
    }
}
