//! The sweeper: republishes the outbox events that the stream did not deliver (the relay's
//! retries ran out, the stream's 24 hours passed, a Pipe dropped one), found through the
//! table's sparse pending index, under their original ids.
//!
//! Run it on a schedule (template.yaml's `OutboxSweeperFunction`, every five minutes) or by
//! hand (`idemctl outbox sweep`). Together with the relay, every committed event is published at
//! least once: an event stays pending, without a TTL, until something marks it published. An
//! event its destination refuses is parked and never blocks the others; one whose publish
//! fails (a queue deleted, a grant missing) stays pending, moves to its partition's retry
//! partition of the index, and is tried again after a wait that doubles with each failure, so
//! that it never stands before the events no sweep has tried; after [`MAX_SWEEP_FAILURES`]
//! failed sweeps it is parked too, for an operator. On the Pipe path
//! ([`Sweeper::redriving`]) the sweeper hands each pending event back to the stream instead, so
//! that the Pipe publishes it exactly as it publishes every event.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::SystemTime;
//! use lambda_idempotency::lambda::relay::{Publisher, sweeper::Sweeper};
//! use lambda_idempotency::effects::{Destinations, Outbox, OutboxMarks};
//!
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let marks = OutboxMarks::new(aws_sdk_dynamodb::Client::new(&config), &Outbox::new("outbox"));
//! let publisher = Publisher::from_conf(&config).with_destinations(Destinations::from_env()?);
//! let report = Sweeper::new(publisher, marks)
//!     .sweep(SystemTime::now())
//!     .await?;
//! println!("{report}");
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::warn;

use super::{PublishError, Publisher, Relayed, deliver_all};
use crate::effects::OutboxRecord;
use crate::effects::outbox_marks::{MAX_BACKOFF_DOUBLINGS, OutboxError, OutboxMarks, PublishedBy};
use crate::error::BoxError;

/// How long an event may be pending before the sweeper republishes it, by default: the relay
/// publishes within seconds, and retries a failed publish for longer than this only when its
/// destination keeps failing.
pub const DEFAULT_SWEEP_AFTER: Duration = Duration::from_secs(10 * 60);

/// The most events one sweep republishes, by default (a scheduled run's time is bounded).
pub const DEFAULT_SWEEP_LIMIT: usize = 1000;

/// How many sweeps fail to publish one event before it is parked (with the waits between them,
/// which double from the sweeper's threshold: about 11 hours at the default ten minutes): a
/// destination that failed that long (a queue deleted, a grant missing) needs an operator.
pub const MAX_SWEEP_FAILURES: u32 = 7;

/// How often a redriving sweeper hands one event back to the stream before it parks it: a Pipe
/// that did not publish it (its destination refuses it, its retries run out) or whose marker
/// keeps failing would otherwise be handed it forever.
pub const MAX_REDRIVES: u32 = 5;

/// Republishes pending events older than a threshold.
#[derive(Debug, Clone)]
pub struct Sweeper {
    via: Via,
    marks: OutboxMarks,
    after: Duration,
    limit: usize,
}

/// How the sweeper publishes again.
#[derive(Debug, Clone)]
enum Via {
    /// Itself, to each event's destination, as the relay does.
    Publisher(Publisher),
    /// Through the table's stream: it redrives the event, and the Pipe reading the stream
    /// publishes it (with the Pipe's own envelope) and its rule marks it.
    Stream,
}

/// What one sweep did, and what it left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Events published (and marked) by this sweep, or, for a [redriving](Sweeper::redriving)
    /// sweeper, handed back to the stream.
    pub republished: u64,
    /// Events their destination refused: parked by this sweep.
    pub parked: u64,
    /// Events whose publish or mark failed: still pending, tried again by a later sweep (the
    /// sweeper's threshold after the failure, twice that after a second, up to 32 times it;
    /// parked at the [seventh](MAX_SWEEP_FAILURES)),
    /// out of the way of the events no sweep has tried yet.
    pub failed: u64,
    /// Indexed items that are no outbox event this build reads: left as they are
    /// ([`Found::unreadable`](crate::effects::Found::unreadable)).
    pub unreadable: u64,
    /// How long the oldest event still pending has waited, after the sweep; `None` when
    /// nothing is pending.
    pub oldest_pending_age: Option<Duration>,
    /// The pending events this sweep found older than its threshold (at most its limit).
    pub found: u64,
    /// The longest time from commit to publication among the events this sweep published.
    pub max_lag: Option<Duration>,
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "republished {}, parked {}, failed {}, unreadable {}, oldest pending ",
            self.republished, self.parked, self.failed, self.unreadable
        )?;
        match self.oldest_pending_age {
            Some(age) => write!(f, "{} s", age.as_secs()),
            None => write!(f, "none"),
        }
    }
}

