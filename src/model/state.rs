//! The model's state: the store's tables, the true clock, the workers and what they did.

use std::fmt;

use crate::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};
use crate::store::MemoryStore;

/// Everything the checker explores (the store's contents are sorted, so that one state has
/// one form).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    /// True time, in ticks (seconds) from the model's start.
    pub(crate) now: u64,
    /// The idempotency table's records and the uniqueness table's evidence.
    pub(crate) records: Vec<Record>,
    pub(crate) evidence: Vec<(String, Evidence)>,
    /// The store answers nothing (an outage) while set.
    pub(crate) down: bool,
    /// What the environment may still do: outages, answers lost after commit, crashes,
    /// cancellations, terminal handler failures.
    pub(crate) outages: u8,
    pub(crate) losses: u8,
    pub(crate) crashes: u8,
    pub(crate) cancels: u8,
    pub(crate) declines: u8,
    /// How many completions may still be refused (their writes' condition fails).
    pub(crate) refusals: u8,
    pub(crate) workers: Vec<Worker>,
    /// Step effects sent downstream that may still land (until their timeout), or landed
    /// before their sender heard of it.
    pub(crate) flights: Vec<Flight>,
    /// Per operation: every handler run that acted, and those excused (a new execution's
    /// first, and a re-run of a handler declared safe to repeat after an attempt that acted
    /// ended without settling).
    pub(crate) effects: Vec<u8>,
    pub(crate) excused: Vec<u8>,
    /// Per operation: the next fresh claim starts an execution whose first effect is
    /// excused, because an attempt that acted ended unsettled and its record is gone: TTL
    /// deleted it (a claim that does not declare the operation's business identity is then
    /// fresh: the design's accepted case, only evidence outlives retention), or a re-run's
    /// retryable failure released it.
    pub(crate) afresh: Vec<bool>,
    /// Per operation: a new execution (after one of those, or after the last outcome's
    /// retention) has not acted yet; its first effect, whichever attempt makes it, is
    /// excused.
    pub(crate) fresh_excuse: Vec<bool>,
    /// The ticks at which an outage ended.
    pub(crate) ups: Vec<u64>,
    /// Per operation: the first outcome recorded (completed, or a retained failure), and the
    /// tick its retention ends.
    pub(crate) first_outcome: Vec<Option<Outcome>>,
    /// The outbox table's events, committed with their operation's effect, in order.
    pub(crate) outbox: Vec<Event>,
    /// The event ids the outbox's consumer has acted on (it deduplicates on them), and how
    /// many times the relay may still publish an event again.
    pub(crate) consumed: Vec<String>,
    pub(crate) republishes: u8,
    /// What a transition saw that breaks an invariant (checked by the properties).
    pub(crate) broken: Vec<&'static str>,
}

/// A step's effect on its way downstream: it lands at any tick before `until` (true time:
/// its start plus the step's declared effect timeout, and no later than its sender's lease),
/// or never.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Flight {
    /// The worker waiting for its answer (`None` once it stopped waiting: the step timed out,
    /// or the worker ended).
    pub(crate) sender: Option<usize>,
    pub(crate) op: usize,
    pub(crate) until: u64,
    /// Whether its landing is excused (as [`Held::excused`], or a new execution's first).
    pub(crate) excused: bool,
    pub(crate) landed: bool,
}

/// A settled record's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Outcome {
    /// COMPLETED, or FAILED (a retained failure).
    pub(crate) status: Status,
    pub(crate) bytes: Vec<u8>,
    /// The tick its retention ends.
    pub(crate) until: u64,
}

impl Outcome {
    /// Whether `record` holds this outcome.
    pub(crate) fn held_by(&self, record: &Record) -> bool {
        record.status == self.status && record.outcome.as_ref() == Some(&self.bytes)
    }
}

/// An event in the outbox.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Event {
    /// Its id, which its consumer deduplicates on.
    pub(crate) id: String,
    /// Whether the relay (or the sweeper) has published it.
    pub(crate) published: bool,
    /// Whether it is marked published: out of the pending index, the stream's checkpoint past
    /// it.
    pub(crate) marked: bool,
    /// Whether the table's stream still holds it (until it is marked, or the stream's 24 hours
    /// and retries run out).
    pub(crate) in_stream: bool,
}

impl State {
    /// A store holding this state's tables.
    pub(crate) fn store(&self) -> MemoryStore {
        MemoryStore::holding(self.records.clone(), self.evidence.clone())
    }

