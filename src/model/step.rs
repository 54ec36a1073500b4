//! A worker's steps: each one store request (or none), and the engine's decision on its answer.

use std::time::Duration;

use super::properties::ALLOWED;
use super::state::{Answer, Flight, Held, Pc, Phase, State, Worker};
use super::{Handler, Protocol, Revert, at, ready, tick};
use crate::engine::INDETERMINATE_RETENTION;
use crate::engine::answer::{answer_existing, identity_taken};
use crate::engine::decide::{
    self, AfterFailure, Claimed, Failure, Recover, StepStanding, TookOver,
};
use crate::engine::settle::settle_patience;
use crate::error::Error;
use crate::key::OperationKey;
use crate::reconcile::Recovery;
use crate::record::{FailureKind, Record, RetainedFailure, Settlement, Status, StepRecord};
use crate::store::{Claim, Fence, Guard, MemoryStore, Request, StoreExt, Target};
use crate::testing::transitions;

/// The stepped handler's one step.
const STEP: &str = "charge";

/// How long before its deadline a worker stops retrying a settlement (the design's margin).
const SETTLE_MARGIN: u64 = 1;

/// A late step's declared effect timeout, in ticks: its effect lands before its start plus
/// this, or never.
const EFFECT_TIMEOUT: u64 = 2;

impl Protocol {
    /// Whether worker `w` has a step to take now.
    pub(super) fn can_step(&self, state: &State, worker: &Worker) -> bool {
        if self.past_deadline(state, worker) {
            return true;
        }
        match &worker.pc {
            Pc::Ready => true,
            Pc::Done(_) | Pc::Dead => false,
            Pc::Settling { not_before, .. } => state.now + worker.skew >= *not_before,
            Pc::ResendClaim { .. }
            | Pc::TakingOver { .. }
            | Pc::Running(_)
            | Pc::GivingBack { .. }
            | Pc::GivingBackSteps { .. } => true,
        }
    }

    /// Whether worker `w`'s next step writes to the store (so that its answer can be lost).
    pub(super) fn writes(&self, state: &State, worker: &Worker) -> bool {
        !state.down
            && matches!(
                worker.pc,
                Pc::Ready | Pc::ResendClaim { .. } | Pc::TakingOver { .. } | Pc::Settling { .. }
            )
    }

    /// Worker `w`'s next step; with `lose`, its write commits and the answer is lost.
    pub(super) fn step(&self, state: &mut State, w: usize, lose: bool) {
        let worker = state.workers[w].clone();
        let clock = state.now + worker.skew;
        let pc = worker.pc.clone();
        let stepped = self.bounds.handler == Handler::Stepped;
        if self.past_deadline(state, &worker) {
            // Lambda ends the invocation at its deadline, wherever it is.
            state.workers[w].pc = Pc::Dead;
            return;
        }
        let next = match pc {
            Pc::Ready => self.claim(state, w, clock, None, lose),
            Pc::ResendClaim { claim, started } => {
                self.claim(state, w, clock, Some((claim, started)), lose)
            }
            Pc::TakingOver {
                claim,
                started,
                existing,
                lease,
                expires_at,
            } => {
                if state.down {
                    return;
                }
                let request = Request::TakeOver {
                    previous: &existing,
                    lease: &lease,
                    expires_at: at(expires_at),
                    now: at(clock),
                };
                let fence = self.write(state, &existing.key, &lease.token, request, |store| {
                    ready(store.take_over(&existing, &lease, at(expires_at), at(clock)))
                });
                if lose {
                    return;
                }
                let Ok(fence) = fence else {
                    state.workers[w].pc = Pc::Done(Answer::Unavailable);
                    return;
                };
                match decide::took_over(fence, &lease) {
                    TookOver::Held => {
                        let claim = Box::new(Record {
                            lease: lease.clone(),
                            ..*claim
                        });
                        self.recover(state, w, claim, started, existing, false)
                    }
                    TookOver::Answer(current) => {
                        Pc::Done(self.answer_from(state, w, *current, clock))
                    }
                    // The engine claims again once, as a caller told to retry at once would.
                    TookOver::Gone => Pc::Done(Answer::RetryNow),
                }
            }
            Pc::Running(held) if stepped && held.phase != Phase::Acted => {
                self.stepped(state, w, clock, held, lose)
            }
            Pc::Running(held) if stepped => {
                // The step's result goes with the settlement.
                let outcome = format!("{w}").into_bytes();
                let mut steps = held.steps.clone();
                if let Some(step) = steps.last_mut() {
                    step.result = Some(outcome.clone());
                }
                let settlement = Settlement::completed(outcome, None, at(clock), self.retention())
                    .with_steps(Some(steps));
                settling(held, Some(settlement), clock)
            }
            Pc::Running(held) if self.bounds.handler == Handler::Transactional => {
                // The handler's write and event go with its settlement, in one transaction.
                let outcome = format!("{w}").into_bytes();
                let settlement = Settlement::completed(outcome, None, at(clock), self.retention());
                settling(held, Some(settlement), clock)
            }
            Pc::Running(held) => {
                // The handler acts and succeeds: one effect.
                self.act(state, w, &held);
                let outcome = format!("{w}").into_bytes();
                let settlement = Settlement::completed(outcome, None, at(clock), self.retention());
                settling(held, Some(settlement), clock)
            }
            Pc::Settling {
                held,
                settlement,
                tries,
                not_before,
            } => self.settle(state, w, clock, held, settlement, tries, not_before, lose),
            Pc::GivingBack { held, until } => self.give_back(state, &held, until),
            Pc::GivingBackSteps { held } => self.give_back_steps(state, clock, held),
            Pc::Done(_) | Pc::Dead => return,
        };
        if let Pc::Done(answer) = &next {
            self.check_answer(state, w, answer);
        }
        state.workers[w].pc = next;
    }

