//! A transactional outbox: follow-on events written as items in the same transaction as a
//! step's record and the handler's own writes, for a relay to publish at least once.
//!
//! Each event's id is derived from the operation key, the execution (when it was first
//! claimed), the step and the event's name: the same on every attempt, so a republished event (the relay crashed after publishing, before its
//! ledger recorded it) reaches consumers under the same id, and they deduplicate on it.
//!
//! An event is **pending until it is published**: its item carries `pending` (the key of the
//! table's sparse [`PENDING_INDEX`]) and no TTL. Whatever publishes it (the relay, the
//! sweeper, a Pipe's marker) then marks it: `published_at`, `published_by`, `pending` removed and a
//! TTL [`OUTBOX_RETENTION`] later. A pending event never expires, so one the stream's 24 hours
//! (or its retries) did not deliver is still there for the sweeper
//! ([`relay::sweeper`](crate::lambda::relay::sweeper), feature `relay`), which finds it through the
//! index at the cost of what is pending, not of the table's size. An event its destination
//! refuses is **parked** (`parked_at`, `parked_reason`, `pending` set to [`PARKED`]): kept, out
//! of the sweeper's way, listed by the same index.
//!
//! | outbox item attribute | meaning |
//! |---|---|
//! | `pk` (S) | the event id: the producer's namespace, `#`, 64 hex characters ([`event_id`]; 0.4's ids have no namespace) |
//! | `event` (S) | the event's name, e.g. `order-placed` |
//! | `operation` (S) | the operation that wrote it (its scope, no key material) |
//! | `destination` (S) | `eventbridge`, `sns` or `sqs` |
//! | `target` (S) | the event bus name or ARN, the topic ARN, the queue URL |
//! | `source`, `detail_type` (S) | EventBridge's `Source` and `DetailType` |
//! | `payload` (S) | the event's JSON, as serialized |
//! | `created_at` (N) | epoch milliseconds: the sort key of [`PENDING_INDEX`] |
//! | `ordering_key` (S), `sequence` (N) | the event's [`EventOrder`], when it names one |
//! | `pending` (S) | while pending: `p0` … `pf` (the id's first hex digit, spreading the index's partitions), `r0` … `rf` once a sweep failed to publish it; [`PARKED`] once parked; absent once published |
//! | `sweep_failures` (N), `sweep_failed_at` (N) | once a sweep failed to publish it: how often, and when last (epoch milliseconds); the next sweeps wait longer each time before trying it again |
//! | `published_at` (N), `published_by` (S) | once published: epoch milliseconds, and `relay`, `sweeper` or `pipe` |
//! | `parked_at` (N), `parked_reason` (S) | once parked: epoch milliseconds, and the destination's refusal |
//! | `unparked_by` (S) | once an operator unparked it: a token of that write, by which a retry of it knows its own |
//! | `redriven_at` (N), `redrives` (N) | while a sweeper asks a Pipe to publish it again: when it last did (the Pipe's filter passes the modification) and how often |
//! | `expires_at` (N) | epoch seconds, the table's TTL: [`OUTBOX_RETENTION`] after publication; absent while pending or parked |
//!
//! Items 0.4 wrote have no `pending` and a TTL from their creation: they are published from
//! the stream as before, and one the relay fails to publish it puts in the pending index
//! (dropping its TTL) for the sweeper.
//!
//! What a consumer receives is the [envelope](OutboxRecord::envelope)
//! `{"event_id": …, "event": …, "payload": …}`; with the crate's doors, key it by its id
//! (`sources::eventbridge_detail("/event_id")`, `sources::sns_by_key_attribute()`, and on an SQS
//! queue the relay sends to, `sources::sqs_across_senders(None)`: the relay and the sweeper
//! send under roles of their own, which `sources::sqs` would key apart, so that a sweeper's
//! republication would take effect again). See [the relay](crate::lambda::relay).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use serde::Serialize;
use serde_json::Value;

