//! Settling a held claim: the outcome stored, a failure released or retained, a claim given
//! back; each a fenced write retried with patience.

use std::time::{Instant, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::{debug, warn};

use super::decide::{AfterFailure, Failure};
use super::replayable::replayable;
use super::retry::Patience;
use super::{GIVE_BACK_GRACE, INDETERMINATE_RETENTION, Idempotency, answer, decide};
use aws_sdk_dynamodb::types::TransactWriteItem;

use super::attempt::StepLedger;
use crate::defects;
use crate::effects::{COMPLETION, StepError};
use crate::error::{BoxError, Error, StoreError};
use crate::execution::{Execution, Invocation, Origin};
use crate::failure::{AfterEffect, Classifier, FailureClass, Release, Terminal};
use crate::observe::{self};
use crate::record::MAX_FAILURE_MESSAGE_BYTES;
use crate::record::{FailureKind, Record, RetainedFailure, Settlement, StepRecord};
use crate::store::{Committed, Fence, Guard, Request, Store, StoreExt, Target, writes_refused};

impl Idempotency {
    /// Records `value` (the handler's, or the reconciler's for it) as the operation's outcome.
    pub(super) async fn record<T: Serialize + DeserializeOwned>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        value: T,
        origin: Origin,
        completion: Completion<'_>,
    ) -> Result<Execution<T>, Error> {
        let attempt = match origin {
            Origin::Executed { attempt } | Origin::Reconciled { attempt } => attempt,
            Origin::Replayed => claim.lease.attempt,
        };
        let limit = self.config.max_outcome_bytes();
        let serialized = replayable("the handler's result", &value, limit);
        let raw = self
            .complete(target, invocation, claim, attempt, serialized, completion)
            .await?;
        Ok(Execution {
            value,
            raw,
            origin,
            reentered: false,
        })
    }

    /// Stores a result as COMPLETED (with the steps, when they changed, and the handler's
    /// writes); one that cannot be stored is retained as FAILED instead (the effect happened:
    /// it must not run again) and returned as the error. Writes that did not commit fail the
    /// operation: a failed condition as the handler's error would, writes that cannot be sent
    /// as a retained failure.
    pub(super) async fn complete(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        serialized: Result<Box<RawValue>, String>,
        completion: Completion<'_>,
    ) -> Result<Box<RawValue>, Error> {
        let refusal = completion
            .steps
            .is_some_and(StepLedger::refused_without_effect);
        let steps = completion.steps.and_then(StepLedger::pending);
        let writes = completion.steps.and_then(StepLedger::take_completion);
        let key = target.key;
        let now = self.clock.now();
        let patience = settle_patience(invocation, claim, now);
        let unstorable = match serialized {
            Ok(raw) => {
                let limit = self.config.max_outcome_bytes();
                if raw.get().len() <= limit {
                    let settlement = Settlement::completed(
                        raw.get().as_bytes().to_vec(),
                        answer::result_ref(invocation, &raw),
                        now,
                        self.config.retention(),
                    )
                    .with_steps(steps.clone())
                    .releasing_identity(refusal);
                    let completing = Instant::now();
                    let settled = self
                        .settle_completion(target, attempt, &settlement, writes.as_ref(), patience)
                        .await;
                    self.observe_latency(key, observe::Phase::Completion, completing);
                    let refused = match settled {
                        Err(Error::Store(StoreError::Rejected { message, .. })) => {
                            warn!(attempt, "the store rejected the outcome after the effect");
                            let failure = RetainedFailure {
                                kind: FailureKind::OutcomeUnstorable,
                                message,
                            }
                            .bounded();
                            let retained = failure.clone();
                            self.retain_as(target, attempt, retained, patience, steps, refusal)
                                .await?;
                            // Within the limit: told what every later caller is (applied,
                            // its result not kept), never that it was too large.
                            return Err(Error::Failed {
                                key: key.clone(),
                                failure,
                            });
                        }
                        settled => settled?,
                    };
                    if let Some(refusal) = refused {
                        let failed =
                            self.refused_completion(attempt, patience, &completion, &steps);
                        return Err(self.refused(target, refusal, failed).await);
                    }
                    debug!(attempt, "completed");
                    return Ok(raw);
                }
                Error::OutcomeTooLarge {
                    key: key.clone(),
                    size: raw.get().len(),
                    limit,
                }
            }
            Err(reason) => Error::InvalidEvent { reason },
        };
        let kind = match unstorable {
            Error::OutcomeTooLarge { .. } => FailureKind::OutcomeTooLarge,
            _ => FailureKind::OutcomeUnserializable,
        };
        let message = match &unstorable {
            Error::InvalidEvent { reason } => reason.clone(),
            other => other.to_string(),
        };
        let failure = RetainedFailure {
            kind,
            message: message.clone(),
        };
        // The writes waiting for the completion are the operation's effect: they commit
        // with the retained failure, which then tells every caller the truth (applied, its
        // result not kept), or nothing commits and the writes' refusal answers.
        let settlement = self.failed_settlement(failure, steps.clone(), refusal);
        let completing = Instant::now();
        let committed = self
            .settle_completion(target, attempt, &settlement, writes.as_ref(), patience)
            .await;
        self.observe_latency(key, observe::Phase::Completion, completing);
        let committed = committed?;
        if let Some(refused) = committed {
            let failed = self.refused_completion(attempt, patience, &completion, &steps);
            return Err(self.refused(target, refused, failed).await);
        }
        match unstorable {
            // The effect happened and its result cannot be kept: the caller is told what every
            // later caller is (the retained failure), never that its event was invalid.
            Error::InvalidEvent { .. } => Err(Error::Failed {
                key: key.clone(),
                failure: RetainedFailure {
                    kind: FailureKind::OutcomeUnserializable,
                    message: crate::record::cut_to(message, MAX_FAILURE_MESSAGE_BYTES),
                },
            }),
            unstorable => Err(unstorable),
        }
    }

    /// Handles a handler error by its class: release (retryable) or retain (terminal); the
    /// error for the caller. An operation that recorded steps is never released (its steps
    /// would be lost with its record): its claim is given back, for the next delivery to take
    /// over and replay them.
    pub(super) async fn fail(
        &self,
        target: Target<'_>,
        attempt: u32,
        source: BoxError,
        patience: Patience,
        steps: Option<&StepLedger>,
    ) -> Result<Error, Error> {
        // Timed as the completion is: the writes that keep, release or hold the failure.
        let settling = Instant::now();
        let answer = self
            .failed(Failure::Handler, target, attempt, source, patience, steps)
            .await;
        self.observe_latency(target.key, observe::Phase::Completion, settling);
        answer
    }

    /// Acts on a `failure` by the decision table ([`decide::after_failure`]); the error for
    /// the caller.
    async fn failed(
        &self,
        failure: Failure,
        target: Target<'_>,
        attempt: u32,
        source: BoxError,
        patience: Patience,
        steps: Option<&StepLedger>,
    ) -> Result<Error, Error> {
        let class = self.failure_class(&*source);
        let recorded = steps.is_some_and(StepLedger::has_recorded);
        match decide::after_failure(failure, &class, self.recovery, recorded) {
            AfterFailure::GiveBack => {
                if let Some(steps) = steps {
                    steps.give_back().await?;
                }
            }
            AfterFailure::Release => self.release_claim(target, attempt, patience).await?,
            AfterFailure::Retain(kind) => {
                warn!(attempt, kind = kind.as_str(), "terminal failure retained");
                let kind = FailureKind::from(kind);
                let steps = steps.and_then(StepLedger::pending);
                self.retain(target, attempt, kind, source.to_string(), patience, steps)
                    .await?;
            }
            AfterFailure::Hold => {
                warn!(
                    attempt,
                    "the completion was refused after a handler whose effects are not declared repeatable: held for an operator"
                );
                let pending = steps.and_then(StepLedger::pending);
                let settlement =
                    Settlement::indeterminate(self.clock.now(), INDETERMINATE_RETENTION)
                        .with_steps(pending);
                self.settle(target, attempt, &settlement, patience).await?;
                return Ok(Error::Indeterminate {
                    key: target.key.clone(),
                });
            }
        }
        Ok(Error::Handler { source })
    }

    /// The class of a handler's error: retryable when it asks for a release ([`Release`]),
    /// else the classifier's.
    pub(crate) fn failure_class(&self, error: &(dyn std::error::Error + 'static)) -> FailureClass {
        class_by(&*self.classifier, error)
    }

    /// Whether a handler's error is retained as a terminal failure by `classifier` (an
    /// operation's own), else the engine's (the HTTP door's status, the batch doors' poison).
    pub(crate) fn is_terminal(
        &self,
        error: &(dyn std::error::Error + 'static),
        classifier: Option<&dyn Classifier>,
    ) -> bool {
        let classifier = classifier.unwrap_or(&*self.classifier);
        matches!(class_by(classifier, error), FailureClass::Terminal { .. })
    }

    /// Releases a held claim (and its evidence) so that the next delivery runs afresh;
    /// [`Error::LeaseLost`] when another worker took the lease over first.
    pub(super) async fn release_claim(
        &self,
        target: Target<'_>,
        attempt: u32,
        patience: Patience,
    ) -> Result<(), Error> {
        let fence = self
            .retrying(patience, || self.store.release(target))
            .await?;
        let own_token = match target.guard {
            Guard::Lease(token) => Some(token),
            _ => None,
        };
        match fence {
            // A later attempt holds (or settled) the record: a takeover of this claim; or the
            // claim stands with this attempt's token, changed (an operator resolved it). A
            // fresh claim after this release committed (its answer lost) is attempt 1, with a
            // token of its own.
            Fence::Lost {
                current: Some(current),
            } if current.lease.attempt > attempt
                || own_token.is_some_and(|token| current.lease.token == token) =>
            {
                warn!(
                    attempt,
                    holder = current.lease.attempt,
                    "handler failed after its lease was taken over"
                );
                Err(Error::LeaseLost {
                    key: target.key.clone(),
                    attempt,
                })
            }
            // Gone, or claimed afresh: this release committed before its answer was lost.
            _ => Ok(()),
        }
    }

    /// Records a terminal failure, replayed to every later caller.
    pub(super) async fn retain(
        &self,
        target: Target<'_>,
        attempt: u32,
        kind: FailureKind,
        message: String,
        patience: Patience,
        steps: Option<Vec<StepRecord>>,
    ) -> Result<(), Error> {
        self.retain_as(
            target,
            attempt,
            RetainedFailure { kind, message },
            patience,
            steps,
            false,
        )
        .await
    }

    /// [`Self::retain`] of `failure`, deleting the identity's evidence instead of settling it
    /// when `releases_identity` (a refusal that took no effect, whose result cannot be kept).
    async fn retain_as(
        &self,
        target: Target<'_>,
        attempt: u32,
        failure: RetainedFailure,
        patience: Patience,
        steps: Option<Vec<StepRecord>>,
        releases_identity: bool,
    ) -> Result<(), Error> {
        let settlement = self.failed_settlement(failure, steps, releases_identity);
        self.settle(target, attempt, &settlement, patience).await
    }

    /// The FAILED settlement retaining `failure` with `steps`, deleting the identity's
    /// evidence instead of settling it when `releases_identity`.
    fn failed_settlement(
        &self,
        failure: RetainedFailure,
        steps: Option<Vec<StepRecord>>,
        releases_identity: bool,
    ) -> Settlement {
        // A handler's error text (and its classifier's kind) can be any length: only its
        // start is kept.
        Settlement::failed(
            &failure.bounded(),
            self.clock.now(),
            self.config.retention(),
        )
        .with_steps(steps)
        .releasing_identity(releases_identity)
    }

    /// [`Self::settle`], or [`Self::settle_committing`] in one transaction with the
    /// completion's `writes` when it queued any.
    async fn settle_completion(
        &self,
        target: Target<'_>,
        attempt: u32,
        settlement: &Settlement,
        writes: Option<&(Vec<TransactWriteItem>, String)>,
        patience: Patience,
    ) -> Result<Option<StepError>, Error> {
        match writes {
            None => self
                .settle(target, attempt, settlement, patience)
                .await
                .map(|()| None),
            Some((writes, token)) => {
                self.settle_committing(target, attempt, settlement, writes, token, patience)
                    .await
            }
        }
    }

    /// What [`Self::refused`] needs of a completion whose writes did not commit.
    fn refused_completion<'a>(
        &self,
        attempt: u32,
        patience: Patience,
        completion: &Completion<'a>,
        pending: &Option<Vec<StepRecord>>,
    ) -> RefusedCompletion<'a> {
        RefusedCompletion {
            attempt,
            patience,
            steps: completion.steps,
            pending: pending.clone(),
        }
    }

    /// A fenced settlement, retried while transient; a lost fence is [`Error::LeaseLost`],
    /// unless the record shows this very settlement (it committed before its answer was lost).
    pub(super) async fn settle(
        &self,
        target: Target<'_>,
        attempt: u32,
        settlement: &Settlement,
        patience: Patience,
    ) -> Result<(), Error> {
        let fence = self
            .retrying(patience, || self.store.settle(target, settlement))
            .await?;
        match fence {
            Fence::Held => Ok(()),
            Fence::Lost { current } => self.lost_settling(target, attempt, settlement, current),
        }
    }

    /// A fenced settlement with the handler's `writes`, in one transaction retried under
    /// `token` while transient: as [`Self::settle`]; `Some` when the writes did not commit
    /// and nothing was written: [`StepError::Refused`] (a write's condition failed) or
    /// [`StepError::Rejected`] (they cannot be sent).
    async fn settle_committing(
        &self,
        target: Target<'_>,
        attempt: u32,
        settlement: &Settlement,
        writes: &[TransactWriteItem],
        token: &str,
        patience: Patience,
    ) -> Result<Option<StepError>, Error> {
        let request = Request::Settle { target, settlement };
        let committed = match self.store.transactional() {
            Some(store) => {
                self.retrying(patience, || store.commit(request, writes, token))
                    .await
            }
            None => Ok(writes_refused(request)),
        };
        let committed = match committed {
            // DynamoDB refused the transaction as invalid (an item over 400 KB, a table that
            // refuses transactions, two actions on one item it alone can tell): nothing in it
            // committed, the record included. Said so, never as an outcome that could not be
            // kept after its effect.
            Err(StoreError::Rejected { message, .. })
                if !defects::is_reintroduced(defects::REFUSED_TRANSACTION_APPLIED) =>
            {
                Committed::Invalid { message }
            }
            committed => committed?,
        };
        match committed {
            Committed::Applied => Ok(None),
            Committed::Refused { write } => {
                debug!(attempt, write, "a write of the completion was refused");
                Ok(Some(StepError::Refused {
                    step: COMPLETION.to_owned(),
                    write,
                }))
            }
            Committed::Invalid { message } => Ok(Some(StepError::Rejected {
                step: COMPLETION.to_owned(),
                message,
            })),
            Committed::LeaseLost { current } => self
                .lost_settling(target, attempt, settlement, current)
                .map(|()| None),
        }
    }

    /// Fails an operation whose completion's writes did not commit (nothing was written): a
    /// failed condition by its class, as the handler's own error; writes that cannot be sent
    /// are retained (`completion_rejected`): the same handler would send them again. The
    /// caller's error.
    async fn refused(
        &self,
        target: Target<'_>,
        refusal: StepError,
        failed: RefusedCompletion<'_>,
    ) -> Error {
        let RefusedCompletion {
            attempt,
            patience,
            steps,
            pending,
        } = failed;
        if let StepError::Refused { .. } = refusal {
            let failure = Failure::CompletionRefused;
            return match self
                .failed(failure, target, attempt, Box::new(refusal), patience, steps)
                .await
            {
                Ok(err) | Err(err) => err,
            };
        }
        warn!(
            attempt,
            "the completion's writes cannot be sent: the operation is retained as failed"
        );
        let kind = FailureKind::CompletionRejected;
        let retained = self
            .retain(
                target,
                attempt,
                kind,
                refusal.to_string(),
                patience,
                pending,
            )
            .await;
        match retained {
            Ok(()) => Error::Handler {
                source: Box::new(Terminal::new(
                    FailureKind::CompletionRejected.as_str(),
                    refusal,
                )),
            },
            Err(err) => err,
        }
    }

    /// A settlement's failed fence: the caller's own settlement when `current` shows it (it
    /// committed before its answer was lost), else [`Error::LeaseLost`].
    fn lost_settling(
        &self,
        target: Target<'_>,
        attempt: u32,
        settlement: &Settlement,
        current: Option<Box<Record>>,
    ) -> Result<(), Error> {
        match current {
            Some(current) if decide::shows_settlement(&current, target.guard, settlement) => {
                debug!(
                    attempt,
                    "the settlement committed before its answer was lost"
                );
                Ok(())
            }
            current => {
                warn!(
                    attempt,
                    holder = current.map(|r| r.lease.attempt),
                    "lease lost before settling"
                );
                Err(Error::LeaseLost {
                    key: target.key.clone(),
                    attempt,
                })
            }
        }
    }

    /// Gives a held claim back: its lease (ending at `lease_end`) runs out after a short grace
    /// (for what the handler left in flight), or when a step's effect can have landed
    /// (`lands_by`), never later than it would have; retried briefly, never past the
    /// invocation's `deadline`.
    pub(super) async fn shorten(
        &self,
        target: Target<'_>,
        lease_end: SystemTime,
        deadline: Option<SystemTime>,
        lands_by: Option<SystemTime>,
    ) -> Result<Fence, Error> {
        let until = given_back_until(self.clock.now(), lease_end, lands_by);
        Ok(self
            .retrying(Patience::brief(lease_end, deadline), || {
                self.store.shorten(target, until)
            })
            .await?)
    }
}

