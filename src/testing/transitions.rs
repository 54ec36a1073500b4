//! The store's transitions as the protocol's model allows them: what one store request may
//! change of an operation's record, stated apart from the stores' code. It is the
//! specification two checkers share: the model (`src/model`, stateright) checks every write
//! its workers send in every state it explores against it, so that it allows nothing the
//! protocol does not need and forbids nothing the protocol does; the shuttle schedules of the
//! integration suite check each request the real engine sends, as it applies, so that a write
//! the engine sends (or a store applies) that the model forbids is reported where it happens,
//! whether or not the schedule's outcome ever shows it.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use lambda_idempotency::key::{Fingerprint, OperationKey, OperationScope};
//! use lambda_idempotency::record::{Lease, Record, Status};
//! use lambda_idempotency::store::Request;
//! use lambda_idempotency::testing::transitions::allowed;
//!
//! let scope = OperationScope::new("orders", "charge").unwrap();
//! let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
//! let claim = |token: &str| Record {
//!     key: OperationKey::derive(&scope, None, &"o-1").unwrap(),
//!     status: Status::InProgress,
//!     fingerprint: Fingerprint::of(&"o-1").unwrap(),
//!     lease: Lease { token: token.into(), attempt: 1, expires_at: now + Duration::from_secs(60) },
//!     expires_at: now + Duration::from_secs(3600),
//!     outcome: None,
//!     created_at: now,
//!     completed_at: None,
//!     request_id: None,
//!     identity: None,
//!     audit: None,
//!     steps: Vec::new(),
//!     steps_version: 0,
//! };
//! let (mine, theirs) = (claim("attempt-a"), claim("attempt-b"));
//! // A claim of an absent key writes its own record.
//! assert!(allowed(Request::Claim { record: &mine, now }, None, Some(&mine)).is_ok());
//! // A claim that replaced another's live claim is a transition the model forbids.
//! assert!(allowed(Request::Claim { record: &theirs, now }, Some(&mine), Some(&theirs)).is_err());
//! ```

use std::time::SystemTime;

use crate::record::{Record, Status, epoch_millis, epoch_secs};
use crate::store::{Guard, Request};

