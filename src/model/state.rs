//! The model's state: the store's tables, the true clock, the workers and what they did.

use std::fmt;
use std::hash::{Hash, Hasher};

use crate::record::{Evidence, Lease, Record, Settlement, StepRecord};
use crate::store::MemoryStore;

/// Everything the checker explores. Hashed and compared by its `Debug` form, which is
/// deterministic (the store's contents are sorted) and covers every field.
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// True time, in ticks (seconds) from the model's start.
    pub(crate) now: u64,
    /// The idempotency table's records and the uniqueness table's evidence.
    pub(crate) records: Vec<Record>,
    pub(crate) evidence: Vec<(String, Evidence)>,
    /// The store answers nothing (an outage) while set.
    pub(crate) down: bool,
    /// What the environment may still do: outages, answers lost after commit, crashes.
    pub(crate) outages: u8,
    pub(crate) losses: u8,
    pub(crate) crashes: u8,
    pub(crate) workers: Vec<Worker>,
    /// Per operation: every handler run that acted, and those a crash excuses (a handler
    /// declared safe to repeat, re-run after its predecessor died without settling).
    pub(crate) effects: Vec<u8>,
    pub(crate) excused: Vec<u8>,
    /// Per operation: the next run starts afresh and is excused. TTL deleted an unsettled
    /// record, so a claim that does not declare the operation's business identity is fresh
    /// (the design's accepted case: only evidence outlives retention, and only for a claim
    /// that names it); or a handler's retryable failure released the claim (the next
    /// delivery re-executes, as the seeded simulation's ledger excuses it too).
    pub(crate) afresh: Vec<bool>,
    /// Per operation: the worker whose claim wrote the business identity's evidence.
    pub(crate) evidence_writer: Vec<Option<usize>>,
    /// The ticks at which an outage ended.
    pub(crate) ups: Vec<u64>,
    /// Per operation: the first outcome recorded, and the tick its retention ends.
    pub(crate) first_outcome: Vec<Option<(Vec<u8>, u64)>>,
    /// What a transition saw that breaks an invariant (checked by the properties).
    pub(crate) broken: Vec<&'static str>,
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

impl Hash for State {
    fn hash<H: Hasher>(&self, state: &mut H) {
        format!("{self:?}").hash(state);
    }
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        format!("{self:?}") == format!("{other:?}")
    }
}

impl Eq for State {}

/// One Lambda invocation handling one delivery of an operation.
#[derive(Clone, Debug)]
pub(crate) struct Worker {
    /// The operation it was delivered.
    pub(crate) op: usize,
    /// How far ahead of true time its clock runs.
    pub(crate) skew: u64,
    /// Whether its deployment declares a business identity.
    pub(crate) identity: bool,
    pub(crate) pc: Pc,
}

/// Where a worker is.
#[derive(Clone, Debug)]
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
    /// Answered.
    Done(Answer),
    /// Crashed, or killed at its deadline.
    Dead,
}

/// A lease the worker holds.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) claim: Box<Record>,
    /// The tick (on the worker's clock) the invocation started: its deadline is a lease later.
    pub(crate) started: u64,
    /// The crashed attempt's record, for a takeover.
    pub(crate) previous: Option<Box<Record>>,
    /// A re-run of a handler declared safe to repeat after its predecessor died.
    pub(crate) excused: bool,
    /// A stepped handler: the steps the operation recorded so far, and where its one step is.
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) phase: Phase,
}

/// Where a stepped handler's one step is (an unstepped handler acts at `Start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Not started.
    Start,
    /// Its intent is recorded (or it runs again): the effect is next.
    Intended,
    /// Its effect happened: its result goes with the settlement.
    Acted,
}

/// What a worker answered its caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Ran and recorded this outcome.
    Executed(Vec<u8>),
    /// Replayed this stored outcome.
    Replayed(Vec<u8>),
    /// Another attempt holds a live lease.
    InProgress,
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
