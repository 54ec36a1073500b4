//! The simulation's actors: the handler each delivery runs, the reconciler, the skewed worker
//! clocks, and the downstream system they share (where an effect sent and not answered lands
//! once the clock passes its instant).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::ledger::{Ledger, Profile};
use crate::clock::{Clock, ManualClock};
use crate::effects::Checked;
use crate::effects::Writes;
use crate::error::BoxError;
use crate::execution::{ExecutionContext, Invocation};
use crate::failure::Terminal;
use crate::key::OperationKey;
use crate::reconcile::Takeover;
use crate::testing::conformance::EffectTables;

/// The largest clock skew between workers (within the lease margin).
pub(super) const MAX_SKEW: Duration = Duration::from_secs(2);
/// The report one operation in three returns: past the inline limit, in one part.
const LARGE_OUTCOME_BYTES: usize = 24 * 1024;
/// The receipt the step of one operation in three returns: long enough for the DynamoDB store
/// to compress it in the step list (past 1 KB), so that another build's encoding of it (another
/// zstd level, uncompressed) is other bytes.
const RECEIPT_REPEATS: usize = 1500;

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
    /// (A stepped operation's.) The step's effect is sent and its answer times out: it lands
    /// downstream `lands_after` seconds after it was sent, within the step's declared effect
    /// timeout (`timeout` seconds, or none declared: within the lease). Then the handler fails
    /// retryably, or its task is cancelled while the effect is in flight.
    LateEffect {
        /// The step's declared effect timeout, in seconds (`None`: none declared).
        timeout: Option<u64>,
        /// When the effect lands after it was sent, in seconds.
        lands_after: u64,
        /// What the handler does once the effect was sent.
        then: AfterTimeout,
    },
    /// (A stepped operation's.) Fails retryably after its step's effect, the step's result
    /// recorded: a knowing give-back, whose steps the next delivery replays.
    FailAfterStep,
    /// (An operation without steps, where the handler has tables of its own.) Applies the
    /// effect, then returns with a completion write whose condition fails: the completion is
    /// refused after an effect outside it.
    RefusedCompletion,
}

/// What a handler whose step's effect timed out does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterTimeout {
    /// Returns the step's error: a retryable failure after a step (a give-back).
    Fails,
    /// Its task is cancelled while the effect is in flight.
    Cancelled,
}

impl Behaviour {
    /// Every behaviour, each with its weight in the mix.
    pub(super) const WEIGHTED: [(Self, u32); 9] = [
        (Self::Complete, 35),
        (Self::RetryableFailure, 8),
        (Self::TerminalFailure, 5),
        (Self::CrashBeforeEffect, 8),
        (Self::CrashAfterEffect, 10),
        (Self::PanicAfterEffect, 6),
        (Self::CancelAfterEffect, 6),
        (Self::SuspendBeforeEffect, 10),
        (Self::SuspendAfterEffect, 12),
    ];

    /// The behaviour's name in the run's figures (a late effect by what follows it).
    pub fn name(&self) -> String {
        match self {
            Self::LateEffect { then, .. } => format!("LateEffectThen{then:?}"),
            other => format!("{other:?}"),
        }
    }
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

/// What the actors share: the ledger of effects and runs, the effects in flight, what the
/// reconciler is told to answer, and what went wrong inside a handler (checked after the step).
#[derive(Debug)]
pub(super) struct Downstream {
    pub(super) ledger: Ledger,
    pub(super) keys: Vec<OperationKey>,
    pub(super) answer: Answer,
    pub(super) violations: Vec<String>,
    /// Reconciler answers given, by name.
    pub(super) reconciles: BTreeMap<String, u64>,
    /// Per operation: the reconciler's decisions (`Applied`, `NotApplied`) over the run.
    pub(super) decisions: Vec<u64>,
    /// The world's clock: an effect in flight lands once it passes the effect's instant.
    clock: ManualClock,
    /// Step effects sent whose answer timed out, not landed yet.
    in_flight: Vec<Landing>,
    /// Effects that landed late, over the run.
    pub(super) landed: u64,
    /// A handler that failed retryably after its step's effect (its result recorded), as
    /// `(op, attempt)`: taken by the delivery that ran it.
    pub(super) failed_after_step: Option<(usize, u32)>,
    /// A handler of `op` that returned with a completion its condition refuses: taken by the
    /// delivery that ran it.
    pub(super) refused_completion: Option<usize>,
    /// Completions handed to the engine that their condition refuses by design (a plain
    /// handler's refused completion, a transactional operation's first takeover), over the run.
    pub(super) refusals: u64,
    /// The life each execution (an operation and its record's `created_at`, in milliseconds)
    /// was first seen in: an adoption may take over an orphan of an earlier life, whose
    /// effects a truthful reconciler then reports.
    pub(super) executions: std::collections::HashMap<(usize, u64), u32>,
    /// Per operation: the reconciler's `Applied` answers for an execution of an earlier life.
    pub(super) applied_for_earlier_lives: Vec<u64>,
}

/// A step's effect sent and not answered: it lands downstream once the clock passes `at`.
#[derive(Debug, Clone, Copy)]
struct Landing {
    op: usize,
    at: SystemTime,
    /// Whether the worker that sent it declared the whole handler safe to repeat.
    declared_rerun: bool,
}

impl Downstream {
    /// What a truthful reconciler of the takeover of `previous` finds downstream: the
    /// effects of the operation's current life, or, when `previous` is an execution of an
    /// earlier life (an adopted orphan), those of that life too (an effect of either is
    /// applied: re-running would repeat it).
    fn effects_of(&mut self, op: usize, previous: &crate::record::Record) -> u32 {
        let current = self.ledger.effects(op);
        let execution = (op, crate::record::epoch_millis(previous.created_at));
        match self.executions.get(&execution).copied() {
            Some(life) if life != self.ledger.life(op) => {
                let earlier = self.ledger.effects_in(op, life);
                if current == 0 && earlier > 0 {
                    self.applied_for_earlier_lives[op] += 1;
                }
                current.max(earlier)
            }
            _ => current,
        }
    }