    /// A stepped handler's step before its effect is settled: where it stands, its intent,
    /// its effect.
    fn stepped(&self, state: &mut State, w: usize, clock: u64, mut held: Held, lose: bool) -> Pc {
        match held.phase {
            Phase::Intended if self.bounds.late => return self.send(state, w, clock, held),
            Phase::Intended => {
                self.act(state, w, &held);
                held.phase = Phase::Acted;
                return Pc::Running(held);
            }
            Phase::Sent => return self.answered(state, w, clock, held),
            Phase::Start | Phase::Acted => {}
        }
        match decide::step_standing(&held.steps, 0, STEP) {
            StepStanding::Done(bytes) => {
                // Recorded: returned without running, and the handler completes with it.
                let outcome = bytes.to_vec();
                let settlement = Settlement::completed(outcome, None, at(clock), self.retention());
                settling(held, Some(settlement), clock)
            }
            StepStanding::Uncertain => {
                let again = match self.revert {
                    Some(Revert::UncertainStepRerun) => true,
                    _ => decide::rerun_uncertain(false, self.recovery),
                };
                if again {
                    // Under `Recovery::Rerun` every effect is declared safe to repeat.
                    held.excused |= self.recovery == Recovery::Rerun;
                    held.phase = Phase::Intended;
                    return Pc::Running(held);
                }
                if self.bounds.checked {
                    // The step's check reads the downstream truth: applied, its result is the
                    // step's; not applied, the step runs.
                    let op = state.workers[w].op;
                    if state.effects[op] == 0 {
                        held.phase = Phase::Intended;
                        return Pc::Running(held);
                    }
                    let outcome = format!("checked-{w}").into_bytes();
                    if let Some(step) = held.steps.last_mut() {
                        step.result = Some(outcome.clone());
                    }
                    let settlement =
                        Settlement::completed(outcome, None, at(clock), self.retention())
                            .with_steps(Some(held.steps.clone()));
                    return settling(held, Some(settlement), clock);
                }
                // No check: the operation is held for an operator.
                let settlement = Settlement::indeterminate(at(clock), INDETERMINATE_RETENTION);
                settling(held, Some(settlement), clock)
            }
            StepStanding::New => {
                if state.down {
                    return Pc::Running(held);
                }
                let intent = vec![StepRecord::intent(STEP, held.claim.lease.attempt)];
                let target = Target {
                    key: &held.claim.key,
                    identity: None,
                    guard: Guard::Lease(&held.claim.lease.token),
                };
                let request = Request::RecordSteps {
                    target,
                    steps: &intent,
                };
                let token = &held.claim.lease.token;
                let written = self.write(state, &held.claim.key, token, request, |store| {
                    ready(store.record_steps(target, &intent))
                });
                if lose {
                    return Pc::Running(held);
                }
                match written {
                    Ok(Fence::Held) => {
                        held.steps = intent;
                        held.phase = Phase::Intended;
                        Pc::Running(held)
                    }
                    Ok(Fence::Lost { .. }) => Pc::Done(Answer::LeaseLost),
                    Err(err) => Pc::Done(Answer::Refused(err.to_string())),
                }
            }
            StepStanding::Mismatch(_) => Pc::Done(Answer::Refused("step mismatch".into())),
        }
    }

