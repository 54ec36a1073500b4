//! The 0.4 key rule, where the deployer turns it on
//! ([`ConfigBuilder::keyed_by_0_4_before`](crate::config::ConfigBuilder::keyed_by_0_4_before)):
//! 0.4 read neither the tenant Lambda's tenant isolation mode gives an invocation, the
//! producer of an SQS message, a Kinesis record's stream nor an EventBridge event's source and
//! account, so it keyed every tenant's and producer's operations (and their
//! identities' evidence) alike. 0.5 keys them apart. 0.4 also keyed a quoted HTTP
//! `Idempotency-Key` with its quotes; 0.5 reads the Structured Field String inside. A redelivery that spans the upgrade must
//! not run again, and must not be answered with what may be another tenant's result.
//!
//! Before claiming a key that differs from 0.4's, and only when no live record stands under
//! it, the engine reads what 0.4 would have written for the same event, and, with the 0.1
//! rule on too ([`ConfigBuilder::rfc8785_records_before`](crate::config::ConfigBuilder::rfc8785_records_before)),
//! what 0.1 would have (0.4's material with its integers past ±2^53 read as doubles), for
//! what 0.1 wrote before that rule's cut-over. It applies only to
//! what 0.4 wrote: a record or evidence that names no key rule (0.5 writes one) and was created
//! before the cut-over.
//! - A record of this very intent answers by its state alone, never with its result (0.4 did
//!   not record whose it was): applied or failed, still running, or held for an operator (a
//!   crashed 0.4 attempt is never re-run blind under the new key). A record of another intent
//!   is another operation's and is left alone.
//! - With a business identity, the evidence 0.4 kept answers as it did under 0.4: this
//!   operation's by its state; another operation's as the identity's holder (redacted), since
//!   0.4 could not tell whose it was. Evidence is permanent: keep the rule on for as long as
//!   such evidence must protect its identity.

use std::time::SystemTime;

use tracing::{info, warn};

use super::Idempotency;
use crate::error::Error;
use crate::execution::Invocation;
use crate::key::{Fingerprint, KeyRule};
use crate::record::{Evidence, Status};
use crate::store::StoreExt;

impl Idempotency {
    /// `Err` with the answer when 0.4 recorded this operation (or its identity), before the
    /// cut-over, under the key it derived; `Ok` to claim as usual.
    pub(super) async fn check_keyed_by_0_4(
        &self,
        invocation: &Invocation,
        now: SystemTime,
    ) -> Result<(), Error> {
        let (Some(cutover), Some(before)) = (
            self.config.keyed_by_0_4_before(),
            invocation.key_by_0_4.as_ref(),
        ) else {
            return Ok(());
        };
        if let Some(record) = self.store.get(&invocation.key).await?
            && !record.counts_as_absent(now)
        {
            return Ok(());
        }
        // Written by 0.4 or before: it names no key rule (0.5 writes one) and predates the
        // cut-over.
        let written_before =
            |cutover: SystemTime, created_at: SystemTime, fingerprint: &Fingerprint| {
                created_at < cutover && fingerprint.rule() == KeyRule::Unstated
            };
        let by_0_4 = |created_at, fingerprint: &Fingerprint| {
            written_before(cutover, created_at, fingerprint)
        };
        let of_this_intent = |created_at: SystemTime, fingerprint: &Fingerprint| {
            invocation.fingerprint.names(fingerprint, created_at)
        };
        // Where 0.4 keyed the event, then, with the 0.1 rule on, where 0.1 keyed what 0.4
        // read (its integers past ±2^53 as doubles): neither read Lambda's tenant nor an SQS
        // producer, so a redelivery across a 0.1 → 0.5 upgrade finds 0.1's record there.
        let by_0_1 = self
            .config
            .rfc8785_records_before()
            .zip(invocation.key_by_0_1_as_0_4.as_ref())
            .map(|(rfc8785_before, key)| (key, rfc8785_before.min(cutover)));
        let key = invocation.key.clone();
        for (stored_under, cutover) in std::iter::once((before, cutover)).chain(by_0_1) {
            let Some(record) = self.store.get(stored_under).await? else {
                continue;
            };
            if record.counts_as_absent(now)
                || !written_before(cutover, record.created_at, &record.fingerprint)
                || !of_this_intent(record.created_at, &record.fingerprint)
            {
                continue;
            }
            info!(
                key = stored_under.short(),
                status = %record.status,
                "an earlier version recorded this operation under the key it derived: answered by its state"
            );
            return Err(match record.status {
                Status::InProgress if !record.lease.is_expired(now) => Error::AlreadyInProgress {
                    key,
                    attempt: record.lease.attempt,
                    retry_after: record
                        .lease
                        .expires_at
                        .duration_since(now)
                        .unwrap_or_default(),
                },
                // A crashed 0.4 attempt: held for an operator (`idemctl resolve` on its key,
                // which the error names), never re-run blind under the new key.
                Status::InProgress | Status::Indeterminate => {
                    warn!(
                        key = stored_under.short(),
                        "a crashed attempt of an earlier version holds this operation under the key it derived: resolve that key"
                    );
                    Error::Indeterminate {
                        key: stored_under.clone(),
                    }
                }
                status => settled_as(invocation, status, record.created_at, record.completed_at),
            });
        }
        let Some(evidence) = self.evidence_keyed_by_0_4(invocation).await? else {
            return Ok(());
        };
        if !by_0_4(evidence.created_at, &evidence.fingerprint) {
            return Ok(());
        }
        info!(
            key = before.short(),
            status = %evidence.status,
            "0.4 kept this identity's evidence where it kept it: answered by its state"
        );
        if evidence.key != *before || !of_this_intent(evidence.created_at, &evidence.fingerprint) {
            // Another operation held the identity under 0.4, which could not tell tenants or
            // producers apart: it keeps holding it, and the caller learns only its state.
            return Err(Error::KeyExpiredConflict {
                key,
                evidence: Box::new(evidence.redacted()),
            });
        }
        Err(match evidence.status {
            // Its record gone (TTL) and never settled: held for an operator.
            Status::InProgress | Status::Indeterminate => Error::Indeterminate { key },
            status => settled_as(
                invocation,
                status,
                evidence.created_at,
                evidence.completed_at,
            ),
        })
    }

    /// The evidence 0.4 kept for the invocation's identity, where it is not where 0.5 keeps it.
    async fn evidence_keyed_by_0_4(
        &self,
        invocation: &Invocation,
    ) -> Result<Option<Evidence>, Error> {
        let (Some(identity), Some(before)) = (
            invocation.identity.as_deref(),
            invocation.key_by_0_4.as_ref(),
        ) else {
            return Ok(None);
        };
        let earlier = invocation.identity_scope.evidence_key(identity, before);
        if Some(&earlier) == invocation.evidence_key().as_ref() {
            return Ok(None);
        }
        Ok(self.store.evidence(&earlier).await?)
    }
}

/// The answer for this very operation, settled as `status` by 0.4: its state, never its result.
fn settled_as(
    invocation: &Invocation,
    status: Status,
    created_at: SystemTime,
    completed_at: Option<SystemTime>,
) -> Error {
    let key = invocation.key.clone();
    Error::KeyExpiredConflict {
        evidence: Box::new(Evidence {
            identity: invocation.identity.clone().unwrap_or_default(),
            key: key.clone(),
            fingerprint: invocation.fingerprint.clone(),
            status,
            result_ref: None,
            created_at,
            completed_at,
            audit: None,
        }),
        key,
    }
}
