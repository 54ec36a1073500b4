//! Batched publishing: events grouped by where they go (every EventBridge bus shares one
//! `PutEvents`; a topic its `PublishBatch`; a queue its `SendMessageBatch`), up to
//! [`MAX_BATCH_ENTRIES`] entries and [`MAX_BATCH_BYTES`] per request, with each entry's
//! failure reported on its own event.
//!
//! A destination's requests leave in waves of up to [`REQUESTS_IN_FLIGHT`], in the order the
//! events came (commit order, on one stream shard).
//!
//! **Order per ordering key.** A wave never carries two events of one ordering key (a
//! per-entry failure, or a request answered before another, could otherwise let the later one
//! through alone): the second waits for the next wave, which leaves once this one is answered;
//! and once an event fails, the later events of its ordering key in the same batch are held
//! (failed, not sent), so that none overtakes it. A refused (parked) event holds nothing back:
//! its sequence number is a gap the consumer sees.

use std::collections::{HashSet, VecDeque};

use futures_util::future::join_all;
use tokio::sync::mpsc;

use super::publisher::{Prepared, Publisher};
use super::transport::{Answers, Channel, Message, PublishError};
use crate::effects::outbox::{MAX_EVENT_BYTES, OutboxRecord};

/// The most entries one request carries: `PutEvents`, `SendMessageBatch` and `PublishBatch`
/// each take 10 (their documented quotas).
pub const MAX_BATCH_ENTRIES: usize = 10;

/// How many requests to one destination are in flight at once (a wave: see
/// [`Publisher::publish_batch`]).
pub const REQUESTS_IN_FLIGHT: usize = 4;

/// The most bytes one request carries: the entries of `PutEvents`, `SendMessageBatch` and
/// `PublishBatch` together are bounded by 256 KiB, as one message is.
pub const MAX_BATCH_BYTES: usize = MAX_EVENT_BYTES;

/// One event of the batch, checked, with its place in the caller's slice.
struct Entry<'a> {
    index: usize,
    event: &'a OutboxRecord,
    prepared: Prepared,
}

impl Entry<'_> {
    fn ordering_key(&self) -> Option<&str> {
        self.event.order.as_ref().map(|order| order.key.as_str())
    }
}

/// Takes the next wave's requests from the front of `entries`: up to [`REQUESTS_IN_FLIGHT`]
/// requests of up to [`MAX_BATCH_ENTRIES`] entries and [`MAX_BATCH_BYTES`] each, stopping at
/// the first event whose ordering key the wave carries already (it waits for the next wave, and
/// so does everything behind it). An event whose ordering key failed is answered held.
fn next_wave<'a>(
    entries: &mut VecDeque<Entry<'a>>,
    failed_keys: &HashSet<String>,
    sink: &Sink,
) -> Vec<Vec<Entry<'a>>> {
    let mut wave: Vec<Vec<Entry<'a>>> = Vec::new();
    let mut keys: HashSet<String> = HashSet::new();
    let mut bytes = 0;
    while let Some(next) = entries.pop_front() {
        let key = next.ordering_key().map(str::to_owned);
        if key.as_ref().is_some_and(|key| failed_keys.contains(key)) {
            answer(
                sink,
                next.index,
                Err(PublishError::failed(
                    "held behind an earlier event of its ordering key that failed",
                )),
            );
            continue;
        }
        if key.as_ref().is_some_and(|key| keys.contains(key)) {
            entries.push_front(next);
            break;
        }
        let fits = wave.last().is_some_and(|request| {
            request.len() < MAX_BATCH_ENTRIES && bytes + next.prepared.bytes <= MAX_BATCH_BYTES
        });
        if !fits {
            if wave.len() == REQUESTS_IN_FLIGHT {
                entries.push_front(next);
                break;
            }
            wave.push(Vec::new());
            bytes = 0;
        }
        bytes += next.prepared.bytes;
        keys.extend(key);
        if let Some(request) = wave.last_mut() {
            request.push(next);
        }
    }
    wave
}

/// Where each event's answer goes, with the event's place in the caller's slice.
pub(crate) type Sink = mpsc::UnboundedSender<(usize, Result<(), PublishError>)>;

/// Hands one answer to `sink` (a caller that stopped listening wants no more).
fn answer(sink: &Sink, index: usize, result: Result<(), PublishError>) {
    let _ = sink.send((index, result));
}

