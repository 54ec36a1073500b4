//! The outbox's far side (feature `relay`): the real [`Relay`] and [`Sweeper`], over the real
//! marks on the embedded server, publishing through an in-process destination that a consumer
//! behind the crate's own SQS key policy reads; and the faults between them: a request that
//! fails before it applies, one whose answer is lost after it applied, a relay or sweeper that
//! crashes after publishing and before marking, a stream that gives a record up (its retries
//! ran out, or its 24 hours passed), and poison events the destination refuses.
//!
//! The stream is a stand-in: each relay step reads the outbox table (consistently) and appends
//! the insert image of every event it has not seen, in the order it first sees them; the
//! checkpoint moves as Lambda moves it (past every record before the first one the relay
//! reports failed; not at all when the relay crashed). Checked after every step: no consumer
//! effect twice. At the end, after the relay and the sweeper drained everything: no event
//! pending, every committed event's effect performed once, and only poison events parked.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_lambda_events::event::dynamodb::EventRecord as DynamoDbRecord;
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Value, json};

use crate::clock::{Clock, ManualClock};
use crate::effects::{Outbox, OutboxMarks};
use crate::error::BoxError;
use crate::lambda::relay::sweeper::Sweeper;
use crate::lambda::relay::{Publisher, Relay, relay};
use crate::store::Store;
use crate::testing::conformance::EffectTables;

use self::consumer::Consumer;
pub use self::destination::PublishFault;
use self::destination::{InProcess, is_poison};
use super::world::{Action, World};

mod consumer;
mod destination;

/// Stream records per relay invocation (the example stack's event source mapping takes 100;
/// a few here, so that a run has several batches and a checkpoint between them).
const BATCH: usize = 4;
/// How long an event waits pending before the sweeper republishes it.
pub(super) const SWEEP_AFTER: Duration = Duration::from_secs(30);
/// The mark attributes a stream's insert image never holds.
const MARKS: [&str; 7] = [
    "published_at",
    "published_by",
    "expires_at",
    "parked_at",
    "parked_reason",
    "redriven_at",
    "redrives",
];

/// The relay, the sweeper, the destination, the consumer and the stream stand-in of one run.
pub(super) struct OutboxWorld {
    relay: Relay,
    sweeper: Sweeper,
    destination: InProcess,
    consumer: Consumer,
    client: aws_sdk_dynamodb::Client,
    table: String,
    clock: ManualClock,
    /// Every committed event's insert record, in the order first seen.
    stream: Vec<(String, DynamoDbRecord)>,
    /// The checkpoint: records before it were relayed (or given up).
    position: usize,
    seen: HashSet<String>,
    /// What happened, by name, for the run's figures.
    pub(super) counts: std::collections::BTreeMap<String, u64>,
}

impl OutboxWorld {
    /// The far side of `tables`' outbox, on `clock`.
    pub(super) fn new(tables: &EffectTables, clock: ManualClock) -> Result<Self, BoxError> {
        let destination = InProcess::default();
        let publisher = Publisher::over(destination.clone());
        let marks = OutboxMarks::new(tables.client.clone(), &Outbox::new(&tables.outbox));
        Ok(Self {
            relay: relay(publisher.clone(), marks.clone()).with_clock(clock.clone()),
            sweeper: Sweeper::new(publisher, marks).after(SWEEP_AFTER),
            destination,
            consumer: Consumer::new(clock.clone())?,
            client: tables.client.clone(),
            table: tables.outbox.clone(),
            clock,
            stream: Vec::new(),
            position: 0,
            seen: HashSet::new(),
            counts: std::collections::BTreeMap::new(),
        })
    }

    fn count(&mut self, name: &str, by: u64) {
        *self.counts.entry(name.to_owned()).or_default() += by;
    }

