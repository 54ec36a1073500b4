//! The store's one forwarding point: every core request is a [`Request`] answered by
//! [`Store::call`] with an [`Answer`], and [`StoreExt`] gives each request its typed method.
//! A decorator matches the requests it changes and hands every other on as it is, so no
//! method is written once per request and per store, and none can be bypassed.

use std::future::Future;
use std::time::SystemTime;

use futures_util::FutureExt;

use super::{Claim, Fence, Store, Target};
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Evidence, Lease, Record, Settlement, StepRecord};

/// One request to a store's core ([`Store::call`]); [`StoreExt`] documents what each asks.
/// Exhaustive on purpose: a store of your own states what it does with every request (a
/// request added in a later release is a breaking change, listed in the upgrade notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// [`StoreExt::claim`].
    Claim {
        /// The IN_PROGRESS record to write.
        record: &'a Record,
        /// The claimant's time.
        now: SystemTime,
    },
    /// [`StoreExt::adopt`].
    Adopt {
        /// The IN_PROGRESS record to write.
        record: &'a Record,
        /// The crashed attempt's evidence, as read.
        orphan: &'a Evidence,
        /// The claimant's time.
        now: SystemTime,
    },
    /// [`StoreExt::take_over`].
    TakeOver {
        /// The record as the taker read it (its lease run out).
        previous: &'a Record,
        /// The new attempt's lease.
        lease: &'a Lease,
        /// The record's new retention.
        expires_at: SystemTime,
        /// The taker's time.
        now: SystemTime,
    },
    /// [`StoreExt::shorten`].
    Shorten {
        /// The record and its guard.
        target: Target<'a>,
        /// The lease's new end.
        until: SystemTime,
    },
    /// [`StoreExt::settle`].
    Settle {
        /// The record and its guard.
        target: Target<'a>,
        /// What the settlement writes.
        settlement: &'a Settlement,
    },
    /// [`StoreExt::record_steps`].
    RecordSteps {
        /// The record and its guard.
        target: Target<'a>,
        /// Every step the record then holds.
        steps: &'a [StepRecord],
    },
    /// [`StoreExt::release`].
    Release {
        /// The record and its guard.
        target: Target<'a>,
    },
    /// [`StoreExt::release_by_operator`].
    ReleaseByOperator {
        /// The record as the operator saw it (`None`: absent, or settled and expired).
        seen: Option<&'a Record>,
        /// The evidence to delete, as seen.
        evidence: Option<&'a Evidence>,
        /// The expired FAILED record written in its place.
        released: &'a Record,
        /// The operator's time.
        now: SystemTime,
    },
    /// [`StoreExt::settle_evidence`].
    SettleEvidence {
        /// The evidence as the operator saw it.
        seen: &'a Evidence,
        /// What it is settled with.
        settlement: &'a Settlement,
        /// The operator's time.
        now: SystemTime,
    },
    /// [`StoreExt::get`].
    Get {
        /// The operation key.
        key: &'a OperationKey,
    },
    /// [`StoreExt::evidence`].
    Evidence {
        /// The business identity.
        identity: &'a str,
    },
}

impl Request<'_> {
    /// The request's name, as errors name the store operation.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Claim { .. } => "claim",
            Self::Adopt { .. } => "adopt",
            Self::TakeOver { .. } => "take_over",
            Self::Shorten { .. } => "shorten",
            Self::Settle { .. } => "settle",
            Self::RecordSteps { .. } => "record_steps",
            Self::Release { .. } => "release",
            Self::ReleaseByOperator { .. } => "release_by_operator",
            Self::SettleEvidence { .. } => "settle_evidence",
            Self::Get { .. } => "get",
            Self::Evidence { .. } => "evidence",
        }
    }
}

