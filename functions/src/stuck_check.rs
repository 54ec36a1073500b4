//! The scheduled stuck check: what waits for an operator or a takeover (IN_PROGRESS records past
//! their lease, INDETERMINATE records, orphaned evidence) and how long the oldest has waited
//! (the reconciliation age), emitted as CloudWatch Embedded Metric Format gauges that the stack's
//! alarms watch. Bounded: at most `STUCK_MAX_PAGES` scan pages per run
//! ([`DynamoDbStore::find_stuck`], which says what that costs), each read as the records'
//! summaries only (a projection: no outcome, manifest or step list is read or decompressed),
//! so its memory follows the summaries, not what the records hold.

use std::time::{Duration, SystemTime};

use lambda_idempotency::record::Status;
use lambda_idempotency::store::{DynamoDbStore, Stuck};
use serde_json::Value;

use crate::metrics::{Gauge, gauges_document};

/// How long past its lease a record counts as stuck (seconds; default 300).
pub const OLDER_THAN_VAR: &str = "STUCK_OLDER_THAN_SECONDS";
/// The most scan pages one run reads (default 100: up to 100 MB of table).
pub const MAX_PAGES_VAR: &str = "STUCK_MAX_PAGES";
/// The longest [`OLDER_THAN_VAR`] takes: two weeks (longer, and the alarm says nothing for
/// longer than anyone waits on a stuck operation).
pub const MAX_OLDER_THAN_SECS: u64 = 14 * 24 * 3600;
/// The most pages [`MAX_PAGES_VAR`] takes.
pub const MAX_PAGES: u64 = 10_000;

/// What a run reads, from the function's environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long past its lease (or since it became INDETERMINATE) a record counts.
    pub older_than: Duration,
    /// The most scan pages one run reads.
    pub max_pages: u32,
}

impl Settings {
    /// From [`OLDER_THAN_VAR`] and [`MAX_PAGES_VAR`], with their defaults.
    ///
    /// # Errors
    /// When one is set but is not a whole number within its bound ([`MAX_OLDER_THAN_SECS`], [`MAX_PAGES`]).
    pub fn from_env() -> Result<Self, lambda_runtime::Error> {
        use crate::settings::bounded;
        Ok(Self {
            older_than: Duration::from_secs(bounded(OLDER_THAN_VAR, 300, MAX_OLDER_THAN_SECS)?),
            max_pages: u32::try_from(bounded(MAX_PAGES_VAR, 100, MAX_PAGES)?).unwrap_or(u32::MAX),
        })
    }
}

/// One run at `now`: the EMF document to print (one line of the function's log, which CloudWatch
/// turns into the gauges), also returned as the invocation's response.
///
/// # Errors
/// The store's, when a read fails.
pub async fn run(
    store: &DynamoDbStore,
    settings: Settings,
    function: &str,
    now: SystemTime,
) -> Result<Value, lambda_runtime::Error> {
    let stuck = store
        .find_stuck(now, settings.older_than, settings.max_pages)
        .await?;
    Ok(emf_document(function, &stuck, now))
}

/// The gauges as one Embedded Metric Format document, dimension `Function`.
pub fn emf_document(function: &str, stuck: &Stuck, now: SystemTime) -> Value {
    let gauge = |name, unit, value| Gauge { name, unit, value };
    gauges_document(
        function,
        &[
            gauge("StuckInProgress", "Count", stuck.count(Status::InProgress)),
            gauge("Indeterminate", "Count", stuck.count(Status::Indeterminate)),
            gauge("OrphanedEvidence", "Count", stuck.orphans.len() as u64),
            gauge(
                "ReconciliationAge",
                "Seconds",
                stuck.oldest_wait(now).as_secs(),
            ),
            gauge("StuckCheckIncomplete", "Count", u64::from(!stuck.complete)),
        ],
        now,
    )
}
