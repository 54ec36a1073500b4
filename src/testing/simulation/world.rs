//! The simulated world: operations, skewed workers, the downstream ledger, the steps, and the
//! invariants checked after each of them.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{Budget, Stats, Violation};
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::engine::{Idempotency, Resolution};
use crate::error::{BoxError, Error};
use crate::execution::{Execution, Invocation, Origin};
use crate::failure::Terminal;
use crate::key::{Fingerprint, JsonPointer, OperationKey, OperationScope};
use crate::reconcile::{Reconciliation, Takeover};
use crate::record::{Record, Status};
use crate::store::Store;
use crate::testing::conformance::{Fixture, Sweeper};
use crate::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};

/// The lease every delivery asks for.
const LEASE: Duration = Duration::from_secs(30);
/// How long before its lease runs out a worker's invocation is killed (the lease policy's skew).
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);
/// The largest clock skew between workers (within the lease margin).
const MAX_SKEW: Duration = Duration::from_secs(2);
/// Retention choices: shorter than the lease, between one and two leases, longer.
const RETENTIONS: [u64; 5] = [5, 20, 45, 90, 3600];
/// Workers, each with its clock skew.
const WORKERS: usize = 3;
/// The report one operation in three returns: past the inline limit, in one part.
const LARGE_OUTCOME_BYTES: usize = 24 * 1024;
/// How many deliveries the final sweep makes per operation before calling it stuck.
const SETTLE_ROUNDS: usize = 6;

/// What a simulated handler does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Applies the effect and returns.
    Complete,
    /// Fails before any effect (the claim is released).
    RetryableFailure,
    /// Fails terminally before any effect (the failure is retained).
    TerminalFailure,
    /// The process dies before the effect: nothing of it runs again.
    CrashBeforeEffect,
    /// The process dies after the effect.
    CrashAfterEffect,
    /// Panics after the effect.
    PanicAfterEffect,
    /// Its task is cancelled (dropped) after the effect.
    CancelAfterEffect,
    /// Waits before the effect until a later step resumes it (killed past its deadline).
    SuspendBeforeEffect,
    /// Waits after the effect until a later step resumes it (killed past its deadline).
    SuspendAfterEffect,
}

/// What the reconciler answers on a takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// What the downstream really shows: applied or not.
    Truthful,
    /// Cannot tell.
    Unknown,
    /// The reconciler itself fails.
    Fails,
}

/// One step of the simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A delivery of `op` to `worker`.
    Deliver {
        /// The operation.
        op: usize,
        /// The worker (its clock skew).
        worker: usize,
        /// What its handler does.
        behaviour: Behaviour,
        /// A fault injected into its next call of a primitive.
        fault: Option<(Primitive, Fault)>,
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

/// The downstream system and what the reconciler is told to answer.
#[derive(Debug)]
struct Downstream {
    /// Effects applied per operation in its current life. An operation without a business
    /// identity starts a new life when its record is gone (TTL) or settled and expired: by
    /// design, nothing remembers it then.
    effects: Vec<u32>,
    has_identity: Vec<bool>,
    keys: Vec<OperationKey>,
    answer: Answer,
}

impl Downstream {
    /// Applies one effect of `op`; `new_life`: the delivery found the operation forgotten.
    fn apply_effect(&mut self, op: usize, new_life: bool) {
        if new_life && !self.has_identity[op] {
            self.effects[op] = 0;
        }
        self.effects[op] += 1;
    }
}

type Shared = Arc<Mutex<Downstream>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Downstream> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A worker's clock: the world's, skewed.
#[derive(Debug, Clone)]
struct Skewed {
    base: ManualClock,
    ahead: bool,
    by: Duration,
}

impl Clock for Skewed {
    fn now(&self) -> SystemTime {
        if self.ahead {
            self.base.now() + self.by
        } else {
            self.base.now() - self.by
        }
    }

    fn sleep(&self, duration: Duration) -> crate::reconcile::BoxFuture<'static, ()> {
        self.base.sleep(duration)
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        self.base.jitter(ceiling)
    }
}

