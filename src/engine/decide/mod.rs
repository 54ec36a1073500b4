//! The engine's decisions, as pure functions of the record, the clock and the store's answer:
//! what a claim's answer means, what a takeover writes and what its fenced answer means,
//! whether a failed fence shows the caller's own settlement, how a takeover recovers, which
//! business identity an attempt settles, whether a failing write is tried again, and until
//! when a claim given back still holds.
//!
//! The engine acts on these and nothing else, so that the protocol's model checker
//! (`src/model`, in the crate's tests) checks the decisions that run, not a copy of them.

use std::time::{Duration, SystemTime};

use crate::defects;
use crate::execution::{Invocation, MIN_LEASE};
use crate::reconcile::Recovery;
use crate::record::{
    Evidence, Lease, Record, Settlement, Status, StepRecord, epoch_millis, retention_expiry,
};
use crate::store::{Claim, Fence, Guard};

/// The record a fresh claim of `invocation` writes at `now` under the random `token`: attempt
/// 1, a lease of the invocation's (at least [`MIN_LEASE`]: a claim never starts expired), and a
/// retention expiry that outlives it.
pub(crate) fn claim_record(
    invocation: &Invocation,
    token: String,
    now: SystemTime,
    retention: Duration,
) -> Record {
    let lease_expires_at = now + invocation.lease.max(MIN_LEASE);
    Record {
        key: invocation.key.clone(),
        status: Status::InProgress,
        fingerprint: invocation.fingerprint.clone(),
        lease: Lease {
            token,
            attempt: 1,
            expires_at: lease_expires_at,
        },
        expires_at: retention_expiry(lease_expires_at, retention),
        outcome: None,
        created_at: now,
        completed_at: None,
        request_id: invocation.request_id.clone(),
        identity: invocation.evidence_key(),
        audit: None,
        steps: Vec::new(),
        steps_version: 0,
    }
}

/// What a claim's answer means for the caller.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The caller holds a fresh lease (its claim committed, perhaps with its answer lost).
    Run,
    /// The operation's own evidence stands IN_PROGRESS without its record (TTL deleted it):
    /// re-create the record as a takeover.
    Adopt(Evidence),
    /// A business identity's evidence refuses the claim.
    IdentityTaken(Evidence),
    /// The record stands for another intent.
    PayloadConflict,
    /// The record stands and is not to be taken over: answer from it.
    Answer(Record),
    /// The record's lease ran out: take it over.
    TakeOver(Record),
}

/// What the answer `claimed` to the caller's `claim` (which carries its intent's fingerprint)
/// means at `now`.
pub(crate) fn claimed(claimed: Claim, claim: &Record, now: SystemTime) -> Claimed {
    let existing = match claimed {
        Claim::Acquired => return Claimed::Run,
        Claim::Existing(existing) if is_own_claim(&existing, claim) => return Claimed::Run,
        Claim::Existing(existing) => existing,
        Claim::IdentityTaken(evidence)
            if evidence.key == claim.key && evidence.status == Status::InProgress =>
        {
            return Claimed::Adopt(evidence);
        }
        Claim::IdentityTaken(evidence) => return Claimed::IdentityTaken(evidence),
    };
    if !claim
        .fingerprint
        .names(&existing.fingerprint, existing.created_at)
    {
        return Claimed::PayloadConflict;
    }
    match existing.lease_is_takeable(now) {
        true => Claimed::TakeOver(existing),
        false => Claimed::Answer(existing),
    }
}

/// Whether `existing` is a claim of the owner the caller's `claim` is made for
/// ([`Invocation::with_owner`]), which the caller re-enters: IN_PROGRESS under the owner's
/// token. Only an owned claim's token is anyone else's than its invocation's.
pub(crate) fn reenters(existing: &Record, claim: &Record) -> bool {
    existing.status == Status::InProgress && existing.lease.token == claim.lease.token
}

/// Whether `stored` is the fresh `claim` itself as it committed: IN_PROGRESS under its lease,
/// with no step, created when it was (at the store's millisecond). An owner's record from an
/// earlier invocation has its own creation time, or steps, or a later attempt.
pub(crate) fn is_this_claim(stored: &Record, claim: &Record) -> bool {
    is_own_claim(stored, claim)
        && stored.steps.is_empty()
        && epoch_millis(stored.created_at) == epoch_millis(claim.created_at)
}

/// Whether `existing` is the caller's own `claim`: it committed before its answer was lost and
/// the retry found it standing.
pub(crate) fn is_own_claim(existing: &Record, claim: &Record) -> bool {
    if defects::is_reintroduced(defects::OWN_CLAIM_UNRECOGNISED) {
        return false;
    }
    existing.status == Status::InProgress && holds(&existing.lease, &claim.lease)
}

