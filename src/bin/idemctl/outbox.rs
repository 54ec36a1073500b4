//! `idemctl outbox`: what waits in an outbox table, and a sweep on demand.
//!
//! `pending` lists the events not yet published, oldest first among those read (each of the
//! index's partitions gives its share of `--limit`), and `parked` the events their destination
//! refused, with the refusal; both read the table's sparse pending index only.
//! `sweep` does what the scheduled sweeper does: publishes again, under their ids, the events
//! pending longer than `--older-than`, and marks them (`published_by` = `sweeper`).

use std::time::{Duration, SystemTime};

use clap::Subcommand;
use lambda_idempotency::BoxError;
use lambda_idempotency::effects::{Destination, Destinations, Found, Outbox, OutboxMarks};
use lambda_idempotency::lambda::relay::Publisher;
use lambda_idempotency::lambda::relay::sweeper::Sweeper;
use lambda_idempotency::store::dynamodb_config;
use serde_json::json;

use super::show;

/// `idemctl outbox …`.
#[derive(Subcommand)]
pub(crate) enum OutboxCommand {
    /// List the events not yet published (oldest first among those read), committed more
    /// than --older-than ago.
    Pending {
        /// How long since its commit, e.g. 10m, 2h (0s: every pending event).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the events their destination refused, with the refusal.
    Parked {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Publish again, under their ids, the events pending longer than --older-than, and mark
    /// them published (what the scheduled sweeper does).
    Sweep {
        /// How long since its commit, e.g. 10m (0s: every pending event).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// The stack publishes through an EventBridge Pipe: hand each event back to the
        /// stream for the Pipe instead of publishing it to the destination its item names
        /// (where the Pipe's consumers do not listen).
        #[arg(long)]
        redrive: bool,
    },
    /// Put a parked event back among the pending ones (once its destination takes it: a
    /// grant added, a queue created), for the next sweep to publish.
    Unpark {
        /// The event id.
        #[arg(long)]
        id: String,
    },
}

/// Runs `command` on the outbox table `table`.
pub(crate) async fn run(command: OutboxCommand, table: Option<String>) -> Result<(), BoxError> {
    let table = table.ok_or("no outbox table: pass --outbox-table or set OUTBOX_TABLE")?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let client = aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&sdk));
    let marks = OutboxMarks::new(client, &Outbox::new(table));
    let now = SystemTime::now();
    match command {
        OutboxCommand::Pending {
            older_than,
            limit,
            json,
        } => {
            let before = now.checked_sub(older_than).unwrap_or(now) + Duration::from_millis(1);
            let found = marks.pending(before, limit).await?;
            list(&found, now, limit, json);
            summary(found.events.len(), limit, "pending", json);
        }
        OutboxCommand::Parked { limit, json } => {
            let found = marks.parked(limit).await?;
            list(&found, now, limit, json);
            summary(found.events.len(), limit, "parked", json);
        }
        OutboxCommand::Sweep {
            older_than,
            limit,
            redrive,
        } => {
            let sweeper = match redrive {
                true => Sweeper::redriving(marks),
                false => Sweeper::new(
                    Publisher::from_conf(&sdk).with_destinations(Destinations::from_env()?),
                    marks,
                ),
            };
            let report = sweeper.after(older_than).limit(limit).sweep(now).await?;
            println!("{report}");
            // A script (or an operator's shell) sees that some events are still pending.
            if report.failed > 0 {
                return Err(format!(
                    "{} events failed to publish and wait for a later sweep (or check the destinations' permissions)",
                    report.failed
                )
                .into());
            }
        }
        OutboxCommand::Unpark { id } => {
            if !marks.unpark(&id).await? {
                return Err(format!("{} is not parked", show::text(&id)).into());
            }
            println!("{} is pending again", show::text(&id));
        }
    }
    Ok(())
}

/// Prints how many were listed (`what`: pending or parked), and whether `--limit` cut the
/// list short; on stderr under `--json`, so that stdout stays one JSON object per line.
fn summary(found: usize, limit: usize, what: &str, json: bool) {
    let line = match found >= limit {
        true => format!("{limit} {what} listed: the --limit; more may wait (raise --limit)"),
        false => format!("{found} {what}"),
    };
    match json {
        true => eprintln!("{line}"),
        false => println!("{line}"),
    }
}

/// Prints what was `found`, escaped (an outbox holds what producers wrote), at most `limit`
/// events (a read gives each index partition at least one); the ids of unreadable items on
/// stderr.
fn list(found: &Found, now: SystemTime, limit: usize, json: bool) {
    for id in &found.unreadable {
        eprintln!("not an outbox event this idemctl reads: {}", show::text(id));
    }
    if !json {
        println!(
            "{:<11} {:<24} {:<12}  {:<64}  TARGET",
            "DESTINATION", "EVENT", "WAITING", "ID"
        );
    }
    // Oldest first across the index's partitions, which are each read oldest first.
    let mut events: Vec<_> = found.events.iter().collect();
    events.sort_by_key(|record| record.created_at);
    for record in events.into_iter().take(limit) {
        let (kind, target) = match &record.destination {
            Destination::EventBridge { bus, .. } => ("eventbridge", bus.as_str()),
            Destination::Sns { topic_arn } => ("sns", topic_arn.as_str()),
            Destination::Sqs { queue_url } => ("sqs", queue_url.as_str()),
            _ => ("other", ""),
        };
        let waiting = record
            .created_at
            .and_then(|at| now.duration_since(at).ok())
            .unwrap_or_default();
        if json {
            let line = json!({
                "event_id": record.id,
                "event": record.name,
                "destination": kind,
                "target": target,
                "waiting_seconds": waiting.as_secs(),
                "parked_reason": record.parked.as_ref().map(|(_, reason)| reason),
            });
            println!("{}", show::json(&line));
            continue;
        }
        println!(
            "{:<11} {:<24} {:<12}  {:<64}  {}",
            kind,
            show::text(&record.name),
            humantime::format_duration(Duration::from_secs(waiting.as_secs())).to_string(),
            show::text(&record.id),
            show::text(target)
        );
        if let Some((_, reason)) = &record.parked {
            println!("    refused: {}", show::text(reason));
        }
    }
}
