//! The design's invariants, as the checker's properties, and the bookkeeping transitions do
//! for them.

use stateright::{Expectation, Property};

use super::state::{Answer, Held, Outcome, State};
use super::{Handler, Protocol, at, tick};
use crate::key::OperationKey;
use crate::record::Status;
use crate::testing::transitions::{self, Answered, Shown};

/// At most one effect per operation, counting every handler run that acted (a re-run of a
/// handler declared safe to repeat is excused only after its predecessor died unsettled; a
/// transactional handler's effect counts when its transaction commits, and only a new
/// execution after the last outcome's retention is excused).
pub(crate) const ONE_EFFECT: &str = "at most one effect per operation";
/// Where every delivery declares one business identity for all operations, at most one effect
/// among them all.
pub(crate) const ONE_PER_IDENTITY: &str = "at most one effect per business identity";
/// A write (or TTL) never replaces, deletes or shortens a record under another's lease that is
/// live on every clock.
pub(crate) const LIVE_LEASE: &str = "a live lease is never overwritten";
/// An outcome once recorded stays, unchanged, while its retention lasts on every clock.
pub(crate) const OUTCOME_KEPT: &str =
    "a recorded outcome is never lost or changed within retention";
/// No IN_PROGRESS record holds a lease longer than an invocation (so a takeover always comes).
pub(crate) const WAY_FORWARD: &str = "every lease ends";
/// Each answer is what the store shows when it is given.
pub(crate) const TRUTHFUL: &str = "every answer is truthful";
/// Every event committed to the outbox is acted on by its consumer exactly once: the relay
/// publishes it (perhaps again), and the consumer, deduplicating on its id, never takes it for
/// another.
pub(crate) const EVENT_ONCE: &str = "every committed event takes effect once";

/// Every event committed to the outbox is published at least once, or still can be: it is
/// published, or pending with something that will publish it (the stream still holds it, or
/// the sweeper finds it pending). An event marked without being published, or given up by the
/// stream with no sweeper, is lost.
pub(crate) const EVENT_PUBLISHED: &str = "every committed event is published at least once";
/// An operation is held INDETERMINATE for an operator only where nothing else can decide:
/// the takeover of an attempt that gave its claim back knowingly (its handler's retryable
/// failure after its steps) replays the done steps and checks the uncertain ones.
pub(crate) const CONTINUED: &str = "a knowing give-back is continued, never held";
/// Every write a worker sends changes its operation's record only as the store transitions'
/// specification (`testing::transitions`, which the shuttle schedules hold the real engine
/// to) allows: the model needs no transition it forbids.
pub(crate) const ALLOWED: &str = "every write is a transition the specification allows";
/// Reachability, so that a passing check is not vacuous.
pub(crate) const COMPLETES: &str = "an operation completes";
pub(crate) const TAKES_OVER: &str = "a crashed attempt is taken over";
pub(crate) const DELIVERS: &str = "a transactional handler's event reaches its consumer";

/// Every property the checker checks.
pub(super) fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(ONE_EFFECT, |_, s: &State| {
            s.effects
                .iter()
                .zip(&s.excused)
                .all(|(effects, excused)| effects.saturating_sub(*excused) <= 1)
        }),
        Property::always(ONE_PER_IDENTITY, |m: &Protocol, s: &State| {
            let effects: u8 = s.effects.iter().sum();
            let excused: u8 = s.excused.iter().sum();
            let declared = m.bounds.workers.iter().all(|spec| spec.identity);
            !(m.bounds.shared_identity && declared) || effects.saturating_sub(excused) <= 1
        }),
        Property::always(ALLOWED, |_, s: &State| !s.broken.contains(&ALLOWED)),
        Property::always(LIVE_LEASE, |_, s: &State| !s.broken.contains(&LIVE_LEASE)),
        Property::always(OUTCOME_KEPT, |_, s: &State| {
            !s.broken.contains(&OUTCOME_KEPT)
        }),
        Property::always(WAY_FORWARD, |m: &Protocol, s: &State| {
            s.records.iter().all(|record| {
                record.status != Status::InProgress
                    || tick(record.lease.expires_at) <= s.now + m.bounds.lease + m.bounds.max_skew()
            })
        }),
        Property::always(TRUTHFUL, |_, s: &State| !s.broken.contains(&TRUTHFUL)),
        Property::always(EVENT_ONCE, |_, s: &State| !s.broken.contains(&EVENT_ONCE)),
        Property::always(EVENT_PUBLISHED, |m: &Protocol, s: &State| {
            (0..s.outbox.len()).all(|e| s.outbox[e].published || m.publishable(s, e))
        }),
        Property::always(CONTINUED, |_, s: &State| !s.broken.contains(&CONTINUED)),
        Property::sometimes(COMPLETES, |_, s: &State| {
            s.records
                .iter()
                .any(|record| record.status == Status::Completed)
        }),
        Property::sometimes(TAKES_OVER, |_, s: &State| {
            s.records.iter().any(|record| record.lease.attempt > 1)
        }),
        Property::sometimes(DELIVERS, |m: &Protocol, s: &State| {
            m.bounds.handler != Handler::Transactional || !s.consumed.is_empty()
        }),
    ]
}

