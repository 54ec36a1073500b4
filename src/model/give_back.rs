//! An invocation cancelled while it holds its lease gives its claim back: a task of its own
//! shortens the lease to a short grace, fenced on its token, so that the next delivery takes
//! over sooner. The task sends one try, and may run late (the sandbox frozen after the
//! answer, thawed for a later invocation). A handler that panics (unwinding) has its claim
//! shortened the same way before the panic resumes; the model's late task covers that too.

use std::time::Duration;

use super::state::{Held, Pc, State};
use super::{Protocol, Revert, at, ready, tick};
use crate::engine::decide;
use crate::store::{Guard, Request, StoreExt, Target};

/// The model's give-back grace, in ticks (the engine's is a few seconds of a lease of
/// minutes: here, a tick of a lease of three).
const GRACE: u64 = 1;

impl Protocol {
    /// Worker `w`'s invocation is cancelled (or its handler panics) while it holds its lease:
    /// its give-back is sent later, from a task of its own.
    pub(super) fn cancel(&self, state: &mut State, w: usize) {
        let clock = state.now + state.workers[w].skew;
        let held = match state.workers[w].pc.clone() {
            Pc::Running(held) | Pc::Settling { held, .. } => held,
            _ => return,
        };
        let lands_by = match self.revert {
            Some(Revert::GiveBackWithoutGrace) => None,
            _ => held.lands_by.map(at),
        };
        let until = decide::given_back_until(
            at(clock),
            held.claim.lease.expires_at,
            Duration::from_secs(GRACE),
            lands_by,
        );
        state.workers[w].pc = Pc::GivingBack {
            held,
            until: tick(until),
        };
    }

    /// The give-back's write: the lease shortened where the worker still holds it. In an
    /// outage its try fails, and the claim waits out its lease.
    pub(super) fn give_back(&self, state: &mut State, held: &Held, until: u64) -> Pc {
        if !state.down {
            let token = match self.revert {
                // Whoever holds the record now, as an unconditioned write would find it.
                Some(Revert::GiveBackUnfenced) => state
                    .record(&held.claim.key)
                    .map_or_else(String::new, |record| record.lease.token.clone()),
                _ => held.claim.lease.token.clone(),
            };
            let target = Target {
                key: &held.claim.key,
                identity: None,
                guard: Guard::Lease(&token),
            };
            let request = Request::Shorten {
                target,
                until: at(until),
            };
            let token = &held.claim.lease.token;
            let _ = self.write(state, &held.claim.key, token, request, |store| {
                ready(store.shorten(target, at(until)))
            });
        }
        Pc::Dead
    }
}
