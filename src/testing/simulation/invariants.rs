//! DESIGN's invariants on the store as it stands after a step: a live lease is never
//! overwritten nor deleted by anyone but its holder, a recorded outcome is never lost or
//! changed within retention, and a record and its evidence tell one story.

use std::time::{Duration, SystemTime};

use super::actors::MAX_SKEW;
use super::world::World;
use crate::record::{Record, Status};
use crate::store::Store;

impl<S: Store + Clone> World<S> {
    /// A live lease replaced by another claim, or deleted by anyone but its holder (only a
    /// step that delivered, resumed or resolved the operation may see its lease go: the holder
    /// giving back its claim).
    pub(super) fn lease_overwritten(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let before = self.last_seen[op].as_ref()?;
        let was_live = before.status == Status::InProgress
            && before.lease.expires_at > now + MAX_SKEW + Duration::from_secs(1);
        if !was_live {
            return None;
        }
        match record {
            Some(after) if after.lease.token != before.lease.token => Some(format!(
                "operation {op}: the live lease of attempt {} was overwritten by attempt {}",
                before.lease.attempt, after.lease.attempt
            )),
            None if !self.touched[op] => Some(format!(
                "operation {op}: the live lease of attempt {} disappeared in a step that did not touch it",
                before.lease.attempt
            )),
            _ => None,
        }
    }

    /// A recorded outcome gone or changed within its retention.
    pub(super) fn outcome_lost(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let seen = self.completed_seen[op].as_ref()?;
        if seen.expires_at <= now + MAX_SKEW + Duration::from_secs(1) {
            return None;
        }
        let kept = record.is_some_and(|record| {
            record.status == Status::Completed && record.outcome == seen.outcome
        });
        (!kept).then(|| {
            format!("operation {op}: its recorded outcome was lost or changed within retention")
        })
    }

    /// A record and the evidence of the identity it recorded at its claim that tell different
    /// stories.
    pub(super) async fn evidence_disagrees(
        &self,
        op: usize,
        record: Option<&Record>,
        now: SystemTime,
    ) -> Option<String> {
        let record = record?;
        let identity = record.identity.as_deref()?;
        let settled_and_expired =
            matches!(record.status, Status::Completed | Status::Failed) && record.expires_at < now;
        if settled_and_expired {
            return None;
        }
        let evidence = self.store.inner().evidence(identity).await.ok().flatten();
        match evidence {
            Some(evidence) if evidence.key == record.key && evidence.status == record.status => {
                None
            }
            other => Some(format!(
                "operation {op}: its record is {} but the evidence of its identity is {:?}",
                record.status,
                other.map(|evidence| evidence.status)
            )),
        }
    }
}