/// An answer the engine gave a delivery, as far as the store must show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answered<'a> {
    /// The handler ran (or a reconciler found its effect), and these outcome bytes were
    /// recorded.
    Executed(&'a [u8]),
    /// These stored outcome bytes were replayed.
    Replayed(&'a [u8]),
    /// A retained failure (its bytes, where the answer carries them).
    Failed(Option<&'a [u8]>),
    /// Another attempt holds a live lease.
    InProgress,
    /// The record a takeover was sent for is gone (released, or deleted by TTL): the caller's
    /// retry claims afresh.
    RetryNow,
    /// The attempt's lease was taken, or ran out, before it settled.
    LeaseLost,
    /// Held for an operator.
    Indeterminate,
    /// Anything else (a refusal, an outage outlasted, the handler's own error): the store need
    /// show nothing of it.
    Other,
}

/// What the store showed an attempt at its last request, the state its answer is judged
/// against.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shown<'a> {
    /// The attempt's own lease token, once it claimed or took over.
    pub own: Option<&'a str>,
    /// The operation's record, as that request left it.
    pub record: Option<&'a Record>,
    /// Whether the business identity's evidence it read was INDETERMINATE.
    pub evidence_indeterminate: bool,
    /// The attempt's time when it answered (`None`: not known, and a lease counts as live).
    pub now: Option<SystemTime>,
}

/// Whether `answer` is one the model gives from the state `shown`: `Err` names the untruth.
/// An outcome answered is the record's, byte for byte; "in progress" only under another's
/// lease; "lease lost" only to an attempt that claimed, where the record is no longer its own,
/// or is still IN_PROGRESS under its lease run out by the attempt's clock (anyone may take it
/// over then, and no effect may start).
pub fn truthful(answer: Answered<'_>, shown: Shown<'_>) -> Result<(), String> {
    let record = shown.record;
    let holds = |status: Status, bytes: Option<&[u8]>| {
        record.is_some_and(|record| {
            record.status == status
                && bytes.is_none_or(|bytes| record.outcome.as_deref() == Some(bytes))
        })
    };
    let others = |record: &Record| shown.own.is_none_or(|own| record.lease.token != own);
    let truthful = match answer {
        Answered::Executed(bytes) | Answered::Replayed(bytes) => {
            holds(Status::Completed, Some(bytes))
        }
        Answered::Failed(bytes) => holds(Status::Failed, bytes),
        Answered::InProgress => {
            record.is_some_and(|record| record.status == Status::InProgress && others(record))
        }
        Answered::RetryNow => record.is_none(),
        Answered::LeaseLost => {
            shown.own.is_some()
                && record.is_none_or(|record| {
                    // Another worker's, or an operator resolved this attempt's claim.
                    others(record)
                        || record.audit.is_some()
                        || (record.status == Status::InProgress
                            && shown.now.is_some_and(|now| record.lease.is_expired(now)))
                })
        }
        Answered::Indeterminate => {
            holds(Status::Indeterminate, None) || shown.evidence_indeterminate
        }
        Answered::Other => true,
    };
    match truthful {
        true => Ok(()),
        false => Err(format!(
            "answered {answer:?} where the store showed {:?}",
            record.map(|record| (record.status, record.lease.attempt))
        )),
    }
}

/// Whether the store request `request` may have turned the record of its key from `before`
/// into `after`: `Err` names the transition the model forbids. A request that changed nothing
/// is always allowed; an adoption is judged as the claim it is; an operator's release writes
/// its released record only over the record the operator saw; a read and an operator's
/// settlement of evidence change no record.
pub fn allowed(
    request: Request<'_>,
    before: Option<&Record>,
    after: Option<&Record>,
) -> Result<(), String> {
    if before == after {
        return Ok(());
    }
    match request {
        Request::Claim { record, now } | Request::Adopt { record, now, .. } => {
            if before.is_some_and(|before| !absent_at(before, now)) {
                return Err(
                    "a claim replaced a record that stands (live, or settled and retained)".into(),
                );
            }
            match after == Some(record) {
                true => Ok(()),
                false => Err("a claim wrote another record than its own".into()),
            }
        }
        Request::TakeOver {
            previous,
            lease,
            expires_at,
            now,
        } => {
            let before = before.ok_or("a takeover wrote a record that was absent")?;
            if before.status != Status::InProgress
                || before.lease.token != previous.lease.token
                || epoch_millis(before.lease.expires_at) >= epoch_millis(now)
                || before.steps != previous.steps
            {
                return Err("a takeover replaced a lease that was not the expired one it read, or steps that changed since".into());
            }
            if expires_at < lease.expires_at {
                return Err("a takeover's record is retained less long than its lease".into());
            }
            // The next attempt (under a new token, or the owner's own when it re-enters).
            if lease.attempt != previous.lease.attempt.saturating_add(1) {
                return Err(format!(
                    "a takeover of attempt {} wrote attempt {}",
                    previous.lease.attempt, lease.attempt
                ));
            }
            let expected = Record {
                lease: lease.clone(),
                expires_at,
                ..before.clone()
            };
            unchanged_but(after, &expected, "a takeover")
        }
        Request::Shorten { target, until } => {
            let before = held(before, target.guard, "a shortening")?;
            if until > before.lease.expires_at {
                return Err(format!(
                    "a give-back's shortening extended the lease of attempt {} from {:?} to {until:?}",
                    before.lease.attempt, before.lease.expires_at
                ));
            }
            let mut expected = before.clone();
            expected.lease.expires_at = until;
            unchanged_but(after, &expected, "a shortening")
        }
        Request::Settle { target, settlement } => {
            let before = held(before, target.guard, "a settlement")?;
            let mut expected = Record {
                status: settlement.status,
                outcome: settlement.outcome.clone(),
                expires_at: settlement.expires_at,
                completed_at: Some(settlement.completed_at),
                ..before.clone()
            };
            if let Some(steps) = &settlement.steps {
                expected.steps.clone_from(steps);
                expected.steps_version = before.steps_version + 1;
            }
            if settlement.audit.is_some() {
                expected.audit.clone_from(&settlement.audit);
            }
            // A settlement that releases for a fresh retry deletes nothing here: it writes
            // its status; only `release` deletes.
            unchanged_but(after, &expected, "a settlement")
        }
        Request::RecordSteps { target, steps } => {
            let before = held(before, target.guard, "a step write")?;
            let expected = Record {
                steps: steps.to_vec(),
                steps_version: before.steps_version + 1,
                ..before.clone()
            };
            unchanged_but(after, &expected, "a step write")
        }
        Request::Release { target } => {
            held(before, target.guard, "a release")?;
            match after {
                None => Ok(()),
                Some(_) => Err("a release left a record".into()),
            }
        }
        Request::ReleaseByOperator {
            seen,
            released,
            now,
            ..
        } => {
            let as_seen = match (before, seen) {
                (Some(before), Some(seen)) => {
                    before.status == seen.status
                        && before.lease.token == seen.lease.token
                        && before.lease.attempt == seen.lease.attempt
                        && before.steps_version == seen.steps_version
                        && (before.status != Status::InProgress || before.lease.is_expired(now))
                }
                (before, None) => before.is_none_or(|before| before.counts_as_absent(now)),
                (None, Some(_)) => false,
            };
            if !as_seen {
                return Err(
                    "an operator's release replaced a record that was not as the operator saw it"
                        .into(),
                );
            }
            match after == Some(released) {
                true => Ok(()),
                false => Err("an operator's release wrote another record than its own".into()),
            }
        }
        Request::SettleEvidence { .. } => {
            Err("an operator's settlement of evidence changed the record".into())
        }
        Request::Get { .. } | Request::Evidence { .. } => Err("a read changed the record".into()),
    }
}

/// Whether a claim at `now` may take `record`'s place: only a settled record past its
/// retention (never an IN_PROGRESS or INDETERMINATE one, however old).
fn absent_at(record: &Record, now: SystemTime) -> bool {
    matches!(record.status, Status::Completed | Status::Failed)
        && epoch_secs(record.expires_at) < epoch_secs(now)
}

/// `before`, when `guard` admits a write to it: IN_PROGRESS under the guard's lease (an
/// operator's guards: INDETERMINATE, or IN_PROGRESS under its token with the lease run out).
fn held<'r>(
    before: Option<&'r Record>,
    guard: Guard<'_>,
    what: &str,
) -> Result<&'r Record, String> {
    let before = before.ok_or_else(|| format!("{what} wrote a record that was absent"))?;
    let admitted = match guard {
        Guard::Lease(token) => before.status == Status::InProgress && before.lease.token == token,
        Guard::Indeterminate { token, attempt } => {
            before.status == Status::Indeterminate
                && before.lease.token == token
                && before.lease.attempt == attempt
        }
        Guard::Expired {
            now,
            token,
            attempt,
            steps,
            steps_version,
        } => {
            before.status == Status::InProgress
                && before.lease.token == token
                && before.lease.attempt == attempt
                && epoch_millis(before.lease.expires_at) < epoch_millis(now)
                && before.steps_version == steps_version
                && before.steps == steps
        }
    };
    match admitted {
        true => Ok(before),
        false => Err(format!(
            "{what} fenced on one lease changed the record held by attempt {} ({:?})",
            before.lease.attempt, before.status
        )),
    }
}

