//! Claiming a key: a fresh claim, a takeover of an expired lease, or the adoption of an
//! operation's orphaned evidence.

use std::time::{Duration, SystemTime};

use tracing::{debug, warn};

use super::retry::Patience;
use super::settle::settle_patience;
use super::{Held, Idempotency, Step, answer, erased};
use crate::error::Error;
use crate::execution::Invocation;
use crate::record::{Evidence, Lease, Record, Status, StepRecord, retention_expiry};
use crate::store::{Claim, Fence, Guard, Store, Target};

impl Idempotency {
    /// Claims the key: a fresh claim, a takeover of an expired lease, or the adoption of this
    /// operation's orphaned evidence; `Err` is the answer when the key is not ours to run.
    pub(super) async fn claim(
        &self,
        claim: &Record,
        invocation: &Invocation,
        now: SystemTime,
    ) -> Result<Step, Error> {
        let key = &invocation.key;
        let deadline = claim.lease.expires_at;
        let target = Target {
            key,
            identity: claim.identity.as_deref(),
            guard: Guard::Lease(&claim.lease.token),
        };
        let claimed = match self
            .retrying(Patience::Brief(deadline), || self.store.claim(claim, now))
            .await
        {
            Ok(claimed) => claimed,
            Err(err) => {
                // A transient failure may hide a claim that committed with its answer lost;
                // nothing ran under it yet, so it is given back whole, as patiently as a
                // settlement (a claim left standing would wait out its lease). Any other
                // failure (refused, missing table, denied) wrote nothing.
                if err.is_transient() {
                    let patience = settle_patience(invocation, claim, self.clock.now());
                    let _ = self.retrying(patience, || self.store.release(target)).await;
                }
                return Err(err.into());
            }
        };
        let existing = match claimed {
            Claim::Acquired => return Ok(Step::Run(Held::Fresh)),
            Claim::Existing(existing) if is_own_claim(&existing, claim) => {
                debug!("the claim committed before its answer was lost");
                return Ok(Step::Run(Held::Fresh));
            }
            Claim::Existing(existing) => existing,
            Claim::IdentityTaken(evidence)
                if evidence.key == *key && evidence.status == Status::InProgress =>
            {
                return self.adopt(claim, invocation, evidence, now).await;
            }
            Claim::IdentityTaken(evidence) => {
                return Err(answer::identity_taken(invocation, evidence));
            }
        };
        if !invocation.fingerprint.matches(&existing.fingerprint) {
            return Err(Error::PayloadConflict { key: key.clone() });
        }
        if !existing.lease_is_takeable(now) {
            return Ok(Step::Answer(Box::new(existing)));
        }
        let lease = Lease {
            attempt: existing.lease.attempt.saturating_add(1),
            ..claim.lease.clone()
        };
        let expires_at = retention_expiry(lease.expires_at, self.config.retention());
        let fence = match self
            .retrying(Patience::Brief(deadline), || {
                self.store.take_over(&existing, &lease, expires_at, now)
            })
            .await
        {
            Ok(fence) => fence,
            Err(err) => {
                // The takeover may have committed with its answer lost. The crashed attempt
                // may have acted, so the record stays for the next takeover: only the lease
                // this one may hold is cut short.
                let _ = erased(self.store.shorten(target, now)).await;
                return Err(err.into());
            }
        };
        match fence {
            Fence::Held => {}
            Fence::Lost {
                current: Some(current),
            } if current.status == Status::InProgress && holds(&current.lease, &lease) => {
                debug!("the takeover committed before its answer was lost");
            }
            Fence::Lost {
                current: Some(current),
            } => return Ok(Step::Answer(current)),
            Fence::Lost { current: None } => {
                return Err(Error::AlreadyInProgress {
                    key: key.clone(),
                    attempt: lease.attempt,
                    retry_after: Duration::ZERO,
                });
            }
        }
        warn!(attempt = lease.attempt, "took over an expired lease");
        Ok(Step::Run(Held::TakenOver {
            attempt: lease.attempt,
            previous: Box::new(existing),
            adopted: false,
        }))
    }

    /// Re-creates the record of a crashed attempt that TTL deleted while the identity's
    /// evidence still says IN_PROGRESS, as a takeover: the reconciler decides, not a blind run.
    pub(super) async fn adopt(
        &self,
        claim: &Record,
        invocation: &Invocation,
        orphan: Evidence,
        now: SystemTime,
    ) -> Result<Step, Error> {
        let key = &invocation.key;
        if !invocation.fingerprint.matches(&orphan.fingerprint) {
            return Err(Error::PayloadConflict { key: key.clone() });
        }
        // The orphan's evidence is the operation's, under whatever key it was written. Its
        // steps went with its record: the re-created record says so, for every later takeover
        // (this one may stop before it settles anything).
        let record = Record {
            lease: Lease {
                attempt: 2,
                ..claim.lease.clone()
            },
            identity: Some(orphan.identity.clone()),
            steps: vec![StepRecord::steps_lost()],
            ..claim.clone()
        };
        let adopted = match self
            .retrying(Patience::Brief(claim.lease.expires_at), || {
                self.store.adopt(&record, &orphan, now)
            })
            .await
        {
            Ok(adopted) => adopted,
            Err(err) => {
                // As for a takeover: keep the record, cut the lease this adoption may hold.
                let target = Target {
                    key,
                    identity: None,
                    guard: Guard::Lease(&record.lease.token),
                };
                let _ = erased(self.store.shorten(target, now)).await;
                return Err(err.into());
            }
        };
        match adopted {
            Claim::Acquired => {}
            Claim::Existing(existing) if is_own_claim(&existing, &record) => {}
            Claim::Existing(existing) => {
                return Ok(Step::Answer(Box::new(existing)));
            }
            Claim::IdentityTaken(evidence) => {
                return Err(answer::identity_taken(invocation, evidence));
            }
        }
        warn!("adopted a crashed attempt whose record had expired");
        Ok(Step::Run(Held::TakenOver {
            attempt: 2,
            previous: Box::new(orphaned_record(&record, &orphan)),
            adopted: true,
        }))
    }

    pub(super) fn new_claim(&self, invocation: &Invocation, now: SystemTime) -> Record {
        let lease_expires_at = now + invocation.lease;
        Record {
            key: invocation.key.clone(),
            status: Status::InProgress,
            fingerprint: invocation.fingerprint.clone(),
            lease: Lease {
                token: uuid::Uuid::new_v4().to_string(),
                attempt: 1,
                expires_at: lease_expires_at,
            },
            expires_at: retention_expiry(lease_expires_at, self.config.retention()),
            outcome: None,
            created_at: now,
            completed_at: None,
            request_id: invocation.request_id.clone(),
            identity: invocation.evidence_key(),
            audit: None,
            steps: Vec::new(),
        }
    }
}

/// Whether `existing` is the caller's own `claim`: it committed before its answer was lost and
/// the SDK's retry found it standing.
pub(super) fn is_own_claim(existing: &Record, claim: &Record) -> bool {
    existing.status == Status::InProgress && holds(&existing.lease, &claim.lease)
}

/// Whether `stored` is `mine` as a store gives it back: the same random token and attempt
/// (times come back at the store's resolution, milliseconds on DynamoDB).
pub(super) fn holds(stored: &Lease, mine: &Lease) -> bool {
    stored.token == mine.token && stored.attempt == mine.attempt
}

/// The crashed attempt of an orphaned evidence, as the reconciler sees it.
pub(super) fn orphaned_record(adopted: &Record, orphan: &Evidence) -> Record {
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