/// Worker 0's clock is the world's, worker 1's runs ahead, worker 2's behind.
fn skewed(clock: &ManualClock, worker: usize) -> Skewed {
    Skewed {
        base: clock.clone(),
        ahead: worker == 1,
        by: if worker == 0 {
            Duration::ZERO
        } else {
            MAX_SKEW
        },
    }
}

/// A handler stopped at a point of its choosing.
struct Parked {
    task: JoinHandle<Delivered>,
    resume: Option<oneshot::Sender<()>>,
    deadline: SystemTime,
    op: usize,
}

/// How a delivery ended for its caller.
enum Delivered {
    Answered(Result<Execution<Value>, Error>),
    Cancelled,
}

pub(super) struct World<S> {
    rng: fastrand::Rng,
    seed: u64,
    clock: ManualClock,
    sweep: Sweeper,
    store: FaultyStore<S>,
    workers: Vec<Idempotency<FaultyStore<S>>>,
    invocations: Vec<Invocation>,
    shared: Shared,
    retention: Duration,
    suspended: Vec<Parked>,
    frozen: Vec<JoinHandle<Delivered>>,
    last_seen: Vec<Option<Record>>,
    completed_seen: Vec<Option<Record>>,
    trace: Vec<String>,
    stats: Stats,
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
        let scope = OperationScope::new("simulation", "op").ok();
        let mut invocations = Vec::new();
        let mut has_identity = Vec::new();
        for op in 0..budget.operations {
            let material = format!("op-{op}");
            let key = scope
                .as_ref()
                .and_then(|scope| OperationKey::derive(scope, None, &material).ok());
            let (Some(key), Ok(fingerprint)) = (key, Fingerprint::of(&json!({"op": op}))) else {
                continue;
            };
            let mut invocation = Invocation::new(key, fingerprint, LEASE);
            let identity = rng.bool();
            if identity {
                invocation = invocation.with_identity(format!("sim:{seed}:{op}"));
                if let Ok(pointer) = JsonPointer::new("/op") {
                    invocation = invocation.with_result_ref(pointer);
                }
            }
            has_identity.push(identity);
            invocations.push(invocation);
        }
        let operations = invocations.len();
        let shared = Arc::new(Mutex::new(Downstream {
            effects: vec![0; operations],
            has_identity,
            keys: invocations.iter().map(|inv| inv.key().clone()).collect(),
            answer: Answer::Truthful,
        }));
        let store = FaultyStore::new(fixture.store);
        let workers = (0..WORKERS)
            .map(|worker| {
                Idempotency::new(store.clone(), config.clone())
                    .with_clock(skewed(&fixture.clock, worker))
                    .with_reconciler(reconciler(Arc::clone(&shared)))
            })
            .collect();
        Self {
            rng,
            seed,
            clock: fixture.clock,
            sweep: fixture.sweep,
            store,
            workers,
            invocations,
            shared,
            retention,
            suspended: Vec::new(),
            frozen: Vec::new(),
            last_seen: vec![None; operations],
            completed_seen: vec![None; operations],
            trace: vec![format!("retention {retention:?}, lease {LEASE:?}")],
            stats: Stats {
                seeds: 1,
                ..Stats::default()
            },
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
        let operations = self.invocations.len().max(1);
        match self.rng.u32(..100) {
            0..55 => Action::Deliver {
                op: self.rng.usize(..operations),
                worker: self.rng.usize(..self.workers.len()),
                behaviour: self.behaviour(),
                fault: self.fault(),
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
        const WEIGHTED: [(Behaviour, u32); 9] = [
            (Behaviour::Complete, 35),
            (Behaviour::RetryableFailure, 8),
            (Behaviour::TerminalFailure, 5),
            (Behaviour::CrashBeforeEffect, 8),
            (Behaviour::CrashAfterEffect, 10),
            (Behaviour::PanicAfterEffect, 6),
            (Behaviour::CancelAfterEffect, 6),
            (Behaviour::SuspendBeforeEffect, 10),
            (Behaviour::SuspendAfterEffect, 12),
        ];
        let mut roll = self.rng.u32(..WEIGHTED.iter().map(|(_, w)| w).sum::<u32>());
        for (behaviour, weight) in WEIGHTED {
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
        match action {
            Action::Deliver {
                op,
                worker,
                behaviour,
                fault,
                answer,
            } => {
                lock(&self.shared).answer = answer;
                if let Some((primitive, fault)) = fault {
                    self.store.inject(primitive, fault);
                }
                self.deliver(op, worker, behaviour).await;
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

    /// Before a delivery: whether the operation is forgotten by design (its record gone, or
    /// settled and expired on the worker's clock), so that its next effect is a new life.
    async fn is_forgotten(&self, op: usize, worker: usize) -> bool {
        let key = self.invocations[op].key();
        let Ok(record) = self.store.inner().get(key).await else {
            return false;
        };
        let now = self.worker_clock(worker).now();
        record.is_none_or(|record| record.counts_as_absent(now))
    }

    fn worker_clock(&self, worker: usize) -> Skewed {
        skewed(&self.clock, worker)
    }

    fn note(&mut self, line: String) {
        self.trace.push(format!("    {line}"));
    }

    async fn deliver(&mut self, op: usize, worker: usize, behaviour: Behaviour) {
        let new_life = self.is_forgotten(op, worker).await;
        self.stats.deliveries += 1;
        *self
            .stats
            .behaviours
            .entry(format!("{behaviour:?}"))
            .or_default() += 1;
        let (parked_tx, mut parked_rx) = mpsc::unbounded_channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        let idem = self.workers[worker].clone();
        let invocation = self.invocations[op].clone();
        let (shared, store) = (Arc::clone(&self.shared), self.store.clone());
        let deadline = self.clock.now() + LEASE - DEADLINE_MARGIN;
        let mut task = tokio::spawn(async move {
            let run = idem.execute(&invocation, move |ctx| {
                handler(
                    shared,
                    op,
                    new_life,
                    ctx.attempt(),
                    behaviour,
                    parked_tx,
                    resume_rx,
                )
            });
            match store.cancellable(run).await {
                Some(answer) => Delivered::Answered(answer),
                None => Delivered::Cancelled,
            }
        });
        tokio::select! {
            joined = &mut task => self.answered(op, behaviour, joined),
            Some(()) = parked_rx.recv() => match behaviour {
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
            },
        }
    }

    async fn resume(&mut self, index: usize) {
        if index >= self.suspended.len() {
            return;
        }
        let mut parked = self.suspended.remove(index);
        if self.clock.now() > parked.deadline {
            self.note("past its deadline: the invocation was killed".into());
            self.frozen.push(parked.task);
            return;
        }
        if let Some(resume) = parked.resume.take() {
            let _ = resume.send(());
        }
        let joined = (&mut parked.task).await;
        self.answered(parked.op, Behaviour::Complete, joined);
    }

    /// Checks what the caller was told against the downstream truth.
    fn answered(
        &mut self,
        op: usize,
        behaviour: Behaviour,
        joined: Result<Delivered, tokio::task::JoinError>,
    ) {
        let effects = lock(&self.shared).effects[op];
        let answer = match joined {
            Ok(Delivered::Answered(answer)) => answer,
            Ok(Delivered::Cancelled) => return self.note("cancelled by a store fault".into()),
            Err(err) if err.is_panic() => return self.note("the handler panicked".into()),
            Err(_) => return self.note("aborted".into()),
        };
        let line = match &answer {
            Ok(done) => format!("answered {:?}", done.origin()),
            Err(err) => format!("answered {}", error_name(err)),
        };
        self.note(line);
        let lie = match &answer {
            Ok(done) => match done.origin() {
                Origin::Executed { .. } => {
                    behaviour == Behaviour::TerminalFailure
                        || behaviour == Behaviour::RetryableFailure
                }
                Origin::Replayed | Origin::Reconciled { .. } => effects == 0,
            },
            Err(err) => acknowledges(err) && effects == 0,
        };
        if lie {
            self.pending_violation = Some(format!(
                "operation {op}: the caller was told it took effect, but the downstream shows {effects} effects"
            ));
        }
    }

    async fn resolve_indeterminate(&mut self) {
        for op in 0..self.invocations.len() {
            let key = self.invocations[op].key().clone();
            let Ok(Some(record)) = self.store.inner().get(&key).await else {
                continue;
            };
            if record.status != Status::Indeterminate {
                continue;
            }
            let resolution = if lock(&self.shared).effects[op] > 0 {
                Resolution::Completed(json!({"op": op, "resolved": true}))
            } else {
                Resolution::Release
            };
            let resolved = self.workers[0].resolve::<Value>(&key, resolution).await;
            self.note(format!("operator resolved op {op}: {resolved:?}"));
        }
    }

    /// Checks DESIGN's invariants on the store as it stands.
    pub(super) async fn check(&mut self, step: usize) -> Result<(), Violation> {
        if let Some(invariant) = self.pending_violation.take() {
            return Err(self.violation(step, invariant));
        }
        let now = self.clock.now();
        for op in 0..self.invocations.len() {
            self.stats.checks += 1;
            let key = self.invocations[op].key().clone();
            let record = self.store.inner().get(&key).await.ok().flatten();
            if let Some(invariant) = self.lease_overwritten(op, record.as_ref(), now) {
                return Err(self.violation(step, invariant));
            }
            let effects = lock(&self.shared).effects[op];
            if effects > 1 {
                return Err(
                    self.violation(step, format!("operation {op} took effect {effects} times"))
                );
            }
            if let Some(invariant) = self.outcome_lost(op, record.as_ref(), now) {
                return Err(self.violation(step, invariant));
            }
            if let Some(invariant) = self.evidence_disagrees(op, record.as_ref(), now).await {
                return Err(self.violation(step, invariant));
            }
            if let Some(record) = record.as_ref().filter(|r| r.status == Status::Completed) {
                self.completed_seen[op] = Some(record.clone());
            }
            self.last_seen[op] = record;
        }
        Ok(())
    }

    /// A live lease replaced by another claim.
    fn lease_overwritten(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let before = self.last_seen[op].as_ref()?;
        let after = record?;
        let was_live = before.status == Status::InProgress
            && before.lease.expires_at > now + MAX_SKEW + Duration::from_secs(1);
        (was_live && after.lease.token != before.lease.token).then(|| {
            format!(
                "operation {op}: the live lease of attempt {} was overwritten by attempt {}",
                before.lease.attempt, after.lease.attempt
            )
        })
    }

    /// A recorded outcome gone or changed within its retention.
    fn outcome_lost(&self, op: usize, record: Option<&Record>, now: SystemTime) -> Option<String> {
        let seen = self.completed_seen[op].as_ref()?;
        if seen.expires_at <= now + MAX_SKEW + Duration::from_secs(1) {
            return None;
        }
        let kept = record.is_some_and(|record| {
            record.status == Status::Completed && record.outcome == seen.outcome
        });
        (!kept).then(|| {
            format!("operation {op}: its recorded outcome was lost or changed within retention")
        })
    }

    /// A record and its evidence that tell different stories.
    async fn evidence_disagrees(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let identity = self.invocations[op].evidence_key()?;
        let record = record?;
        let settled_and_expired =
            matches!(record.status, Status::Completed | Status::Failed) && record.expires_at < now;
        if settled_and_expired {
            return None;
        }
        let evidence = self.store.inner().evidence(&identity).await.ok().flatten();
        match evidence {
            Some(evidence) if evidence.key == record.key && evidence.status == record.status => {
                None
            }
            other => Some(format!(
                "operation {op}: its record is {} but its evidence is {:?}",
                record.status,
                other.map(|evidence| evidence.status)
            )),
        }
    }

    fn violation(&self, step: usize, invariant: String) -> Violation {
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
        for op in 0..self.invocations.len() {
            let mut last = String::new();
            let mut settled = false;
            for _ in 0..SETTLE_ROUNDS {
                self.clock
                    .advance(LEASE + MAX_SKEW + Duration::from_secs(1));
                let joined = self.deliver_and_wait(op).await;
                let outcome = match &joined {
                    Ok(Delivered::Answered(Ok(_))) => Some(true),
                    Ok(Delivered::Answered(Err(err))) => {
                        last = error_name(err);
                        match err {
                            Error::Failed { .. } => Some(true),
                            Error::KeyExpiredConflict { evidence, .. } => {
                                matches!(evidence.status, Status::Completed | Status::Failed)
                                    .then_some(true)
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                self.answered(op, Behaviour::Complete, joined);
                self.check(step).await?;
                if outcome == Some(true) {
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

    async fn deliver_and_wait(&mut self, op: usize) -> Result<Delivered, tokio::task::JoinError> {
        self.trace
            .push(format!("Deliver {{ op: {op}, behaviour: Complete }}"));
        let idem = self.workers[0].clone();
        let invocation = self.invocations[op].clone();
        let shared = Arc::clone(&self.shared);
        let new_life = self.is_forgotten(op, 0).await;
        tokio::spawn(async move {
            let (parked_tx, _) = mpsc::unbounded_channel();
            let (_, resume_rx) = oneshot::channel();
            Delivered::Answered(
                idem.execute(&invocation, move |ctx| {
                    handler(
                        shared,
                        op,
                        new_life,
                        ctx.attempt(),
                        Behaviour::Complete,
                        parked_tx,
                        resume_rx,
                    )
                })
                .await,
            )
        })
        .await
    }
}

/// Whether a consumer acknowledges the message on this error (as the batch processor does).
fn acknowledges(err: &Error) -> bool {
    err.already_took_effect()
}

fn error_name(err: &Error) -> String {
    let debug = format!("{err:?}");
    debug
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The simulated handler.
async fn handler(
    shared: Shared,
    op: usize,
    new_life: bool,
    attempt: u32,
    behaviour: Behaviour,
    parked: mpsc::UnboundedSender<()>,
    resume: oneshot::Receiver<()>,
) -> Result<Value, BoxError> {
    let effect = || lock(&shared).apply_effect(op, new_life);
    let park = || async {
        let _ = parked.send(());
        std::future::pending::<()>().await;
    };
    // One operation in three returns a report too large for a 1 KB record: the DynamoDB store
    // keeps it compressed in part items, written before the settlement that names them.
    let result = if op.is_multiple_of(3) {
        let report = super::super::outcomes::incompressible(LARGE_OUTCOME_BYTES, op as u64);
        json!({"op": op, "attempt": attempt, "report": report})
    } else {
        json!({"op": op, "attempt": attempt})
    };
    match behaviour {
        Behaviour::Complete => {
            effect();
            Ok(result)
        }
        Behaviour::RetryableFailure => Err(std::io::Error::other("downstream timed out").into()),
        Behaviour::TerminalFailure => {
            Err(Terminal::new("declined", std::io::Error::other("the downstream declined")).into())
        }
        Behaviour::CrashBeforeEffect => {
            park().await;
            Ok(result)
        }
        Behaviour::CrashAfterEffect | Behaviour::CancelAfterEffect => {
            effect();
            park().await;
            Ok(result)
        }
        Behaviour::PanicAfterEffect => {
            effect();
            std::panic::panic_any(SimulatedPanic)
        }
        Behaviour::SuspendBeforeEffect | Behaviour::SuspendAfterEffect => {
            if behaviour == Behaviour::SuspendAfterEffect {
                effect();
            }
            let _ = parked.send(());
            if resume.await.is_err() {
                std::future::pending::<()>().await;
            }
            if behaviour == Behaviour::SuspendBeforeEffect {
                effect();
            }
            Ok(result)
        }
    }
}

/// The payload of the simulation's own panics, kept out of the test output.
struct SimulatedPanic;

fn silence_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<SimulatedPanic>().is_none() {
                previous(info);
            }
        }));
    });
}

/// The reconciler: the downstream truth, or what the step told it to answer.
fn reconciler(
    shared: Shared,
) -> impl Fn(Takeover) -> std::future::Ready<Result<Reconciliation, BoxError>> + Send + Sync + 'static
{
    move |takeover: Takeover| {
        let downstream = lock(&shared);
        let op = downstream.keys.iter().position(|key| *key == takeover.key);
        let answer = match (downstream.answer, op) {
            (Answer::Fails, _) => Err("the downstream could not be asked".into()),
            (Answer::Unknown, _) | (_, None) => Ok(Reconciliation::Unknown),
            (Answer::Truthful, Some(op)) if downstream.effects[op] > 0 => Ok(
                Reconciliation::Applied(json!({"op": op, "reconciled": true})),
            ),
            (Answer::Truthful, Some(_)) => Ok(Reconciliation::NotApplied),
        };
        std::future::ready(answer)
    }
}
