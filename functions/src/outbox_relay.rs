//! The outbox relay: the outbox table's stream in, every committed event published in batches
//! under its event id and marked published in the outbox table (`OUTBOX_TABLE`), and one EMF
//! document per batch: how many it published, parked and left to retry, and the longest time
//! from an event's commit to its publication.

use std::time::SystemTime;

use lambda_idempotency::effects::{Outbox, OutboxMarks};
use lambda_idempotency::lambda::relay::{Publisher, Relay, RelayReport, relay};
use serde_json::Value;

use crate::checkout::OUTBOX_TABLE_VAR;
use crate::metrics::{Gauge, gauges_document};

/// The relay of the outbox named by `OUTBOX_TABLE`, marking with `client` and publishing with
/// `publisher`.
///
/// # Errors
/// When `OUTBOX_TABLE` is not set.
pub fn from_env(
    client: aws_sdk_dynamodb::Client,
    publisher: Publisher,
) -> Result<Relay, lambda_runtime::Error> {
    let table = crate::settings::required(OUTBOX_TABLE_VAR, "the outbox table's name")?;
    Ok(relay(
        publisher,
        OutboxMarks::new(client, &Outbox::new(table)),
    ))
}

/// One batch's figures as an Embedded Metric Format document, dimension `Function`.
pub fn emf_document(function: &str, report: &RelayReport, now: SystemTime) -> Value {
    let gauge = |name, unit, value| Gauge { name, unit, value };
    gauges_document(
        function,
        &[
            gauge("OutboxPublished", "Count", report.published),
            gauge("OutboxAlreadyPublished", "Count", report.already),
            gauge("OutboxParkedNow", "Count", report.parked),
            gauge(
                "OutboxRelayFailed",
                "Count",
                u64::try_from(report.failed.len()).unwrap_or(u64::MAX),
            ),
            gauge(
                "OutboxPublishLag",
                "Seconds",
                report.max_lag.map_or(0, |lag| lag.as_secs()),
            ),
        ],
        now,
    )
}
