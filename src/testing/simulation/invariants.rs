//! DESIGN's invariants, checked after every step: the ledger's account of every run, and, on
//! the store as it stands, that a live lease is never overwritten nor deleted by anyone but
//! its holder, a recorded outcome (or step result) is never lost or changed within retention,
//! and a record and its evidence tell one story, and a record goes missing only by a release or
//! a TTL sweep after its expiry. Every answer a caller got is judged (one rule per variant)
//! against the ledger, the downstream truth and the store, and at the end of a run every
//! operation must reach a settled answer.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::Violation;
use super::actors::{AfterTimeout, Answer, Behaviour, MAX_SKEW, lock};
use super::world::{Absence, Deploy, LEASE, World, error_name};
use crate::clock::Clock;
use crate::error::Error;
use crate::execution::Execution;
use crate::record::{FailureKind, Record, Status};
use crate::store::{Store, StoreExt};

/// How many deliveries the final sweep makes per operation before calling it stuck.
const SETTLE_ROUNDS: usize = 6;
/// How late after an outage's end a settlement may still land: the largest back-off pause,
/// the workers' skew, and the settlement's margin before the deadline.
const OUTAGE_SLACK: Duration = Duration::from_secs(2 + 2 + 1);

/// What a delivery's answer is judged against.
#[derive(Clone)]
pub(super) struct Judged {
    pub(super) op: usize,
    pub(super) behaviour: Behaviour,
    /// The invocation's deadline, on the world's clock.
    pub(super) deadline: SystemTime,
    /// When the outage the handler started ends, on the world's clock.
    pub(super) outage_end: Option<SystemTime>,
    /// Whether the delivery carried another intent than the operation's (a neighbouring
    /// amount): a payload conflict, and nothing else.
    pub(super) other_intent: bool,
    /// The evidence key of the business identity the delivery declared, if any.
    pub(super) identity: Option<String>,
    /// What the reconciler and the steps' checks were told to answer.
    pub(super) answer: Answer,
    /// The run's figures as the handler's run began (its delivery, for a resumed one).
    pub(super) before: Before,
}

/// The run's figures as a delivery began, to tell what happened since.
#[derive(Debug, Clone, Copy)]
pub(super) struct Before {
    /// Faults fired (outages' failures included): a store error is truthful only if one fired
    /// since.
    pub(super) faults: u64,
    /// The reconciler's decisions (`Applied`, `NotApplied`) about the delivery's operation.
    pub(super) decided: u64,
    /// Completions handed to the engine that their condition refuses by design.
    pub(super) refusals: u64,
    /// The reconciler's `Applied` answers about the delivery's operation for an execution of
    /// an earlier life (an adopted orphan whose effect applied then).
    pub(super) earlier_lives: u64,
}