impl Publisher {
    /// Publishes `events` in as few requests as their destinations take, and answers for each
    /// event, in the same order: `Ok` once its destination accepted it,
    /// [`PublishError::Refused`] when the destination refuses that event (park it),
    /// [`PublishError::Failed`] when it should be published again later (its request failed,
    /// its entry was throttled, or an earlier event of its ordering key failed in this batch).
    ///
    /// ```no_run
    /// # async fn demo(events: Vec<lambda_idempotency::effects::OutboxRecord>) {
    /// use lambda_idempotency::lambda::relay::Publisher;
    ///
    /// let publisher = Publisher::from_env().await;
    /// for (event, published) in events.iter().zip(publisher.publish_batch(&events).await) {
    ///     if let Err(err) = published {
    ///         eprintln!("{} not published: {err}", event.id);
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn publish_batch(&self, events: &[OutboxRecord]) -> Vec<Result<(), PublishError>> {
        let (sink, mut answered) = mpsc::unbounded_channel();
        self.publish_each(events, &sink).await;
        drop(sink);
        let mut answers: Vec<Option<Result<(), PublishError>>> =
            events.iter().map(|_| None).collect();
        while let Some((index, answer)) = answered.recv().await {
            if let Some(slot) = answers.get_mut(index) {
                *slot = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| Err(PublishError::failed("the event was not sent")))
            })
            .collect()
    }

    /// Publishes `events` as [`Publisher::publish_batch`] does, handing each event's answer
    /// (with its place in `events`) to `sink` as soon as its request is answered, so that the
    /// caller marks it while the next request is on its way.
    pub(crate) async fn publish_each(&self, events: &[OutboxRecord], sink: &Sink) {
        let mut channels: Vec<(Channel, VecDeque<Entry<'_>>)> = Vec::new();
        for (index, event) in events.iter().enumerate() {
            match self.prepare(event) {
                Err(refused) => answer(sink, index, Err(refused)),
                Ok(prepared) => {
                    let channel = Channel::of(&event.destination);
                    let entry = Entry {
                        index,
                        event,
                        prepared,
                    };
                    match channels.iter_mut().find(|(known, _)| *known == channel) {
                        Some((_, entries)) => entries.push_back(entry),
                        None => channels.push((channel, VecDeque::from([entry]))),
                    }
                }
            }
        }
        join_all(
            channels
                .into_iter()
                .map(|(channel, entries)| self.publish_channel(channel, entries, sink)),
        )
        .await;
    }

    /// One destination's events, in order, in waves of up to [`REQUESTS_IN_FLIGHT`] requests
    /// sent together: a wave carries at most one event of an ordering key, and the next wave
    /// leaves once this one is answered; an event is held when an earlier one of its ordering
    /// key failed.
    async fn publish_channel(
        &self,
        channel: Channel,
        mut entries: VecDeque<Entry<'_>>,
        sink: &Sink,
    ) {
        let mut failed_keys: HashSet<String> = HashSet::new();
        loop {
            let wave = next_wave(&mut entries, &failed_keys, sink);
            if wave.is_empty() {
                return;
            }
            let sent = join_all(wave.iter().map(|request| self.send(&channel, request))).await;
            for (request, results) in wave.iter().zip(sent) {
                for (entry, result) in request.iter().zip(results) {
                    if let (Err(PublishError::Failed { .. }), Some(key)) =
                        (&result, entry.ordering_key())
                    {
                        failed_keys.insert(key.to_owned());
                    }
                    answer(sink, entry.index, result);
                }
            }
        }
    }

    /// One request of `entries` (at least one), answered per entry. A request the destination
    /// refuses as a whole (one entry may be the cause) is sent again one entry at a time, so
    /// that only the refused event is parked.
    async fn send(
        &self,
        channel: &Channel,
        entries: &[Entry<'_>],
    ) -> Vec<Result<(), PublishError>> {
        match self.request(channel, entries).await {
            Ok(answers) => answers,
            Err(PublishError::Refused { .. }) if entries.len() > 1 => {
                let mut answers = Vec::with_capacity(entries.len());
                for entry in entries {
                    let alone = self.request(channel, std::slice::from_ref(entry)).await;
                    answers.push(alone.and_then(|mut answer| {
                        answer
                            .pop()
                            .unwrap_or_else(|| Err(PublishError::failed("no answer")))
                    }));
                }
                answers
            }
            Err(err) => {
                let reason = err.to_string();
                let mut answers = vec![Err(err)];
                answers.extend(
                    entries
                        .iter()
                        .skip(1)
                        .map(|_| Err(PublishError::failed(reason.clone()))),
                );
                answers
            }
        }
    }

    /// One request, through the publisher's transport: `Err` when the request itself failed,
    /// else one answer per entry.
    async fn request(&self, channel: &Channel, entries: &[Entry<'_>]) -> Answers {
        let messages: Vec<Message<'_>> = entries
            .iter()
            .map(|entry| Message {
                event: entry.event,
                envelope: &entry.prepared.envelope,
            })
            .collect();
        self.transport.send(channel, &messages).await
    }
}