/// A store's answer to a [`Request`], of the kind the request takes: a claim and an adoption
/// are answered [`Answer::Claim`], the fenced writes (a takeover, a shortening, a settlement,
/// the steps, a release) [`Answer::Fence`], an operator's writes [`Answer::Written`], the reads
/// [`Answer::Record`] and [`Answer::Evidence`]. Another kind is a defect of the store, which
/// [`StoreExt`] reports as [`StoreError::WrongAnswer`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// A claim's or an adoption's answer.
    Claim(Claim),
    /// A fenced write's answer.
    Fence(Fence),
    /// An operator's write: `true` when it was applied, `false` when what it saw had changed.
    Written(bool),
    /// The record read, if any.
    Record(Option<Record>),
    /// The evidence read, if any.
    Evidence(Option<Evidence>),
}

/// `store`'s answer to `request`, of the kind `kind` takes, or [`StoreError::WrongAnswer`].
fn ask<'a, S: Store + ?Sized, T: 'a>(
    store: &'a S,
    request: Request<'a>,
    kind: fn(Answer) -> Option<T>,
) -> impl Future<Output = Result<T, StoreError>> + Send + 'a {
    let operation = request.name();
    store
        .call(request)
        .map(move |answer| kind(answer?).ok_or(StoreError::WrongAnswer { operation }))
}

/// Each core request as a typed method, for every [`Store`] (implemented for all of them: a
/// store implements [`Store::call`] alone). Bring it into scope to call a store.
pub trait StoreExt: Store {
    /// Writes `record` (IN_PROGRESS, with its identity's evidence) unless a live record holds
    /// its key or its identity has evidence.
    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send + 'a {
        ask(self, Request::Claim { record, now }, claim)
    }

    /// Writes `record` (IN_PROGRESS, a takeover of a crashed attempt) if its key is absent or
    /// its record settled and expired, and the identity's evidence is still `orphan` (this
    /// operation's, IN_PROGRESS, created when `orphan` was).
    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send + 'a {
        ask(
            self,
            Request::Adopt {
                record,
                orphan,
                now,
            },
            claim,
        )
    }

    /// Gives `previous`'s record the new `lease` and the retention `expires_at` if it is still
    /// IN_PROGRESS under `previous.lease.token`, that lease has run out at `now`, and it holds
    /// the very steps `previous` holds (none when the attribute is absent). Compare the lease
    /// with `now` as given, never the store's own clock: an owner re-entering its own live
    /// claim ([`Invocation::with_owner`](crate::Invocation::with_owner)) passes a time past
    /// the lease's end.
    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        ask(
            self,
            Request::TakeOver {
                previous,
                lease,
                expires_at,
                now,
            },
            fence,
        )
    }

    /// Moves the target's lease expiry to `until` (a claim given back early: a panicking or
    /// cancelled handler), so that the next delivery takes over without waiting out the lease;
    /// never later: a lease already running out by `until` stands as it is (answered
    /// [`Fence::Held`] while the target holds it), so that a give-back sent after the claim was
    /// cut shorter never lengthens it again.
    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        ask(self, Request::Shorten { target, until }, fence)
    }

    /// Moves the target record to `settlement.status` with its outcome (and its evidence too:
    /// settled alike, or deleted when the settlement [releases the identity](Settlement::releases_identity)).
    /// Outcomes up to [`Config::max_outcome_bytes`](crate::Config::max_outcome_bytes) come
    /// here, whatever the backend's item limit: a store keeps a large one its own way (the
    /// DynamoDB store compresses it and keeps it in part items,
    /// [`OutcomeStorage`](super::OutcomeStorage)) and never lets a reader see part of one. A
    /// store that cannot keep it answers [`StoreError::Rejected`]; the engine then retains the
    /// operation as FAILED.
    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        ask(self, Request::Settle { target, settlement }, fence)
    }

    /// Writes the target record's steps as `steps` ([`crate::effects`]), fenced by the target's
    /// guard (the record alone: the evidence is not touched). A store that does not keep steps
    /// answers [`StoreError::Rejected`]; the engine then halts a handler at its first step (a
    /// plain step, before its effect).
    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        ask(self, Request::RecordSteps { target, steps }, fence)
    }

    /// Deletes the target record (and its evidence) so that a retry executes afresh.
    fn release<'a>(
        &'a self,
        target: Target<'a>,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        ask(self, Request::Release { target }, fence)
    }

    /// An operator's release: writes `released` (an expired FAILED record carrying the
    /// operator's audit, so that the next delivery claims afresh) where the record is still as
    /// `seen` (the same status, lease token and [`Record::steps_version`] (no step recorded
    /// since), and, IN_PROGRESS, its lease run out at `now`;
    /// `None`: absent, or settled and expired), and
    /// deletes `evidence` (as seen: the same operation, status and creation) in the same write.
    /// `false`: one of them had changed; nothing was written.
    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        ask(
            self,
            Request::ReleaseByOperator {
                seen,
                evidence,
                released,
                now,
            },
            written,
        )
    }

    /// An operator's settlement of evidence whose record is gone: `seen` (the same operation,
    /// status and creation) takes `settlement`'s status, result reference, time and audit, if
    /// its operation's record is still absent, or settled and expired at `now` (a redelivery
    /// that adopted the evidence meanwhile holds a live claim). `false`: either had changed;
    /// nothing was written.
    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        ask(
            self,
            Request::SettleEvidence {
                seen,
                settlement,
                now,
            },
            written,
        )
    }

    /// Reads the record of `key` as stored, expired or not. A record past its retention may
    /// come without its outcome (`None`): the DynamoDB store's TTL deletes an outcome kept in
    /// part items an hour after the record's retention, and may do so before the record.
    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send + 'a {
        ask(self, Request::Get { key }, record)
    }

    /// Reads the permanent evidence of a business identity.
    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> impl Future<Output = Result<Option<Evidence>, StoreError>> + Send + 'a {
        ask(self, Request::Evidence { identity }, evidence)
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

