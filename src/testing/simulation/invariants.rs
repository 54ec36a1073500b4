//! DESIGN's invariants, checked after every step: the ledger's account of every run, and, on
//! the store as it stands, that a live lease is never overwritten nor deleted by anyone but
//! its holder, a recorded outcome (or step result) is never lost or changed within retention,
//! and a record and its evidence tell one story. Every answer a caller got is checked against the downstream
//! truth, and at the end of a run every operation must reach a settled answer.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::Violation;
use super::actors::{Answer, Behaviour, MAX_SKEW, lock};
use super::world::{Deploy, LEASE, World, error_name};
use crate::clock::Clock;
use crate::error::Error;
use crate::execution::Execution;
use crate::record::{FailureKind, Record, Status};
use crate::store::Store;

/// How many deliveries the final sweep makes per operation before calling it stuck.
const SETTLE_ROUNDS: usize = 6;
/// How late after an outage's end a settlement may still land: the largest back-off pause,
/// the workers' skew, and the settlement's margin before the deadline.
const OUTAGE_SLACK: Duration = Duration::from_secs(2 + 2 + 1);

/// What a delivery's answer is judged against.
#[derive(Clone, Copy)]
pub(super) struct Judged {
    pub(super) op: usize,
    pub(super) behaviour: Behaviour,
    /// The invocation's deadline, on the world's clock.
    pub(super) deadline: SystemTime,
    /// When the outage the handler started ends, on the world's clock.
    pub(super) outage_end: Option<SystemTime>,
}

impl<S: Store + Clone> World<S> {
    /// Checks DESIGN's invariants after a step.
    pub(super) async fn check(&mut self, step: usize) -> Result<(), Violation> {
        if let Some(invariant) = self.pending_violation.take() {
            return Err(self.violation(step, invariant));
        }
        if let Some(blind) = lock(&self.shared).violations.first().cloned() {
            return Err(self.violation(step, blind));
        }
        if let Some(disagrees) = self.transaction_disagrees().await {
            return Err(self.violation(step, disagrees));
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
                .or_else(|| self.outcome_lost(op, record.as_ref(), now))
                .or_else(|| self.step_result_changed(op, record.as_ref()));
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

    /// A step's recorded result lost or changed within the record's life (the same record:
    /// the same creation, no operator's release): a replay would then return another result
    /// than the step's effect produced, or run the step again.
    fn step_result_changed(&self, op: usize, record: Option<&Record>) -> Option<String> {
        let (Some(before), Some(now)) = (self.last_seen[op].as_ref(), record) else {
            return None;
        };
        if before.created_at != now.created_at || now.audit.is_some() {
            return None;
        }
        before
            .steps
            .iter()
            .enumerate()
            .filter(|(_, step)| step.result.is_some())
            .find(|(index, step)| {
                now.steps
                    .get(*index)
                    .is_none_or(|later| later.name != step.name || later.result != step.result)
            })
            .map(|(_, step)| {
                format!(
                    "operation {op}: the recorded result of step `{}` was lost or changed",
                    step.name
                )
            })
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

impl<S: Store + Clone> World<S> {
    /// A live lease replaced by another claim, or deleted by anyone but its holder (only a
    /// step that delivered, resumed or resolved the operation may see its lease go: the holder
    /// giving back its claim).
    pub(super) fn lease_overwritten(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let before = self.last_seen[op].as_ref()?;
        let was_live = before.status == Status::InProgress
            && before.lease.expires_at > now + MAX_SKEW + Duration::from_secs(1);
        if !was_live {
            return None;
        }
        match record {
            Some(after) if after.lease.token != before.lease.token => Some(format!(
                "operation {op}: the live lease of attempt {} was overwritten by attempt {}",
                before.lease.attempt, after.lease.attempt
            )),
            None if !self.touched[op] => Some(format!(
                "operation {op}: the live lease of attempt {} disappeared in a step that did not touch it",
                before.lease.attempt
            )),
            _ => None,
        }
    }

    /// A recorded outcome gone or changed within its retention.
    pub(super) fn outcome_lost(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
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

    /// A record and the evidence of the identity it recorded at its claim that tell different
    /// stories.
    pub(super) async fn evidence_disagrees(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let record = record?;
        let identity = record.identity.as_deref()?;
        let settled_and_expired =
            matches!(record.status, Status::Completed | Status::Failed) && record.expires_at < now;
        if settled_and_expired {
            return None;
        }
        let evidence = self.store.inner().evidence(identity).await.ok().flatten();
        match evidence {
            Some(evidence) if evidence.key == record.key && evidence.status == record.status => {
                None
            }
            other => Some(format!(
                "operation {op}: its record is {} but the evidence of its identity is {:?}",
                record.status,
                other.map(|evidence| evidence.status)
            )),
        }
    }
}

/// Whether a consumer acknowledges the message on this error (as the batch processor does).
pub(super) fn acknowledges(err: &Error) -> bool {
    err.already_took_effect()
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
    pub(super) async fn untruthful(
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
                        Behaviour::TerminalFailure
                            | Behaviour::RetryableFailure
                            | Behaviour::FailAfterStep
                            | Behaviour::RefusedCompletion
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
            Err(Error::Failed { failure, .. }) if failure.kind == FailureKind::Released => {
                Some(format!(
                    "operation {op}: an operator released it, yet it was answered as a retained failure"
                ))
            }
            Err(err) if judged.gave_up_early(err) => Some(format!(
                "operation {op}: the settlement gave up ({}) though its outage ended well before the deadline",
                error_name(err)
            )),
            Err(_) => None,
        }
    }
}
