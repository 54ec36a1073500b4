//! One attempt's steps: what the record holds, what this attempt adds, and the writes.

use std::fmt;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use aws_sdk_dynamodb::types::TransactWriteItem;
use sha2::{Digest, Sha256};

use super::step::{Checked, NotApplied, StepCheck, StepError};
use super::transaction::Transaction;
use super::{MAX_STEP_NAME_BYTES, MAX_STEP_RESULTS_BYTES};
use crate::Idempotency;
use crate::engine::retry::Patience;
use crate::error::{BoxError, Error, StoreError};
use crate::key::OperationKey;
use crate::record::{FailureKind, StepRecord};
use crate::store::{Commit, Committed, Fence, Guard, Store, Target};

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
    attempt: u32,
    /// When the lease runs out: a step write is not retried past it.
    lease_expires_at: SystemTime,
    /// [`Recovery::Rerun`](crate::reconcile::Recovery::Rerun): the whole handler is safe to
    /// repeat, so an uncertain step runs again too.
    rerun_uncertain: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The steps: those an earlier attempt recorded, then this attempt's.
    steps: Vec<StepRecord>,
    /// Whether `steps` differ from what the store holds (a result not yet written).
    dirty: bool,
    /// The position of the next step this attempt runs.
    cursor: usize,
    /// Whether a step's effect or check is running.
    in_flight: bool,
    /// Why the attempt stopped, once it has.
    halt: Option<Halt>,
    /// Whether a commit's outcome is unknown: the record's steps are then as the store has
    /// them (the commit applied or not), and nothing may overwrite them.
    frozen: bool,
    /// How many commits this attempt sent: each gets its own request token.
    commits: u32,
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
    /// The ledger of `attempt` under lease `token`, starting from the steps the record holds.
    pub(crate) fn new(
        idem: Idempotency,
        key: OperationKey,
        token: String,
        attempt: u32,
        lease_expires_at: SystemTime,
        recorded: Vec<StepRecord>,
        rerun_uncertain: bool,
    ) -> Self {
        Self {
            idem,
            key,
            token,
            attempt,
            lease_expires_at,
            rerun_uncertain,
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

    /// Whether the record holds (or is about to hold) a step: the operation is then never
    /// released to run afresh, only given back, so that the steps replay.
    pub(crate) fn has_steps(&self) -> bool {
        !self.lock().steps.is_empty()
    }

    /// Writes the pending steps, if any; `false` when the lease is lost or the store failed.
    pub(crate) async fn flush(&self) -> bool {
        // Frozen: nothing to write (`pending` is `None`); the record stands as the store has it.
        let Some(steps) = self.pending() else {
            return true;
        };
        match self.write(&steps).await {
            Ok(()) => {
                self.lock().dirty = false;
                true
            }
            Err(_) => false,
        }
    }

    /// Gives the claim back for the next delivery to take over now and replay the steps: the
    /// pending steps written first, then the lease cut to now. Best effort: a lease lost or a
    /// store failing leaves the lease to run out (the steps not written are then uncertain).
    pub(crate) async fn give_back(&self) {
        if !self.flush().await {
            return;
        }
        let store = self.idem.store();
        let target = self.target();
        let now = self.idem.now();
        let given_back = self
            .idem
            .retrying(Patience::Brief(self.lease_expires_at), || {
                store.shorten(target, now)
            })
            .await;
        if given_back.is_err() {
            warn!(
                attempt = self.attempt,
                "the claim could not be given back: its lease runs out"
            );
        }
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

    /// One fenced write of `steps`, retried briefly.
    async fn write(&self, steps: &[StepRecord]) -> Result<(), Halt> {
        let store = self.idem.store();
        let target = self.target();
        let written = self
            .idem
            .retrying(Patience::Brief(self.lease_expires_at), || {
                store.record_steps(target, steps)
            })
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
        check: C,
        effect: F,
    ) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        C: StepCheck<T>,
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let standing = self.standing::<T>(&name)?;
        let downstream = self.key.downstream(&name);
        match standing {
            Standing::Done(value) => return Ok(value),
            Standing::New => self.record_intent(&name).await?,
            Standing::Uncertain if repeat_safe || self.rerun_uncertain => {
                debug!(
                    attempt = self.attempt,
                    "an uncertain repeat-safe step runs again"
                );
            }
            Standing::Uncertain => match self.check(&name, check, downstream.clone()).await? {
                Some(value) => return Ok(value),
                None => debug!(
                    attempt = self.attempt,
                    "checked: not applied, the step runs"
                ),
            },
        }
        self.set_in_flight(true);
        let ran = effect(downstream).await;
        self.set_in_flight(false);
        self.settle(&name, ran.map_err(Into::into))
    }

    /// Where step `name` stands, refusing overlap, a reused name and another order.
    fn standing<T: DeserializeOwned>(&self, name: &str) -> Result<Standing<T>, StepError> {
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
        if state.in_flight {
            return Err(invalid(
                "another step is still running: run steps one after the other",
            ));
        }
        let cursor = state.cursor;
        let mismatch = |expected: Option<String>| {
            Halt::Hold(Error::StepMismatch {
                key: self.key.clone(),
                step: name.to_owned(),
                expected,
            })
        };
        if state.steps[..cursor].iter().any(|step| step.name == name) {
            return Err(self.halt(&mut state, name, mismatch(None)));
        }
        let Some(recorded) = state.steps.get(cursor) else {
            return Ok(Standing::New);
        };
        if recorded.name != name {
            let expected = Some(recorded.name.clone());
            return Err(self.halt(&mut state, name, mismatch(expected)));
        }
        let Some(bytes) = &recorded.result else {
            return Ok(Standing::Uncertain);
        };
        match serde_json::from_slice(bytes) {
            Ok(value) => {
                state.cursor += 1;
                Ok(Standing::Done(value))
            }
            Err(err) => {
                let unreadable = Error::StoredOutcomeUnreadable {
                    key: self.key.clone(),
                    reason: format!("the recorded result of a step: {err}"),
                };
                Err(self.halt(&mut state, name, Halt::Hold(unreadable)))
            }
        }
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
        match self.standing::<T>(&name)? {
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
        self.set_in_flight(true);
        let built = build(self.key.downstream(&name)).await;
        self.set_in_flight(false);
        let transaction = built.map_err(|source| StepError::Effect {
            step: name.clone(),
            source: source.into(),
        })?;
        let rejected = |message: String| StepError::Rejected {
            step: name.clone(),
            message,
        };
        let bytes = serde_json::to_vec(&transaction.value).map_err(|err| {
            rejected(format!(
                "the step's result does not serialize to JSON: {err}"
            ))
        })?;
        let (steps, token) = {
            let mut state = self.lock();
            let limit = MAX_STEP_RESULTS_BYTES.min(self.idem.config().max_outcome_bytes());
            if recorded_bytes(&state.steps) + bytes.len() > limit {
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
            (steps, commit_token(&self.token, state.commits))
        };
        let committed = match transaction.writes.is_empty() {
            // Nothing of the handler's: the step's record alone, on any store.
            true => self.write(&steps).await.map(|()| Committed::Applied),
            false => self.commit(&steps, &transaction.writes, &token).await,
        };
        let mut state = self.lock();
        match committed {
            Ok(Committed::Applied) => {
                state.steps = steps;
                state.dirty = false;
                state.cursor += 1;
                Ok(transaction.value)
            }
            Ok(Committed::Refused { write }) => Err(StepError::Refused { step: name, write }),
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
                // Committed or not, the store alone knows: keep its steps as they are.
                state.frozen = true;
                Err(self.halt(&mut state, &name, halt))
            }
        }
    }

    /// One commit of `steps` with the handler's `writes`, retried briefly under one token.
    async fn commit(
        &self,
        steps: &[StepRecord],
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, Halt> {
        let store = self.idem.store();
        let target = self.target();
        let commit = Commit {
            steps,
            writes,
            token,
        };
        self.idem
            .retrying(Patience::Brief(self.lease_expires_at), || {
                store.commit_steps(target, commit)
            })
            .await
            .map_err(|err| Halt::GiveBack(err.into()))
    }

    /// Records a new step's intent, with whatever result is pending.
    async fn record_intent(&self, name: &str) -> Result<(), StepError> {
        let steps = {
            let mut state = self.lock();
            state
                .steps
                .push(StepRecord::intent(name.to_owned(), self.attempt));
            state.dirty = true;
            state.steps.clone()
        };
        match self.write(&steps).await {
            Ok(()) => {
                self.lock().dirty = false;
                Ok(())
            }
            Err(halt) => {
                // The effect will not run: the intent is withdrawn from what is written next
                // (it may have committed with its answer lost; the give-back overwrites it).
                let mut state = self.lock();
                state.steps.pop();
                Err(self.halt(&mut state, name, halt))
            }
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
        T: Serialize,
        C: StepCheck<T>,
    {
        let Some(checking) = check.check(downstream) else {
            warn!(
                attempt = self.attempt,
                "an uncertain step has no check: the operation is held for an operator"
            );
            let held = Halt::Hold(Error::Indeterminate {
                key: self.key.clone(),
            });
            return Err(self.halt(&mut self.lock(), name, held));
        };
        self.set_in_flight(true);
        let checked = checking.await;
        self.set_in_flight(false);
        match checked {
            Ok(Checked::NotApplied) => Ok(None),
            Ok(Checked::Applied(value)) => self.settle::<T>(name, Ok(value)).map(Some),
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

    fn set_in_flight(&self, in_flight: bool) {
        self.lock().in_flight = in_flight;
    }

    /// Records what the step at the cursor came to: its result (written with the next write),
    /// or its failure (uncertain, or withdrawn when [`NotApplied`]).
    fn settle<T: Serialize>(&self, name: &str, ran: Result<T, BoxError>) -> Result<T, StepError> {
        let mut state = self.lock();
        let cursor = state.cursor;
        let value = match ran {
            Ok(value) => value,
            Err(source) => {
                if source.is::<NotApplied>() {
                    state.steps.remove(cursor);
                    state.dirty = true;
                } else {
                    state.cursor += 1;
                }
                return Err(StepError::Effect {
                    step: name.to_owned(),
                    source,
                });
            }
        };
        let bytes = match serde_json::to_vec(&value) {
            Ok(bytes) => bytes,
            Err(err) => {
                let unserializable = Error::InvalidEvent {
                    reason: format!("a step's result does not serialize to JSON: {err}"),
                };
                let halt = Halt::Retain(FailureKind::OutcomeUnserializable, unserializable);
                return Err(self.halt(&mut state, name, halt));
            }
        };
        let limit = MAX_STEP_RESULTS_BYTES.min(self.idem.config().max_outcome_bytes());
        let recorded = recorded_bytes(&state.steps);
        if recorded + bytes.len() > limit {
            let too_large = Error::OutcomeTooLarge {
                key: self.key.clone(),
                size: recorded + bytes.len(),
                limit,
            };
            let halt = Halt::Retain(FailureKind::OutcomeTooLarge, too_large);
            return Err(self.halt(&mut state, name, halt));
        }
        state.steps[cursor].result = Some(bytes);
        state.dirty = true;
        state.cursor += 1;
        Ok(value)
    }
}

/// The bytes the recorded step results take.
fn recorded_bytes(steps: &[StepRecord]) -> usize {
    steps
        .iter()
        .filter_map(|step| step.result.as_ref().map(Vec::len))
        .sum()
}

/// The request token of an attempt's `n`th commit: the same on every try of that commit,
/// another for the next (32 hex characters, within DynamoDB's 36).
fn commit_token(lease_token: &str, n: u32) -> String {
    let digest = Sha256::digest(format!("{lease_token}#commit#{n}").as_bytes());
    hex::encode(&digest[..16])
}
