//! Choosing the next step: a delivery (its worker, its handler's behaviour, a fault, an
//! outage, a deploy, the reconciler's answer), a resumption, a clock jump, a TTL sweep or an
//! operator's resolution, each drawn from the seed's random source.

use std::time::Duration;

use super::actors::{Answer, Behaviour};
use super::world::{Action, Deploy, LEASE, World};
use crate::store::Store;
use crate::testing::faults::{Fault, FaultKind, Primitive};

/// Outages of the store after an effect, in seconds: short, a few seconds, past the deadline.
const OUTAGES: [u64; 3] = [1, 5, 30];

impl<S: Store + Clone> World<S> {
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