    /// The stream stand-in takes every event committed since it last looked.
    async fn observe_commits(&mut self) -> Result<(), String> {
        let mut items = scan(&self.client, &self.table).await?;
        items.sort_by_key(|item| {
            (
                number(item, "created_at"),
                text(item, "pk").unwrap_or_default(),
            )
        });
        for item in items {
            let Some(id) = text(&item, "pk") else {
                continue;
            };
            if !self.seen.insert(id.clone()) {
                continue;
            }
            let sequence = self.stream.len().to_string();
            let image: serde_json::Map<String, Value> = item
                .iter()
                .filter(|(name, _)| !MARKS.contains(&name.as_str()))
                .filter_map(|(name, value)| {
                    let typed = match value {
                        AttributeValue::S(text) => json!({"S": text}),
                        AttributeValue::N(number) => json!({"N": number}),
                        _ => return None,
                    };
                    Some((name.clone(), typed))
                })
                .collect();
            let record = serde_json::from_value(json!({
                "eventID": sequence,
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "eventVersion": "1.1",
                "awsRegion": "us-east-1",
                "dynamodb": {
                    "Keys": {"pk": {"S": id}},
                    "NewImage": image,
                    "SequenceNumber": sequence,
                    "SizeBytes": 100,
                    "StreamViewType": "NEW_IMAGE",
                },
            }))
            .map_err(|err| format!("a stream record of the outbox: {err}"))?;
            self.stream.push((id, record));
        }
        Ok(())
    }

    /// One invocation of the relay with the stream's next records; `fault` fires on its first
    /// request. Returns what the trace notes.
    pub(super) async fn relay_step(
        &mut self,
        fault: Option<PublishFault>,
    ) -> Result<String, String> {
        self.observe_commits().await?;
        let end = (self.position + BATCH).min(self.stream.len());
        let batch: Vec<DynamoDbRecord> = self.stream[self.position..end]
            .iter()
            .map(|(_, record)| record.clone())
            .collect();
        if batch.is_empty() {
            return Ok("the stream holds nothing new".into());
        }
        let crashed = self.arm(fault);
        let relay = self.relay.clone();
        let report = tokio::select! {
            report = relay.relay_batch(&batch) => Some(report),
            Ok(()) = crashed => None,
        };
        self.disarm();
        let note = match report {
            None => {
                self.count("relay crashed after publishing", 1);
                format!("relayed {} records, crashed after publishing", batch.len())
            }
            Some(report) => {
                let first_failed = batch
                    .iter()
                    .position(|record| {
                        report
                            .failed
                            .contains(&record.change.sequence_number.clone().unwrap_or_default())
                    })
                    .unwrap_or(batch.len());
                self.position += first_failed;
                self.count("relay batches", 1);
                self.count("relay published", report.published);
                self.count("relay parked", report.parked);
                format!(
                    "relayed {} records: published {}, already {}, parked {}, failed {}; checkpoint {}",
                    batch.len(),
                    report.published,
                    report.already,
                    report.parked,
                    report.failed.len(),
                    self.position
                )
            }
        };
        self.consume().await?;
        Ok(note)
    }

    /// The stream gives its next record up (its retries ran out, or its 24 hours passed):
    /// only the sweeper can publish that event now.
    pub(super) async fn stream_gives_up(&mut self) -> Result<String, String> {
        self.observe_commits().await?;
        match self.stream.get(self.position) {
            None => Ok("the stream holds nothing to give up".into()),
            Some((id, _)) => {
                let note = format!("the stream gave up the record of {id}");
                self.position += 1;
                self.count("stream records given up", 1);
                Ok(note)
            }
        }
    }

    /// One scheduled run of the sweeper at the world's time; `fault` fires on its first
    /// request.
    pub(super) async fn sweep_step(
        &mut self,
        fault: Option<PublishFault>,
    ) -> Result<String, String> {
        let crashed = self.arm(fault);
        let sweeper = self.sweeper.clone();
        let now = self.clock.now();
        let report = tokio::select! {
            report = sweeper.sweep(now) => Some(report),
            Ok(()) = crashed => None,
        };
        self.disarm();
        let note = match report {
            None => {
                self.count("sweeper crashed after publishing", 1);
                "the sweeper crashed after publishing".to_owned()
            }
            Some(Err(err)) => return Err(format!("the sweeper failed: {err}")),
            Some(Ok(report)) => {
                self.count("sweeper republished", report.republished);
                self.count("sweeper parked", report.parked);
                format!("swept the outbox: {report}")
            }
        };
        self.consume().await?;
        Ok(note)
    }

    /// Sets the destination's fault for this step; the receiver hears a crash.
    fn arm(&self, fault: Option<PublishFault>) -> tokio::sync::oneshot::Receiver<()> {
        let (crash, crashed) = tokio::sync::oneshot::channel();
        let mut state = self.destination.state();
        state.fault = fault;
        state.crash = Some(crash);
        crashed
    }

