//! The downstream ledger and the contract's account of every handler run, kept apart from the
//! code under test: it counts every run (crashed, killed, failed or not) and every effect, and
//! says which re-runs the contract excuses. A re-run is excused only by the previous run's
//! retryable failure (it failed before any effect), an operator's release, a reconciler's
//! `NotApplied` for this very takeover, or the worker's declared recovery policy
//! ([`Recovery::Rerun`]: a takeover without a reconciler, or a release after a refused
//! completion). Anything else is a blind re-run.

use crate::reconcile::Recovery;

/// How a worker recovers a crashed attempt it takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Profile {
    /// Whether the worker asks a reconciler.
    pub(super) reconciler: bool,
    /// What it does without one.
    pub(super) recovery: Recovery,
    /// Whether the handler keeps its effect in a step ([`crate::effects`]): its runs are then
    /// not judged (a re-run replays the step), its step's effects are.
    pub(super) stepped: bool,
}

/// How the latest run of an operation's life ended, as far as a re-run cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Previous {
    /// No run yet in this life.
    Nothing,
    /// It failed before any effect (a retryable failure), or an operator released it: the
    /// next run starts afresh.
    Released,
    /// It may have acted: crashed, killed, cancelled, panicked, suspended, or it returned.
    Open,
    /// It acted and its completion was refused, on a worker that declared the handler safe to
    /// repeat: released by that declaration, the next run is a declared re-run.
    Declared,
}

/// One operation's account in its current life.
#[derive(Debug, Clone)]
struct Account {
    effects: u32,
    runs: u32,
    excused: u32,
    declared: u32,
    previous: Previous,
    not_applied: bool,
}

impl Account {
    fn new() -> Self {
        Self {
            effects: 0,
            runs: 0,
            excused: 0,
            declared: 0,
            previous: Previous::Nothing,
            not_applied: false,
        }
    }
}

/// Every operation's account.
#[derive(Debug)]
pub(super) struct Ledger {
    accounts: Vec<Account>,
    /// Effects per operation over all its lives.
    ever: Vec<u32>,
    /// Each operation's current life: 0, then one more per new life.
    lives: Vec<u32>,
    /// Effects of each operation's earlier lives, by `(op, life)`, as each life ended.
    past_effects: std::collections::HashMap<(usize, u32), u32>,
    /// Re-runs the workers' declared [`Recovery::Rerun`] excused, over the whole run.
    pub(super) declared_reruns: u64,
}

impl Ledger {
    pub(super) fn new(operations: usize) -> Self {
        Self {
            accounts: vec![Account::new(); operations],
            ever: vec![0; operations],
            lives: vec![0; operations],
            past_effects: std::collections::HashMap::new(),
            declared_reruns: 0,
        }
    }

    /// Effects applied to `op` in its current life.
    pub(super) fn effects(&self, op: usize) -> u32 {
        self.accounts[op].effects
    }

    /// Effects applied to `op` in its life `life` (the current one, or an earlier one as it
    /// ended).
    pub(super) fn effects_in(&self, op: usize, life: u32) -> u32 {
        match life == self.lives[op] {
            true => self.accounts[op].effects,
            false => self.past_effects.get(&(op, life)).copied().unwrap_or(0),
        }
    }

    /// Effects applied to `op` in any of its lives: what permanent evidence may vouch for.
    pub(super) fn effects_ever(&self, op: usize) -> u32 {
        self.ever[op]
    }

    /// `op` starts a new life: nothing in the ledger remembers it any more (its record is gone
    /// or settled and expired, and no evidence stands for the identity it declares), so by
    /// design its next run is a first run.
    pub(super) fn new_life(&mut self, op: usize) {
        self.past_effects
            .insert((op, self.lives[op]), self.accounts[op].effects);
        self.accounts[op] = Account::new();
        self.lives[op] += 1;
    }

    /// `op`'s current life (0 for the first).
    pub(super) fn life(&self, op: usize) -> u32 {
        self.lives[op]
    }

    /// The downstream shows `effects` of `op` in its current life (a transactional effect is
    /// counted where it commits, in the handler's own table, not by the handler).
    pub(super) fn observed_effects(&mut self, op: usize, effects: u32) {
        let account = &mut self.accounts[op];
        self.ever[op] += effects.saturating_sub(account.effects);
        account.effects = effects;
    }

    /// A run of `op` starts as `attempt` on a worker of `profile`; `Err` names a blind re-run.
    pub(super) fn start_run(
        &mut self,
        op: usize,
        attempt: u32,
        profile: Profile,
    ) -> Result<(), String> {
        let account = &mut self.accounts[op];
        account.runs += 1;
        let not_applied = std::mem::take(&mut account.not_applied);
        let previous = std::mem::replace(&mut account.previous, Previous::Open);
        match previous {
            Previous::Nothing => Ok(()),
            Previous::Released => {
                account.excused += 1;
                Ok(())
            }
            Previous::Declared => {
                account.declared += 1;
                self.declared_reruns += 1;
                Ok(())
            }
            Previous::Open if not_applied => {
                account.excused += 1;
                Ok(())
            }
            // A stepped handler runs again by design: its effect is a step, counted apart.
            Previous::Open if profile.stepped => Ok(()),
            Previous::Open
                if attempt > 1 && !profile.reconciler && profile.recovery == Recovery::Rerun =>
            {
                account.declared += 1;
                self.declared_reruns += 1;
                Ok(())
            }
            Previous::Open => Err(format!(
                "operation {op}: run {} (attempt {attempt}) re-ran the handler after a run that may have acted, with nothing to excuse it (no retryable failure, no operator release, no reconciler's NotApplied, no declared re-run)",
                account.runs
            )),
        }
    }

