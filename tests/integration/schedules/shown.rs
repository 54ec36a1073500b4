//! What the store showed each delivery at its last request, and its answer judged against it
//! by the specification's `transitions::truthful`: the answers' half of the conformance
//! check (the requests' half is `transitions::allowed`, in [`super::scheduled`]).

use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use lambda_idempotency::key::OperationKey;
use lambda_idempotency::lambda::IdempotencyError;
use lambda_idempotency::record::{Evidence, Record, Status};
use lambda_idempotency::store::Request;
use lambda_idempotency::testing::transitions::{Answered, Shown, truthful};
use lambda_idempotency::{BoxError, Error, ErrorKind, Execution, Origin};

use super::deliveries;

/// What the store showed one delivery: its own lease token once it claimed or took over, its
/// operation's record as its last request on it left it (the state read with that request,
/// before any other task ran), and the last evidence it read.
#[derive(Debug, Default)]
pub(super) struct Seen {
    own: Option<String>,
    record: Option<Record>,
    evidence: Option<Evidence>,
    /// The request that left `record`.
    last: &'static str,
}

/// `note` on what the store showed the calling task's delivery, if it runs one.
fn noting(note: impl FnOnce(&mut Seen)) {
    if let Some(delivery) = deliveries::current() {
        note(&mut delivery.seen.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Notes that `request` (`operation`) left its operation's record as `after` (a read:
/// `None`).
pub(super) fn record(operation: &'static str, request: Option<Request<'_>>, after: Option<Record>) {
    noting(|seen| {
        match request {
            Some(Request::Claim { record, .. } | Request::Adopt { record, .. }) => {
                seen.own = Some(record.lease.token.clone());
            }
            Some(Request::TakeOver { lease, .. }) => seen.own = Some(lease.token.clone()),
            _ => {}
        }
        seen.record = after;
        seen.last = operation;
    });
}

/// Notes the evidence a read found.
pub(super) fn evidence(found: Option<&Evidence>) {
    noting(|seen| seen.evidence = found.cloned());
}

/// Panics when `answer`, given at `now` to the delivery of `key`, is not one the model gives from
/// what the store showed it.
pub(super) fn check(
    key: &OperationKey,
    now: SystemTime,
    answer: &Result<Execution<String>, IdempotencyError<BoxError>>,
    seen: &Mutex<Seen>,
) {
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let shown = Shown {
        own: seen.own.as_deref(),
        record: seen.record.as_ref(),
        evidence_indeterminate: seen.evidence.as_ref().is_some_and(|evidence| {
            evidence.key == *key && evidence.status == Status::Indeterminate
        }),
        now: Some(now),
    };
    // "In progress" with nothing to wait for is the model's "retry now" where the record is
    // gone, its "in progress" where a lease ran out at this very millisecond.
    let candidates: &[Answered<'_>] =
        match answer {
            Ok(execution) => {
                let bytes = execution.raw_json().get().as_bytes();
                match execution.origin() {
                    Origin::Replayed => &[Answered::Replayed(bytes)],
                    _ => &[Answered::Executed(bytes)],
                }
            }
            Err(IdempotencyError::Idempotency(Error::AlreadyInProgress {
                retry_after, ..
            })) if retry_after.is_zero() => &[Answered::RetryNow, Answered::InProgress],
            Err(IdempotencyError::Idempotency(err)) => match err.kind() {
                ErrorKind::AlreadyInProgress => &[Answered::InProgress],
                ErrorKind::LeaseLost => &[Answered::LeaseLost],
                ErrorKind::Indeterminate => &[Answered::Indeterminate],
                ErrorKind::Failed => &[Answered::Failed(None)],
                _ => &[Answered::Other],
            },
            Err(_) => &[Answered::Other],
        };
    let verdicts: Vec<_> = candidates
        .iter()
        .map(|answered| truthful(*answered, shown))
        .collect();
    if let Some(Err(untrue)) = verdicts
        .iter()
        .find(|_| verdicts.iter().all(Result::is_err))
    {
        let own = match (&seen.record, &seen.own) {
            (Some(record), Some(own)) if record.lease.token == *own => "its own",
            (Some(_), _) => "another's",
            (None, _) => "no",
        };
        panic!(
            "{}: {untrue}, {own} lease, after its {} (an answer the model never gives from that state)",
            key.short(),
            seen.last
        );
    }
}