use super::destinations::{
    DESTINATIONS_VAR, Destination, Destinations, SQS_REFUSED, escaped_for_sqs,
};
use super::pending_index::pending_shard;
#[cfg(doc)]
use super::pending_index::{PARKED, PENDING_INDEX};
use crate::error::Error;
use crate::key::OperationKey;
use crate::record::epoch_millis;

/// How long an outbox item is kept once published (DynamoDB TTL, from its publication): long
/// enough to look an event up when a consumer asks about it. A pending or parked item has no
/// TTL.
pub const OUTBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The largest message a destination takes, in bytes: EventBridge's `PutEvents` entry (its
/// `Source`, `DetailType` and `Detail` together) and an SNS message are 256 KiB each (their
/// documented quotas); SQS has taken 1 MiB since 2025, but one bound for every destination keeps
/// an event movable between them (and an outbox item is a DynamoDB item, 400 KB at most).
/// An event whose envelope would pass it is refused when it is
/// committed ([`OutboxEvent::new`]), so it never reaches the outbox; the relay and the sweeper
/// park one written otherwise.
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// The SNS and SQS message attribute that carries the event id, which the crate's SQS door keys
/// by.
pub const ID_ATTRIBUTE: &str = "idempotency-key";

/// The most bytes of an ordering key: SQS's and SNS's `MessageGroupId` (128 characters of
/// ASCII letters, digits and punctuation).
pub const MAX_ORDERING_KEY_BYTES: usize = 128;

/// Where an event stands in its aggregate's history: the aggregate it belongs to (its ordering
/// key: an order id, an account id) and its sequence number there (the aggregate's version,
/// which the handler's own write in the same transaction conditions on).
///
/// The ordering key is the FIFO message group on a `.fifo` queue or topic, so that one
/// aggregate's events arrive in commit order without holding back another's; both travel in
/// the envelope (`ordering_key`, `sequence`), so that a consumer can tell an older event from
/// a newer one whatever path published it (see the guide's ordering section: the sweeper and
/// per-entry retries can reorder, and a parked event leaves a gap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOrder {
    /// The aggregate's id: 1 to [`MAX_ORDERING_KEY_BYTES`] ASCII letters, digits and
    /// punctuation.
    pub key: String,
    /// The event's sequence number within the aggregate.
    pub sequence: u64,
}

/// A follow-on event a transactional step publishes ([`Transaction::publish`](super::Transaction::publish)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub(crate) name: String,
    pub(crate) destination: Destination,
    pub(crate) payload: String,
    pub(crate) order: Option<EventOrder>,
}

impl OutboxEvent {
    /// The event `name` (unique within its step: it names the event's id) carrying `payload`,
    /// for `destination`.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] for a blank name (or one holding `#`, the event id's
    /// separator), a payload that does not serialize, or an event
    /// larger than its destination takes ([`MAX_EVENT_BYTES`], with the envelope).
    ///
    /// ```
    /// use lambda_idempotency::effects::{Destination, OutboxEvent};
    ///
    /// let placed = OutboxEvent::new(
    ///     "order-placed",
    ///     Destination::Sqs { queue_url: "https://sqs.eu-west-1.amazonaws.com/1/orders".into() },
    ///     &serde_json::json!({"order": "o-418"}),
    /// )?;
    /// # let _ = placed;
    /// # Ok::<(), lambda_idempotency::Error>(())
    /// ```
    pub fn new(
        name: impl Into<String>,
        destination: Destination,
        payload: &impl Serialize,
    ) -> Result<Self, Error> {
        let name = name.into();
        // No `#`: the event's id hashes `{step}#event={name}#…`, which a name holding the
        // separator could make another step's event's.
        if name.trim().is_empty()
            || name.len() > super::MAX_STEP_NAME_BYTES
            || name.contains('#')
            || name.contains(SQS_REFUSED)
        {
            return Err(Error::InvalidEvent {
                reason: "an outbox event's name is 1 to 255 bytes, not blank, without '#' and without U+FFFE or U+FFFF"
                    .into(),
            });
        }
        let payload = serde_json::to_string(payload).map_err(|err| Error::InvalidEvent {
            reason: format!("an outbox event's payload does not serialize to JSON: {err}"),
        })?;
        let payload = escaped_for_sqs(payload);
        Self {
            name,
            destination,
            payload,
            order: None,
        }
        .checked()
    }