    pub(super) fn new(ledger: Ledger, keys: Vec<OperationKey>, clock: ManualClock) -> Self {
        let operations = keys.len();
        Self {
            ledger,
            decisions: vec![0; keys.len()],
            keys,
            answer: Answer::Truthful,
            violations: Vec::new(),
            reconciles: BTreeMap::new(),
            clock,
            in_flight: Vec::new(),
            landed: 0,
            failed_after_step: None,
            refused_completion: None,
            refusals: 0,
            executions: std::collections::HashMap::new(),
            applied_for_earlier_lives: vec![0; operations],
        }
    }

    /// Lands every effect in flight whose instant the clock has passed.
    fn land(&mut self) {
        let now = self.clock.now();
        let (due, later): (Vec<Landing>, Vec<Landing>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|landing| landing.at <= now);
        self.in_flight = later;
        for landing in due {
            self.ledger
                .stepped_effect(landing.op, landing.declared_rerun);
            self.landed += 1;
        }
    }

    /// `op`'s step sends its effect, whose answer times out: it lands `after` from now.
    fn send_late(&mut self, op: usize, after: Duration, declared_rerun: bool) {
        let at = self.clock.now() + after;
        self.in_flight.push(Landing {
            op,
            at,
            declared_rerun,
        });
    }

    /// Whether an effect of `op` is in flight.
    pub(super) fn in_flight(&self, op: usize) -> bool {
        self.in_flight.iter().any(|landing| landing.op == op)
    }
}

pub(super) type Shared = Arc<Mutex<Downstream>>;

/// The downstream as it stands now: every effect whose instant the clock passed has landed.
pub(super) fn lock(shared: &Shared) -> MutexGuard<'_, Downstream> {
    let mut downstream = shared.lock().unwrap_or_else(PoisonError::into_inner);
    downstream.land();
    downstream
}

/// A worker's clock: the world's, skewed.
#[derive(Debug, Clone)]
pub(super) struct Skewed {
    base: ManualClock,
    ahead: bool,
    by: Duration,
}

impl Skewed {
    /// Worker 0's clock is the world's, worker 1's runs ahead, worker 2's behind.
    pub(super) fn of(clock: &ManualClock, worker: usize) -> Self {
        Self {
            base: clock.clone(),
            ahead: worker == 1,
            by: if worker == 0 {
                Duration::ZERO
            } else {
                MAX_SKEW
            },
        }
    }
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

    fn deadline(&self, duration: Duration) -> crate::reconcile::BoxFuture<'static, ()> {
        self.base.deadline(duration)
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        self.base.jitter(ceiling)
    }
}

/// One run of the simulated handler.
pub(super) struct Run {
    pub(super) shared: Shared,
    pub(super) op: usize,
    /// The operation's life, as the ledger counts them.
    pub(super) life: u32,
    /// Whether the operation's effects are transactional.
    pub(super) transactional: bool,
    /// The handler's own tables, when it has some.
    pub(super) tables: Option<Arc<EffectTables>>,
    pub(super) profile: Profile,
    pub(super) behaviour: Behaviour,
    /// Called right after the effect (starts an outage of the store).
    pub(super) after_effect: Box<dyn FnOnce() + Send>,
    pub(super) parked: mpsc::UnboundedSender<()>,
    pub(super) resume: oneshot::Receiver<()>,
}

