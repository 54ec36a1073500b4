//! An in-process store with the same semantics as the DynamoDB store.

#[cfg(feature = "testing")]
mod transactional;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use futures_util::future::BoxFuture;

use crate::defects;
use crate::error::StoreError;
use crate::key::{OperationKey, elsewhere};

use crate::record::{Evidence, Lease, Record, Settlement, Status, StepRecord, epoch_millis};
use crate::store::{Answer, Claim, Fence, Request, Store, Target, TransactionalStore};

/// Records in maps behind one mutex; clones share them.
///
/// For unit tests, the demo and single-process use. It never forgets a record by itself:
/// like DynamoDB before TTL deletion, it keeps expired records and treats them as absent.
/// [`MemoryStore::sweep_expired`] deletes them, as TTL eventually does. Evidence of business
/// identities is never swept.
///
/// ```
/// use lambda_idempotency::store::MemoryStore;
/// let store = MemoryStore::new();
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    tables: Arc<Mutex<Tables>>,
    /// The handler's own tables, which its transactional writes go to (feature `testing`).
    #[cfg(feature = "testing")]
    own_tables: Option<transactional::OwnTables>,
}

#[derive(Debug, Default)]
struct Tables {
    records: HashMap<OperationKey, Record>,
    evidence: HashMap<String, Evidence>,
}

impl Tables {
    /// The record of `key` unless it counts as absent at `now` ([`Record::counts_as_absent`]).
    fn live(&self, key: &OperationKey, now: SystemTime) -> Option<&Record> {
        self.records
            .get(key)
            .filter(|existing| !existing.counts_as_absent(now))
    }

    /// `None` if the target's guard admits its record and its evidence (if any) is this
    /// operation's; else the [`Fence::Lost`] to answer.
    fn fence(&self, target: Target<'_>) -> Result<Option<Fence>, StoreError> {
        match self.records.get(target.key) {
            Some(record) if target.guard.admits(record) => {
                if let Some(identity) = target.identity {
                    let owned = self
                        .evidence
                        .get(identity)
                        .is_some_and(|evidence| evidence.key == *target.key);
                    if !owned {
                        return Err(StoreError::evidence_not_owned(target.key));
                    }
                }
                Ok(None)
            }
            current => Ok(Some(Fence::Lost {
                current: current.cloned().map(Box::new),
            })),
        }
    }

    /// Moves the target's record (and its evidence) to `settlement`.
    fn settle(&mut self, target: Target<'_>, settlement: &Settlement) {
        if let Some(record) = self.records.get_mut(target.key) {
            record.status = settlement.status;
            record.outcome.clone_from(&settlement.outcome);
            record.expires_at = settlement.expires_at;
            record.completed_at = Some(settlement.completed_at);
            if let Some(steps) = &settlement.steps {
                record.steps.clone_from(steps);
                record.steps_version += 1;
            }
            if settlement.audit.is_some() {
                record.audit.clone_from(&settlement.audit);
            }
        }
        if settlement.releases_identity {
            if let Some(identity) = target.identity {
                self.evidence.remove(identity);
            }
        } else if let Some(evidence) = target
            .identity
            .and_then(|identity| self.evidence.get_mut(identity))
        {
            evidence.status = settlement.status;
            evidence.result_ref.clone_from(&settlement.result_ref);
            evidence.completed_at = Some(settlement.completed_at);
            evidence.audit.clone_from(&settlement.audit);
        }
    }

    /// Writes the target's record's steps as `steps`.
    fn record_steps(&mut self, target: Target<'_>, steps: &[StepRecord]) {
        if let Some(record) = self.records.get_mut(target.key) {
            record.steps = steps.to_vec();
            record.steps_version += 1;
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records it holds, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    /// Deletes the records expired at `now`, as DynamoDB TTL eventually does; returns how many.
    pub fn sweep_expired(&self, now: SystemTime) -> usize {
        let records = &mut self.lock().records;
        let before = records.len();
        records.retain(|_, record| !record.is_expired(now));
        before - records.len()
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `write` if the target's guard admits its record and its evidence (if any) is
    /// this operation's.
    fn fenced(
        &self,
        target: Target<'_>,
        write: impl FnOnce(&mut Tables),
    ) -> Result<Fence, StoreError> {
        let mut tables = self.lock();
        if let Some(lost) = tables.fence(target)? {
            return Ok(lost);
        }
        write(&mut tables);
        Ok(Fence::Held)
    }
}

/// The model checker's view (src/model): a store built from a state, and read back into one.
#[cfg(all(test, feature = "testing"))]
impl MemoryStore {
    /// A store holding `records` and `evidence` (keyed by identity).
    pub(crate) fn holding(records: Vec<Record>, evidence: Vec<(String, Evidence)>) -> Self {
        let tables = Tables {
            records: records.into_iter().map(|r| (r.key.clone(), r)).collect(),
            evidence: evidence.into_iter().collect(),
        };
        Self {
            tables: Arc::new(Mutex::new(tables)),
            ..Self::default()
        }
    }

    /// What it holds: records and evidence, each sorted by key.
    pub(crate) fn contents(&self) -> (Vec<Record>, Vec<(String, Evidence)>) {
        let tables = self.lock();
        let mut records: Vec<Record> = tables.records.values().cloned().collect();
        records.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        let mut evidence: Vec<(String, Evidence)> = tables
            .evidence
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        evidence.sort_by(|a, b| a.0.cmp(&b.0));
        (records, evidence)
    }
}

impl Store for MemoryStore {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move { self.apply(request) })
    }

    /// `Some` for a store given the handler's own tables ([`MemoryStore::with_tables`],
    /// feature `testing`), else `None`: it has nowhere to commit DynamoDB writes.
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        #[cfg(feature = "testing")]
        if self.own_tables.is_some() {
            return Some(self);
        }
        None
    }
}