    /// This event as the `sequence`-th of aggregate `key` ([`EventOrder`]): `key` becomes its
    /// FIFO message group, and both travel in its envelope.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] for a key that is empty, longer than
    /// [`MAX_ORDERING_KEY_BYTES`] or not ASCII letters, digits and punctuation (what a FIFO
    /// message group takes), or when the envelope would pass [`MAX_EVENT_BYTES`].
    ///
    /// ```
    /// use lambda_idempotency::effects::{Destination, OutboxEvent};
    ///
    /// let shipped = OutboxEvent::new(
    ///     "order-shipped",
    ///     Destination::Sqs { queue_url: "https://sqs.eu-west-1.amazonaws.com/1/orders.fifo".into() },
    ///     &serde_json::json!({"order": "o-418"}),
    /// )?
    /// .ordered_by("o-418", 3)?;
    /// # let _ = shipped;
    /// # Ok::<(), lambda_idempotency::Error>(())
    /// ```
    pub fn ordered_by(mut self, key: impl Into<String>, sequence: u64) -> Result<Self, Error> {
        let key = key.into();
        let valid = !key.is_empty()
            && key.len() <= MAX_ORDERING_KEY_BYTES
            && key.bytes().all(|byte| byte.is_ascii_graphic());
        if !valid {
            return Err(Error::InvalidEvent {
                reason: format!(
                    "the outbox event `{}` has an ordering key that is not 1 to {MAX_ORDERING_KEY_BYTES} ASCII letters, digits and punctuation (what a FIFO message group takes): use the aggregate's id, hashed if need be",
                    self.name
                ),
            });
        }
        self.order = Some(EventOrder { key, sequence });
        self.checked()
    }

    /// This event, refused when its published size passes [`MAX_EVENT_BYTES`] under an id of
    /// a Lambda function's namespace (64 characters); [`Outbox`] checks it again under its real
    /// id when it is committed.
    fn checked(self) -> Result<Self, Error> {
        self.fits(&format!("{}#{}", "f".repeat(64), "0".repeat(64)), false)?;
        Ok(self)
    }

    /// Refuses this event when, under `id`, it would pass [`MAX_EVENT_BYTES`]: as the relay
    /// publishes it, or (`through_pipe`) inside an EventBridge Pipe's envelope
    /// ([`Outbox::through_pipe`]).
    fn fits(&self, id: &str, through_pipe: bool) -> Result<(), Error> {
        let record = self.record(id);
        let (size, reaches) = match through_pipe {
            false => (record.published()?.1, "would be published as"),
            true => (
                record.through_pipe_bytes(),
                "would reach the Pipe's bus (its payload escaped inside a JSON string) as about",
            ),
        };
        if size > MAX_EVENT_BYTES {
            let instead = match through_pipe {
                false => "",
                true => ", or publish with the relay",
            };
            return Err(Error::InvalidEvent {
                reason: format!(
                    "the outbox event `{}` {reaches} {size} bytes, past the {MAX_EVENT_BYTES} its destination takes: publish a reference (an id, an S3 key) instead{instead}",
                    self.name
                ),
            });
        }
        Ok(())
    }

    /// The event as its item will stand under `id`.
    fn record(&self, id: &str) -> OutboxRecord {
        OutboxRecord {
            id: id.to_owned(),
            name: self.name.clone(),
            destination: self.destination.clone(),
            payload: self.payload.clone(),
            order: self.order.clone(),
            created_at: None,
            parked: None,
            redriven: None,
        }
    }

    /// The event's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its place in its aggregate's history, when it names one ([`OutboxEvent::ordered_by`]).
    pub fn order(&self) -> Option<&EventOrder> {
        self.order.as_ref()
    }
}

/// The outbox table events are written to, and the destinations its events may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbox {
    table: String,
    destinations: Destinations,
    through_pipe: bool,
}