    /// The handler fails retryably: before it acted, the claim is released; after its step,
    /// the claim is given back with its steps (the engine's decision table).
    pub(super) fn fail(&self, state: &mut State, w: usize) {
        let clock = state.now + state.workers[w].skew;
        if let Pc::Running(mut held) = state.workers[w].pc.clone() {
            if held.phase == Phase::Acted
                && let Some(step) = held.steps.last_mut()
            {
                // The step's result is the ledger's, written with the give-back.
                step.result = Some(format!("{w}").into_bytes());
            }
            state.workers[w].pc = self.after_failure(held, Failure::Handler, self.recovery, clock);
        }
    }

    /// Worker `w`'s completion is refused (its writes' condition failed): nothing of it
    /// committed, and its handler's effects outside it happened.
    pub(super) fn refuse(&self, state: &mut State, w: usize) {
        let clock = state.now + state.workers[w].skew;
        if let Pc::Settling { held, .. } = state.workers[w].pc.clone() {
            let recovery = match self.revert {
                Some(Revert::RefusedCompletionReleased) => Recovery::Rerun,
                _ => self.recovery,
            };
            let next = self.after_failure(held, Failure::CompletionRefused, recovery, clock);
            if matches!(
                next,
                Pc::Settling {
                    settlement: None,
                    ..
                }
            ) && self.recovery == Recovery::Rerun
            {
                // Released: a handler declared safe to repeat runs again, excused.
                state.afresh[state.workers[w].op] = true;
            }
            state.workers[w].pc = next;
        }
    }

    /// What the engine does after a retryable `failure` of the attempt `held` (the decision
    /// table): released, given back with its steps, or held.
    fn after_failure(&self, held: Held, failure: Failure, recovery: Recovery, clock: u64) -> Pc {
        let retryable = crate::failure::FailureClass::Retryable;
        let recorded = !held.steps.is_empty();
        match decide::after_failure(failure, &retryable, recovery, recorded) {
            AfterFailure::Release => settling(held, None, clock),
            AfterFailure::GiveBack => Pc::GivingBackSteps { held },
            AfterFailure::Hold | AfterFailure::Retain(_) => {
                let settlement = Settlement::indeterminate(at(clock), INDETERMINATE_RETENTION);
                settling(held, Some(settlement), clock)
            }
        }
    }

    /// A late step's effect is sent: it lands downstream within the step's effect timeout, or
    /// never.
    fn send(&self, state: &mut State, w: usize, clock: u64, mut held: Held) -> Pc {
        let op = state.workers[w].op;
        let excused = std::mem::take(&mut state.fresh_excuse[op]) || held.excused;
        state.workers[w].unrecorded = true;
        // It lands before its timeout, and before its invocation's lease ends (the lease's
        // margin past the deadline): the protocol's assumption for every effect, a crashed
        // invocation's too.
        let lease_end = tick(held.claim.lease.expires_at).saturating_sub(state.workers[w].skew);
        state.flights.push(Flight {
            sender: Some(w),
            op,
            until: (state.now + EFFECT_TIMEOUT).min(lease_end),
            excused,
            landed: false,
        });
        held.lands_by = Some((clock + EFFECT_TIMEOUT).min(tick(held.claim.lease.expires_at)));
        held.phase = Phase::Sent;
        Pc::Running(held)
    }

    /// A late step's effect answers: its result, if it landed; otherwise the step times out,
    /// uncertain, and the handler fails retryably (its effect may still land).
    fn answered(&self, state: &mut State, w: usize, clock: u64, mut held: Held) -> Pc {
        let flight = state.flights.iter().position(|f| f.sender == Some(w));
        match flight {
            Some(f) if state.flights[f].landed => {
                state.flights.remove(f);
                held.phase = Phase::Acted;
                held.lands_by = None;
                Pc::Running(held)
            }
            _ => {
                if let Some(f) = flight {
                    state.flights[f].sender = None;
                }
                self.after_failure(held, Failure::Handler, self.recovery, clock)
            }
        }
    }

