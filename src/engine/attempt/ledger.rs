//! One attempt's steps: what the record holds, what this attempt adds, and the writes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use aws_sdk_dynamodb::types::TransactWriteItem;
use sha2::{Digest, Sha256};

use crate::effects::{
    COMPLETION, COMPLETION_EVENTS, MAX_STEP_NAME_BYTES, MAX_STEP_RESULTS_BYTES, MAX_STEPS,
    NotApplied, Outbox, OutboxEvent, StepCheck, StepError, Transaction, event_id,
};
use crate::reconcile::Checked;

/// What a step's fields (`name`, `attempt`, `result` and the list's framing) add in the record.
const STEP_OVERHEAD_BYTES: usize = 32;
/// Why a step is refused once the handler has returned (it runs in a task the handler spawned).
const HANDLER_RETURNED: &str =
    "the handler has returned: a step runs inside the handler's own future";

use crate::engine::decide::{self, StepStanding};
use crate::engine::replayable::replayable;
use crate::engine::retry::Patience;
use crate::engine::{Idempotency, LandsBy};
use crate::error::{BoxError, Error, StoreError, decode_failure};
use crate::execution::Invocation;
use crate::key::OperationKey;
use crate::record::{FailureKind, Record, StepRecord};
use crate::store::{Committed, Fence, Guard, Request, Store, StoreExt, Target, writes_refused};

/// Why an attempt stopped at a step, and what the engine does about it.
#[derive(Debug)]
pub(crate) enum Halt {
    /// This attempt cannot decide the operation: it is held INDETERMINATE for an operator;
    /// the caller gets the error.
    Hold(Error),
    /// The claim is given back (the steps written first) for the next delivery; the caller
    /// gets the error.
    GiveBack(Error),
    /// The lease is another's: nothing more is written.
    Lost(Error),
    /// A step's effect happened but its result cannot be kept: the operation is retained as
    /// FAILED of this kind.
    Retain(FailureKind, Error),
}

impl Halt {
    fn error(&self) -> &Error {
        match self {
            Self::Hold(err) | Self::GiveBack(err) | Self::Lost(err) | Self::Retain(_, err) => err,
        }
    }
}

/// The steps of one attempt under its lease, shared by the handler's [`ExecutionContext`]
/// clones and read by the engine once the handler returns.
///
/// [`ExecutionContext`]: crate::ExecutionContext
pub(crate) struct StepLedger {
    idem: Idempotency,
    key: OperationKey,
    token: String,
    /// Each step's result is written as soon as the step ends (an owned claim's), not with the
    /// next write.
    saves_each_result: bool,
    /// This run's own: the request tokens of its commits are derived from it, since an owned
    /// claim's lease token is the same on every run of its owner
    /// ([`Invocation::with_owner`](crate::Invocation::with_owner)).
    run: String,
    attempt: u32,
    /// When the lease runs out: a step write is not retried past it.
    lease_expires_at: SystemTime,
    /// The invocation's deadline, if it has one: a write carrying a step's result is retried
    /// until shortly before it.
    deadline: Option<SystemTime>,
    /// How far apart two invocations' clocks may run: an effect may land until its start plus
    /// its declared timeout, on the clock of whoever takes over.
    clock_skew: Duration,
    /// The operation's recovery policy (its own, else the engine's default): under
    /// [`Recovery::Rerun`](crate::reconcile::Recovery::Rerun) the whole handler is safe to
    /// repeat, so an uncertain step runs again too.
    recovery: crate::reconcile::Recovery,
    /// When the operation's execution was first claimed (the same on every attempt of it,
    /// another for a new execution of the key): it names the outbox events' ids.
    created_at: SystemTime,
    /// Until when the effect of a step that ended without a result may still land downstream
    /// (its start plus its declared effect timeout, else the lease's end): no give-back, panic
    /// or cancellation lets a takeover in before then.
    lands_by: LandsBy,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The steps: those an earlier attempt recorded, then this attempt's.
    steps: Vec<StepRecord>,
    /// Whether `steps` differ from what the store holds (a result not yet written).
    dirty: bool,
    /// Whether `steps` hold a result the store lacks: its effect happened, so the write that
    /// carries it is as patient as a settlement (a few-second outage must not turn a known
    /// result into an uncertain step).
    unsaved_result: bool,
    /// The position of the next step this attempt runs.
    cursor: usize,
    /// Whether a step is running (from its start to its end, however it ends).
    in_flight: bool,
    /// The position of the step whose effect this attempt started, from the effect's start
    /// to its answer: still set when the step's future was dropped mid-effect (a timeout
    /// around it), whose effect may still land.
    started: Option<usize>,
    /// Whether the handler has returned: no step runs after.
    closed: bool,
    /// Why the attempt stopped, once it has.
    halt: Option<Halt>,
    /// Whether a commit's outcome is unknown: the record's steps are then as the store has
    /// them (the commit applied or not), and nothing may overwrite them.
    frozen: bool,
    /// How many commits this attempt sent: each gets its own request token.
    commits: u32,
    /// The handler's writes to commit with the completion (each call's writes, then its outbox
    /// events' items).
    completion: Vec<TransactWriteItem>,
    /// The names of the events the completion publishes.
    completion_events: Vec<String>,
    /// Whether the handler declared its result a refusal ([`ExecutionContext::refuse`]).
    refused: bool,
}