/// Whether `stored` is `mine` as a store gives it back: the same random token and attempt
/// (times come back at the store's resolution, milliseconds on DynamoDB).
pub(crate) fn holds(stored: &Lease, mine: &Lease) -> bool {
    stored.token == mine.token && stored.attempt == mine.attempt
}

/// The record an adoption of `orphan` (the operation's own evidence, IN_PROGRESS, whose
/// record TTL deleted) re-creates from the caller's `claim`: attempt 2, the orphan's identity,
/// its execution's `created_at` (which names the execution's outbox events, on every later
/// takeover too), and a mark that the crashed attempt's steps are lost (for every later
/// takeover).
pub(crate) fn adoption(claim: &Record, orphan: &Evidence) -> Record {
    Record {
        lease: Lease {
            attempt: 2,
            ..claim.lease.clone()
        },
        identity: Some(orphan.identity.clone()),
        created_at: orphan.created_at,
        steps: vec![StepRecord::steps_lost()],
        steps_version: 1,
        ..claim.clone()
    }
}

/// The crashed attempt of an orphaned evidence, as the reconciler sees it.
pub(crate) fn orphaned_record(adopted: &Record, orphan: &Evidence) -> Record {
    Record {
        lease: Lease {
            token: String::new(),
            attempt: 1,
            expires_at: orphan.created_at,
        },
        expires_at: orphan.created_at,
        created_at: orphan.created_at,
        request_id: None,
        ..adopted.clone()
    }
}

/// What a takeover of `existing` writes: the caller's new lease (`fresh`, with the next
/// attempt number) and a retention expiry that outlives it, so that TTL never deletes a
/// record whose lease is live.
pub(crate) fn takeover(
    existing: &Record,
    fresh: &Lease,
    retention: Duration,
) -> (Lease, SystemTime) {
    let lease = Lease {
        attempt: existing.lease.attempt.saturating_add(1),
        ..fresh.clone()
    };
    let expires_at = match defects::is_reintroduced(defects::TAKEOVER_KEEPS_RETENTION) {
        true => existing.expires_at,
        false => retention_expiry(lease.expires_at, retention),
    };
    (lease, expires_at)
}

/// The time a takeover's expiry condition is given: `now`, or for an owner re-entering its own
/// claim (`reentered`), a time past the lease's end, since the owner takes it back live or
/// not (the token and the steps as read still fence it).
pub(crate) fn reentry_time(existing: &Record, now: SystemTime, reentered: bool) -> SystemTime {
    match reentered {
        true => now.max(existing.lease.expires_at + Duration::from_millis(1)),
        false => now,
    }
}

/// What a takeover's fenced answer means.
#[derive(Debug)]
pub(crate) enum TookOver {
    /// The caller holds `lease` (its takeover committed, perhaps with its answer lost).
    Held,
    /// Another write came first: answer from the record as it stands.
    Answer(Box<Record>),
    /// Another write came first and the record is gone (released, given back whole, deleted
    /// by TTL): the key is claimed again.
    Gone,
}

/// What the fenced answer `fence` to a takeover that wrote `lease` means.
pub(crate) fn took_over(fence: Fence, lease: &Lease) -> TookOver {
    match fence {
        Fence::Held => TookOver::Held,
        Fence::Lost {
            current: Some(current),
        } if current.status == Status::InProgress && holds(&current.lease, lease) => TookOver::Held,
        Fence::Lost {
            current: Some(current),
        } => TookOver::Answer(current),
        Fence::Lost { current: None } => TookOver::Gone,
    }
}

/// Whether `current` (the record a failed fence returned) is the record as `settlement` left
/// it under `guard`: the caller's own settlement, committed before its answer was lost.
pub(crate) fn shows_settlement(
    current: &Record,
    guard: Guard<'_>,
    settlement: &Settlement,
) -> bool {
    if defects::is_reintroduced(defects::OWN_SETTLEMENT_UNRECOGNISED) {
        return false;
    }
    let same_write = current.status == settlement.status
        && current.outcome == settlement.outcome
        && current.completed_at.map(epoch_millis) == Some(epoch_millis(settlement.completed_at));
    match guard {
        Guard::Lease(token) | Guard::Expired { token, .. } | Guard::Indeterminate { token, .. } => {
            same_write && current.lease.token == token
        }
    }
}

/// How a takeover of an attempt that may have acted goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recover {
    /// The crashed attempt's recorded steps decide: run the handler, whose recorded steps replay.
    Steps,
    /// Ask the reconciler.
    Reconcile,
    /// Re-run the handler (declared safe to repeat).
    Rerun,
    /// Hold the operation INDETERMINATE for an operator.
    Hold,
}

