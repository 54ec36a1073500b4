//! The protocol, checked exhaustively at small sizes with [stateright]: every interleaving of
//! a few workers (Lambda invocations of the same operation, or of two), a store whose
//! conditional writes are atomic and whose answers can be lost after they commit, an outage,
//! crashes, Lambda's deadline, clocks that run ahead by a bounded skew, and TTL deleting
//! expired records at any time after they expire; the handler acts directly, keeps its
//! effect in a step (its intent recorded before, its result with the settlement), or commits
//! it as a DynamoDB write with an outbox event in its settlement's transaction, which a relay
//! publishes, at least once, to a consumer that deduplicates on the event's id. A stepped
//! handler's effect may also land late (within the step's declared timeout, after the step
//! timed out), its step has a check that reads the downstream truth, and the handler may fail
//! retryably after its step (its claim given back with its steps and the attempt's mark); a
//! direct handler's completion may be refused after its effect (its writes' condition failed).
//! What the engine does then is its decision table (`decide::after_failure`,
//! `decide::recover`, `decide::given_back_until`).
//!
//! The model checks the code that runs: its store is the crate's [`MemoryStore`] (the same
//! semantics as the DynamoDB store, held to it by the conformance suite), and every decision
//! a worker takes is the engine's own ([`crate::engine::decide`], the engine's answers and its
//! settlement patience). What the model adds is the environment and the invariants of the
//! design: at most one effect per operation (counting every handler run) and per business
//! identity, a live lease never overwritten, a recorded outcome never lost or changed within
//! its retention, no lease without an end, truthful answers, and every committed outbox event
//! acted on once by its consumer. A transactional handler's DynamoDB write and outbox event
//! are the model's own tables, written in the same transition as the fenced settlement they
//! commit with, as `TransactWriteItems` commits all of its actions or none; what the
//! transaction itself can answer besides a refused condition (writes that cannot be sent) is
//! left to the integration suite. A knowing give-back is continued, never held for an
//! operator, is a property too.
//!
//! [`Revert`] puts back, in the model, a historical defect's decision; the tests show the
//! checker finds each one with a counterexample. `MODEL_BOUNDS=large` runs the larger bounds.

mod bounds;
mod give_back;
mod outbox;
mod properties;
mod state;
mod step;
mod tests;

use std::time::{Duration, SystemTime};

use stateright::{Model, Property};

pub(crate) use self::bounds::{Bounds, Handler, Revert, Spec};
use self::state::{Pc, State, Worker};
use crate::execution::Invocation;
use crate::key::{Fingerprint, OperationKey, OperationScope};
use crate::reconcile::Recovery;

/// The model's epoch: tick 0.
const EPOCH_SECS: u64 = 1_800_000_000;

/// The time of tick `tick`.
fn at(tick: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS + tick)
}

/// The tick of `time` (whole seconds; times before the epoch are tick 0).
fn tick(time: SystemTime) -> u64 {
    crate::record::epoch_secs(time).saturating_sub(EPOCH_SECS)
}

/// The protocol under `bounds`, with the engine's recovery policy `recovery`, and perhaps a
/// historical defect put back.
#[derive(Debug, Clone)]
pub(crate) struct Protocol {
    pub(crate) bounds: Bounds,
    pub(crate) recovery: Recovery,
    pub(crate) revert: Option<Revert>,
    /// Per operation: its key, and its invocation without and with the business identity,
    /// derived once (their hashes would otherwise dominate the time a state takes).
    keys: Vec<OperationKey>,
    invocations: Vec<[Invocation; 2]>,
}

