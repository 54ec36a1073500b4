//! Claiming a key: a fresh claim, a takeover of an expired lease, or the adoption of an
//! operation's orphaned evidence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use tracing::{debug, warn};

use super::decide::{self, Claimed, TookOver};
use super::give_back::HandedOn;
use super::retry::Patience;
use super::settle::settle_patience;
use super::{AfterClaim, Held, Idempotency, answer};
use crate::error::Error;
use crate::execution::Invocation;
use crate::record::{Evidence, Record};
use crate::store::{Claim, Fence, Guard, StoreExt, Target};

impl Idempotency {
    /// Claims the key: a fresh claim, a takeover of an expired lease, or the adoption of this
    /// operation's orphaned evidence; `Err` is the answer when the key is not ours to run.
    /// `fresh` is cleared before anything but a fresh claim is sent (a takeover, a re-entry,
    /// an adoption): a cancellation gives those back, never releases them. A takeover sets
    /// what a cancellation hands on (`handed_on`).
    pub(super) async fn claim(
        &self,
        claim: &Record,
        invocation: &Invocation,
        now: SystemTime,
        fresh: &AtomicBool,
        handed_on: &HandedOn,
    ) -> Result<AfterClaim, Error> {
        let key = &invocation.key;
        let target = Target {
            key,
            identity: claim.identity.as_deref(),
            guard: Guard::Lease(&claim.lease.token),
        };
        let claimed = match self
            .retrying(
                Patience::before_running(claim.lease.expires_at, invocation.deadline),
                || self.store.claim(claim, now),
            )
            .await
        {
            Ok(claimed) => claimed,
            Err(err) => {
                // A transient failure may hide a claim that committed with its answer lost;
                // nothing ran under it yet, so it is given back whole, as patiently as a
                // settlement (a claim left standing would wait out its lease). Any other
                // failure (refused, missing table, denied) wrote nothing.
                // An owned claim's token is its owner's: the record under it may be the
                // owner's earlier invocation's, steps and all, which stays for the owner to
                // re-enter. Only this claim itself, if it committed, is given back.
                if err.is_transient() {
                    let patience = settle_patience(invocation, claim, self.clock.now());
                    if invocation.owner.is_none() || Box::pin(self.stands_as(claim, patience)).await
                    {
                        let _ = self.retrying(patience, || self.store.release(target)).await;
                    }
                }
                return Err(err.into());
            }
        };
        if let Claim::Existing(existing) = &claimed
            && invocation.owner.is_none()
            && decide::is_own_claim(existing, claim)
        {
            debug!("the claim committed before its answer was lost");
        }
        // The rare paths (a re-entry, an adoption, a takeover, a give-back) are boxed: a fresh
        // claim's or a duplicate's future carries none of their state.
        let claimed = match claimed {
            Claim::Existing(existing)
                if invocation.owner.is_some() && decide::reenters(&existing, claim) =>
            {
                fresh.store(false, Ordering::SeqCst);
                return Box::pin(self.reenter(existing, claim, invocation, now)).await;
            }
            claimed => claimed,
        };
        let existing = match decide::claimed(claimed, claim, now) {
            Claimed::Run => return Ok(AfterClaim::Run(Held::Fresh)),
            Claimed::Adopt(evidence) => {
                fresh.store(false, Ordering::SeqCst);
                return Box::pin(self.adopt(claim, invocation, evidence, now)).await;
            }
            Claimed::IdentityTaken(evidence) => {
                return Err(answer::identity_taken(invocation, evidence));
            }
            Claimed::PayloadConflict => return Err(Error::PayloadConflict { key: key.clone() }),
            Claimed::Answer(existing) => return Ok(AfterClaim::Answer(Box::new(existing))),
            Claimed::TakeOver(existing) => existing,
        };
        fresh.store(false, Ordering::SeqCst);
        Box::pin(self.take_over(existing, claim, invocation, now, Some(handed_on))).await
    }