/// Each request applied under the tables' lock, at once: the memory store does not wait.
impl MemoryStore {
    fn apply(&self, request: Request<'_>) -> Result<Answer, StoreError> {
        Ok(match request {
            Request::Claim { record, now } => Answer::Claim(self.apply_claim(record, now)?),
            Request::Adopt {
                record,
                orphan,
                now,
            } => Answer::Claim(self.apply_adopt(record, orphan, now)?),
            Request::TakeOver {
                previous,
                lease,
                expires_at,
                now,
            } => Answer::Fence(self.apply_take_over(previous, lease, expires_at, now)?),
            Request::Shorten { target, until } => Answer::Fence(self.apply_shorten(target, until)?),
            Request::Settle { target, settlement } => {
                Answer::Fence(self.fenced(target, |tables| tables.settle(target, settlement))?)
            }
            Request::RecordSteps { target, steps } => {
                Answer::Fence(self.apply_record_steps(target, steps)?)
            }
            Request::Release { target } => Answer::Fence(self.apply_release(target)?),
            Request::ReleaseByOperator {
                seen,
                evidence,
                released,
                now,
            } => Answer::Written(self.apply_release_by_operator(seen, evidence, released, now)?),
            Request::SettleEvidence {
                seen,
                settlement,
                now,
            } => Answer::Written(self.apply_settle_evidence(seen, settlement, now)?),
            Request::Get { key } => Answer::Record(self.lock().records.get(key).cloned()),
            Request::Evidence { identity } => {
                Answer::Evidence(self.lock().evidence.get(identity).cloned())
            }
        })
    }