/// What the environment or a worker does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// True time moves on a tick.
    Tick,
    /// The store stops answering, or answers again.
    Down,
    Up,
    /// TTL deletes the expired record of operation `op`.
    Sweep(usize),
    /// Worker `w` takes its next step and gets the store's answer.
    Step(usize),
    /// Worker `w`'s write commits and its answer is lost.
    Lose(usize),
    /// Worker `w`'s handler fails retryably: before it acts (its claim is released), or after
    /// its step (its claim is given back with its steps).
    Fail(usize),
    /// Worker `w`'s completion is refused: the condition of the writes it queued fails.
    Refuse(usize),
    /// Step effect `f`, on its way downstream, lands.
    Land(usize),
    /// Worker `w`'s handler fails terminally instead of acting (the failure is retained).
    Decline(usize),
    /// Worker `w`'s process dies.
    Crash(usize),
    /// Worker `w`'s invocation is cancelled, or its handler panics (unwinding), while it
    /// holds its lease: it gives its claim back.
    Cancel(usize),
    /// The outbox relay (or, once the stream no longer holds it, the sweeper) publishes event
    /// `e` (again, if it was published before).
    Publish(usize),
    /// Event `e`, published, is marked so (a relay that dies first never takes this step).
    Mark(usize),
    /// The stream gives event `e`'s record up before it is marked.
    Expire(usize),
}

impl Protocol {
    /// The protocol under `bounds` with `recovery`, and `revert` put back.
    pub(crate) fn new(bounds: Bounds, recovery: Recovery, revert: Option<Revert>) -> Self {
        let scope = OperationScope::new("model", "op").unwrap_or_else(|_| unreachable!());
        let keys: Vec<OperationKey> = (0..bounds.ops())
            .map(|op| {
                OperationKey::derive(&scope, None, &format!("op-{op}"))
                    .unwrap_or_else(|_| unreachable!())
            })
            .collect();
        let mut protocol = Self {
            bounds,
            recovery,
            revert,
            keys,
            invocations: Vec::new(),
        };
        protocol.invocations = (0..protocol.keys.len())
            .map(|op| {
                let fingerprint = Fingerprint::of(&op).unwrap_or_else(|_| unreachable!());
                let lease = Duration::from_secs(protocol.bounds.lease);
                let plain = Invocation::new(protocol.keys[op].clone(), fingerprint, lease);
                let declared = plain
                    .clone()
                    .with_identity(protocol.identity(op))
                    .unwrap_or_else(|_| unreachable!());
                [plain, declared]
            })
            .collect();
        protocol
    }

    /// The key of operation `op`.
    fn key(&self, op: usize) -> OperationKey {
        self.keys[op].clone()
    }

    /// The invocation worker `w` handles, started at `started` on its clock.
    fn invocation(&self, worker: &Worker, started: u64) -> Invocation {
        self.invocations[worker.op][usize::from(worker.identity)]
            .clone()
            .with_deadline(at(started + self.bounds.lease))
    }

    /// The business identity operation `op` declares (where its worker's deployment does).
    fn identity(&self, op: usize) -> String {
        match self.bounds.shared_identity {
            true => "order".to_owned(),
            false => format!("order-{op}"),
        }
    }