impl Outbox {
    /// The outbox in `table` (`pk` string key, TTL on `expires_at`, a stream of new images, the
    /// sparse [`PENDING_INDEX`]), for any destination until [`Outbox::with_destinations`] names
    /// the relay's list ([`Destinations::from_env`]): only then is an event for a destination the
    /// relay will not publish to refused at commit.
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            destinations: Destinations::any(),
            through_pipe: false,
        }
    }

    /// Refuses, at commit, an event for a destination not among `destinations` (the list the
    /// relay publishes to: [`Destinations`]).
    #[must_use]
    pub fn with_destinations(mut self, destinations: Destinations) -> Self {
        self.destinations = destinations;
        self
    }

    /// Checks each event at commit against what an EventBridge Pipe publishes to its bus
    /// (template.yaml's `OutboxPipe`, when `OutboxPublisher` is `pipe`), whatever destination
    /// the event names: the Pipe's envelope carries the payload as an escaped JSON string, so
    /// its quotes and backslashes count twice, and an event whose envelope would pass
    /// [`MAX_EVENT_BYTES`] that way is refused, nothing written, instead of being refused by
    /// the bus after its commit (then redriven and parked).
    ///
    /// ```
    /// use lambda_idempotency::effects::Outbox;
    ///
    /// let outbox = Outbox::new("outbox").through_pipe();
    /// # let _ = outbox;
    /// ```
    #[must_use]
    pub fn through_pipe(mut self) -> Self {
        self.through_pipe = true;
        self
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The `Put` of `event`, the event `id` of operation `key`, written at `now`.
    pub(crate) fn put(
        &self,
        key: &OperationKey,
        id: &str,
        event: &OutboxEvent,
        now: SystemTime,
    ) -> Result<Put, Error> {
        if !self.destinations.allows(&event.destination) {
            return Err(Error::InvalidEvent {
                reason: format!(
                    "the outbox event `{}` names a destination the outbox does not publish to: add it to {DESTINATIONS_VAR} (the relay's list too) or publish elsewhere",
                    event.name
                ),
            });
        }
        event.fits(id, false)?;
        if self.through_pipe {
            event.fits(id, true)?;
        }
        let s = |value: &str| AttributeValue::S(value.to_owned());
        let mut put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(id))
            .item("event", s(&event.name))
            .item("operation", s(key.operation()))
            .item("destination", s(event.destination.kind()))
            .item("target", s(event.destination.target()))
            .item("payload", s(&event.payload))
            .item(
                "created_at",
                AttributeValue::N(epoch_millis(now).to_string()),
            )
            // Pending until published: in the sparse index, without a TTL.
            .item("pending", s(pending_shard(id)));
        if let Some(order) = &event.order {
            put = put
                .item("ordering_key", s(&order.key))
                .item("sequence", AttributeValue::N(order.sequence.to_string()));
        }
        if let Destination::EventBridge {
            source,
            detail_type,
            ..
        } = &event.destination
        {
            put = put
                .item("source", s(source))
                .item("detail_type", s(detail_type));
        }
        put.build().map_err(|err| Error::InvalidEvent {
            reason: format!("the outbox item could not be built: {err}"),
        })
    }
}

/// The id of event `name` of step `step` of the execution of operation `key` first claimed at
/// `created_at` ([`Record::created_at`](crate::record::Record::created_at), kept by every
/// takeover): the same on every attempt of that execution, another for a later execution of
/// the same key (after its record expired, or an operator released it), so that a new
/// execution's event is never taken for the old one.
///
/// It is the producer's namespace (the key's, in Lambda the function's name), `#`, and 64 hex
/// characters, so that `dynamodb:LeadingKeys` `<function>#*` scopes which outbox events a
/// producer may write, as it scopes its records.
pub fn event_id(key: &OperationKey, created_at: SystemTime, step: &str, name: &str) -> String {
    let digest = if crate::defects::is_reintroduced(crate::defects::EVENT_ID_WITHOUT_EXECUTION) {
        key.downstream(&format!("{step}#event={name}"))
    } else {
        key.downstream(&format!(
            "{step}#event={name}#execution={}",
            epoch_millis(created_at)
        ))
    };
    format!("{}#{digest}", key.namespace())
}