impl Idempotency {
    /// Gives a held claim back at once (its lease cut to now), retried briefly, never past the
    /// invocation's `deadline`: the next delivery takes over without waiting. A failed
    /// give-back leaves the lease to run out.
    pub(super) async fn give_back_now(
        &self,
        target: Target<'_>,
        claim: &Record,
        deadline: Option<SystemTime>,
    ) {
        let now = self.clock.now();
        let given_back = self
            .retrying(Patience::brief(claim.lease.expires_at, deadline), || {
                self.store.shorten(target, now)
            })
            .await;
        if given_back.is_err() {
            warn!(
                attempt = claim.lease.attempt,
                "the claim could not be given back: its lease runs out"
            );
        }
    }
}

/// What a completion writes besides the outcome: the attempt's steps (when they changed since
/// the last write) and the handler's own writes queued by
/// [`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with), if it ran a
/// handler.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Completion<'a> {
    pub(super) steps: Option<&'a StepLedger>,
}

/// What failing a refused completion needs.
struct RefusedCompletion<'a> {
    attempt: u32,
    patience: Patience,
    steps: Option<&'a StepLedger>,
    pending: Option<Vec<StepRecord>>,
}

/// How long a write after the handler ran (a settlement, a release) is retried (see
/// [`Patience::settling`]).
pub(crate) fn settle_patience(
    invocation: &Invocation,
    claim: &Record,
    now: SystemTime,
) -> Patience {
    Patience::settling(claim.lease.expires_at, invocation.deadline, now)
}