    fn retention(&self) -> Duration {
        Duration::from_secs(self.bounds.retention)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let ops = self.bounds.ops();
        vec![State {
            now: 0,
            records: Vec::new(),
            evidence: Vec::new(),
            down: false,
            outages: self.bounds.outages,
            losses: self.bounds.losses,
            crashes: self.bounds.crashes,
            cancels: self.bounds.cancels,
            declines: self.bounds.declines,
            refusals: self.bounds.refusals,
            flights: Vec::new(),
            workers: self
                .bounds
                .workers
                .iter()
                .map(|spec| Worker {
                    op: spec.op,
                    skew: spec.skew,
                    identity: spec.identity,
                    unrecorded: false,
                    pc: Pc::Ready,
                })
                .collect(),
            effects: vec![0; ops],
            excused: vec![0; ops],
            afresh: vec![false; ops],
            fresh_excuse: vec![false; ops],
            ups: Vec::new(),
            first_outcome: vec![None; ops],
            outbox: Vec::new(),
            consumed: Vec::new(),
            republishes: self.bounds.republishes,
            broken: Vec::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if self.breaks_an_invariant(state) {
            return;
        }
        if state.now < self.bounds.max_time {
            actions.push(Action::Tick);
        }
        if !state.down && state.outages > 0 {
            actions.push(Action::Down);
        }
        if state.down {
            actions.push(Action::Up);
        }
        for op in 0..self.bounds.ops() {
            let key = self.key(op);
            if state
                .record(&key)
                .is_some_and(|r| r.is_expired(at(state.now)))
            {
                actions.push(Action::Sweep(op));
            }
        }
        for (f, flight) in state.flights.iter().enumerate() {
            if !flight.landed {
                actions.push(Action::Land(f));
            }
        }
        for (e, event) in state.outbox.iter().enumerate() {
            if self.publishable(state, e) {
                actions.push(Action::Publish(e));
            }
            if event.published && !event.marked {
                actions.push(Action::Mark(e));
            }
            if event.in_stream && !event.marked {
                actions.push(Action::Expire(e));
            }
        }
        for (w, worker) in state.workers.iter().enumerate() {
            if self.can_step(state, worker) {
                actions.push(Action::Step(w));
                if state.losses > 0 && self.writes(state, worker) {
                    actions.push(Action::Lose(w));
                }
            }
            // A handler fails before it acts, and before any step is recorded; a stepped one
            // whose step has ended (done, or timed out with its effect in flight) fails
            // retryably after it too.
            let starting =
                |held: &state::Held| held.phase == state::Phase::Start && held.steps.is_empty();
            if matches!(&worker.pc, Pc::Running(held) if starting(held)) {
                actions.push(Action::Fail(w));
                if state.declines > 0 {
                    actions.push(Action::Decline(w));
                }
            }
            let after_step =
                |held: &state::Held| self.bounds.late && matches!(held.phase, state::Phase::Acted);
            if matches!(&worker.pc, Pc::Running(held) if after_step(held)) {
                actions.push(Action::Fail(w));
            }
            if state.refusals > 0
                && !state.down
                && matches!(&worker.pc, Pc::Settling { settlement: Some(s), .. } if s.status == crate::record::Status::Completed)
            {
                actions.push(Action::Refuse(w));
            }
            let alive = !matches!(worker.pc, Pc::Ready | Pc::Done(_) | Pc::Dead);
            if alive && state.crashes > 0 {
                actions.push(Action::Crash(w));
            }
            let holding = matches!(worker.pc, Pc::Running(_) | Pc::Settling { .. });
            if holding && state.cancels > 0 {
                actions.push(Action::Cancel(w));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => {
                state.now += 1;
                // An effect not landed by its timeout never lands.
                let now = state.now;
                state.flights.retain(|flight| {
                    (flight.landed && flight.sender.is_some())
                        || (!flight.landed && flight.until > now)
                });
            }
            Action::Down => {
                state.down = true;
                state.outages -= 1;
            }
            Action::Up => {
                state.down = false;
                state.ups.push(state.now);
            }
            Action::Sweep(op) => {
                // TTL is the environment: it deletes an expired item, whatever its status.
                let key = self.key(op);
                let now = at(state.now);
                // An unsettled record gone: a claim that declares the identity finds the
                // evidence (and adopts it); one that does not starts a new operation.
                if let Some(swept) = state.record(&key).filter(|r| r.is_expired(now))
                    && !swept.status.is_settled()
                {
                    state.afresh[op] |= self.acted_unsettled(&state, op, None);
                }
                state.records.retain(|r| r.key != key || !r.is_expired(now));
                self.check_overwrite(&mut state, last, &key, None);
            }
            Action::Step(w) => self.step(&mut state, w, false),
            Action::Lose(w) => {
                state.losses -= 1;
                self.step(&mut state, w, true);
            }
            Action::Fail(w) => self.fail(&mut state, w),
            Action::Refuse(w) => {
                state.refusals -= 1;
                self.refuse(&mut state, w);
            }
            Action::Land(f) => self.land(&mut state, f),
            Action::Decline(w) => {
                state.declines -= 1;
                self.decline(&mut state, w);
            }
            Action::Crash(w) => {
                state.crashes -= 1;
                state.workers[w].pc = Pc::Dead;
            }
            Action::Cancel(w) => {
                state.cancels -= 1;
                self.cancel(&mut state, w);
            }
            Action::Publish(e) => self.publish(&mut state, e),
            Action::Mark(e) => Self::mark(&mut state, e),
            Action::Expire(e) => Self::expire(&mut state, e),
        }
        self.track_outcomes(&mut state);
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

/// A store's future, which the memory store completes without waiting.
fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => unreachable!("the memory store never waits"),
    }
}