    /// Step effect `f` lands downstream: one effect of its operation.
    pub(super) fn land(&self, state: &mut State, f: usize) {
        let flight = state.flights[f].clone();
        state.effects[flight.op] += 1;
        state.excused[flight.op] += u8::from(flight.excused);
        let awaited = flight.sender.is_some_and(
            |s| matches!(&state.workers[s].pc, Pc::Running(held) if held.phase == Phase::Sent),
        );
        match awaited {
            true => state.flights[f].landed = true,
            false => {
                state.flights.remove(f);
            }
        }
    }

    /// The step ledger's give-back: the steps written with the attempt's mark, fenced, then
    /// the lease cut to when the step's effect can have landed (kept if that is its end). In
    /// an outage both fail, and the claim waits out its lease.
    fn give_back_steps(&self, state: &mut State, clock: u64, held: Held) -> Pc {
        if state.down {
            return Pc::Done(Answer::Released);
        }
        let token = held.claim.lease.token.clone();
        let target = Target {
            key: &held.claim.key,
            identity: None,
            guard: Guard::Lease(&token),
        };
        let mut marked = held.steps.clone();
        marked.push(StepRecord::given_back(held.claim.lease.attempt));
        let request = Request::RecordSteps {
            target,
            steps: &marked,
        };
        let written = self.write(state, &held.claim.key, &token, request, |store| {
            ready(store.record_steps(target, &marked))
        });
        match written {
            Ok(Fence::Held) => {}
            Ok(Fence::Lost { .. }) => return Pc::Done(Answer::LeaseLost),
            Err(err) => return Pc::Done(Answer::Refused(err.to_string())),
        }
        let lands_by = match self.revert {
            Some(Revert::GiveBackWithoutGrace) => None,
            _ => held.lands_by.map(at),
        };
        let lease_end = held.claim.lease.expires_at;
        let until = decide::given_back_until(at(clock), lease_end, Duration::ZERO, lands_by);
        if until < lease_end {
            let request = Request::Shorten { target, until };
            let _ = self.write(state, &held.claim.key, &token, request, |store| {
                ready(store.shorten(target, until))
            });
        }
        Pc::Done(Answer::Released)
    }

    /// The handler fails terminally (its classifier's terminal class): the failure is
    /// retained, and replayed to every later delivery within retention.
    pub(super) fn decline(&self, state: &mut State, w: usize) {
        let clock = state.now + state.workers[w].skew;
        if let Pc::Running(held) = state.workers[w].pc.clone() {
            let failure = RetainedFailure {
                kind: FailureKind::Terminal("declined".into()),
                message: "the card was declined".into(),
            };
            let settlement = Settlement::failed(&failure, at(clock), self.retention());
            state.workers[w].pc = settling(held, Some(settlement), clock);
        }
    }