/// What a takeover inherits from the step list of the attempt it takes over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inherited {
    /// The recorded steps, marks left out: they replay.
    pub(crate) steps: Vec<StepRecord>,
    /// The list carries an adoption's mark: the crashed attempt's steps went with TTL.
    pub(crate) lost: bool,
    /// The attempt taken over gave its claim back knowingly (its own mark ends the list): the
    /// steps are all it did through steps.
    pub(crate) given_back: bool,
}

/// What a takeover of `previous` inherits. A give-back's mark counts only when the attempt
/// taken over wrote it: a later attempt that crashed before writing its own steps left the
/// mark of the one before.
pub(crate) fn inherited(previous: &Record) -> Inherited {
    let given_back = previous
        .steps
        .last()
        .is_some_and(|last| last.marks_given_back() && last.attempt == previous.lease.attempt)
        && !defects::is_reintroduced(defects::GIVEN_BACK_HELD);
    Inherited {
        steps: previous
            .steps
            .iter()
            .filter(|step| !step.is_mark())
            .cloned()
            .collect(),
        lost: previous.steps.iter().any(StepRecord::marks_steps_lost),
        given_back,
    }
}

/// The steps a takeover by `attempt` that ran nothing writes over `previous`'s when
/// `previous` ended in a give-back's mark ([`inherited`]): the same steps, the mark now
/// `attempt`'s; `None` when there is no mark to hand on.
pub(crate) fn handed_on(previous: &Record, attempt: u32) -> Option<Vec<StepRecord>> {
    if !inherited(previous).given_back {
        return None;
    }
    let mut steps = previous.steps.clone();
    steps.pop();
    steps.push(StepRecord::given_back(attempt));
    Some(steps)
}

/// How a takeover recovers, under the engine's `recovery` policy: `adopted` when the record
/// was re-created from orphaned evidence (its steps went with TTL), from what it `inherited`,
/// `reconciler` when one is set.
///
/// An attempt that gave its claim back knowingly with steps recorded (its handler's own
/// retryable failure, a stop at a step) is continued from its steps under every policy: they
/// replay, the uncertain ones are checked. A crashed attempt's steps decide only where the
/// handler declares its effects to be its steps, or safe to repeat.
///
/// An owner re-entering its own claim (`reentered`: a durable execution replayed after it
/// suspended) goes on from its steps, whatever they are: the earlier invocations were its
/// own, and what they did outside steps the owner replays itself.
pub(crate) fn recover(
    recovery: Recovery,
    adopted: bool,
    reentered: bool,
    inherited: &Inherited,
    reconciler: bool,
) -> Recover {
    // An adopted orphan's steps are lost: nothing says they were none.
    let lost = adopted || inherited.lost;
    if reentered && !lost {
        return Recover::Steps;
    }
    let recovery = match (lost, recovery) {
        (true, Recovery::Steps) => Recovery::Indeterminate,
        (_, recovery) => recovery,
    };
    let recorded = !inherited.steps.is_empty();
    let continued = inherited.given_back && !lost;
    if recorded && (continued || matches!(recovery, Recovery::Steps | Recovery::Rerun)) {
        return Recover::Steps;
    }
    if reconciler {
        return Recover::Reconcile;
    }
    match recovery {
        Recovery::Rerun | Recovery::Steps => Recover::Rerun,
        Recovery::Indeterminate => Recover::Hold,
    }
}

/// What failed an attempt that held its lease to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The handler returned an error (or an HTTP door's 5xx it does not store).
    Handler,
    /// A condition of the writes the handler queued for its completion failed: nothing of
    /// the completion committed, but the handler's effects outside it may have happened.
    CompletionRefused,
}

/// What an attempt does after a `failure` of `class`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Delete the claim: the next delivery runs afresh.
    Release,
    /// Keep the steps, marked as given back, and cut the lease: the next delivery replays
    /// them and checks the uncertain ones, whatever the recovery policy.
    GiveBack,
    /// Keep the failure of this kind, answered to every later caller.
    Retain(String),
    /// Hold the operation INDETERMINATE for an operator.
    Hold,
}

