//! The tenant compatibility rule, where the deployer turns it on
//! ([`ConfigBuilder::keyed_by_0_4_before`](crate::config::ConfigBuilder::keyed_by_0_4_before)):
//! 0.4 never read the tenant Lambda's tenant isolation mode gives an invocation, so it keyed
//! every tenant's operations (and their identities' evidence) as the policy alone did. 0.5
//! keys them under that tenant. A redelivery that spans the upgrade must not run again, and
//! must not be answered with what may be another tenant's result.
//!
//! Before claiming a key that Lambda's tenant changed, and only when no live record stands
//! under it, the engine reads the record (and, with a business identity, the evidence) 0.4
//! would have written for the same event. One created before the cut-over, of this very
//! intent, answers the invocation by its state alone: applied, failed, still running, held.
//! Its result is never returned: a record 0.4 wrote does not say which tenant wrote it. One of
//! another intent, or created after the cut-over, is another operation's and is left alone.

use std::time::SystemTime;

use tracing::info;

use super::{Idempotency, erased};
use crate::error::Error;
use crate::execution::Invocation;
use crate::record::{Evidence, Status};
use crate::store::Store;

impl Idempotency {
    /// `Err` with the answer when 0.4 recorded this operation, before the cut-over, under the
    /// key it derived without Lambda's tenant; `Ok` to claim as usual.
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
        if let Some(record) = erased(self.store.get(&invocation.key)).await?
            && !record.counts_as_absent(now)
        {
            return Ok(());
        }
        let of_this_intent = |created_at: SystemTime, fingerprint| {
            created_at < cutover && invocation.fingerprint.names(fingerprint, created_at)
        };
        let seen = match erased(self.store.get(before)).await? {
            Some(record)
                if !record.counts_as_absent(now)
                    && of_this_intent(record.created_at, &record.fingerprint) =>
            {
                Some((record.status, record.created_at, record.completed_at))
            }
            _ => match self.evidence_keyed_by_0_4(invocation).await? {
                Some(evidence)
                    if evidence.key == *before
                        && of_this_intent(evidence.created_at, &evidence.fingerprint) =>
                {
                    Some((evidence.status, evidence.created_at, evidence.completed_at))
                }
                _ => None,
            },
        };
        let Some((status, created_at, completed_at)) = seen else {
            return Ok(());
        };
        info!(
            key = before.short(),
            status = %status,
            "0.4 recorded this operation without Lambda's tenant: answered by its state"
        );
        let key = invocation.key.clone();
        Err(match status {
            Status::Indeterminate => Error::Indeterminate { key },
            status => Error::KeyExpiredConflict {
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
            },
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
        Ok(erased(self.store.evidence(&earlier)).await?)
    }
}