    /// The run of `op` failed before any effect: the next run is excused.
    pub(super) fn failed_before_effect(&mut self, op: usize) {
        self.accounts[op].previous = Previous::Released;
    }

    /// `op`'s handler applied its effect and returned a completion its condition refuses. A
    /// worker that declared the handler safe to repeat ([`Recovery::Rerun`]) releases it, and
    /// the run that follows (a first attempt again) is a declared re-run; under any other
    /// policy the operation is held, and nothing excuses a re-run.
    pub(super) fn completion_refused(&mut self, op: usize, profile: Profile) {
        if profile.recovery == Recovery::Rerun {
            self.accounts[op].previous = Previous::Declared;
        }
    }

    /// An operator released `op` (its effect truly absent): the next run is excused.
    pub(super) fn operator_released(&mut self, op: usize) {
        self.accounts[op].previous = Previous::Released;
    }

    /// A reconciler answered `NotApplied` for the takeover of `op` about to run.
    pub(super) fn not_applied(&mut self, op: usize) {
        self.accounts[op].not_applied = true;
    }

    /// `op`'s step applied its effect once more; a worker that declared the whole handler safe
    /// to repeat ([`Recovery::Rerun`]) may run an uncertain step again, and that repeat is
    /// excused (no other may).
    pub(super) fn stepped_effect(&mut self, op: usize, declared_rerun: bool) {
        if self.accounts[op].effects > 0 && declared_rerun {
            self.accounts[op].declared += 1;
            self.declared_reruns += 1;
        }
        self.effect(op);
    }

    /// `op`'s effect happened once more.
    pub(super) fn effect(&mut self, op: usize) {
        self.accounts[op].effects += 1;
        self.ever[op] += 1;
    }

    /// The at-most-once invariant on `op`'s account: one effect, plus one per re-run that the
    /// declared recovery policy excused (a handler declared safe to repeat).
    pub(super) fn check(&self, op: usize) -> Result<(), String> {
        let account = &self.accounts[op];
        if account.effects > 1 + account.declared {
            return Err(format!(
                "operation {op} took effect {} times ({} runs, {} of them declared re-runs)",
                account.effects, account.runs, account.declared
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Ledger, Profile};
    use crate::reconcile::Recovery;

    const RECONCILED: Profile = Profile {
        reconciler: true,
        recovery: Recovery::Rerun,
        stepped: false,
    };
    const RERUN: Profile = Profile {
        reconciler: false,
        recovery: Recovery::Rerun,
        stepped: false,
    };
    const STEPPED: Profile = Profile {
        reconciler: false,
        recovery: Recovery::Steps,
        stepped: true,
    };

    /// A stepped handler's runs are free; its step's second effect is not, unless declared.
    #[test]
    fn a_stepped_handler_is_judged_by_its_steps_effects() {
        let mut ledger = Ledger::new(1);
        ledger.start_run(0, 1, STEPPED).expect("first run");
        ledger.stepped_effect(0, false);
        ledger
            .start_run(0, 2, STEPPED)
            .expect("a re-run replays the step");
        ledger.check(0).expect("one effect");
        ledger.stepped_effect(0, false);
        assert!(ledger.check(0).is_err(), "the step ran twice, undeclared");
        let mut ledger = Ledger::new(1);
        ledger.stepped_effect(0, true);
        ledger.stepped_effect(0, true);
        ledger.check(0).expect("a declared re-run of the step");
    }

    #[test]
    fn a_blind_rerun_is_caught_and_each_excuse_excuses_one() {
        let mut ledger = Ledger::new(1);
        ledger.start_run(0, 1, RECONCILED).expect("first run");
        ledger.effect(0);
        assert!(
            ledger.start_run(0, 2, RECONCILED).is_err(),
            "a blind re-run"
        );

        let mut ledger = Ledger::new(1);
        ledger.start_run(0, 1, RECONCILED).expect("first run");
        ledger.failed_before_effect(0);
        ledger
            .start_run(0, 1, RECONCILED)
            .expect("after a retryable failure");
        ledger.not_applied(0);
        ledger
            .start_run(0, 2, RECONCILED)
            .expect("after NotApplied");
        assert!(
            ledger.start_run(0, 3, RECONCILED).is_err(),
            "NotApplied excuses one run"
        );

        let mut ledger = Ledger::new(1);
        ledger.start_run(0, 1, RERUN).expect("first run");
        ledger.effect(0);
        ledger.start_run(0, 2, RERUN).expect("a declared re-run");
        ledger.effect(0);
        ledger.check(0).expect("declared: two effects allowed");
        ledger.effect(0);
        assert!(
            ledger.check(0).is_err(),
            "three effects, one declared re-run"
        );
        assert!(
            ledger.start_run(0, 1, RERUN).is_err(),
            "attempt 1 is no takeover"
        );
    }

    /// A refused completion excuses the fresh run after it only where the worker declared the
    /// handler safe to repeat.
    #[test]
    fn a_refused_completion_excuses_a_rerun_only_where_declared() {
        let mut ledger = Ledger::new(1);
        ledger.start_run(0, 1, RERUN).expect("first run");
        ledger.effect(0);
        ledger.completion_refused(0, RERUN);
        ledger
            .start_run(0, 1, RERUN)
            .expect("released by the declaration");
        ledger.effect(0);
        ledger.check(0).expect("a declared re-run's second effect");

        let held = Profile {
            recovery: Recovery::Indeterminate,
            ..RERUN
        };
        let mut ledger = Ledger::new(1);
        ledger.start_run(0, 1, held).expect("first run");
        ledger.effect(0);
        ledger.completion_refused(0, held);
        assert!(
            ledger.start_run(0, 1, held).is_err(),
            "held under the default: a fresh run is blind"
        );
    }
}
