//! The protocol's transitions as the model allows them (`src/model`: the store's conditions
//! its workers meet), stated apart from the store's code: what one store request may change of
//! an operation's record. Each request of a schedule is checked as it applies, so that a
//! write the engine sends (or a store applies) that the model forbids is reported where it
//! happens, whether or not the schedule's outcome ever shows it.

use std::time::SystemTime;

use lambda_idempotency::record::{
    Lease, Record, Settlement, Status, StepRecord, epoch_millis, epoch_secs,
};
use lambda_idempotency::store::Guard;

/// One store request, as far as it concerns the record of its key.
#[derive(Debug, Clone, Copy)]
pub(super) enum Request<'a> {
    /// A claim (or an adoption) writing `record`.
    Claim { record: &'a Record, now: SystemTime },
    /// A takeover of `previous` with a new `lease` and retention `expires_at`.
    TakeOver {
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    },
    /// A give-back's shortening of the lease to `until`.
    Shorten { guard: Guard<'a>, until: SystemTime },
    /// A settlement (with or without the handler's writes).
    Settle {
        guard: Guard<'a>,
        settlement: &'a Settlement,
    },
    /// The steps written (with or without a transactional step's writes).
    Steps {
        guard: Guard<'a>,
        steps: &'a [StepRecord],
    },
    /// The record deleted for a fresh retry.
    Release { guard: Guard<'a> },
}

/// Whether `request` may have turned the record `before` into `after`: `Err` names the
/// transition the model forbids. A request that changed nothing is always allowed.
pub(super) fn allowed(
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