/// Whether `after` is `expected`: what the request writes, and nothing else changed.
fn unchanged_but(after: Option<&Record>, expected: &Record, what: &str) -> Result<(), String> {
    match after == Some(expected) {
        true => Ok(()),
        false => Err(format!("{what} changed more than it writes")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::allowed;
    use crate::engine::decide::claim_record;
    use crate::record::{Evidence, Record, Settlement, Status};
    use crate::store::Request;
    use crate::testing::conformance::invocation;

    /// A fresh claim of the conformance suite's operation under `token`.
    fn claim(token: &str) -> Record {
        let invocation = invocation("operator", &serde_json::json!({"order": "o-1"}));
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        claim_record(&invocation, token.into(), now, Duration::from_secs(3600))
    }

    #[test]
    fn an_operators_release_writes_its_record_only_over_the_one_it_saw() {
        let stuck = claim("attempt-a");
        let past_lease = stuck.lease.expires_at + Duration::from_secs(1);
        let released = Record {
            status: Status::Failed,
            expires_at: past_lease,
            ..stuck.clone()
        };
        let release = |seen| Request::ReleaseByOperator {
            seen,
            evidence: None,
            released: &released,
            now: past_lease,
        };
        assert!(allowed(release(Some(&stuck)), Some(&stuck), Some(&released)).is_ok());
        // Another attempt took the claim over meanwhile: not the record the operator saw.
        let taken = claim("attempt-b");
        assert!(allowed(release(Some(&stuck)), Some(&taken), Some(&released)).is_err());
        // Its holder recorded a step since the operator looked.
        let stepped = Record {
            steps_version: stuck.steps_version + 1,
            ..stuck.clone()
        };
        assert!(allowed(release(Some(&stuck)), Some(&stepped), Some(&released)).is_err());
        // A live lease is never released by an operator.
        let early = Request::ReleaseByOperator {
            seen: Some(&stuck),
            evidence: None,
            released: &released,
            now: stuck.created_at,
        };
        assert!(allowed(early, Some(&stuck), Some(&released)).is_err());
        // Something else written in its place.
        assert!(allowed(release(Some(&stuck)), Some(&stuck), Some(&taken)).is_err());
    }

    #[test]
    fn an_operators_settlement_of_evidence_and_a_read_change_no_record() {
        let stuck = claim("attempt-a");
        let now = stuck.lease.expires_at;
        let evidence = Evidence::of_claim(&stuck, "order o-1");
        let settlement = Settlement::completed(b"{}".to_vec(), None, now, Duration::ZERO);
        let settle = Request::SettleEvidence {
            seen: &evidence,
            settlement: &settlement,
            now,
        };
        assert!(allowed(settle, Some(&stuck), Some(&stuck)).is_ok());
        assert!(allowed(settle, Some(&stuck), None).is_err());
        let read = Request::Get { key: &stuck.key };
        assert!(allowed(read, None, Some(&stuck)).is_err());
    }
}
