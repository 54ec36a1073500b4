//! The scheduled outbox sweeper: republishes, under their ids, the outbox events pending longer
//! than `OUTBOX_SWEEP_AFTER_SECONDS` (the stream never delivered them, or the relay's retries
//! ran out), and prints what it did and what waits as EMF gauges that the stack's alarms watch.
//! Bounded: at most `OUTBOX_SWEEP_LIMIT` events per run, found through the outbox's sparse
//! pending index (it reads what is pending, not the table).

use std::time::{Duration, SystemTime};

use lambda_idempotency::effects::{Outbox, OutboxMarks};
use lambda_idempotency::lambda::relay::Publisher;
use lambda_idempotency::lambda::relay::sweeper::{SweepReport, Sweeper};
use serde_json::Value;

use crate::checkout::OUTBOX_TABLE_VAR;
use crate::metrics::{Gauge, gauges_document};

/// How long an event is pending before the sweeper republishes it (seconds; default 600).
pub const SWEEP_AFTER_VAR: &str = "OUTBOX_SWEEP_AFTER_SECONDS";
/// The most events one run republishes (default 1000).
pub const SWEEP_LIMIT_VAR: &str = "OUTBOX_SWEEP_LIMIT";
/// How the sweeper publishes again: `publish` (itself, as the relay: the default) or
/// `redrive` (hands each event back to the stream, for the Pipe).
pub const SWEEP_MODE_VAR: &str = "OUTBOX_SWEEP_MODE";
/// The longest threshold [`SWEEP_AFTER_VAR`] takes: a week (an event pending longer than the
/// stream's 24 hours waits for the sweeper alone).
pub const MAX_SWEEP_AFTER_SECS: u64 = 7 * 24 * 3600;
/// The most events one sweep takes ([`SWEEP_LIMIT_VAR`]).
pub const MAX_SWEEP_LIMIT: u64 = 100_000;
/// The most parked events one run counts (the `ParkedEvents` gauge stops there).
pub const PARKED_COUNTED: usize = 100;

/// The sweeper and its outbox, from the function's environment.
#[derive(Debug, Clone)]
pub struct OutboxSweeper {
    sweeper: Sweeper,
    marks: OutboxMarks,
}

impl OutboxSweeper {
    /// From `OUTBOX_TABLE`, [`SWEEP_MODE_VAR`], [`SWEEP_AFTER_VAR`] and [`SWEEP_LIMIT_VAR`],
    /// writing marks with `client` and publishing with `publisher` (in `publish` mode).
    ///
    /// # Errors
    /// When `OUTBOX_TABLE` is not set, the mode is neither `publish` nor `redrive`, or a
    /// setting is not a whole number within its bound ([`MAX_SWEEP_AFTER_SECS`], [`MAX_SWEEP_LIMIT`]).
    pub fn from_env(
        client: aws_sdk_dynamodb::Client,
        publisher: Publisher,
    ) -> Result<Self, lambda_runtime::Error> {
        use crate::settings::{bounded, required};
        let table = required(OUTBOX_TABLE_VAR, "the outbox table's name")?;
        let marks = OutboxMarks::new(client, &Outbox::new(table));
        let sweeper = match std::env::var(SWEEP_MODE_VAR).as_deref().map(str::trim) {
            Err(_) | Ok("publish") => Sweeper::new(publisher, marks.clone()),
            Ok("redrive") => Sweeper::redriving(marks.clone()),
            Ok(_) => return Err(format!("{SWEEP_MODE_VAR} is `publish` or `redrive`").into()),
        };
        let sweeper = sweeper
            .after(Duration::from_secs(bounded(
                SWEEP_AFTER_VAR,
                600,
                MAX_SWEEP_AFTER_SECS,
            )?))
            .limit(
                usize::try_from(bounded(SWEEP_LIMIT_VAR, 1000, MAX_SWEEP_LIMIT)?)
                    .unwrap_or(usize::MAX),
            );
        Ok(Self { sweeper, marks })
    }

    /// One run at `now`: the EMF document to print (the function's log line CloudWatch turns
    /// into the gauges), also the invocation's response.
    ///
    /// # Errors
    /// When the pending index cannot be read.
    pub async fn run(
        &self,
        function: &str,
        now: SystemTime,
    ) -> Result<Value, lambda_runtime::Error> {
        let report = self.sweeper.sweep(now).await?;
        let parked = self.marks.parked(PARKED_COUNTED).await?.events.len();
        Ok(emf_document(function, &report, parked, now))
    }
}

/// The gauges as one Embedded Metric Format document, dimension `Function`.
pub fn emf_document(function: &str, report: &SweepReport, parked: usize, now: SystemTime) -> Value {
    let gauge = |name, unit, value| Gauge { name, unit, value };
    gauges_document(
        function,
        &[
            gauge("OutboxRepublished", "Count", report.republished),
            gauge("OutboxParkedNow", "Count", report.parked),
            gauge("OutboxSweepFailed", "Count", report.failed),
            gauge(
                "OutboxParkedEvents",
                "Count",
                u64::try_from(parked).unwrap_or(u64::MAX),
            ),
            gauge("OutboxSweepFound", "Count", report.found),
            gauge("OutboxUnreadable", "Count", report.unreadable),
            gauge(
                "OutboxPublishLag",
                "Seconds",
                report.max_lag.map_or(0, |lag| lag.as_secs()),
            ),
            gauge(
                "OutboxOldestPendingAge",
                "Seconds",
                report.oldest_pending_age.map_or(0, |age| age.as_secs()),
            ),
        ],
        now,
    )
}