fn claim(answer: Answer) -> Option<Claim> {
    match answer {
        Answer::Claim(claim) => Some(claim),
        _ => None,
    }
}

fn fence(answer: Answer) -> Option<Fence> {
    match answer {
        Answer::Fence(fence) => Some(fence),
        _ => None,
    }
}

fn written(answer: Answer) -> Option<bool> {
    match answer {
        Answer::Written(written) => Some(written),
        _ => None,
    }
}

fn record(answer: Answer) -> Option<Option<Record>> {
    match answer {
        Answer::Record(record) => Some(record),
        _ => None,
    }
}

fn evidence(answer: Answer) -> Option<Option<Evidence>> {
    match answer {
        Answer::Evidence(evidence) => Some(evidence),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;
    use futures_util::future::BoxFuture;

    use super::{Answer, Request, StoreExt};
    use crate::error::StoreError;
    use crate::key::{OperationKey, OperationScope};
    use crate::store::{Store, TransactionalStore};

    /// Answers every request with `0`.
    #[derive(Debug)]
    struct AlwaysAnswers(Answer);

    impl Store for AlwaysAnswers {
        fn call<'a>(&'a self, _: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
            Box::pin(async move { Ok(self.0.clone()) })
        }

        fn transactional(&self) -> Option<&dyn TransactionalStore> {
            None
        }
    }

    #[test]
    fn an_answer_of_another_kind_is_reported_and_one_in_kind_is_typed() {
        let scope = OperationScope::new("orders", "charge").unwrap();
        let key = OperationKey::derive(&scope, None, &"o-1").unwrap();
        let confused = AlwaysAnswers(Answer::Written(true));
        let read = confused.get(&key).now_or_never().unwrap();
        assert!(
            matches!(read, Err(StoreError::WrongAnswer { operation: "get" })),
            "{read:?}"
        );
        let read = confused.evidence("order o-1").now_or_never().unwrap();
        assert!(
            matches!(
                read,
                Err(StoreError::WrongAnswer {
                    operation: "evidence"
                })
            ),
            "{read:?}"
        );
        let absent = AlwaysAnswers(Answer::Record(None));
        assert_eq!(absent.get(&key).now_or_never().unwrap().unwrap(), None);
    }
}
