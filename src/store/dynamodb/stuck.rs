//! Finding what waits for an operator or a takeover: IN_PROGRESS records past their lease,
//! INDETERMINATE records, and unsettled evidence whose record is gone, with bounded,
//! paginated reads (`idemctl stuck`, the scheduled stuck check).

use std::time::{Duration, SystemTime};

use super::DynamoDbStore;
use crate::error::StoreError;
use crate::record::{Evidence, Record, Status};

/// What [`DynamoDbStore::find_stuck`] found.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Stuck {
    /// IN_PROGRESS records past their lease and INDETERMINATE records, stuck longer than asked.
    pub records: Vec<Record>,
    /// Unsettled evidence (IN_PROGRESS, INDETERMINATE) whose record is gone or settled and
    /// expired, older than asked: an orphan, for an operator (`idemctl resolve --identity`).
    pub orphans: Vec<Evidence>,
    /// Pages read (each `Scan` page of either table).
    pub pages: u32,
    /// Items that did not decode, skipped.
    pub skipped: usize,
    /// Whether every page was read (`false`: the page budget ran out first; the figures are
    /// a lower bound).
    pub complete: bool,
}

impl Stuck {
    /// How many of the records are IN_PROGRESS past their lease (`Status::InProgress`) or
    /// INDETERMINATE (`Status::Indeterminate`).
    pub fn count(&self, status: Status) -> u64 {
        self.records
            .iter()
            .filter(|record| record.status == status)
            .count() as u64
    }

    /// How long the oldest of the records and orphans has waited at `now` (the reconciliation
    /// age); zero when none.
    pub fn oldest_wait(&self, now: SystemTime) -> Duration {
        self.records
            .iter()
            .filter_map(stuck_since)
            .chain(self.orphans.iter().map(|evidence| evidence.created_at))
            .map(|since| now.duration_since(since).unwrap_or_default())
            .max()
            .unwrap_or_default()
    }
}

/// Since when a record waits: an IN_PROGRESS one since its lease ran out, an INDETERMINATE one
/// since it became so (its settlement's time, else its claim's); `None` for the others.
pub fn stuck_since(record: &Record) -> Option<SystemTime> {
    match record.status {
        Status::InProgress => Some(record.lease.expires_at),
        Status::Indeterminate => Some(record.completed_at.unwrap_or(record.created_at)),
        _ => None,
    }
}

impl DynamoDbStore {
    /// What waits at `now` for longer than `older_than`: IN_PROGRESS records past their lease,
    /// INDETERMINATE records, and (with a uniqueness table) unsettled evidence whose record is
    /// gone. Reads at most `max_pages` `Scan` pages in all (each up to 1 MB; eventually
    /// consistent), then one `GetItem` per unsettled evidence older than `older_than` (its
    /// record, without the outcome's parts); `Stuck::complete` says whether it read every
    /// page. A record that does not decode is skipped and counted.
    ///
    /// Records are read as summaries ([`Self::scan_summary_page`], and a `GetItem` with the
    /// same projection): no outcome, manifest or step list is read or decompressed, so the
    /// check's memory is what the summaries take, however large or hostile what the records
    /// hold (a compression bomb in an outcome or a step is never opened).
    ///
    /// Cost: a `Scan` page bills one read unit per 8 KB read (eventually consistent), whatever
    /// the filter keeps, so a check of a table of `n` bytes costs about `n / 8 KB` read units,
    /// plus one per unsettled evidence.
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// use lambda_idempotency::record::Status;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let now = SystemTime::now();
    /// let stuck = store.find_stuck(now, Duration::from_secs(300), 100).await?;
    /// println!(
    ///     "{} in progress, {} indeterminate, {} orphans, oldest {:?}",
    ///     stuck.count(Status::InProgress),
    ///     stuck.count(Status::Indeterminate),
    ///     stuck.orphans.len(),
    ///     stuck.oldest_wait(now),
    /// );
    /// # Ok(()) }
    /// ```
    pub async fn find_stuck(
        &self,
        now: SystemTime,
        older_than: Duration,
        max_pages: u32,
    ) -> Result<Stuck, StoreError> {
        let old_enough = |since: SystemTime| {
            since
                .checked_add(older_than)
                .is_some_and(|limit| limit < now)
        };
        let mut found = Stuck {
            complete: true,
            ..Stuck::default()
        };
        let mut start = None;
        loop {
            if found.pages >= max_pages {
                found.complete = false;
                return Ok(found);
            }
            let (records, skipped, next) = self.scan_summary_page(start).await?;
            found.pages += 1;
            found.skipped += skipped;
            found.records.extend(
                records
                    .into_iter()
                    .filter(|record| stuck_since(record).is_some_and(old_enough)),
            );
            start = next;
            if start.is_none() {
                break;
            }
        }
        if self.uniqueness_table().is_none() {
            return Ok(found);
        }
        let mut start = None;
        loop {
            if found.pages >= max_pages {
                found.complete = false;
                return Ok(found);
            }
            let (unsettled, skipped, next) = self.scan_unsettled_evidence(start).await?;
            found.pages += 1;
            found.skipped += skipped;
            for evidence in unsettled {
                if !old_enough(evidence.created_at) {
                    continue;
                }
                // A record that does not decode is counted, not a reason to stop the check.
                match self.get_summary(&evidence.key).await {
                    Ok(record)
                        if record
                            .as_ref()
                            .is_none_or(|record| record.counts_as_absent(now)) =>
                    {
                        found.orphans.push(evidence);
                    }
                    Ok(_) => {}
                    Err(StoreError::CorruptRecord { .. }) => found.skipped += 1,
                    Err(err) => return Err(err),
                }
            }
            start = next;
            if start.is_none() {
                return Ok(found);
            }
        }
    }
}