    /// A claim (or its re-sending, `resend`) and what its answer means.
    fn claim(
        &self,
        state: &mut State,
        w: usize,
        clock: u64,
        resend: Option<(Box<Record>, u64)>,
        lose: bool,
    ) -> Pc {
        let worker = state.workers[w].clone();
        let resending = resend.is_some();
        let (claim, started) = match resend {
            Some(resent) => resent,
            None => {
                let invocation = self.invocation(&worker, clock);
                let token = format!("w{w}");
                let mut claim =
                    decide::claim_record(&invocation, token, at(clock), self.retention());
                if self.revert == Some(Revert::IdentityNotClaimed) {
                    claim.identity = None;
                }
                (Box::new(claim), clock)
            }
        };
        if state.down {
            // The claim's tries fail before anything commits: the caller's redelivery retries.
            return match resending {
                false => Pc::Done(Answer::Unavailable),
                true => Pc::ResendClaim { claim, started },
            };
        }
        if self.revert == Some(Revert::InProgressExpires)
            && let Some(stale) = state.record(&claim.key)
            && stale.is_expired(at(clock))
        {
            // The old condition: any record past its retention counted as absent.
            state.records.retain(|record| record.key != claim.key);
        }
        let request = Request::Claim {
            record: &claim,
            now: at(clock),
        };
        let claimed = self.write(state, &claim.key, &claim.lease.token, request, |store| {
            ready(store.claim(&claim, at(clock)))
        });
        if lose {
            return Pc::ResendClaim { claim, started };
        }
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(err) => return Pc::Done(Answer::Refused(err.to_string())),
        };
        let verdict = match (self.revert, claimed) {
            (Some(Revert::OwnClaimUnrecognised), Claim::Existing(existing))
                if decide::is_own_claim(&existing, &claim) =>
            {
                Claimed::Answer(existing)
            }
            (_, claimed) => decide::claimed(claimed, &claim, at(clock)),
        };
        let invocation = self.invocation(&worker, started);
        match verdict {
            Claimed::Run => {
                // A fresh claim after the last outcome's retention ended, or after TTL deleted
                // an unsettled record without an identity, starts a new operation (the
                // design's: only evidence outlives retention).
                let op = worker.op;
                let expired = state.first_outcome[op]
                    .as_ref()
                    .is_some_and(|first| first.until < clock);
                // Excused only after an outcome that had an effect, not a retained failure.
                let effected = expired
                    && state.first_outcome[op]
                        .as_ref()
                        .is_some_and(|first| first.status == Status::Completed);
                if expired {
                    state.first_outcome[op] = None;
                }
                // Never past COMPLETED evidence that the claim declares: that is the design's
                // KeyExpiredConflict. A deployment that no longer declares the identity cannot
                // find the evidence (it is keyed by the identity): past retention its delivery
                // is a new operation, as the seeded simulation judges it too.
                let evidence_done = claim.identity.as_ref().is_some_and(|identity| {
                    state
                        .evidence
                        .iter()
                        .any(|(id, e)| id == identity && e.status == Status::Completed)
                });
                let fresh = (std::mem::take(&mut state.afresh[op]) || effected) && !evidence_done;
                state.fresh_excuse[op] |= fresh;
                Pc::Running(Held {
                    claim,
                    started,
                    previous: None,
                    excused: false,
                    steps: Vec::new(),
                    phase: Phase::Start,
                    lands_by: None,
                })
            }
            Claimed::TakeOver(existing) => {
                let (lease, expires_at) = match self.revert {
                    Some(Revert::TakeoverKeepsRetention) => {
                        let (lease, _) =
                            decide::takeover(&existing, &claim.lease, self.retention());
                        (lease, existing.expires_at)
                    }
                    _ => decide::takeover(&existing, &claim.lease, self.retention()),
                };
                Pc::TakingOver {
                    claim,
                    started,
                    existing: Box::new(existing),
                    lease,
                    expires_at: tick(expires_at),
                }
            }
            Claimed::Adopt(orphan) => {
                let record = decide::adoption(&claim, &orphan);
                let request = Request::Adopt {
                    record: &record,
                    orphan: &orphan,
                    now: at(clock),
                };
                let token = &record.lease.token;
                let adopted = self.write(state, &record.key, token, request, |store| {
                    ready(store.adopt(&record, &orphan, at(clock)))
                });
                match adopted {
                    Ok(Claim::Acquired) => {
                        let previous = decide::orphaned_record(&record, &orphan);
                        self.recover(
                            state,
                            w,
                            Box::new(record),
                            started,
                            Box::new(previous),
                            true,
                        )
                    }
                    Ok(Claim::Existing(existing)) => {
                        Pc::Done(self.answer_from(state, w, existing, clock))
                    }
                    Ok(Claim::IdentityTaken(evidence)) => {
                        Pc::Done(refusal(identity_taken(&invocation, evidence)))
                    }
                    Err(err) => Pc::Done(Answer::Refused(err.to_string())),
                }
            }
            Claimed::IdentityTaken(evidence) => {
                Pc::Done(refusal(identity_taken(&invocation, evidence)))
            }
            Claimed::PayloadConflict => Pc::Done(Answer::Refused("payload conflict".into())),
            Claimed::Answer(existing) => Pc::Done(self.answer_from(state, w, existing, clock)),
        }
    }

    /// After a takeover (or an adoption) is held: the engine's recovery decision.
    fn recover(
        &self,
        state: &State,
        w: usize,
        claim: Box<Record>,
        started: u64,
        previous: Box<Record>,
        adopted: bool,
    ) -> Pc {
        let mut inherited = decide::inherited(&previous);
        if self.revert == Some(Revert::GivenBackHeld) {
            // 0.4: a knowing give-back's mark was not read.
            inherited.given_back = false;
        }
        let recover = decide::recover(self.recovery, adopted, false, &inherited, false);
        let steps = inherited.steps;
        let held = Held {
            // Only a handler declared safe to repeat may run its effect again.
            excused: recover == Recover::Rerun
                && self.acted_unsettled(state, state.workers[w].op, Some(w)),
            claim,
            started,
            previous: Some(previous),
            steps,
            phase: Phase::Start,
            lands_by: None,
        };
        match recover {
            Recover::Steps | Recover::Rerun | Recover::Reconcile => Pc::Running(held),
            Recover::Hold => {
                let clock = state.now + state.workers[w].skew;
                let settlement = Settlement::indeterminate(at(clock), INDETERMINATE_RETENTION);
                settling(held, Some(settlement), clock)
            }
        }
    }

    /// Worker `w` acts: one effect of its operation, excused if it is its execution's first
    /// after an excused start, or a re-run excused when it took over.
    fn act(&self, state: &mut State, w: usize, held: &Held) {
        let op = state.workers[w].op;
        state.effects[op] += 1;
        state.workers[w].unrecorded = true;
        if std::mem::take(&mut state.fresh_excuse[op]) || held.excused {
            state.excused[op] += 1;
        }
    }

    /// Whether an attempt of operation `op` (other than worker `except`'s) acted and has ended
    /// without its settlement committing: it died, was cancelled, or gave up with no time
    /// left.
    pub(super) fn acted_unsettled(&self, state: &State, op: usize, except: Option<usize>) -> bool {
        state.workers.iter().enumerate().any(|(other, holder)| {
            Some(other) != except
                && holder.op == op
                && holder.unrecorded
                && match &holder.pc {
                    // Its claim given back or released: its effect, if any, is recorded by
                    // no settlement (at most in the steps of a record TTL may delete).
                    Pc::Dead | Pc::GivingBack { .. } | Pc::Done(Answer::Released) => true,
                    // Excused only if the store stayed down for as long as its patience lasted.
                    Pc::Done(Answer::GaveUp { at, until }) => {
                        !state.ups.iter().any(|up| at < up && up < until)
                    }
                    _ => self.past_deadline(state, holder),
                }
        })
    }

    /// A settlement's (or, `settlement` `None`, a release's) try.
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        state: &mut State,
        w: usize,
        clock: u64,
        held: Held,
        settlement: Option<Box<Settlement>>,
        tries: u32,
        not_before: u64,
        lose: bool,
    ) -> Pc {
        let worker = state.workers[w].clone();
        let invocation = self.invocation(&worker, held.started);
        if state.down {
            let patience = settle_patience(&invocation, &held.claim, at(clock));
            let (until, max_tries) = patience.limits();
            let max_tries = match self.revert {
                Some(Revert::SettleGivesUpEarly) => 2,
                _ => max_tries,
            };
            if decide::try_again(tries, max_tries, at(clock), Duration::from_secs(1), until) {
                return Pc::Settling {
                    held,
                    settlement,
                    tries: tries + 1,
                    not_before: clock.max(not_before) + 1,
                };
            }
            let deadline = held.started + self.bounds.lease;
            let until = deadline.saturating_sub(SETTLE_MARGIN + worker.skew);
            return Pc::Done(Answer::GaveUp {
                at: state.now,
                until,
            });
        }
        let identity = match self.revert {
            Some(Revert::IdentityFromDeployment) => invocation.evidence_key(),
            _ => decide::settled_identity(&held.claim, held.previous.as_deref()).map(str::to_owned),
        };
        let guard = Guard::Lease(&held.claim.lease.token);
        let target = Target {
            key: &held.claim.key,
            identity: identity.as_deref(),
            guard,
        };
        let request = match &settlement {
            Some(settlement) => Request::Settle { target, settlement },
            None => Request::Release { target },
        };
        let token = &held.claim.lease.token;
        let answer = self.write(
            state,
            &held.claim.key,
            token,
            request,
            |store| match &settlement {
                Some(settlement) => ready(store.settle(target, settlement)),
                None => ready(store.release(target)),
            },
        );
        if settlement.is_some() && matches!(answer, Ok(Fence::Held)) {
            state.workers[w].unrecorded = false;
        }
        let carries_writes = self.bounds.handler == Handler::Transactional
            && settlement
                .as_ref()
                .is_some_and(|s| s.status == Status::Completed);
        // The transaction commits the handler's writes with the settlement, or neither: they
        // committed if its fence held (whether or not the answer is then lost). Sent beside
        // it, they commit on every try.
        let applied = matches!(answer, Ok(Fence::Held));
        if carries_writes && (applied || self.revert == Some(Revert::UnfencedTransaction)) {
            self.committed(state, w, &held);
        }
        if lose {
            return Pc::Settling {
                held,
                settlement,
                tries,
                not_before,
            };
        }
        let fence = match answer {
            Ok(fence) => fence,
            Err(err) => return Pc::Done(Answer::Refused(err.to_string())),
        };
        let Some(settlement) = settlement else {
            return Pc::Done(match fence {
                Fence::Held | Fence::Lost { current: None } => {
                    state.afresh[worker.op] |= self.acted_unsettled(state, worker.op, Some(w));
                    Answer::Released
                }
                Fence::Lost { current: Some(_) } => Answer::LeaseLost,
            });
        };
        let own = match fence {
            Fence::Held => true,
            Fence::Lost {
                current: Some(current),
            } => {
                self.revert != Some(Revert::OwnSettlementUnrecognised)
                    && decide::shows_settlement(&current, guard, &settlement)
            }
            Fence::Lost { current: None } => false,
        };
        if own && settlement.status == Status::Indeterminate {
            self.check_hold(state, &held);
        }
        Pc::Done(match (own, settlement.status) {
            (false, _) => Answer::LeaseLost,
            (true, Status::Indeterminate) => Answer::Indeterminate,
            (true, Status::Failed) => {
                Answer::Failed(settlement.outcome.clone().unwrap_or_default())
            }
            (true, _) => Answer::Executed(settlement.outcome.clone().unwrap_or_default()),
        })
    }

    /// The engine's answer from a record that stands.
    fn answer_from(&self, state: &State, w: usize, existing: Record, clock: u64) -> Answer {
        let invocation = self.invocation(&state.workers[w], clock);
        match answer_existing::<serde_json::Value>(existing, &invocation, at(clock)) {
            Ok(execution) => Answer::Replayed(execution.raw_json().get().as_bytes().to_vec()),
            Err(err) => refusal(err),
        }
    }

    /// Sends one of a worker's writes (under its lease `token`) to the store as `state` holds
    /// it, takes the tables back, and notes a live lease the write overwrote, and a change of
    /// the record the store transitions' specification (`request`'s) does not allow.
    pub(super) fn write<T>(
        &self,
        state: &mut State,
        key: &OperationKey,
        token: &str,
        request: Request<'_>,
        send: impl FnOnce(&MemoryStore) -> T,
    ) -> T {
        let before = state.clone();
        let store = state.store();
        let answer = send(&store);
        state.absorb(&store);
        self.check_overwrite(state, &before, key, Some(token));
        if transitions::allowed(request, before.record(key), state.record(key)).is_err() {
            state.broken.push(ALLOWED);
        }
        answer
    }

    /// Whether `worker`'s invocation has reached its deadline on its own clock.
    pub(super) fn past_deadline(&self, state: &State, worker: &Worker) -> bool {
        started(&worker.pc)
            .is_some_and(|started| state.now + worker.skew >= started + self.bounds.lease)
    }
}