impl<S: Store + Clone> World<S> {
    /// Checks DESIGN's invariants after a step.
    pub(super) async fn check(&mut self, step: usize) -> Result<(), Violation> {
        self.observe_existence();
        if let Some(invariant) = self.pending_violation.take() {
            return Err(self.violation(step, invariant));
        }
        if let Some(blind) = lock(&self.shared).violations.first().cloned() {
            return Err(self.violation(step, blind));
        }
        if let Some(disagrees) = self.transaction_disagrees().await {
            return Err(self.violation(step, disagrees));
        }
        #[cfg(feature = "relay")]
        if let Some(repeated) = self.outbox_effect_repeated() {
            return Err(self.violation(step, repeated));
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
            if record.is_none() {
                // A give-back released in a task of its own may have applied since the
                // account above was taken: take it again, after the read.
                self.observe_existence();
            }
            let counted = lock(&self.shared).ledger.check(op);
            let broken = counted
                .err()
                .or_else(|| self.lease_overwritten(op, record.as_ref(), now))
                .or_else(|| self.outcome_lost(op, record.as_ref(), now))
                .or_else(|| self.step_result_changed(op, record.as_ref()))
                .or_else(|| self.record_lost(op, record.as_ref()));
            let broken = match broken {
                Some(broken) => Some(broken),
                None => self.evidence_disagrees(op, record.as_ref(), now).await,
            };
            if let Some(invariant) = broken {
                return Err(self.violation(step, invariant));
            }
            if let Some(record) = &record {
                self.absence[op] = Absence::Stands;
                let mut downstream = lock(&self.shared);
                let life = downstream.ledger.life(op);
                downstream
                    .executions
                    .entry((op, crate::record::epoch_millis(record.created_at)))
                    .or_insert(life);
            }
            if let Some(record) = record.as_ref().filter(|r| r.status == Status::Completed) {
                if let Some(outcome) = &record.outcome {
                    self.outcome_recorded(op, outcome);
                }
                self.completed_seen[op] = Some(record.clone());
            }
            if let Some(record) = record.as_ref().filter(|r| r.status == Status::Failed) {
                self.failed_seen[op] = Some(record.clone());
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

    /// A record missing where nothing could have removed it: no release, no operator, no TTL
    /// sweep after its expiry. Its operation would otherwise start a new life, unjudged.
    fn record_lost(&self, op: usize, record: Option<&Record>) -> Option<String> {
        (record.is_none() && self.absence[op] == Absence::Stands).then(|| {
            format!(
                "operation {op}: its record is missing, though no release, operator or TTL sweep after its expiry removed it"
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
        #[cfg(feature = "relay")]
        if let Err(broken) = self.outbox_drained().await {
            return Err(self.violation(step, broken));
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

/// What a judgement reads of the world, once, as the answer left it.
struct Seen {
    /// Effects of the operation in its current life, and in all its lives.
    effects: u32,
    ever: u32,
    /// Whether the reconciler answered `Applied` for an execution of an earlier life (an
    /// adopted orphan's) since the delivery began.
    earlier_life: bool,
    /// Its record as it stands now.
    record: Option<Record>,
    /// The evidence of the identity the delivery declared, as it stands now.
    evidence: Option<crate::record::Evidence>,
    /// Whether a fault (or an outage's failure) fired in the step.
    faulted: bool,
    /// Whether the reconciler decided (`Applied`, `NotApplied`) about the operation since the
    /// delivery began.
    decided: bool,
    /// Whether a handler handed the engine a completion refused by design in the step.
    refused: bool,
    now: SystemTime,
}

impl<S: Store + Clone> World<S> {
    /// Judges one answer a worker got against the ledger, the downstream truth and the store as
    /// the answer left it: every variant has its rule, and one this simulation never provokes
    /// is itself a violation. `Some` names the lie.
    ///
    /// - a value: the operation's own, never to a delivery of another intent; `Executed` only
    ///   for a handler that returned, with its effect in this life and no earlier completion
    ///   of this life; `Replayed` only the outcome as recorded (the record standing, or a
    ///   completion of this life, or the last completion while a skewed clock keeps it), never without an effect; `Reconciled` only with an effect;
    /// - `PayloadConflict` only for a delivery of another intent;
    /// - `AlreadyInProgress` only while another attempt holds a live lease (on some worker's
    ///   clock);
    /// - `Indeterminate` only with the record (or, once TTL took it, its evidence) held, after a
    ///   takeover, a refused completion or a hold already standing, and, for a handler without
    ///   steps, never right after the reconciler decided;
    /// - `KeyExpiredConflict` only with standing evidence and the record gone or expired, and
    ///   an acknowledging one only with an effect of some life;
    /// - `Failed` only for a retained terminal failure standing, or kept by a skewed clock (never
    ///   an operator's release);
    /// - `ReconcileFailed` only where the reconciler or a check was told to fail;
    /// - `LeaseLost` only where another attempt (or nothing) holds the record, or a fault
    ///   fired in the step; `Store` only where a fault or an outage fired in the step, and a
    ///   settlement never gives up with its outage over well before the deadline;
    /// - `Handler` only for a handler that fails (or whose write a fault failed).
    pub(super) async fn judge(
        &self,
        judged: &Judged,
        answer: &Result<Execution<Value>, Error>,
    ) -> Option<String> {
        let op = judged.op;
        let key = &self.specs[op].key;
        let record = self.store.inner().get(key).await.ok().flatten();
        let evidence = match &judged.identity {
            Some(identity) => self.store.inner().evidence(identity).await.ok().flatten(),
            None => None,
        };
        let (effects, ever, decided, refused, earlier_life) = {
            let downstream = lock(&self.shared);
            let decided = downstream.decisions[op];
            (
                downstream.ledger.effects(op),
                downstream.ledger.effects_ever(op),
                decided > judged.before.decided,
                downstream.refusals > judged.before.refusals,
                downstream.applied_for_earlier_lives[op] > judged.before.earlier_lives,
            )
        };
        let seen = Seen {
            effects,
            earlier_life,
            ever,
            record,
            evidence,
            faulted: self.store.fired().values().sum::<u64>() > judged.before.faults,
            decided,
            refused,
            now: self.clock.now(),
        };
        if judged.other_intent {
            return match answer {
                Err(Error::PayloadConflict { .. }) => None,
                _ => Some(format!(
                    "operation {op}: a delivery of its key with a neighbouring amount (equal to its own above 2^53 only) was answered {} instead of a payload conflict",
                    answered(answer)
                )),
            };
        }
        match answer {
            Ok(done) => self.judge_value(judged, &seen, done),
            Err(err) => self.judge_error(judged, &seen, err),
        }
    }

    fn judge_value(&self, judged: &Judged, seen: &Seen, done: &Execution<Value>) -> Option<String> {
        let op = judged.op;
        if done.value().get("op") != Some(&json!(op)) {
            return Some(format!(
                "operation {op}: the caller was answered another operation's outcome: {}",
                done.raw_json().get().chars().take(80).collect::<String>()
            ));
        }
        let raw = done.raw_json().get().as_bytes();
        match done.origin() {
            crate::Origin::Executed { attempt } => {
                let failing = matches!(
                    judged.behaviour,
                    Behaviour::TerminalFailure
                        | Behaviour::RetryableFailure
                        | Behaviour::FailAfterStep
                        | Behaviour::RefusedCompletion
                );
                if failing {
                    return Some(format!(
                        "operation {op}: a failed handler was answered as executed"
                    ));
                }
                if done.value().get("attempt") != Some(&json!(attempt)) {
                    return Some(format!(
                        "operation {op}: answered as executed by attempt {attempt}, with another attempt's result"
                    ));
                }
                if seen.effects == 0 {
                    return Some(format!(
                        "operation {op}: answered as executed, but the downstream shows no effect in this life"
                    ));
                }
                let earlier = self.life_outcomes[op]
                    .iter()
                    .any(|outcome| outcome.as_slice() != raw);
                earlier.then(|| {
                    format!(
                        "operation {op}: executed again (attempt {attempt}) though this life already recorded a completion"
                    )
                })
            }
            // A replay may outlive the record's life (a clock behind, a cache): the record as
            // it stands, or a completion of this life, vouches for it; an effect of some life
            // must.
            crate::Origin::Replayed if seen.ever == 0 => Some(format!(
                "operation {op}: the caller was told it took effect, but the downstream shows none"
            )),
            crate::Origin::Replayed => {
                let standing = seen
                    .record
                    .as_ref()
                    .filter(|record| record.status == Status::Completed)
                    .and_then(|record| record.outcome.as_deref());
                // A worker whose clock is behind (its cache too) still replays the last
                // completion seen until its expiry passes on that clock, even once a TTL sweep
                // on the true clock started a new life.
                let skewed_clock_still_keeps = self.completed_seen[op].as_ref().is_some_and(|last| {
                    last.outcome.as_deref() == Some(raw)
                        && last.expires_at + MAX_SKEW + Duration::from_secs(1) > seen.now
                });
                let recorded = standing == Some(raw)
                    || skewed_clock_still_keeps
                    || self.life_outcomes[op]
                        .iter()
                        .any(|outcome| outcome.as_slice() == raw);
                (!recorded).then(|| {
                    format!(
                        "operation {op}: a replay that is neither the recorded outcome, a completion of this life nor one a skewed clock still keeps"
                    )
                })
            }
            crate::Origin::Reconciled { .. } => (seen.effects == 0 && !seen.earlier_life).then(|| {
                format!(
                    "operation {op}: the reconciler's answer was recorded, but the downstream shows no effect"
                )
            }),
        }
    }

    fn judge_error(&self, judged: &Judged, seen: &Seen, err: &Error) -> Option<String> {
        let op = judged.op;
        let now = seen.now;
        let record = seen.record.as_ref();
        let lie = |why: &str| {
            Some(format!(
                "operation {op}: answered {}: {why}",
                error_name(err)
            ))
        };
        // Evidence outlives a life: it vouches for an effect of any of them.
        if acknowledges(err) && seen.ever == 0 {
            return lie("told it took effect, but the downstream shows none");
        }
        match err {
            Error::PayloadConflict { .. } => lie("a delivery of its own intent"),
            Error::AlreadyInProgress { attempt, .. } => {
                let live = record.is_some_and(|record| {
                    record.status == Status::InProgress
                        && record.lease.attempt == *attempt
                        && record.lease.expires_at + MAX_SKEW + Duration::from_secs(1) > now
                });
                (!live).then(|| {
                    format!(
                        "operation {op}: answered AlreadyInProgress (attempt {attempt}), but no live lease of that attempt stands: {}",
                        describe(record)
                    )
                })
            }
            Error::Indeterminate { .. } => {
                let held_record = record.is_some_and(|record| record.status == Status::Indeterminate);
                let held_evidence = seen
                    .evidence
                    .as_ref()
                    .is_some_and(|evidence| evidence.status == Status::Indeterminate);
                // A takeover (attempt 2 or later) meets an attempt that may have acted: the
                // engine cannot tell one that never reached its handler.
                let taken_over = record.is_some_and(|record| record.lease.attempt > 1);
                let held_before = self.last_seen[op]
                    .as_ref()
                    .is_some_and(|record| record.status == Status::Indeterminate);
                if !(held_record || held_evidence) {
                    lie(&format!("nothing is held: {}", describe(record)))
                } else if !(held_before || seen.refused || taken_over) {
                    lie("held though nothing was taken over, no completion refused and no hold stood")
                } else if seen.decided && !held_before && !seen.refused && !self.specs[op].stepped {
                    // A stepped handler's steps are checked apart: one without a check (or
                    // whose check cannot tell) is held whatever the reconciler said.
                    lie("held right after the reconciler decided")
                } else {
                    None
                }
            }
            Error::KeyExpiredConflict { .. } => {
                let gone = record.is_none_or(|record| {
                    record.counts_as_absent(now + MAX_SKEW + Duration::from_secs(1))
                });
                match (&seen.evidence, gone) {
                    (Some(_), true) => None,
                    (None, _) => lie("no evidence of its identity stands"),
                    (Some(_), false) => lie(&format!("its record stands: {}", describe(record))),
                }
            }
            Error::Failed { failure, .. } if failure.kind == FailureKind::Released => {
                lie("an operator released it, yet it was answered as a retained failure")
            }
            Error::Failed { .. } => {
                // As for a replay: a worker whose clock is behind (its cache too) keeps the last
                // retained failure until its expiry passes on that clock.
                let retained = record.is_some_and(|record| record.status == Status::Failed)
                    || self.failed_seen[op].as_ref().is_some_and(|last| {
                        last.expires_at + MAX_SKEW + Duration::from_secs(1) > now
                    });
                (!retained).then(|| {
                    format!(
                        "operation {op}: answered Failed, but no retained failure stands, nor one a skewed clock still keeps: {}",
                        describe(record)
                    )
                })
            }
            Error::ReconcileFailed { .. } => {
                (judged.answer != Answer::Fails).then(|| {
                    format!("operation {op}: answered ReconcileFailed, but the reconciler and the checks answer {:?}", judged.answer)
                })
            }
            Error::LeaseLost { attempt, .. } => {
                // Taken over, gone, or resolved by an operator (its trace on the record).
                let taken = record.is_none_or(|record| {
                    record.lease.attempt != *attempt || record.audit.is_some()
                });
                (!taken && !seen.faulted).then(|| {
                    format!(
                        "operation {op}: answered LeaseLost (attempt {attempt}) with no fault in the step, but its attempt still holds the record: {}",
                        describe(record)
                    )
                })
            }
            Error::Store(_) if !seen.faulted => lie("no fault or outage fired in the step"),
            Error::Store(_) if judged.gave_up_early(err) => {
                lie("the settlement gave up though its outage ended well before the deadline")
            }
            Error::Store(_) => None,
            Error::Handler { .. } => {
                let fails = matches!(
                    judged.behaviour,
                    Behaviour::TerminalFailure
                        | Behaviour::RetryableFailure
                        | Behaviour::FailAfterStep
                        | Behaviour::RefusedCompletion
                        | Behaviour::LateEffect {
                            then: AfterTimeout::Fails,
                            ..
                        }
                );
                (!fails && !seen.faulted && !seen.refused).then(|| {
                    format!(
                        "operation {op}: answered Handler, but its handler ({}) does not fail, no completion was refused and no fault fired",
                        judged.behaviour.name()
                    )
                })
            }
            Error::MissingKey { .. }
            | Error::CallerUnidentified
            | Error::TenantMissing { .. }
            | Error::InvalidEvent { .. }
            | Error::OutcomeTooLarge { .. }
            | Error::StoredOutcomeUnreadable { .. }
            | Error::OutcomeMismatch { .. }
            | Error::StepMismatch { .. }
            | Error::RecordsFailed { .. } => {
                lie("nothing in this simulation provokes it (well-formed invocations, outcomes within the limit, deterministic steps)")
            }
        }
    }
}

/// The answer, for a message.
fn answered(answer: &Result<Execution<Value>, Error>) -> String {
    match answer {
        Ok(done) => format!("{:?}", done.origin()),
        Err(err) => error_name(err),
    }
}

/// A record's state, for a message.
fn describe(record: Option<&Record>) -> String {
    match record {
        Some(record) => format!(
            "{} attempt {} lease until {:?} expires {:?}",
            record.status, record.lease.attempt, record.lease.expires_at, record.expires_at
        ),
        None => "no record".into(),
    }
}