/// The simulated handler: every run is counted (and judged) when it starts, whatever happens
/// to it afterwards. A stepped operation's handler keeps its effect in a step.
pub(super) async fn handler(run: Run, ctx: ExecutionContext) -> Result<Value, BoxError> {
    match (run.tables.clone(), run.profile.stepped) {
        (Some(tables), _) if run.transactional => {
            super::transactional::transactional(run, ctx, tables).await
        }
        (_, true) => stepped(run, ctx).await,
        (_, false) => plain(run, ctx).await,
    }
}

/// Counts a run of `op` in the contract's ledger as it starts; a blind re-run is a violation.
pub(super) fn count_run(shared: &Shared, op: usize, attempt: u32, profile: Profile) {
    let mut downstream = lock(shared);
    if let Err(blind) = downstream.ledger.start_run(op, attempt, profile) {
        downstream.violations.push(blind);
    }
}

/// The handler whose effect is a bare call: only the recovery policy or a reconciler stands
/// between a crashed attempt and a second effect.
async fn plain(run: Run, ctx: ExecutionContext) -> Result<Value, BoxError> {
    let attempt = ctx.attempt();
    let Run {
        shared,
        op,
        life,
        tables,
        profile,
        behaviour,
        after_effect,
        parked,
        resume,
        ..
    } = run;
    count_run(&shared, op, attempt, profile);
    let effect = || {
        lock(&shared).ledger.effect(op);
        after_effect();
    };
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
        Behaviour::RetryableFailure => {
            lock(&shared).ledger.failed_before_effect(op);
            Err(std::io::Error::other("downstream timed out").into())
        }
        Behaviour::TerminalFailure => {
            Err(Terminal::new("declined", std::io::Error::other("the downstream declined")).into())
        }
        // The effect, then a completion its condition refuses (on the handler's own table).
        Behaviour::RefusedCompletion if tables.is_some() => {
            effect();
            if let Some(tables) = tables {
                let mut downstream = lock(&shared);
                downstream.ledger.completion_refused(op, profile);
                downstream.refused_completion = Some(op);
                downstream.refusals += 1;
                drop(downstream);
                let write = super::transactional::refused_write(&tables, op, life)?;
                ctx.complete_with(Writes::default().update(write))?;
            }
            Ok(result)
        }
        // Drawn for other operations only: without tables, or with steps, it completes.
        Behaviour::RefusedCompletion | Behaviour::LateEffect { .. } | Behaviour::FailAfterStep => {
            effect();
            Ok(result)
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
            let suspend = || async {
                let _ = parked.send(());
                if resume.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            if behaviour == Behaviour::SuspendAfterEffect {
                effect();
                suspend().await;
            } else {
                suspend().await;
                effect();
            }
            Ok(result)
        }
    }
}