/// The digest part of event id `id` (after its namespace; all of a 0.4 id, which has none):
/// 64 hex characters, what a FIFO destination's deduplication id and the pending index's shard
/// are made of.
pub(crate) fn id_digest(id: &str) -> &str {
    id.rsplit('#').next().unwrap_or(id)
}

/// An outbox event as its item stands, read from the outbox table's stream or found pending
/// (or parked) in its index ([`OutboxMarks::pending`](super::OutboxMarks::pending)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// The event id.
    pub id: String,
    /// The event's name.
    pub name: String,
    /// Where it goes.
    pub destination: Destination,
    /// The event's JSON, as serialized.
    pub payload: String,
    /// Its place in its aggregate's history, when it names one.
    pub order: Option<EventOrder>,
    /// When it was committed (`created_at`; every event read from the pending index has it).
    pub created_at: Option<SystemTime>,
    /// For a parked event: when it was parked and why.
    pub parked: Option<(SystemTime, String)>,
    /// How often a sweeper handed it back to the stream for a Pipe, and when it last did.
    pub redriven: Option<(u32, SystemTime)>,
}

impl OutboxRecord {
    /// The outbox item in a stream record's new image, as DynamoDB JSON
    /// (`{"pk": {"S": …}, …}`); `None` when the image is not an outbox item.
    pub fn from_image(image: &Value) -> Option<Self> {
        Self::from_fields(|name, kind| image.get(name)?.get(kind)?.as_str().map(str::to_owned))
    }

    /// The outbox item as DynamoDB returns it (a query of the pending index, a `GetItem`);
    /// `None` when it is not an outbox item.
    pub fn from_item(item: &HashMap<String, AttributeValue>) -> Option<Self> {
        Self::from_fields(|name, kind| match item.get(name)? {
            AttributeValue::S(text) if kind == "S" => Some(text.clone()),
            AttributeValue::N(number) if kind == "N" => Some(number.clone()),
            _ => None,
        })
    }

    /// The item read through `field(name, type)` (`"S"` or `"N"`); `None` when it is not an
    /// outbox event (an ordering key without a sequence number included).
    pub(crate) fn from_fields(field: impl Fn(&str, &str) -> Option<String>) -> Option<Self> {
        let text = |name: &str| field(name, "S");
        let order = match (text("ordering_key"), field("sequence", "N")) {
            (Some(key), Some(sequence)) => Some(EventOrder {
                key,
                sequence: sequence.parse().ok()?,
            }),
            (None, None) => None,
            _ => return None,
        };
        let target = text("target")?;
        let destination = match text("destination")?.as_str() {
            "eventbridge" => Destination::EventBridge {
                bus: target,
                source: text("source")?,
                detail_type: text("detail_type")?,
            },
            "sns" => Destination::Sns { topic_arn: target },
            "sqs" => Destination::Sqs { queue_url: target },
            _ => return None,
        };
        let millis = |name: &str| -> Option<SystemTime> {
            let value: u64 = field(name, "N")?.parse().ok()?;
            UNIX_EPOCH.checked_add(Duration::from_millis(value))
        };
        let parked = millis("parked_at").map(|at| (at, text("parked_reason").unwrap_or_default()));
        let redriven = millis("redriven_at").map(|at| {
            let count = field("redrives", "N").and_then(|count| count.parse().ok());
            (count.unwrap_or(1), at)
        });
        Some(Self {
            id: text("pk")?,
            name: text("event")?,
            destination,
            payload: text("payload")?,
            order,
            created_at: millis("created_at"),
            parked,
            redriven,
        })
    }

    /// Its FIFO message group: its ordering key, else its own id's digest (an event without
    /// an ordering key holds no other back).
    pub fn message_group(&self) -> &str {
        self.order
            .as_ref()
            .map_or(id_digest(&self.id), |order| &order.key)
    }

    /// Its FIFO deduplication id: its id's digest (64 characters: a deduplication id takes 128,
    /// a namespace may be long).
    pub fn deduplication_id(&self) -> &str {
        id_digest(&self.id)
    }
}