/// Marks a step as running for as long as it lives: dropped when the step ends, its future
/// dropped included, so that a cancelled step never leaves the ledger thinking one runs.
struct Flight<'a>(&'a StepLedger);

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight = false;
    }
}

/// Armed while a transactional step's commit is awaited. Dropped armed (the step's future
/// cancelled: a timeout around it), the commit may have applied, or may still: the steps are
/// left as the store has them (frozen, never overwritten nor released) and the attempt stops,
/// given back, so that the next attempt reads whether it did.
struct Committing<'a> {
    ledger: &'a StepLedger,
    step: &'a str,
    /// Whether the commit carries the handler's writes (else it is the step's record alone,
    /// which the next write of the steps settles either way).
    writes: bool,
    armed: bool,
}

impl Committing<'_> {
    /// The commit answered: the step settles by its answer.
    fn answered(&mut self) {
        self.armed = false;
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self.ledger.lock();
        if self.writes {
            state.frozen = true;
        }
        let cancelled = Halt::GiveBack(Error::Store(StoreError::Unavailable {
            operation: "TransactWriteItems",
            source: "the step was cancelled before its commit answered".into(),
        }));
        let _ = self.ledger.halt(&mut state, self.step, cancelled);
    }
}

/// How a write of the steps fared.
enum Flushed {
    /// Written (or nothing to write).
    Written,
    /// The store failed: what it holds is an earlier, safe prefix.
    Failed,
    /// The lease is another's.
    Lost,
}

/// Where a step stands when it starts.
enum Standing<T> {
    /// Its result is recorded: returned without running.
    Done(T),
    /// An earlier attempt recorded its intent and no result.
    Uncertain,
    /// It has not been recorded.
    New,
}

impl fmt::Debug for StepLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("StepLedger")
            .field("key", &self.key.short())
            .field("attempt", &self.attempt)
            .field("steps", &state.steps.len())
            .field("cursor", &state.cursor)
            .finish_non_exhaustive()
    }
}

