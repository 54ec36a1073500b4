//! Choosing the next step: a delivery (its worker, its handler's behaviour, a fault, an
//! outage, a deploy, the reconciler's answer), a resumption, a clock jump, a TTL sweep, an
//! operator's resolution, a step list rewritten as another build encodes it or a delivery with
//! a neighbouring amount, each drawn from the seed's random source. A delivery whose step's
//! effect is left in flight is mostly followed by another delivery of its operation at once,
//! and another 7 s later (past a cancellation's short grace, before the latest effects land).

use std::time::Duration;

use super::actors::{AfterTimeout, Answer, Behaviour};
use super::formats::Encoding;
use super::world::{Action, Deploy, LEASE, Planned, World};
use crate::store::Store;
use crate::testing::faults::{Fault, FaultKind, Primitive};

/// Outages of the store after an effect, in seconds: short, a few seconds, past the deadline.
const OUTAGES: [u64; 3] = [1, 5, 30];
/// Late effects: the step's declared effect timeout (seconds, or none: the invocation's
/// remaining time bounds it), when the effect lands after it was sent (seconds), and what the
/// handler does meanwhile. Each lands within its bound, some 1 s before a declared timeout: the
/// takeover that follows runs on a clock up to 4 s ahead of the sender's (the give-back's grace
/// counts the lease policy's clock skew).
const LATE_EFFECTS: [(Option<u64>, u64, AfterTimeout); 8] = [
    (Some(10), 4, AfterTimeout::Fails),
    (Some(10), 9, AfterTimeout::Fails),
    (None, 4, AfterTimeout::Fails),
    (None, 15, AfterTimeout::Fails),
    (Some(10), 4, AfterTimeout::Cancelled),
    (Some(10), 9, AfterTimeout::Cancelled),
    (Some(25), 15, AfterTimeout::Cancelled),
    (None, 15, AfterTimeout::Cancelled),
];

impl<S: Store + Clone> World<S> {
    /// Picks the next step.
    pub(super) fn choose(&mut self) -> Action {
        let operations = self.specs.len().max(1);
        // Right after a step's effect was left in flight: its operation again, mostly.
        if let Some(planned) = self.planned.pop_front() {
            match self.rng.u32(..4) > 0 {
                true => {
                    return match planned {
                        Planned::Deliver(op) => self.delivery(op),
                        Planned::Advance(by) => Action::Advance(by),
                    };
                }
                false => self.planned.clear(),
            }
        }
        #[cfg(feature = "relay")]
        if self.outbox.is_some() && self.rng.u32(..100) < 15 {
            return self.outbox_step();
        }
        match self.rng.u32(..100) {
            0..55 => {
                let op = self.rng.usize(..operations);
                self.delivery(op)
            }
            55..70 if !self.suspended.is_empty() => {
                Action::Resume(self.rng.usize(..self.suspended.len()))
            }
            55..85 => Action::Advance(match self.rng.u32(..4) {
                0 => Duration::from_secs(1),
                1 => Duration::from_secs(10),
                2 => LEASE + Duration::from_secs(1),
                _ => self.retention + Duration::from_secs(1),
            }),
            85..90 => Action::Sweep,
            90..94 => Action::ReEncode(match self.rng.bool() {
                true => Encoding::Zstd19,
                false => Encoding::Uncompressed,
            }),
            94..96 => Action::ChangedAmount(self.rng.usize(..operations)),
            _ => Action::Resolve,
        }
    }

    /// A delivery of `op`: its worker, its handler's behaviour, a fault, an outage, a deploy,
    /// the reconciler's answer.
    fn delivery(&mut self, op: usize) -> Action {
        Action::Deliver {
            op,
            worker: self.rng.usize(..self.workers.len()),
            behaviour: self.behaviour(op),
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
        }
    }

    /// The behaviour of `op`'s handler: one of every handler's, or one of its kind's (a late
    /// effect and a failure after the step for a stepped handler, a refused completion for
    /// one without steps whose handler has tables of its own).
    fn behaviour(&mut self, op: usize) -> Behaviour {
        let (stepped, transactional) = self
            .specs
            .get(op)
            .map_or((false, false), |spec| (spec.stepped, spec.transactional));
        let roll = self.rng.u32(..100);
        if stepped && !transactional && roll < 20 {
            let (timeout, lands_after, then) = LATE_EFFECTS[self.rng.usize(..LATE_EFFECTS.len())];
            return Behaviour::LateEffect {
                timeout,
                lands_after,
                then,
            };
        }
        if stepped && roll >= 90 {
            return Behaviour::FailAfterStep;
        }
        if !stepped && self.tables.is_some() && roll >= 94 {
            return Behaviour::RefusedCompletion;
        }
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

    /// A step of the outbox's far side: the relay (mostly), the sweeper, or the stream giving
    /// a record up; a relay's or sweeper's first request meets a fault one time in three.
    #[cfg(feature = "relay")]
    fn outbox_step(&mut self) -> Action {
        use super::PublishFault;
        let fault = match self.rng.u32(..9) {
            0 => Some(PublishFault::FailBefore),
            1 => Some(PublishFault::LoseAnswer),
            2 => Some(PublishFault::CrashAfterPublish),
            _ => None,
        };
        match self.rng.u32(..100) {
            0..60 => Action::Relay(fault),
            60..85 => Action::SweepOutbox(fault),
            _ => Action::StreamGivesUp,
        }
    }

    fn fault(&mut self) -> Option<(Primitive, Fault)> {
        if self.rng.u32(..100) >= 30 {
            return None;
        }
        let writes = [
            Primitive::Claim,
            Primitive::TakeOver,
            Primitive::Settle,
            Primitive::Release,
            Primitive::RecordSteps,
            Primitive::CommitSteps,
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
}