/// The handler whose effect is the step `effect`, checked against the downstream truth (or
/// answering Unknown, or failing, as the delivery says), then a step `note` without effect
/// (whose intent write records the effect's result). One operation in three returns a receipt
/// from its step long enough to be compressed in the step list.
async fn stepped(run: Run, ctx: ExecutionContext) -> Result<Value, BoxError> {
    let Run {
        shared,
        op,
        profile,
        behaviour,
        after_effect,
        parked,
        resume,
        ..
    } = run;
    let attempt = ctx.attempt();
    count_run(&shared, op, attempt, profile);
    let park = || async {
        let _ = parked.send(());
        std::future::pending::<()>().await;
    };
    let mut resume = Some(resume);
    let mut suspend = || {
        let resume = resume.take();
        let parked = parked.clone();
        async move {
            let _ = parked.send(());
            let resumed = match resume {
                Some(resume) => resume.await.is_ok(),
                None => false,
            };
            if !resumed {
                std::future::pending::<()>().await;
            }
        }
    };
    match behaviour {
        Behaviour::RetryableFailure => {
            lock(&shared).ledger.failed_before_effect(op);
            return Err(std::io::Error::other("downstream timed out").into());
        }
        Behaviour::TerminalFailure => {
            return Err(Terminal::new(
                "declined",
                std::io::Error::other("the downstream declined"),
            )
            .into());
        }
        Behaviour::CrashBeforeEffect => park().await,
        Behaviour::SuspendBeforeEffect => suspend().await,
        _ => {}
    }
    let declared_rerun = profile.recovery == crate::reconcile::Recovery::Rerun;
    let check = {
        let shared = Arc::clone(&shared);
        move |_key: String| {
            let downstream = lock(&shared);
            let checked = match downstream.answer {
                Answer::Fails => Err("the downstream could not be asked".into()),
                Answer::Unknown => Ok(Checked::Unknown),
                Answer::Truthful if downstream.ledger.effects(op) > 0 => {
                    Ok(Checked::Applied(json!({"op": op, "checked": true})))
                }
                Answer::Truthful => Ok(Checked::NotApplied),
            };
            std::future::ready(checked)
        }
    };
    let late = match behaviour {
        Behaviour::LateEffect {
            timeout,
            lands_after,
            then,
        } => Some((timeout, Duration::from_secs(lands_after), then)),
        _ => None,
    };
    let effect_shared = Arc::clone(&shared);
    let in_flight = parked.clone();
    let step = ctx.step("effect").checked_by(check);
    let step = match late.and_then(|(timeout, ..)| timeout) {
        Some(timeout) => step.effect_timeout(Duration::from_secs(timeout)),
        None => step,
    };
    step.run(move |_key| async move {
        if let Some((_, lands_after, then)) = late {
            // Sent; its answer never comes: it lands later, downstream.
            lock(&effect_shared).send_late(op, lands_after, declared_rerun);
            after_effect();
            if then == AfterTimeout::Cancelled {
                // The world cancels the task while the effect is in flight.
                let _ = in_flight.send(());
                std::future::pending::<()>().await;
            }
            return Err::<Value, BoxError>(
                std::io::Error::other("the downstream's answer timed out").into(),
            );
        }
        lock(&effect_shared)
            .ledger
            .stepped_effect(op, declared_rerun);
        after_effect();
        match op.is_multiple_of(3) {
            true => Ok(json!({"op": op, "applied": true, "receipt": "r-".repeat(RECEIPT_REPEATS)})),
            false => Ok(json!({"op": op, "applied": true})),
        }
    })
    .await?;
    match behaviour {
        // The effect's result is not written yet: the step comes back uncertain.
        Behaviour::CrashAfterEffect | Behaviour::CancelAfterEffect => park().await,
        Behaviour::PanicAfterEffect => std::panic::panic_any(SimulatedPanic),
        // The handler's own retryable failure after a done step.
        Behaviour::FailAfterStep => {
            lock(&shared).failed_after_step = Some((op, attempt));
            return Err(std::io::Error::other("the downstream timed out after the step").into());
        }
        _ => {}
    }
    ctx.step("note")
        .repeat_safe()
        .run(|_key| async { Ok::<_, BoxError>(json!("noted")) })
        .await?;
    if behaviour == Behaviour::SuspendAfterEffect {
        suspend().await;
    }
    Ok(json!({"op": op, "attempt": attempt}))
}

/// The payload of the simulation's own panics, kept out of the test output.
pub(super) struct SimulatedPanic;

pub(super) fn silence_simulated_panics() {
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

impl Profile {
    /// `invocation` carrying this profile as its operation's own policy: its recovery, and the
    /// simulation's reconciler when the profile asks one.
    pub(super) fn declared_on(&self, invocation: Invocation, shared: &Shared) -> Invocation {
        let invocation = invocation.with_recovery(self.recovery);
        match self.reconciler {
            true => invocation.with_reconciler(reconciler(Arc::clone(shared))),
            false => invocation,
        }
    }
}

/// The reconciler: the downstream truth, or what the step told it to answer. A `NotApplied`
/// is noted in the ledger: it excuses the run that follows.
pub(super) fn reconciler(
    shared: Shared,
) -> impl Fn(Takeover) -> std::future::Ready<Result<Checked, BoxError>> + Send + Sync + 'static {
    move |takeover: Takeover| {
        let mut downstream = lock(&shared);
        let op = downstream.keys.iter().position(|key| *key == takeover.key);
        let answer = match (downstream.answer, op) {
            (Answer::Fails, _) => Err("the downstream could not be asked".into()),
            (Answer::Unknown, _) | (_, None) => Ok(Checked::Unknown),
            (Answer::Truthful, Some(op)) if downstream.effects_of(op, &takeover.previous) > 0 => {
                Ok(Checked::Applied(json!({"op": op, "reconciled": true})))
            }
            (Answer::Truthful, Some(op)) => {
                downstream.ledger.not_applied(op);
                Ok(Checked::NotApplied)
            }
        };
        let name = match &answer {
            Ok(Checked::Applied(_)) => "Applied",
            Ok(Checked::NotApplied) => "NotApplied",
            Ok(Checked::Unknown) => "Unknown",
            Err(_) => "Fails",
        };
        *downstream.reconciles.entry(name.to_owned()).or_default() += 1;
        if let (Ok(Checked::Applied(_) | Checked::NotApplied), Some(op)) = (&answer, op) {
            downstream.decisions[op] += 1;
        }
        std::future::ready(answer)
    }
}