impl SweepReport {
    /// Counts what became of one event: republished (`Some(true)`), parked (`Some(false)`),
    /// nothing to do (`None`), or failed.
    fn count(&mut self, name: &str, done: Result<Option<bool>, BoxError>) {
        match done {
            Ok(Some(true)) => self.republished += 1,
            Ok(Some(false)) => self.parked += 1,
            Ok(None) => {}
            Err(err) => {
                warn!(event = %name, error = %err, "a pending outbox event could not be republished: left pending");
                self.failed += 1;
            }
        }
    }
}

impl Sweeper {
    /// A sweeper publishing with `publisher` the pending events of `marks`' table older than
    /// [`DEFAULT_SWEEP_AFTER`], at most [`DEFAULT_SWEEP_LIMIT`] per sweep.
    pub fn new(publisher: Publisher, marks: OutboxMarks) -> Self {
        Self {
            via: Via::Publisher(publisher),
            marks,
            after: DEFAULT_SWEEP_AFTER,
            limit: DEFAULT_SWEEP_LIMIT,
        }
    }

    /// A sweeper for the Pipe path: it publishes nothing itself but redrives each pending event
    /// ([`OutboxMarks::redrive`]), so that the Pipe reading the table's stream publishes it
    /// again under its id and in the Pipe's own envelope (consumers see the same event as
    /// the first time), and the rule on the Pipe's bus marks it.
    pub fn redriving(marks: OutboxMarks) -> Self {
        Self {
            via: Via::Stream,
            marks,
            after: DEFAULT_SWEEP_AFTER,
            limit: DEFAULT_SWEEP_LIMIT,
        }
    }

    /// Republishes events pending longer than `after` (zero: every pending event).
    #[must_use]
    pub fn after(mut self, after: Duration) -> Self {
        self.after = after;
        self
    }

    /// Republishes about `limit` events per sweep: each of the pending index's sixteen
    /// partitions is read up to a sixteenth of it (at least one event), and what the others
    /// leave is shared among those that filled theirs; then the partitions of events an
    /// earlier sweep failed to publish, the same way, with what is left
    /// ([`OutboxMarks::pending`](crate::effects::OutboxMarks::pending)).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// One sweep at `now`: every pending event committed more than the threshold before `now`
    /// (up to the limit) published under its id and marked, or parked; then the oldest pending
    /// age.
    ///
    /// # Errors
    /// [`OutboxError`] when the pending index cannot be read. An event that cannot be
    /// published is counted in [`SweepReport::failed`] and left pending.
    pub async fn sweep(&self, now: SystemTime) -> Result<SweepReport, OutboxError> {
        if crate::defects::is_reintroduced(crate::defects::NO_SWEEPER) {
            return Ok(SweepReport::default());
        }
        let cutoff = now.checked_sub(self.after).unwrap_or(now);
        let found = self.marks.due(cutoff, self.limit, now, self.after).await?;
        let mut report = SweepReport {
            unreadable: u64::try_from(found.unreadable.len()).unwrap_or(u64::MAX),
            found: u64::try_from(found.events.len()).unwrap_or(u64::MAX),
            ..SweepReport::default()
        };
        // Oldest first across the index's partitions (each is read oldest first), and one
        // aggregate's events of one commit (one `created_at`, in partitions the ids' hashes
        // chose) in their sequence: an older event is published before its newer one.
        let mut found = found;
        found.events.sort_by(|a, b| {
            let order = |event: &OutboxRecord| {
                event
                    .order
                    .as_ref()
                    .map(|order| (order.key.clone(), order.sequence))
            };
            (committed_at(a), order(a)).cmp(&(committed_at(b), order(b)))
        });
        in_sequence_per_key(&mut found.events);
        match &self.via {
            Via::Publisher(publisher) => {
                let events = self.unpublished(found.events).await;
                let committed: Vec<(String, String, SystemTime)> = events
                    .iter()
                    .map(|event| (event.id.clone(), event.name.clone(), committed_at(event)))
                    .collect();
                // Its own publish failed: recorded as it comes (counted, and it waits its
                // turn). One held behind another of its key, or published but not marked, is
                // left as it is, for the next sweep.
                let answers = deliver_all(
                    publisher,
                    &self.marks,
                    &events,
                    PublishedBy::Sweeper,
                    now,
                    &|event, err| Box::pin(self.failed(event, err, now)),
                )
                .await;
                for ((_, name, created_at), answer) in committed.iter().zip(answers) {
                    let answer = match answer {
                        Ok(Relayed::Published { .. }) => {
                            let lag = now.duration_since(*created_at).ok();
                            report.max_lag = report.max_lag.max(lag);
                            Ok(Some(true))
                        }
                        Ok(Relayed::Parked { .. }) => Ok(Some(false)),
                        Ok(Relayed::Skipped) => Ok(None),
                        Err(err) => Err(err),
                    };
                    report.count(name, answer);
                }
            }
            Via::Stream => {
                for event in &found.events {
                    let done = self.redrive(event, cutoff, now).await;
                    report.count(&event.name, done);
                }
            }
        }
        report.oldest_pending_age = self
            .marks
            .oldest_pending()
            .await?
            .map(|oldest| now.duration_since(oldest).unwrap_or_default());
        Ok(report)
    }