impl StepLedger {
    /// The ledger of `attempt` of `invocation` under the lease of `claim`, starting from the
    /// steps the record holds, of the execution first claimed at `created_at`.
    pub(crate) fn new(
        idem: Idempotency,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        recorded: Vec<StepRecord>,
        created_at: SystemTime,
        lands_by: LandsBy,
    ) -> Self {
        Self {
            recovery: idem.recovery(),
            idem,
            key: invocation.key.clone(),
            token: claim.lease.token.clone(),
            saves_each_result: invocation.owner.is_some(),
            run: uuid::Uuid::new_v4().to_string(),
            attempt,
            lease_expires_at: claim.lease.expires_at,
            deadline: invocation.deadline,
            clock_skew: invocation.clock_skew,
            created_at,
            lands_by,
            state: Mutex::new(State {
                steps: recorded,
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn target(&self) -> Target<'_> {
        Target {
            key: &self.key,
            identity: None,
            guard: Guard::Lease(&self.token),
        }
    }

    /// Why the attempt stopped at a step, if it did (taken: the engine acts on it once).
    pub(crate) fn take_halt(&self) -> Option<Halt> {
        self.lock().halt.take()
    }

    /// The steps to write with the next write, when they changed since the last one.
    pub(crate) fn pending(&self) -> Option<Vec<StepRecord>> {
        let state = self.lock();
        (state.dirty && !state.frozen).then(|| state.steps.clone())
    }

    /// Whether the store may hold a step of this operation that matters (an intent whose
    /// effect may have run, a result, a commit whose outcome is unknown), or may yet (a step
    /// still running, in a task the handler spawned: its intent or its commit may land): it is
    /// then never released to run afresh (the steps would go with the record), only given
    /// back, so that they replay. The ledger takes a step only once its write succeeded, so
    /// its list is what the store holds, withdrawn intents aside.
    pub(crate) fn has_recorded(&self) -> bool {
        let state = self.lock();
        state.frozen || state.in_flight || !state.steps.is_empty()
    }

    /// Whether the attempt stopped at a step (its answer is then the stop's, whatever the
    /// handler returns).
    #[cfg(feature = "http")]
    pub(crate) fn stopped(&self) -> bool {
        self.lock().halt.is_some()
    }

    /// Whether writes wait to commit with the completion ([`ExecutionContext::complete_with`]).
    #[cfg(feature = "http")]
    pub(crate) fn completes_with_writes(&self) -> bool {
        !self.lock().completion.is_empty()
    }

    /// Declares the attempt's result a refusal ([`ExecutionContext::refuse`]).
    pub(crate) fn refuse(&self) {
        self.lock().refused = true;
    }

    /// Whether the attempt's result is a refusal that took no effect: declared one, with no
    /// step recorded and no write queued with the completion. Its settlement then releases the
    /// business identity instead of settling it.
    pub(crate) fn refused_without_effect(&self) -> bool {
        let state = self.lock();
        state.refused && !state.frozen && state.steps.is_empty() && state.completion.is_empty()
    }

    /// Ends the attempt's steps: the handler has returned (or panicked), and a step started
    /// after (from a task it spawned) is refused.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
    }

    /// Writes the steps with this attempt's [`StepRecord::given_back`] mark after them: the
    /// next delivery continues from them whatever the recovery policy. A list whose commit's
    /// outcome is unknown (frozen) is left as the store has it, unmarked, and a list with a
    /// step still running (from a task the handler spawned: its intent may be in flight) is
    /// written unmarked: their takeovers are decided as a crash's.
    async fn mark_given_back(&self) -> Flushed {
        if self.lock().in_flight {
            return self.flush().await;
        }
        let marked = {
            let state = self.lock();
            (!state.frozen).then(|| {
                let mut steps = state.steps.clone();
                steps.push(StepRecord::given_back(self.attempt));
                steps
            })
        };
        match marked {
            Some(marked) => self.write_whole(&marked).await,
            None => Flushed::Written,
        }
    }

    /// Writes the pending steps, if any.
    async fn flush(&self) -> Flushed {
        // Frozen: nothing to write (`pending` is `None`); the record stands as the store has it.
        match self.pending() {
            Some(steps) => self.write_whole(&steps).await,
            None => Flushed::Written,
        }
    }

    /// Writes `steps`, every step of the ledger among them: once written, nothing of the
    /// ledger is left unsaved.
    async fn write_whole(&self, steps: &[StepRecord]) -> Flushed {
        match self.write(steps).await {
            Ok(()) => {
                let mut state = self.lock();
                state.dirty = false;
                state.unsaved_result = false;
                Flushed::Written
            }
            Err(Halt::Lost(_)) => Flushed::Lost,
            Err(_) => Flushed::Failed,
        }
    }

    /// Writes the pending steps before a panic unwinds past the engine (best effort).
    pub(crate) async fn save(&self) {
        let _ = self.flush().await;
    }

    /// Gives the claim back for the next delivery to take over and replay the steps: the
    /// pending steps written first, then the lease cut to now, or to when the effect of a step
    /// that ended without a result can have landed (the next attempt's check must see it). A
    /// failed write of the steps still cuts the lease (what the store holds is an earlier
    /// prefix: the steps it lacks come back uncertain); a lost lease is left alone, and is
    /// the caller's answer ([`Error::LeaseLost`]).
    pub(crate) async fn give_back(&self) -> Result<(), Error> {
        if let Flushed::Lost = self.mark_given_back().await {
            warn!(
                attempt = self.attempt,
                "lease lost before the claim was given back"
            );
            return Err(Error::LeaseLost {
                key: self.key.clone(),
                attempt: self.attempt,
            });
        }
        let store = self.idem.store();
        let target = self.target();
        let until = decide::given_back_until(
            self.idem.now(),
            self.lease_expires_at,
            Duration::ZERO,
            self.lands_by.get(),
        );
        if until >= self.lease_expires_at {
            debug!(
                attempt = self.attempt,
                "a step's effect may land until the lease's end: the claim is kept"
            );
            return Ok(());
        }
        // No retry starts once the caller's answer is due (a patient step write before may
        // have used the time up), and none outlasts the deadline.
        let patience = Patience::brief(self.lease_expires_at, self.deadline);
        let given_back = self
            .idem
            .retrying(patience, || store.shorten(target, until))
            .await;
        if given_back.is_err() {
            warn!(
                attempt = self.attempt,
                "the claim could not be given back: its lease runs out"
            );
        }
        Ok(())
    }

    /// Stops the attempt; the step's error for the handler.
    fn halt(&self, state: &mut State, step: &str, halt: Halt) -> StepError {
        let kind = halt.error().kind();
        warn!(
            attempt = self.attempt,
            kind = kind.name(),
            "the operation stopped at a step"
        );
        state.halt.get_or_insert(halt);
        StepError::Stopped {
            step: step.to_owned(),
            kind,
        }
    }

    /// How long a step write is retried: briefly (a redelivery loses nothing), unless it
    /// carries a result the store lacks, which gets a settlement's patience.
    fn patience(&self) -> Patience {
        match self.lock().unsaved_result {
            true => Patience::settling(self.lease_expires_at, self.deadline, self.idem.now()),
            false => Patience::brief(self.lease_expires_at, self.deadline),
        }
    }

    /// One fenced write of `steps` (see [`StepLedger::patience`]).
    async fn write(&self, steps: &[StepRecord]) -> Result<(), Halt> {
        let store = self.idem.store();
        let target = self.target();
        let written = self
            .idem
            .retrying(self.patience(), || store.record_steps(target, steps))
            .await;
        match written {
            Ok(Fence::Held) => Ok(()),
            Ok(Fence::Lost { .. }) => Err(Halt::Lost(Error::LeaseLost {
                key: self.key.clone(),
                attempt: self.attempt,
            })),
            Err(err) => Err(Halt::GiveBack(err.into())),
        }
    }

    /// Runs step `name` (see [`Step::run`](super::Step::run)).
    pub(crate) async fn run<T, E, C, F, Fut>(
        &self,
        name: String,
        repeat_safe: bool,
        effect_timeout: Option<Duration>,
        check: C,
        effect: F,
    ) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        C: StepCheck<T>,
        C::Future: Send,
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (standing, _flight) = self.begin::<T>(&name)?;
        let downstream = self.key.downstream(&name);
        let recorded_here = matches!(standing, Standing::New);
        match standing {
            Standing::Done(value) => return Ok(value),
            Standing::New => {
                if let Some(refused) = self.outlasts_lease(&name, effect_timeout, false) {
                    return Err(refused);
                }
                self.record_intent(&name).await?;
            }
            Standing::Uncertain if decide::rerun_uncertain(repeat_safe, self.recovery) => {
                debug!(
                    attempt = self.attempt,
                    "an uncertain repeat-safe step runs again"
                );
            }
            // Its own intent, this attempt's effect cut off (a timeout around the step): that
            // effect may still land, so no check can tell yet; the next attempt asks it once
            // the effect can have landed.
            Standing::Uncertain if self.cut_off_here(&self.lock()) && self.may_still_land() => {
                return Err(self.give_back_cut_off(&name));
            }
            Standing::Uncertain => match self.check(&name, check, downstream.clone()).await? {
                Some(value) => return self.saved(&name, Ok(value)).await,
                None => debug!(
                    attempt = self.attempt,
                    "checked: not applied, the step runs"
                ),
            },
        }
        // The check (however long it took) or the intent's write may have outlasted the
        // lease: a takeover may be checking, and running, this step itself.
        if self.past_lease() {
            let lost = Halt::Lost(Error::LeaseLost {
                key: self.key.clone(),
                attempt: self.attempt,
            });
            return Err(self.halt(&mut self.lock(), &name, lost));
        }
        // Its intent written from a task the handler spawned, after it returned: the claim
        // is given back (or settled), and a takeover may check this step. No effect starts.
        if self.lock().closed {
            return Err(StepError::Invalid {
                step: name,
                reason: HANDLER_RETURNED,
            });
        }
        if let Some(refused) = self.outlasts_lease(&name, effect_timeout, recorded_here) {
            return Err(refused);
        }
        // On every clock: a takeover's clock may run ahead of this one by the skew.
        // A timeout past what a clock can count is none: the lease bounds it.
        let lands_by = effect_timeout
            .and_then(|timeout| {
                self.idem
                    .now()
                    .checked_add(timeout.saturating_add(self.clock_skew))
            })
            .map_or(self.lease_expires_at, |lands| {
                lands.min(self.lease_expires_at)
            });
        // From its start the effect may land: a step cancelled mid-effect (a timeout around
        // it) leaves the mark, which a result recorded lifts.
        let before = self.lands_by.get();
        self.lands_by.set(before.max(Some(lands_by)));
        {
            let mut state = self.lock();
            state.started = Some(state.cursor);
        }
        let ran: Result<T, BoxError> = effect(downstream).await.map_err(Into::into);
        self.lock().started = None;
        // A result, or the effect's word that it did nothing: nothing left to land.
        if ran
            .as_ref()
            .map_or_else(|err| err.is::<NotApplied>(), |_| true)
        {
            self.lands_by.set(before);
        }
        let settled = self.settle(&name, ran, lands_by);
        self.saved(&name, settled).await
    }

    /// `settled`, what step `name` came to, once written when the ledger saves each result
    /// (an owned claim's: [`Self::save_result`]), while the step is still in flight.
    async fn saved<T>(&self, name: &str, settled: Result<T, StepError>) -> Result<T, StepError> {
        if self.saves_each_result {
            self.save_result(name).await?;
        }
        settled
    }

    /// Starts step `name`: where it stands, refusing overlap, a step after the handler
    /// returned or past the lease, a reused name and another order. The step runs while the
    /// returned [`Flight`] lives.
    fn begin<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<(Standing<T>, Flight<'_>), StepError> {
        let invalid = |reason| StepError::Invalid {
            step: name.to_owned(),
            reason,
        };
        if name.trim().is_empty() || name.len() > MAX_STEP_NAME_BYTES {
            return Err(invalid("a step name is 1 to 255 bytes and not blank"));
        }
        let mut state = self.lock();
        if let Some(halt) = &state.halt {
            return Err(StepError::Stopped {
                step: name.to_owned(),
                kind: halt.error().kind(),
            });
        }
        if state.closed {
            return Err(invalid(HANDLER_RETURNED));
        }
        if state.in_flight {
            return Err(invalid(
                "another step is still running: run steps one after the other",
            ));
        }
        // Past its lease the claim may be taken over: no effect starts then.
        if self.past_lease() {
            let lost = Halt::Lost(Error::LeaseLost {
                key: self.key.clone(),
                attempt: self.attempt,
            });
            return Err(self.halt(&mut state, name, lost));
        }
        let cursor = state.cursor;
        let mismatch = |expected: Option<String>| {
            Halt::Hold(Error::StepMismatch {
                key: self.key.clone(),
                step: name.to_owned(),
                expected,
            })
        };
        let standing = match decide::step_standing(&state.steps, cursor, name) {
            // Another step after this attempt's own was cut off: not another order.
            StepStanding::Mismatch(Some(_)) if self.cut_off_here(&state) => {
                drop(state);
                return Err(self.give_back_cut_off(name));
            }
            StepStanding::Mismatch(expected) => {
                let expected = expected.map(str::to_owned);
                return Err(self.halt(&mut state, name, mismatch(expected)));
            }
            StepStanding::New if state.steps.len() >= MAX_STEPS => {
                return Err(invalid("an operation records at most 100 steps"));
            }
            StepStanding::New => Standing::New,
            StepStanding::Done(bytes) => match serde_json::from_slice(bytes) {
                Ok(value) => {
                    state.cursor += 1;
                    Standing::Done(value)
                }
                Err(err) => {
                    let unreadable = Error::StoredOutcomeUnreadable {
                        key: self.key.clone(),
                        reason: format!("the recorded result of a step: {}", decode_failure(&err)),
                    };
                    return Err(self.halt(&mut state, name, Halt::Hold(unreadable)));
                }
            },
            StepStanding::Uncertain => Standing::Uncertain,
        };
        state.in_flight = true;
        drop(state);
        Ok((standing, Flight(self)))
    }

    /// Whether the lease is past: a takeover may then hold the claim, and no effect starts.
    fn past_lease(&self) -> bool {
        self.idem.now() >= self.lease_expires_at
    }

    /// Refuses to start an effect declared to land within `timeout` that could land after the
    /// lease's end (now, the timeout and the clock skew past it): a takeover may check the step
    /// before the effect lands, find nothing and run it again. Checked before the step's intent
    /// is written, and again after (the write may have used the time up), when the intent this
    /// attempt `recorded` is withdrawn: nothing started.
    ///
    /// The attempt stops, given back for a delivery with more time: released when no step is
    /// recorded (the caller answered [`Error::LeaseLost`], which says to raise the lease), else
    /// kept given back until the steps' effects can have landed
    /// ([`Error::AlreadyInProgress`] until then). An owned claim's lease is its owner's to size
    /// ([`Invocation::with_lease`]): its steps are not refused, as a durable execution's
    /// replay would meet the same refusal for ever.
    fn outlasts_lease(
        &self,
        name: &str,
        timeout: Option<Duration>,
        recorded: bool,
    ) -> Option<StepError> {
        if self.saves_each_result {
            return None;
        }
        let needed = timeout?.saturating_add(self.clock_skew);
        let now = self.idem.now();
        if now
            .checked_add(needed)
            .is_some_and(|lands| lands <= self.lease_expires_at)
        {
            return None;
        }
        warn!(
            attempt = self.attempt,
            lands_within_ms = u64::try_from(needed.as_millis()).unwrap_or(u64::MAX),
            left_ms = u64::try_from(
                self.lease_expires_at
                    .duration_since(now)
                    .unwrap_or_default()
                    .as_millis()
            )
            .unwrap_or(u64::MAX),
            "a step's effect could land after the lease's end: not started, the claim is given back for a delivery with more time; raise the function's timeout (the lease) above the step's effect timeout, or it never starts"
        );
        let mut state = self.lock();
        if recorded && state.cursor + 1 == state.steps.len() {
            state.steps.pop();
            state.dirty = true;
        }
        let stop = match state.frozen || !state.steps.is_empty() {
            true => Error::AlreadyInProgress {
                key: self.key.clone(),
                attempt: self.attempt,
                retry_after: self
                    .lands_by
                    .get()
                    .and_then(|lands_by| lands_by.duration_since(now).ok())
                    .unwrap_or_default(),
            },
            false => Error::LeaseLost {
                key: self.key.clone(),
                attempt: self.attempt,
            },
        };
        Some(self.halt(&mut state, name, Halt::GiveBack(stop)))
    }

    /// Whether the step at the cursor is one whose effect this attempt started and whose
    /// future was dropped mid-effect (a timeout around it): not another order, nor an
    /// earlier attempt's uncertain step. Known from this attempt's memory, not from the
    /// intent's attempt number (a takeover runs an earlier attempt's intent without writing
    /// its own).
    fn cut_off_here(&self, state: &State) -> bool {
        state.started == Some(state.cursor)
    }

    /// Whether an effect this attempt started may still land (its declared timeout, or the
    /// lease, not yet past): a check asked now could not see it.
    fn may_still_land(&self) -> bool {
        let now = self.idem.now();
        self.lands_by.get().is_some_and(|lands_by| lands_by > now)
    }

    /// Stops the attempt at step `name`, after a step of its own was cut off mid-effect: the
    /// claim is given back until that effect can have landed, and the caller answered that
    /// the operation is in progress until then.
    fn give_back_cut_off(&self, name: &str) -> StepError {
        let now = self.idem.now();
        let retry_after = self
            .lands_by
            .get()
            .and_then(|lands_by| lands_by.duration_since(now).ok())
            .unwrap_or_default();
        let in_progress = Halt::GiveBack(Error::AlreadyInProgress {
            key: self.key.clone(),
            attempt: self.attempt,
            retry_after,
        });
        self.halt(&mut self.lock(), name, in_progress)
    }

    /// Runs transactional step `name` (see [`Step::transact`](super::Step::transact)).
    pub(crate) async fn transact<T, E, F, Fut>(
        &self,
        name: String,
        build: F,
    ) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<Transaction<T>, E>>,
    {
        let (standing, _flight) = self.begin::<T>(&name)?;
        match standing {
            Standing::Done(value) => return Ok(value),
            Standing::New => {}
            // A transactional step records no intent alone: this intent is of a plain step of
            // the same name (a deploy changed the step), whose effect is uncertain.
            Standing::Uncertain => {
                let held = Halt::Hold(Error::Indeterminate {
                    key: self.key.clone(),
                });
                return Err(self.halt(&mut self.lock(), &name, held));
            }
        }
        let built = build(self.key.downstream(&name)).await;
        let transaction = built.map_err(|source| StepError::Effect {
            step: name.clone(),
            source: source.into(),
        })?;
        let rejected = |message: String| StepError::Rejected {
            step: name.clone(),
            message,
        };
        let limit = MAX_STEP_RESULTS_BYTES.min(self.idem.config().max_outcome_bytes());
        let bytes = replayable("the step's result", &transaction.value, limit)
            .map_err(rejected)?
            .get()
            .as_bytes()
            .to_vec();
        let (steps, token) = {
            let mut state = self.lock();
            // Built in a task the handler spawned, after it returned: its claim is given back
            // (or settled), and a takeover may run this step. Nothing commits now.
            if state.closed {
                return Err(StepError::Invalid {
                    step: name,
                    reason: HANDLER_RETURNED,
                });
            }
            if recorded_bytes(&state.steps) + step_bytes(&name, &bytes) > limit {
                return Err(rejected(format!(
                    "the step results would take more than {limit} bytes: keep a reference instead"
                )));
            }
            let mut steps = state.steps.clone();
            steps.push(StepRecord {
                name: name.clone(),
                attempt: self.attempt,
                result: Some(bytes),
            });
            state.commits += 1;
            (steps, commit_token(&self.run, state.commits))
        };
        let writes = self
            .with_events(&name, &transaction)
            .map_err(|err| rejected(err.to_string()))?;
        let mut committing = Committing {
            ledger: self,
            step: &name,
            writes: !writes.is_empty(),
            armed: true,
        };
        let unknown = AtomicBool::new(false);
        let committed = match writes.is_empty() {
            // Nothing of the handler's: the step's record alone, on any store.
            true => self.write(&steps).await.map(|()| Committed::Applied),
            false => self.commit(&steps, &writes, &token, &unknown).await,
        };
        committing.answered();
        drop(committing);
        let mut state = self.lock();
        match committed {
            Ok(Committed::Applied) => {
                state.steps = steps;
                state.dirty = false;
                state.unsaved_result = false;
                state.cursor += 1;
                Ok(transaction.value)
            }
            Ok(Committed::Refused { write }) => Err(StepError::Refused { step: name, write }),
            Ok(Committed::Invalid { message }) => Err(rejected(message)),
            Ok(Committed::LeaseLost { .. }) => {
                let lost = Halt::Lost(Error::LeaseLost {
                    key: self.key.clone(),
                    attempt: self.attempt,
                });
                Err(self.halt(&mut state, &name, lost))
            }
            Err(Halt::GiveBack(Error::Store(StoreError::Rejected { message, .. }))) => {
                Err(rejected(message))
            }
            Err(halt) => {
                // A commit one of whose tries may have applied (its answer lost, or never
                // come, or throttled after the SDK's own retry) is known to the store alone, so
                // its steps are kept as they are. Tries each refused whole (a transaction
                // conflict, no permission, no table) and a step without writes (its record
                // written alone) leave nothing unknown: the next delivery runs the step again.
                if !writes.is_empty() && unknown.load(Ordering::SeqCst) {
                    state.frozen = true;
                }
                Err(self.halt(&mut state, &name, halt))
            }
        }
    }

    /// The handler's writes, then its outbox events' items (each under its event id).
    fn with_events<T>(
        &self,
        step: &str,
        transaction: &Transaction<T>,
    ) -> Result<Vec<TransactWriteItem>, Error> {
        let mut writes = transaction.writes.clone();
        writes.extend(self.event_puts(step, &transaction.events, &mut Vec::new())?);
        Ok(writes)
    }

    /// The items of `events` published at `step` (each under its event id), refusing a name
    /// among `published` (which gains theirs).
    fn event_puts(
        &self,
        step: &str,
        events: &[(Outbox, OutboxEvent)],
        published: &mut Vec<String>,
    ) -> Result<Vec<TransactWriteItem>, Error> {
        let now = self.idem.now();
        let mut puts = Vec::with_capacity(events.len());
        for (outbox, event) in events {
            if published.iter().any(|name| name == event.name()) {
                return Err(Error::InvalidEvent {
                    reason: format!(
                        "two events named `{}` are published together: an event's name names its id",
                        event.name()
                    ),
                });
            }
            let id = event_id(&self.key, self.created_at, step, event.name());
            let put = outbox.put(&self.key, &id, event, now)?;
            puts.push(TransactWriteItem::builder().put(put).build());
            published.push(event.name().to_owned());
        }
        Ok(puts)
    }

    /// Adds `transaction`'s writes and events to those committed with the completion (see
    /// [`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with)).
    pub(crate) fn complete_with(&self, transaction: Transaction<()>) -> Result<(), StepError> {
        let mut state = self.lock();
        if let Some(halt) = &state.halt {
            return Err(StepError::Stopped {
                step: COMPLETION.to_owned(),
                kind: halt.error().kind(),
            });
        }
        if state.closed {
            return Err(StepError::Invalid {
                step: COMPLETION.to_owned(),
                reason: "the handler has returned: writes join the completion from inside the handler's own future",
            });
        }
        let mut published = state.completion_events.clone();
        let puts = self
            .event_puts(COMPLETION_EVENTS, &transaction.events, &mut published)
            .map_err(|err| StepError::Rejected {
                step: COMPLETION.to_owned(),
                message: err.to_string(),
            })?;
        state.completion.extend(transaction.writes);
        state.completion.extend(puts);
        state.completion_events = published;
        Ok(())
    }

    /// The writes to commit with the completion, and the request token of that commit (the
    /// same on every try); `None` when there are none.
    pub(crate) fn take_completion(&self) -> Option<(Vec<TransactWriteItem>, String)> {
        let writes = std::mem::take(&mut self.lock().completion);
        (!writes.is_empty()).then(|| (writes, completion_token(&self.run)))
    }

    /// One commit of `steps` with the handler's `writes`, retried under one token (see
    /// [`StepLedger::patience`]).
    /// `unknown` is set when a try's answer was lost (it may have applied).
    async fn commit(
        &self,
        steps: &[StepRecord],
        writes: &[TransactWriteItem],
        token: &str,
        unknown: &AtomicBool,
    ) -> Result<Committed, Halt> {
        let request = Request::RecordSteps {
            target: self.target(),
            steps,
        };
        let Some(store) = self.idem.store().transactional() else {
            return Ok(writes_refused(request));
        };
        self.idem
            .retrying(self.patience(), || {
                let tried = store.commit(request, writes, token);
                async move {
                    // Unknown until answered: a try dropped unanswered (at the invocation's
                    // cut, by a cancellation) may have applied.
                    let before = unknown.swap(true, Ordering::SeqCst);
                    let answer = tried.await;
                    if Self::refused_whole(&answer) {
                        unknown.store(before, Ordering::SeqCst);
                    }
                    answer
                }
            })
            .await
            .map_err(|err| Halt::GiveBack(err.into()))
    }

    /// Whether a commit's try was answered (applied, or refused by its conditions), or refused
    /// whole before anything applied: DynamoDB cancels a conflicting transaction entirely (a
    /// re-send of one that applied, under its token, is answered as applied or in progress,
    /// never as a conflict), and refuses one it may not make or whose tables are missing.
    /// Throttling is not one: it may answer the SDK's own retry of an attempt that timed out
    /// after it applied.
    fn refused_whole(answer: &Result<Committed, StoreError>) -> bool {
        matches!(
            answer,
            Ok(_)
                | Err(StoreError::Contention { .. }
                    | StoreError::AccessDenied { .. }
                    | StoreError::TableNotFound { .. }
                    | StoreError::UniquenessTableNotFound { .. }
                    | StoreError::Rejected { .. })
        )
    }

    /// Writes what step `name` came to now, not with the next write: an owned claim's handler
    /// may be dropped at any await after a step (a durable execution suspending), and its
    /// owner's replay must find the result, not an uncertain intent.
    async fn save_result(&self, name: &str) -> Result<(), StepError> {
        let Some(steps) = self.pending() else {
            return Ok(());
        };
        match self.write(&steps).await {
            Ok(()) => {
                let mut state = self.lock();
                state.dirty = false;
                state.unsaved_result = false;
                Ok(())
            }
            Err(halt) => Err(self.halt(&mut self.lock(), name, halt)),
        }
    }

    /// Records a new step's intent, with whatever result is pending. The ledger takes the
    /// intent only once it is written: a step whose future is dropped meanwhile left nothing
    /// behind in the ledger (the store may hold the intent: a later attempt checks it).
    async fn record_intent(&self, name: &str) -> Result<(), StepError> {
        let mut steps = self.lock().steps.clone();
        steps.push(StepRecord::intent(name.to_owned(), self.attempt));
        match self.write(&steps).await {
            Ok(()) => {
                let mut state = self.lock();
                state.steps = steps;
                state.dirty = false;
                state.unsaved_result = false;
                Ok(())
            }
            Err(halt) => Err(self.halt(&mut self.lock(), name, halt)),
        }
    }

    /// Asks an uncertain step's check; `Some`: the result found and recorded.
    async fn check<T, C>(
        &self,
        name: &str,
        check: C,
        downstream: String,
    ) -> Result<Option<T>, StepError>
    where
        T: Serialize + DeserializeOwned,
        C: StepCheck<T>,
        C::Future: Send,
    {
        // Boxed: the check's future type is a projection of `C`, which the compiler cannot
        // prove `Send` through once it sits in the handler's future.
        let checking: Option<Pin<Box<dyn Future<Output = _> + Send + '_>>> = check
            .check(downstream)
            .map(|checking| Box::pin(checking) as Pin<Box<dyn Future<Output = _> + Send>>);
        let Some(checking) = checking else {
            warn!(
                attempt = self.attempt,
                "an uncertain step has no check: the operation is held for an operator"
            );
            let held = Halt::Hold(Error::Indeterminate {
                key: self.key.clone(),
            });
            return Err(self.halt(&mut self.lock(), name, held));
        };
        let checked = checking.await;
        match checked {
            Ok(Checked::NotApplied) => Ok(None),
            Ok(Checked::Applied(value)) => self
                .settle::<T>(name, Ok(value), self.lease_expires_at)
                .map(Some),
            Ok(Checked::Unknown) => {
                let held = Halt::Hold(Error::Indeterminate {
                    key: self.key.clone(),
                });
                Err(self.halt(&mut self.lock(), name, held))
            }
            Err(source) => {
                let failed = Halt::GiveBack(Error::ReconcileFailed {
                    key: self.key.clone(),
                    source,
                });
                Err(self.halt(&mut self.lock(), name, failed))
            }
        }
    }

    /// Records what the step at the cursor came to: its result (written with the next write),
    /// or its failure (uncertain, or withdrawn when [`NotApplied`]).
    fn settle<T: Serialize + DeserializeOwned>(
        &self,
        name: &str,
        ran: Result<T, BoxError>,
        lands_by: SystemTime,
    ) -> Result<T, StepError> {
        let mut state = self.lock();
        let cursor = state.cursor;
        let value = match ran {
            Ok(value) => value,
            Err(source) => {
                // Withdrawn only when no later step was recorded after it (an earlier attempt
                // that went on): positions never shift under a recorded step.
                if source.is::<NotApplied>() && cursor + 1 == state.steps.len() {
                    state.steps.pop();
                    state.dirty = true;
                } else {
                    // Uncertain: what the effect sent may still land.
                    state.cursor += 1;
                    self.lands_by.set(self.lands_by.get().max(Some(lands_by)));
                }
                return Err(StepError::Effect {
                    step: name.to_owned(),
                    source,
                });
            }
        };
        let limit = MAX_STEP_RESULTS_BYTES.min(self.idem.config().max_outcome_bytes());
        let bytes = match replayable("a step's result", &value, limit) {
            Ok(raw) => raw.get().as_bytes().to_vec(),
            Err(reason) => {
                let unserializable = Error::InvalidEvent { reason };
                let halt = Halt::Retain(FailureKind::OutcomeUnserializable, unserializable);
                return Err(self.halt(&mut state, name, halt));
            }
        };
        let recorded = recorded_bytes(&state.steps) - step_bytes(name, &[]);
        if recorded + step_bytes(name, &bytes) > limit {
            let too_large = Error::OutcomeTooLarge {
                key: self.key.clone(),
                size: recorded + step_bytes(name, &bytes),
                limit,
            };
            let halt = Halt::Retain(FailureKind::OutcomeTooLarge, too_large);
            return Err(self.halt(&mut state, name, halt));
        }
        state.steps[cursor].result = Some(bytes);
        state.dirty = true;
        state.unsaved_result = true;
        state.cursor += 1;
        Ok(value)
    }
}

/// What the steps take in the record, as the budget counts it.
fn recorded_bytes(steps: &[StepRecord]) -> usize {
    steps
        .iter()
        .map(|step| step_bytes(&step.name, step.result.as_deref().unwrap_or_default()))
        .sum()
}

/// What one step takes in the record: its name, its result and its fields' overhead.
fn step_bytes(name: &str, result: &[u8]) -> usize {
    name.len() + result.len() + STEP_OVERHEAD_BYTES
}

/// The request token of a run's completion with writes (see [`commit_token`]).
fn completion_token(run: &str) -> String {
    let digest = Sha256::digest(format!("{run}#completion").as_bytes());
    hex::encode(&digest[..16])
}

/// The request token of a run's `n`th commit: the same on every try of that commit, another
/// for the next, and another on every run (32 hex characters, within DynamoDB's 36).
fn commit_token(run: &str, n: u32) -> String {
    let digest = Sha256::digest(format!("{run}#commit#{n}").as_bytes());
    hex::encode(&digest[..16])
}