/// A settlement's (or, `None`, a release's) first try, at `clock` on the worker's clock.
fn settling(held: Held, settlement: Option<Settlement>, clock: u64) -> Pc {
    Pc::Settling {
        held,
        settlement: settlement.map(Box::new),
        tries: 1,
        not_before: clock,
    }
}

/// The start of the invocation a worker is in, once it has one.
fn started(pc: &Pc) -> Option<u64> {
    match pc {
        Pc::Ready | Pc::Done(_) | Pc::Dead => None,
        Pc::ResendClaim { started, .. } | Pc::TakingOver { started, .. } => Some(*started),
        Pc::Running(held) | Pc::Settling { held, .. } | Pc::GivingBackSteps { held } => {
            Some(held.started)
        }
        // The invocation has answered; its give-back's task runs whenever its sandbox does
        // (after a freeze, perhaps long after the deadline).
        Pc::GivingBack { .. } => None,
    }
}

/// A refusal's answer.
fn refusal(err: Error) -> Answer {
    match err {
        Error::AlreadyInProgress { .. } => Answer::InProgress,
        Error::Indeterminate { .. } => Answer::Indeterminate,
        Error::LeaseLost { .. } => Answer::LeaseLost,
        Error::Failed { failure, .. } => Answer::Failed(failure.to_json().into_bytes()),
        other => {
            let debug = format!("{other:?}");
            let variant = debug.split([' ', '{', '(']).next().unwrap_or_default();
            Answer::Refused(variant.to_owned())
        }
    }
}