/// What an attempt does after a `failure` of `class`, under `recovery`, `recorded` when the
/// store may hold a step of it. The handler's own retryable error is released, as the handler
/// asked, or given back with its steps (never deleted with the record). A refused completion
/// follows a handler that returned, so its effects outside the completion happened: it is
/// released or given back only where they are declared to be steps or safe to repeat; under
/// [`Recovery::Indeterminate`] it is held, never run again blind.
pub(crate) fn after_failure(
    failure: Failure,
    class: &crate::failure::FailureClass,
    recovery: Recovery,
    recorded: bool,
) -> AfterFailure {
    use crate::failure::FailureClass;
    match class {
        FailureClass::Terminal { kind } => AfterFailure::Retain(kind.clone()),
        _ if failure == Failure::CompletionRefused
            && recovery == Recovery::Indeterminate
            && !defects::is_reintroduced(defects::REFUSED_COMPLETION_RELEASED) =>
        {
            AfterFailure::Hold
        }
        _ if recorded => AfterFailure::GiveBack,
        _ => AfterFailure::Release,
    }
}

/// The business identity an attempt settles: the one its operation recorded when it was
/// claimed (`previous`, the crashed attempt's record, for a takeover), whatever this
/// deployment declares.
pub(crate) fn settled_identity<'a>(
    claim: &'a Record,
    previous: Option<&'a Record>,
) -> Option<&'a str> {
    if defects::is_reintroduced(defects::IDENTITY_FROM_DEPLOYMENT) {
        return claim.identity.as_deref();
    }
    previous.unwrap_or(claim).identity.as_deref()
}

/// Whether a write that failed for a transient reason is tried again after `pause`: while
/// tries remain (`tries` made of `max_tries`) and the next one starts before `until`.
pub(crate) fn try_again(
    tries: u32,
    max_tries: u32,
    now: SystemTime,
    pause: Duration,
    until: SystemTime,
) -> bool {
    tries < max_tries && now + pause < until
}

/// Where a step named `name` stands when it starts at `cursor` in the operation's recorded
/// `steps` (which earlier steps of this attempt passed).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StepStanding<'a> {
    /// Its result is recorded: these bytes are returned without running it.
    Done(&'a [u8]),
    /// An earlier attempt recorded its intent and no result: its effect is uncertain.
    Uncertain,
    /// Not recorded: its intent is written, then it runs.
    New,
    /// Another order than recorded (`Some`: the name recorded at the cursor), or a name used
    /// twice (`None`).
    Mismatch(Option<&'a str>),
}

/// Where step `name` stands at `cursor` in `steps`.
pub(crate) fn step_standing<'a>(
    steps: &'a [StepRecord],
    cursor: usize,
    name: &str,
) -> StepStanding<'a> {
    if steps[..cursor.min(steps.len())]
        .iter()
        .any(|step| step.name == name)
    {
        return StepStanding::Mismatch(None);
    }
    match steps.get(cursor) {
        None => StepStanding::New,
        Some(recorded) if recorded.name != name => StepStanding::Mismatch(Some(&recorded.name)),
        Some(StepRecord {
            result: Some(bytes),
            ..
        }) => StepStanding::Done(bytes),
        Some(_) => StepStanding::Uncertain,
    }
}

/// Whether an uncertain step runs again: only one declared repeat-safe (its downstream key
/// makes the provider deduplicate), or under [`Recovery::Rerun`] (every effect declared safe to
/// repeat); otherwise its check decides, and without one the operation is held.
pub(crate) fn rerun_uncertain(repeat_safe: bool, recovery: Recovery) -> bool {
    repeat_safe
        || recovery == Recovery::Rerun
        || defects::is_reintroduced(defects::UNCERTAIN_STEP_RERUN)
}

/// How long before the invocation's deadline a settlement stops retrying: the answer still
/// has to reach the caller.
pub(crate) const SETTLE_MARGIN: Duration = Duration::from_secs(1);

/// How long a caller waits for its key's turn under single flight: the lease, and never past
/// the invocation's `deadline` less [`SETTLE_MARGIN`]: a waiter
/// that gives up still has to meet the store's answer (`AlreadyInProgress`) and reply before
/// Lambda ends the invocation.
pub(crate) fn single_flight_patience(
    lease: Duration,
    deadline: Option<SystemTime>,
    now: SystemTime,
) -> Duration {
    deadline.map_or(lease, |deadline| {
        let left = deadline.duration_since(now).unwrap_or_default();
        left.saturating_sub(SETTLE_MARGIN).min(lease)
    })
}

/// Until when a claim given back at `now` (its handler panicked, or its task was cancelled)
/// still holds: a `grace` for what the handler left in flight, and until a step's effect can
/// have landed (`lands_by`), never later than its lease.
pub(crate) fn given_back_until(
    now: SystemTime,
    lease_expires_at: SystemTime,
    grace: Duration,
    lands_by: Option<SystemTime>,
) -> SystemTime {
    if defects::is_reintroduced(defects::GIVE_BACK_WITHOUT_GRACE) {
        return now;
    }
    (now + grace)
        .max(lands_by.unwrap_or(now))
        .min(lease_expires_at)
}

#[cfg(test)]
mod tests;