    /// Takes the tables back from `store`.
    pub(crate) fn absorb(&mut self, store: &MemoryStore) {
        let (records, evidence) = store.contents();
        self.records = records;
        self.evidence = evidence;
    }

    /// The record of operation `op`'s key, if one stands.
    pub(crate) fn record(&self, key: &crate::key::OperationKey) -> Option<&Record> {
        self.records.iter().find(|record| record.key == *key)
    }
}

/// One Lambda invocation handling one delivery of an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Worker {
    /// The operation it was delivered.
    pub(crate) op: usize,
    /// How far ahead of true time its clock runs.
    pub(crate) skew: u64,
    /// Whether its deployment declares a business identity.
    pub(crate) identity: bool,
    /// Whether its handler acted and no settlement of it has committed (so that a re-run
    /// after it ended is excused).
    pub(crate) unrecorded: bool,
    pub(crate) pc: Pc,
}

/// Where a worker is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pc {
    /// Delivered, not started.
    Ready,
    /// Its claim committed and its answer was lost: the same write is sent again.
    ResendClaim { claim: Box<Record>, started: u64 },
    /// Taking over `existing` with `lease` (its write sent again after a lost answer).
    TakingOver {
        claim: Box<Record>,
        started: u64,
        existing: Box<Record>,
        lease: Lease,
        expires_at: u64,
    },
    /// Holding the lease: the handler runs (or a takeover recovers first).
    Running(Held),
    /// A settlement (or, with `settlement` `None`, a release) being written.
    Settling {
        held: Held,
        settlement: Option<Box<Settlement>>,
        tries: u32,
        /// No try before this tick on the worker's clock (a back-off).
        not_before: u64,
    },
    /// Cancelled while it held `held`'s lease: its give-back (the lease shortened to tick
    /// `until`) is still to be sent, from a task that runs whenever the sandbox next does.
    GivingBack { held: Held, until: u64 },
    /// Its handler failed retryably after its step: the steps, marked as given back, are
    /// written, then the lease is cut (as the step ledger's give-back does).
    GivingBackSteps { held: Held },
    /// Answered.
    Done(Answer),
    /// Crashed, or killed at its deadline.
    Dead,
}

/// A lease the worker holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Held {
    pub(crate) claim: Box<Record>,
    /// The tick (on the worker's clock) the invocation started: its deadline is a lease later.
    pub(crate) started: u64,
    /// The crashed attempt's record, for a takeover.
    pub(crate) previous: Option<Box<Record>>,
    /// A re-run of a handler declared safe to repeat after an attempt that acted ended
    /// without settling.
    pub(crate) excused: bool,
    /// A stepped handler: the steps the operation recorded so far, and where its one step is.
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) phase: Phase,
    /// Until when (its clock's tick) an effect its step sent may still land: the step's start
    /// plus its declared effect timeout, never past the lease (`None`: nothing in flight).
    pub(crate) lands_by: Option<u64>,
}

/// Where a stepped handler's one step is (an unstepped handler acts at `Start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// Not started.
    Start,
    /// Its intent is recorded (or it runs again): the effect is next.
    Intended,
    /// Its effect is on its way downstream (a late effect): its answer is awaited.
    Sent,
    /// Its effect happened: its result goes with the settlement.
    Acted,
}

/// What a worker answered its caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Answer {
    /// Ran and recorded this outcome.
    Executed(Vec<u8>),
    /// Replayed this stored outcome.
    Replayed(Vec<u8>),
    /// Failed terminally: this retained failure, recorded (or replayed).
    Failed(Vec<u8>),
    /// Another attempt holds a live lease.
    InProgress,
    /// The record a takeover was sent for is gone (released, or deleted by TTL): the engine's
    /// "in progress" with no wait, so that the caller's retry claims afresh.
    RetryNow,
    /// Held for an operator.
    Indeterminate,
    /// Its lease was taken before it settled.
    LeaseLost,
    /// The store failed before anything committed; the caller retries.
    Unavailable,
    /// A settlement (or release) gave up on an outage at true tick `at`; its patience, by the
    /// design (the deadline less a margin), lasted until true tick `until`.
    GaveUp { at: u64, until: u64 },
    /// A retryable handler failure: released for a retry.
    Released,
    /// Any other refusal (a payload conflict, an identity taken, a store refusal).
    Refused(String),
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