    fn apply_claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        let mut tables = self.lock();
        if let Some(existing) = tables.live(&record.key, now) {
            return Ok(Claim::Existing(existing.clone()));
        }
        if let Some(identity) = &record.identity {
            if let Some(evidence) = tables.evidence.get(identity) {
                return Ok(Claim::IdentityTaken(evidence.clone()));
            }
            // Evidence of this scope kept in another form (under another identity scope before
            // a deploy changed it, or before 0.2) refuses the claim, as on DynamoDB with its
            // default check.
            if let Some(elsewhere) = evidence_elsewhere(&tables.evidence, identity, &record.key) {
                return Ok(Claim::IdentityTaken(elsewhere.clone()));
            }
            if !defects::is_reintroduced(defects::IDENTITY_NOT_CLAIMED) {
                tables
                    .evidence
                    .insert(identity.clone(), Evidence::of_claim(record, identity));
            }
        }
        tables.records.insert(record.key.clone(), record.clone());
        Ok(Claim::Acquired)
    }

    fn apply_adopt(
        &self,
        record: &Record,
        orphan: &Evidence,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        let mut tables = self.lock();
        if let Some(existing) = tables.live(&record.key, now) {
            return Ok(Claim::Existing(existing.clone()));
        }
        let Some(identity) = record.identity.as_deref() else {
            return Err(StoreError::CorruptRecord {
                key_short: record.key.short().to_owned(),
                reason: "an adopted claim must name its business identity".into(),
            });
        };
        match tables.evidence.get(identity) {
            Some(standing) if is_orphan(standing, orphan) => {
                tables.records.insert(record.key.clone(), record.clone());
                Ok(Claim::Acquired)
            }
            Some(standing) => Ok(Claim::IdentityTaken(standing.clone())),
            // Released meanwhile (by an operator): a concurrent change, as on DynamoDB.
            None => Err(StoreError::Contention { operation: "adopt" }),
        }
    }

    fn apply_take_over(
        &self,
        previous: &Record,
        lease: &Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> Result<Fence, StoreError> {
        let mut tables = self.lock();
        match tables.records.get_mut(&previous.key) {
            Some(record)
                if record.lease.token == previous.lease.token
                    && record.lease_is_takeable(now)
                    && record.steps_version == previous.steps_version
                    && record.steps == previous.steps =>
            {
                record.lease = lease.clone();
                record.expires_at = expires_at;
                Ok(Fence::Held)
            }
            current => Ok(Fence::Lost {
                current: current.map(|record| Box::new(record.clone())),
            }),
        }
    }

    fn apply_shorten(&self, target: Target<'_>, until: SystemTime) -> Result<Fence, StoreError> {
        // The record alone, as on DynamoDB: the evidence is not touched, so not checked.
        let target = Target {
            identity: None,
            ..target
        };
        if defects::is_reintroduced(defects::GIVE_BACK_UNFENCED)
            && let Some(record) = self.lock().records.get_mut(target.key)
        {
            record.lease.expires_at = until;
        }
        self.fenced(target, |tables| {
            if let Some(record) = tables.records.get_mut(target.key) {
                record.lease.expires_at = record.lease.expires_at.min(until);
            }
        })
    }

    fn apply_record_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
    ) -> Result<Fence, StoreError> {
        // The record alone, as on DynamoDB.
        let target = Target {
            identity: None,
            ..target
        };
        self.fenced(target, |tables| tables.record_steps(target, steps))
    }

    fn apply_release(&self, target: Target<'_>) -> Result<Fence, StoreError> {
        self.fenced(target, |tables| {
            tables.records.remove(target.key);
            if let Some(identity) = target.identity {
                tables.evidence.remove(identity);
            }
        })
    }

    fn apply_release_by_operator(
        &self,
        seen: Option<&Record>,
        evidence: Option<&Evidence>,
        released: &Record,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        let mut tables = self.lock();
        let record_as_seen = match (tables.records.get(&released.key), seen) {
            (Some(current), Some(seen)) => {
                current.status == seen.status
                    && current.lease.token == seen.lease.token
                    && current.lease.attempt == seen.lease.attempt
                    && current.steps_version == seen.steps_version
                    && (current.status != Status::InProgress || current.lease.is_expired(now))
            }
            (current, None) => current.is_none_or(|current| current.counts_as_absent(now)),
            (None, Some(_)) => false,
        };
        let evidence_as_seen = evidence.is_none_or(|seen| {
            tables
                .evidence
                .get(&seen.identity)
                .is_some_and(|current| is_as_seen(current, seen))
        });
        if !(record_as_seen && evidence_as_seen) {
            return Ok(false);
        }
        if let Some(seen) = evidence {
            tables.evidence.remove(&seen.identity);
        }
        tables
            .records
            .insert(released.key.clone(), released.clone());
        Ok(true)
    }

    fn apply_settle_evidence(
        &self,
        seen: &Evidence,
        settlement: &Settlement,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        let mut tables = self.lock();
        let record_gone = tables
            .records
            .get(&seen.key)
            .is_none_or(|record| record.counts_as_absent(now));
        if !record_gone {
            return Ok(false);
        }
        match tables.evidence.get_mut(&seen.identity) {
            Some(current) if is_as_seen(current, seen) => {
                current.status = settlement.status;
                current.result_ref.clone_from(&settlement.result_ref);
                current.completed_at = Some(settlement.completed_at);
                current.audit.clone_from(&settlement.audit);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// Whether `standing` evidence is still the `orphan` an adoption expects: as seen, and
/// IN_PROGRESS.
fn is_orphan(standing: &Evidence, orphan: &Evidence) -> bool {
    standing.status == Status::InProgress && is_as_seen(standing, orphan)
}

/// Whether `standing` evidence is still as `seen`: the same operation and status, created at
/// the same moment (millisecond resolution, as stored).
fn is_as_seen(standing: &Evidence, seen: &Evidence) -> bool {
    standing.key == seen.key
        && standing.status == seen.status
        && epoch_millis(standing.created_at) == epoch_millis(seen.created_at)
}

/// Evidence of an operation in the scope of `evidence_key` kept in another form
/// ([`elsewhere`]): what the DynamoDB store's claim checks too.
fn evidence_elsewhere<'a>(
    evidence: &'a HashMap<String, Evidence>,
    evidence_key: &str,
    key: &OperationKey,
) -> Option<&'a Evidence> {
    elsewhere(evidence_key, key).into_iter().find_map(|place| {
        evidence
            .get(&place.evidence_key)
            .filter(|found| place.refusing.includes(&found.key))
    })
}