    /// Takes over `existing`: a crashed attempt's, whose lease ran out, or (`reentered`) the
    /// caller's owner's own, left by an earlier invocation of it, live or not. Either way the
    /// write gives the next attempt number, a lease from now and a retention that outlives it,
    /// fenced on the record's token and the steps as read. A takeover that is no re-entry
    /// (`handed_on` given) sets there the give-back's mark it hands on should its task be
    /// cancelled before its handler runs.
    async fn take_over(
        &self,
        existing: Record,
        claim: &Record,
        invocation: &Invocation,
        now: SystemTime,
        handed_on: Option<&HandedOn>,
    ) -> Result<AfterClaim, Error> {
        let key = &invocation.key;
        let reentered = handed_on.is_none();
        let lease_end = claim.lease.expires_at;
        let (lease, expires_at) =
            decide::takeover(&existing, &claim.lease, self.config.retention());
        // An attempt that had given its claim back knowingly is continued from its steps:
        // this one, should it end before its handler runs, hands its mark on (fenced on this
        // takeover's token, so only if it committed), or the next takeover would read an
        // attempt that crashed and hold the operation for an operator.
        if let Some(handed_on) = handed_on {
            handed_on.set(decide::handed_on(&existing, lease.attempt));
        }
        // The owner takes its own claim back whether or not its lease ran out: the store's
        // expiry condition is given a time past the lease's end.
        let expired_at = decide::reentry_time(&existing, now, reentered);
        let fence = match self
            .retrying(
                Patience::before_running(lease_end, invocation.deadline),
                || {
                    self.store
                        .take_over(&existing, &lease, expires_at, expired_at)
                },
            )
            .await
        {
            Ok(fence) => fence,
            Err(err) if reentered => {
                // The owner's claim stays as it is for the owner's next invocation.
                return Err(err.into());
            }
            Err(err) => {
                // The takeover may have committed with its answer lost. The crashed attempt
                // may have acted, so the record stays for the next takeover: only the lease
                // this one may hold is cut short.
                let target = Target {
                    key,
                    identity: claim.identity.as_deref(),
                    guard: Guard::Lease(&claim.lease.token),
                };
                let patience = Patience::last_try(invocation.deadline, self.clock.now());
                // Kept for the guard until written: a cancellation meanwhile still hands it on.
                if let Some(steps) = handed_on.and_then(HandedOn::get) {
                    let _ = self
                        .retrying(patience, || self.store.record_steps(target, &steps))
                        .await;
                }
                let _ = self
                    .retrying(patience, || self.store.shorten(target, now))
                    .await;
                return Err(err.into());
            }
        };
        if let Fence::Lost {
            current: Some(current),
        } = &fence
            && decide::holds(&current.lease, &lease)
        {
            debug!("the takeover committed before its answer was lost");
        }
        let took_over = decide::took_over(fence, &lease);
        if !matches!(took_over, TookOver::Held) {
            handed_on.map(HandedOn::take);
        }
        match took_over {
            TookOver::Held => {}
            TookOver::Answer(current) => return Ok(AfterClaim::Answer(current)),
            TookOver::Gone => {
                return Ok(AfterClaim::Gone {
                    attempt: lease.attempt,
                });
            }
        }
        match reentered {
            true => debug!(
                attempt = lease.attempt,
                "re-entered its owner's claim, whose lease had run out"
            ),
            false => warn!(attempt = lease.attempt, "took over an expired lease"),
        }
        Ok(AfterClaim::Run(Held::TakenOver {
            attempt: lease.attempt,
            previous: Box::new(existing),
            adopted: false,
            reentered,
        }))
    }

    /// Re-enters `existing`, the claim of the caller's owner ([`Invocation::with_owner`]) left
    /// IN_PROGRESS by an earlier invocation of it (a durable execution that suspended): taken
    /// back as a takeover is, live or not (the next attempt, a lease from now, a retention that
    /// outlives it, fenced on the owner's token and the steps as read: a caller that took it
    /// over in between, or a late write of the owner's earlier invocation, wins). Its recorded
    /// steps replay.
    async fn reenter(
        &self,
        existing: Record,
        claim: &Record,
        invocation: &Invocation,
        now: SystemTime,
    ) -> Result<AfterClaim, Error> {
        let key = &invocation.key;
        if !claim
            .fingerprint
            .names(&existing.fingerprint, existing.created_at)
        {
            return Err(Error::PayloadConflict { key: key.clone() });
        }
        self.take_over(existing, claim, invocation, now, None).await
    }

    /// Whether the record of `claim`'s key is `claim` itself, as it committed (an owned claim
    /// whose answer was lost), read within `patience`; `false` when it cannot be read.
    async fn stands_as(&self, claim: &Record, patience: Patience) -> bool {
        let read = self.retrying(patience, || self.store.get(&claim.key)).await;
        matches!(read, Ok(Some(stored)) if decide::is_this_claim(&stored, claim))
    }

    /// Re-creates the record of a crashed attempt that TTL deleted while the identity's
    /// evidence still says IN_PROGRESS, as a takeover: the reconciler decides, not a blind run.
    pub(super) async fn adopt(
        &self,
        claim: &Record,
        invocation: &Invocation,
        orphan: Evidence,
        now: SystemTime,
    ) -> Result<AfterClaim, Error> {
        let key = &invocation.key;
        if !invocation
            .fingerprint
            .names(&orphan.fingerprint, orphan.created_at)
        {
            return Err(Error::PayloadConflict { key: key.clone() });
        }
        // The orphan's evidence is the operation's, under whatever key it was written. Its
        // steps went with its record: the re-created record says so, for every later takeover
        // (this one may stop before it settles anything).
        let record = decide::adoption(claim, &orphan);
        let adopted = match self
            .retrying(
                Patience::before_running(claim.lease.expires_at, invocation.deadline),
                || self.store.adopt(&record, &orphan, now),
            )
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
                let patience = Patience::last_try(invocation.deadline, self.clock.now());
                let _ = self
                    .retrying(patience, || self.store.shorten(target, now))
                    .await;
                return Err(err.into());
            }
        };
        match adopted {
            Claim::Acquired => {}
            Claim::Existing(existing) if decide::is_own_claim(&existing, &record) => {}
            Claim::Existing(existing) => {
                return Ok(AfterClaim::Answer(Box::new(existing)));
            }
            Claim::IdentityTaken(evidence) => {
                return Err(answer::identity_taken(invocation, evidence));
            }
        }
        warn!("adopted a crashed attempt whose record had expired");
        Ok(AfterClaim::Run(Held::TakenOver {
            attempt: 2,
            previous: Box::new(decide::orphaned_record(&record, &orphan)),
            adopted: true,
            reentered: false,
        }))
    }

    pub(super) fn new_claim(&self, invocation: &Invocation, now: SystemTime) -> Record {
        // An owned claim's token is its owner's, which every invocation of the owner re-enters;
        // any other is this invocation's alone.
        let token = match &invocation.owner {
            Some(owner) => owner.token().to_owned(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        decide::claim_record(invocation, token, now, self.config.retention())
    }
}