impl Protocol {
    /// Whether `state` breaks an invariant. The checker goes no further from such a state, so
    /// that a counterexample's trace ends where its invariant first broke.
    pub(super) fn breaks_an_invariant(&self, state: &State) -> bool {
        all().iter().any(|property| {
            property.expectation == Expectation::Always && !(property.condition)(self, state)
        })
    }

    /// Notes a write (by the holder of `writer`'s token; `None`: TTL) that replaced, deleted or
    /// shortened the record of `key` while another's lease on it was live on every clock.
    pub(super) fn check_overwrite(
        &self,
        state: &mut State,
        before: &State,
        key: &OperationKey,
        writer: Option<&str>,
    ) {
        let Some(old) = before.record(key) else {
            return;
        };
        let live = old.status == Status::InProgress
            && tick(old.lease.expires_at) >= before.now + self.bounds.max_skew();
        if !live || writer == Some(old.lease.token.as_str()) {
            return;
        }
        let replaced = state.record(key).is_none_or(|new| {
            new.status != Status::InProgress
                || new.lease.token != old.lease.token
                || new.lease.expires_at < old.lease.expires_at
        });
        if replaced {
            state.broken.push(LIVE_LEASE);
        }
    }

    /// Notes an answer worker `w` gave that the store, as it stands, contradicts (the
    /// specification's [`transitions::truthful`]), or that differs from the operation's first
    /// recorded outcome.
    pub(super) fn check_answer(&self, state: &mut State, w: usize, answer: &Answer) {
        let key = self.key(state.workers[w].op);
        let own = format!("w{w}");
        let first = state.first_outcome[state.workers[w].op].as_ref();
        let answered = match answer {
            Answer::Executed(outcome) => Answered::Executed(outcome),
            Answer::Replayed(outcome) => Answered::Replayed(outcome),
            Answer::Failed(failure) => Answered::Failed(Some(failure)),
            Answer::InProgress => Answered::InProgress,
            Answer::RetryNow => Answered::RetryNow,
            Answer::LeaseLost => Answered::LeaseLost,
            Answer::Indeterminate => Answered::Indeterminate,
            Answer::Unavailable | Answer::GaveUp { .. } | Answer::Released | Answer::Refused(_) => {
                Answered::Other
            }
        };
        let shown = Shown {
            own: Some(&own),
            record: state.record(&key),
            evidence_indeterminate: state
                .evidence
                .iter()
                .any(|(_, e)| e.key == key && e.status == Status::Indeterminate),
            now: Some(at(state.now + state.workers[w].skew)),
        };
        let replayed_first = match answer {
            Answer::Replayed(bytes) | Answer::Failed(bytes) => {
                first.is_none_or(|first| first.bytes == *bytes)
            }
            _ => true,
        };
        if transitions::truthful(answered, shown).is_err() || !replayed_first {
            state.broken.push(TRUTHFUL);
        }
    }

    /// Notes a hold (an INDETERMINATE settlement by the attempt `held`) of an operation whose
    /// taken-over attempt gave its claim back knowingly, with every step done or checkable.
    pub(super) fn check_hold(&self, state: &mut State, held: &Held) {
        let Some(previous) = held.previous.as_deref() else {
            return;
        };
        let knowing = previous
            .steps
            .last()
            .is_some_and(|last| last.marks_given_back() && last.attempt == previous.lease.attempt);
        let decidable = previous
            .steps
            .iter()
            .filter(|step| !step.is_mark())
            .all(|step| step.result.is_some() || self.bounds.checked);
        if knowing && decidable {
            state.broken.push(CONTINUED);
        }
    }

    /// Keeps each operation's first recorded outcome, and notes one lost or changed while its
    /// retention lasts on every clock.
    pub(super) fn track_outcomes(&self, state: &mut State) {
        for op in 0..self.bounds.ops() {
            let key = self.key(op);
            let record = state.record(&key).cloned();
            match &state.first_outcome[op] {
                None => {
                    if let Some(record) =
                        record.filter(|r| matches!(r.status, Status::Completed | Status::Failed))
                    {
                        state.first_outcome[op] = Some(Outcome {
                            status: record.status,
                            bytes: record.outcome.clone().unwrap_or_default(),
                            until: tick(record.expires_at),
                        });
                    }
                }
                Some(first) => {
                    let within = state.now + self.bounds.max_skew() <= first.until;
                    let kept = record.is_some_and(|r| first.held_by(&r));
                    if within && !kept {
                        state.broken.push(OUTCOME_KEPT);
                    }
                }
            }
        }
    }
}