/// When a claim given back at `now` (a panic, a cancellation) may be taken over: after
/// [`GIVE_BACK_GRACE`], for what the handler left in flight, and not before a step's effect
/// can have landed (`lands_by`), never later than its lease.
pub(super) fn given_back_until(
    now: SystemTime,
    lease_expires_at: SystemTime,
    lands_by: Option<SystemTime>,
) -> SystemTime {
    decide::given_back_until(now, lease_expires_at, GIVE_BACK_GRACE, lands_by)
}

/// The class of a handler's error: retained as unstorable when it came after the effect
/// ([`AfterEffect`]), retryable when it asks for a release ([`Release`]), retained as
/// `step_rejected` when it is a step's writes that cannot be sent, else `classifier`'s.
fn class_by(
    classifier: &dyn Classifier,
    error: &(dyn std::error::Error + 'static),
) -> FailureClass {
    if AfterEffect::is(error) {
        return FailureClass::terminal(FailureKind::OutcomeUnstorable.as_str());
    }
    match Release::is(error) {
        true => FailureClass::Retryable,
        false if rejected_step(error) => FailureClass::terminal(FailureKind::StepRejected.as_str()),
        false => classifier.classify(error),
    }
}

/// Whether `error` is (or wraps) a transactional step's writes that cannot be sent as built
/// ([`StepError::Rejected`]): every retry would build and send them again.
fn rejected_step(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |error| error.source())
        .any(|error| matches!(error.downcast_ref(), Some(StepError::Rejected { .. })))
}