    /// The `found` events that are still pending: the index is read eventually consistent, so
    /// an event the relay published and marked moments ago may still be listed. One strongly
    /// consistent read of their marks leaves those out; when it fails, every one is published
    /// (at least once, as ever).
    async fn unpublished(&self, found: Vec<OutboxRecord>) -> Vec<OutboxRecord> {
        let ids: Vec<&str> = found.iter().map(|event| event.id.as_str()).collect();
        match self.marks.settled(&ids).await {
            Ok(settled) if !settled.is_empty() => found
                .into_iter()
                .filter(|event| !settled.contains(&event.id))
                .collect(),
            Ok(_) => found,
            Err(err) => {
                warn!(
                    error = %err,
                    "the found events' marks could not be read: each is published again"
                );
                found
            }
        }
    }

    /// What becomes of event `id`, whose publish failed (`err`): out of the way of the events
    /// no sweep has tried, tried again later each time, and parked (`Ok(Some(false))`) once it
    /// failed [`MAX_SWEEP_FAILURES`] sweeps, so that a destination that never comes back
    /// neither holds the retry partitions for ever nor hides the events behind it there.
    async fn failed(
        &self,
        event: &OutboxRecord,
        err: PublishError,
        now: SystemTime,
    ) -> Result<Relayed, BoxError> {
        let err = BoxError::from(err);
        if !publish_failed(&err) {
            return Err(err);
        }
        match self.marks.sweep_failed(&event.id, now, self.after).await {
            Ok(Some(failures)) if failures >= MAX_SWEEP_FAILURES => {
                let reason = format!(
                    "its destination failed every publish at {failures} sweeps over {}: see the sweeper's logs and OutboxSweepFailed, fix the destination, then unpark it",
                    about(self.patience())
                );
                match self.marks.park(&event.id, &reason, now).await? {
                    true => Ok(Relayed::Parked {
                        event_id: event.id.clone(),
                        reason,
                    }),
                    false => Ok(Relayed::Skipped),
                }
            }
            Ok(_) => Err(err),
            Err(not_recorded) => {
                warn!(event = %event.name, error = %not_recorded, "a failed outbox event's retry could not be recorded: tried again at the next sweep");
                Err(err)
            }
        }
    }

    /// How long an event keeps being tried before it is parked: the sweeper's threshold, then
    /// each wait between two of its [`MAX_SWEEP_FAILURES`] tries (the longest 32 times the
    /// threshold).
    fn patience(&self) -> Duration {
        (0..MAX_SWEEP_FAILURES - 1).fold(self.after, |total, failure| {
            let doublings = failure.min(MAX_BACKOFF_DOUBLINGS);
            total.saturating_add(self.after.saturating_mul(1 << doublings))
        })
    }

    /// Hands `event` back to the stream, unless the last redrive is recent (committed before
    /// `cutoff` is the sweeper's threshold: the Pipe gets as long again), or it was redriven
    /// [`MAX_REDRIVES`] times already (then it is parked). `Some(true)` redriven, `Some(false)`
    /// parked, `None` left as it is.
    async fn redrive(
        &self,
        event: &OutboxRecord,
        cutoff: SystemTime,
        now: SystemTime,
    ) -> Result<Option<bool>, BoxError> {
        match event.redriven {
            Some((_, last)) if last > cutoff => Ok(None),
            Some((count, _)) if count >= MAX_REDRIVES => {
                let reason = format!(
                    "the Pipe did not publish it after {MAX_REDRIVES} redrives: see the Pipe's dead-letter queue and the marker's errors, then unpark it"
                );
                let marked = self.marks.park(&event.id, &reason, now).await?;
                Ok(marked.then_some(false))
            }
            // Published or parked since the query: nothing to redrive.
            _ => {
                let read = event.redriven.map_or(0, |(count, _)| count);
                let marked = self
                    .marks
                    .redrive_as_read(&event.id, now, cutoff, read)
                    .await?;
                Ok(marked.then_some(true))
            }
        }
    }
}