    fn disarm(&self) {
        let mut state = self.destination.state();
        state.fault = None;
        state.crash = None;
    }

    /// The consumer reads everything delivered since it last did: republications (after a
    /// lost answer, a crash before the marks, a sweep beside the stream) are its duplicates.
    async fn consume(&mut self) -> Result<(), String> {
        let delivered = std::mem::take(&mut self.destination.state().delivered);
        self.count("deliveries", delivered.len() as u64);
        for envelope in delivered {
            self.consumer.consume(&envelope).await?;
        }
        Ok(())
    }

    /// A consumer effect performed twice: the invariant checked after every step.
    pub(super) fn effect_repeated(&self) -> Option<String> {
        self.consumer
            .effects()
            .into_iter()
            .find(|(_, runs)| *runs > 1)
            .map(|(id, runs)| {
                format!("the consumer's effect of outbox event {id} ran {runs} times")
            })
    }

    /// The end of a run: the relay drains the stream, the sweeper what is still pending once
    /// its threshold passed; then no event is pending, each committed event's effect ran once
    /// (none for a poison event), and only poison events are parked.
    pub(super) async fn drain_and_judge(&mut self) -> Result<(), String> {
        for _ in 0..self.stream.len() + 2 {
            self.relay_step(None).await?;
            if self.position >= self.stream.len() {
                break;
            }
        }
        self.clock.advance(SWEEP_AFTER + Duration::from_secs(1));
        self.sweep_step(None).await?;
        let effects = self.consumer.effects();
        for item in scan(&self.client, &self.table).await? {
            let Some(id) = text(&item, "pk") else {
                continue;
            };
            let parked = item.contains_key("parked_at");
            let published = item.contains_key("published_at");
            let runs = effects.get(&id).copied().unwrap_or(0);
            let broken = match (is_poison(&id), parked, published) {
                (_, false, false) => "still pending after the relay and the sweeper drained",
                (false, true, _) => "parked, though its destination takes it",
                (true, _, true) => "marked published, though its destination refuses it",
                (false, _, _) if runs != 1 => "its consumer's effect did not run exactly once",
                (true, _, _) if runs != 0 => "its consumer's effect ran, though it was refused",
                _ => continue,
            };
            return Err(format!(
                "outbox event {id}: {broken} (consumer effects {runs})"
            ));
        }
        self.count(
            "consumer effects",
            effects.values().map(|runs| u64::from(*runs)).sum(),
        );
        Ok(())
    }
}

impl<S: Store + Clone> World<S> {
    /// Plays a step of the outbox's far side; a broken promise is reported by the next check.
    pub(super) async fn play_outbox(&mut self, action: Action) {
        let Some(outbox) = self.outbox.as_mut() else {
            return;
        };
        let done = match action {
            Action::Relay(fault) => outbox.relay_step(fault).await,
            Action::StreamGivesUp => outbox.stream_gives_up().await,
            Action::SweepOutbox(fault) => outbox.sweep_step(fault).await,
            _ => return,
        };
        match done {
            Ok(note) => self.note(note),
            Err(broken) => self.pending_violation = Some(broken),
        }
    }

    /// A consumer effect of an outbox event performed twice.
    pub(super) fn outbox_effect_repeated(&self) -> Option<String> {
        self.outbox.as_ref()?.effect_repeated()
    }

    /// The end of a run's outbox: see [`OutboxWorld::drain_and_judge`].
    pub(super) async fn outbox_drained(&mut self) -> Result<(), String> {
        match self.outbox.as_mut() {
            Some(outbox) => outbox.drain_and_judge().await,
            None => Ok(()),
        }
    }
}

/// Every item of `table` (small tables: one page).
async fn scan(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<Vec<HashMap<String, AttributeValue>>, String> {
    let scanned = client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .map_err(|err| format!("scan the outbox: {err}"))?;
    Ok(scanned.items.unwrap_or_default())
}

fn text(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    item.get(name)?.as_s().ok().cloned()
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> u64 {
    item.get(name)
        .and_then(|value| value.as_n().ok())
        .and_then(|number| number.parse().ok())
        .unwrap_or(0)
}
