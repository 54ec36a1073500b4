//! The simulation's actors: the handler each delivery runs, the reconciler, the skewed worker
//! clocks, and the downstream system they share.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::ledger::{Ledger, Profile};
use crate::clock::{Clock, ManualClock};
use crate::effects::Checked;
use crate::error::BoxError;
use crate::execution::ExecutionContext;
use crate::failure::Terminal;
use crate::key::OperationKey;
use crate::reconcile::{Reconciliation, Takeover};
use crate::testing::conformance::EffectTables;

/// The largest clock skew between workers (within the lease margin).
pub(super) const MAX_SKEW: Duration = Duration::from_secs(2);
/// The report one operation in three returns: past the inline limit, in one part.
const LARGE_OUTCOME_BYTES: usize = 24 * 1024;

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

/// What the actors share: the ledger of effects and runs, what the reconciler is told to
/// answer, and what went wrong inside a handler (checked after the step).
#[derive(Debug)]
pub(super) struct Downstream {
    pub(super) ledger: Ledger,
    pub(super) keys: Vec<OperationKey>,
    pub(super) answer: Answer,
    pub(super) violations: Vec<String>,
    /// Reconciler answers given, by name.
    pub(super) reconciles: BTreeMap<String, u64>,
}

pub(super) type Shared = Arc<Mutex<Downstream>>;

pub(super) fn lock(shared: &Shared) -> MutexGuard<'_, Downstream> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
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
    /// The handler's own tables, for a transactional operation.
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
        (Some(tables), _) => super::transactional::transactional(run, ctx, tables).await,
        (None, true) => stepped(run, ctx).await,
        (None, false) => plain(run, ctx.attempt()).await,
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
async fn plain(run: Run, attempt: u32) -> Result<Value, BoxError> {
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
/// (whose intent write records the effect's result).
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
    let effect_shared = Arc::clone(&shared);
    ctx.step("effect")
        .checked_by(check)
        .run(move |_key| async move {
            lock(&effect_shared)
                .ledger
                .stepped_effect(op, declared_rerun);
            after_effect();
            Ok::<_, BoxError>(json!({"op": op, "applied": true}))
        })
        .await?;
    match behaviour {
        // The effect's result is not written yet: the step comes back uncertain.
        Behaviour::CrashAfterEffect | Behaviour::CancelAfterEffect => park().await,
        Behaviour::PanicAfterEffect => std::panic::panic_any(SimulatedPanic),
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

/// The reconciler: the downstream truth, or what the step told it to answer. A `NotApplied`
/// is noted in the ledger: it excuses the run that follows.
pub(super) fn reconciler(
    shared: Shared,
) -> impl Fn(Takeover) -> std::future::Ready<Result<Reconciliation, BoxError>> + Send + Sync + 'static
{
    move |takeover: Takeover| {
        let mut downstream = lock(&shared);
        let op = downstream.keys.iter().position(|key| *key == takeover.key);
        let answer = match (downstream.answer, op) {
            (Answer::Fails, _) => Err("the downstream could not be asked".into()),
            (Answer::Unknown, _) | (_, None) => Ok(Reconciliation::Unknown),
            (Answer::Truthful, Some(op)) if downstream.ledger.effects(op) > 0 => Ok(
                Reconciliation::Applied(json!({"op": op, "reconciled": true})),
            ),
            (Answer::Truthful, Some(op)) => {
                downstream.ledger.not_applied(op);
                Ok(Reconciliation::NotApplied)
            }
        };
        let name = match &answer {
            Ok(Reconciliation::Applied(_)) => "Applied",
            Ok(Reconciliation::NotApplied) => "NotApplied",
            Ok(Reconciliation::Unknown) => "Unknown",
            Err(_) => "Fails",
        };
        *downstream.reconciles.entry(name.to_owned()).or_default() += 1;
        std::future::ready(answer)
    }
}