/// Whether a sweep's answer for an event is its own publish failing (not an event held behind
/// another of its key, nor one published whose mark failed).
fn publish_failed(err: &BoxError) -> bool {
    matches!(
        err.downcast_ref::<super::PublishError>(),
        Some(super::PublishError::Failed { .. })
    )
}

/// `duration` for a reason an operator reads: hours from two hours up, else minutes.
fn about(duration: Duration) -> String {
    let minutes = duration.as_secs().div_ceil(60);
    match minutes {
        0..120 => format!("about {minutes} minutes"),
        _ => format!("about {} hours", (minutes + 30) / 60),
    }
}

/// When a pending event was committed: every event read from the pending index has its
/// `created_at` (the index's sort key).
fn committed_at(event: &OutboxRecord) -> SystemTime {
    event.created_at.unwrap_or(UNIX_EPOCH)
}

/// Puts each ordering key's events in their sequence, in the places its events hold: two
/// producers' clocks can disagree, so a later event of an aggregate, committed by another
/// instance, can carry an earlier `created_at` than the event before it.
fn in_sequence_per_key(events: &mut Vec<OutboxRecord>) {
    let mut places: HashMap<&str, Vec<usize>> = HashMap::new();
    for (place, event) in events.iter().enumerate() {
        if let Some(order) = &event.order {
            places.entry(order.key.as_str()).or_default().push(place);
        }
    }
    // `from[place]`: the index of the event that goes there.
    let mut from: Vec<usize> = (0..events.len()).collect();
    for held in places.values() {
        let mut by_sequence = held.clone();
        by_sequence.sort_by_key(|&i| events[i].order.as_ref().map(|order| order.sequence));
        for (&place, &event) in held.iter().zip(&by_sequence) {
            from[place] = event;
        }
    }
    let mut taken: Vec<Option<OutboxRecord>> = events.drain(..).map(Some).collect();
    events.extend(from.into_iter().filter_map(|i| taken[i].take()));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{about, publish_failed};
    use crate::error::BoxError;
    use crate::lambda::relay::PublishError;

    #[test]
    fn only_an_events_own_failed_publish_counts_toward_parking() {
        let failed: BoxError = PublishError::failed("throttled").into();
        let held: BoxError = PublishError::Held.into();
        let mark_failed: BoxError = "the mark's write failed".into();
        assert!(publish_failed(&failed));
        assert!(!publish_failed(&held));
        assert!(!publish_failed(&mark_failed));
    }

    #[test]
    fn an_aggregates_events_go_in_their_sequence_whatever_their_clocks_said() {
        use std::time::UNIX_EPOCH;

        use super::in_sequence_per_key;
        use crate::effects::{Destination, EventOrder, OutboxRecord};

        let event = |id: &str, order: Option<(&str, u64)>, at: u64| OutboxRecord {
            id: id.into(),
            name: "OrderChanged".into(),
            destination: Destination::Sqs {
                queue_url: "https://sqs.eu-west-1.amazonaws.com/1/orders".into(),
            },
            payload: "{}".into(),
            order: order.map(|(key, sequence)| EventOrder {
                key: key.into(),
                sequence,
            }),
            created_at: Some(UNIX_EPOCH + Duration::from_secs(at)),
            parked: None,
            redriven: None,
        };
        // Sorted by commit time: o-1's sequence 6 came from a clock behind the one of 5.
        let mut events = vec![
            event("a6", Some(("o-1", 6)), 1),
            event("x", None, 2),
            event("b1", Some(("o-2", 1)), 3),
            event("a5", Some(("o-1", 5)), 4),
            event("a7", Some(("o-1", 7)), 5),
        ];
        in_sequence_per_key(&mut events);
        let ids: Vec<&str> = events.iter().map(|event| event.id.as_str()).collect();
        assert_eq!(ids, ["a5", "x", "b1", "a6", "a7"]);
    }

    #[test]
    fn a_reasons_duration_reads_in_minutes_then_hours() {
        assert_eq!(about(Duration::from_secs(64 * 30)), "about 32 minutes");
        assert_eq!(about(Duration::from_secs(64 * 600)), "about 11 hours");
    }
}
