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
//! use lambda_idempotency::testing::transitions::{Request, allowed};
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

use crate::record::{Lease, Record, Settlement, Status, StepRecord, epoch_millis, epoch_secs};
use crate::store::Guard;

/// One store request, as far as it concerns the record of its key.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Request<'a> {
    /// A claim (or an adoption) writing its record.
    Claim {
        /// The record the claim writes.
        record: &'a Record,
        /// The claimant's time.
        now: SystemTime,
    },
    /// A takeover of an expired claim.
    TakeOver {
        /// The record the takeover read (its lease run out).
        previous: &'a Record,
        /// The new attempt's lease.
        lease: &'a Lease,
        /// The record's new retention.
        expires_at: SystemTime,
        /// The taker's time.
        now: SystemTime,
    },
    /// A give-back's shortening of the lease.
    Shorten {
        /// Whose lease it must be.
        guard: Guard<'a>,
        /// The lease's new end.
        until: SystemTime,
    },
    /// A settlement (with or without the handler's writes).
    Settle {
        /// Whose lease it must be.
        guard: Guard<'a>,
        /// What it writes.
        settlement: &'a Settlement,
    },
    /// The steps written (with or without a transactional step's writes).
    Steps {
        /// Whose lease it must be.
        guard: Guard<'a>,
        /// Every step the record then holds.
        steps: &'a [StepRecord],
    },
    /// The record deleted for a fresh retry.
    Release {
        /// Whose lease it must be.
        guard: Guard<'a>,
    },
}

/// Whether `request` may have turned the record `before` into `after`: `Err` names the
/// transition the model forbids. A request that changed nothing is always allowed.
pub fn allowed(
    request: Request<'_>,
    before: Option<&Record>,
    after: Option<&Record>,
) -> Result<(), String> {
    if before == after {
        return Ok(());
    }
    match request {
        Request::Claim { record, now } => {
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
            let expected = Record {
                lease: lease.clone(),
                expires_at,
                ..before.clone()
            };
            unchanged_but(after, &expected, "a takeover")
        }
        Request::Shorten { guard, until } => {
            let before = held(before, guard, "a shortening")?;
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
        Request::Settle { guard, settlement } => {
            held(before, guard, "a settlement")?;
            match after {
                Some(after) if after.status == settlement.status => Ok(()),
                // A settlement that releases for a fresh retry deletes nothing here: it writes
                // its status; only `release` deletes.
                _ => Err("a settlement left another status than its own".into()),
            }
        }
        Request::Steps { guard, steps } => {
            let before = held(before, guard, "a step write")?;
            match after {
                Some(after)
                    if after.steps == steps
                        && Record {
                            steps: before.steps.clone(),
                            steps_version: before.steps_version,
                            ..after.clone()
                        } == *before =>
                {
                    Ok(())
                }
                _ => Err("a step write changed more than the steps".into()),
            }
        }
        Request::Release { guard } => {
            held(before, guard, "a release")?;
            match after {
                None => Ok(()),
                Some(_) => Err("a release left a record".into()),
            }
        }
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
        Guard::Indeterminate => before.status == Status::Indeterminate,
        Guard::Expired { token, now } => {
            before.status == Status::InProgress
                && before.lease.token == token
                && epoch_millis(before.lease.expires_at) < epoch_millis(now)
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
