//! Batched publishing: events grouped by where they go (every EventBridge bus shares one
//! `PutEvents`; a topic its `PublishBatch`; a queue its `SendMessageBatch`), up to
//! [`MAX_BATCH_ENTRIES`] entries and [`MAX_BATCH_BYTES`] per request, with each entry's
//! failure reported on its own event.
//!
//! A destination's requests leave in the order the events came (commit order, on one stream
//! shard), up to [`REQUESTS_IN_FLIGHT`] at once, the next as soon as one is answered.
//!
//! **Order per ordering key.** At most one event of an ordering key is in flight (a per-entry
//! failure, or a request answered before another, could otherwise let a later one through
//! alone): the next waits, and so does everything behind it, until that event's request is
//! answered; and once an event fails, the later events of its ordering key in the same batch
//! are held (failed, not sent), so that none overtakes it. A refused (parked) event holds
//! nothing back: its sequence number is a gap the consumer sees.

use std::collections::{HashSet, VecDeque};

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;

use super::publisher::{Prepared, Publisher};
use super::transport::{Answers, Channel, Message, PublishError};
use crate::effects::outbox::{MAX_EVENT_BYTES, OutboxRecord};

/// The most entries one request carries: `PutEvents`, `SendMessageBatch` and `PublishBatch`
/// each take 10 (their documented quotas).
pub const MAX_BATCH_ENTRIES: usize = 10;

/// How many requests to one destination are in flight at once (see
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

/// Takes the next request from the front of `entries`: up to [`MAX_BATCH_ENTRIES`] entries
/// and [`MAX_BATCH_BYTES`], stopping at the first event whose ordering key is in flight
/// (`in_flight`) or in this request already (it waits for that request's answer, and so does
/// everything behind it). An event whose ordering key failed is answered held. Empty when
/// nothing may leave now.
fn next_request<'a>(
    entries: &mut VecDeque<Entry<'a>>,
    failed_keys: &HashSet<String>,
    in_flight: &HashSet<String>,
    sink: &Sink,
) -> Vec<Entry<'a>> {
    let mut request: Vec<Entry<'a>> = Vec::new();
    let mut bytes = 0;
    while let Some(next) = entries.pop_front() {
        let key = next.ordering_key();
        if key.is_some_and(|key| failed_keys.contains(key)) {
            answer(sink, next.index, Err(PublishError::Held));
            continue;
        }
        let waits = key.is_some_and(|key| {
            in_flight.contains(key) || request.iter().any(|sent| sent.ordering_key() == Some(key))
        });
        let full = request.len() == MAX_BATCH_ENTRIES
            || (!request.is_empty() && bytes + next.prepared.bytes > MAX_BATCH_BYTES);
        if waits || full {
            entries.push_front(next);
            break;
        }
        bytes += next.prepared.bytes;
        request.push(next);
    }
    request
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
    /// Up to [`REQUESTS_IN_FLIGHT`] requests to one destination are in flight at once, the next
    /// leaving as soon as one is answered, in the order the events came; at most one event of
    /// an ordering key is in flight, and none leaves once an earlier one of its key failed.
    ///
    /// ```no_run
    /// # async fn demo(events: Vec<lambda_idempotency::effects::OutboxRecord>) -> Result<(), lambda_idempotency::BoxError> {
    /// use lambda_idempotency::effects::Destinations;
    /// use lambda_idempotency::lambda::relay::Publisher;
    ///
    /// let publisher = Publisher::from_env().await.with_destinations(Destinations::from_env()?);
    /// for (event, published) in events.iter().zip(publisher.publish_batch(&events).await) {
    ///     if let Err(err) = published {
    ///         eprintln!("{} not published: {err}", event.id);
    ///     }
    /// }
    /// # Ok(()) }
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

    /// One destination's events, in order, up to [`REQUESTS_IN_FLIGHT`] requests at once, the
    /// next leaving as soon as one is answered: at most one event of an ordering key is in
    /// flight, and an event is held when an earlier one of its ordering key failed.
    async fn publish_channel(
        &self,
        channel: Channel,
        mut entries: VecDeque<Entry<'_>>,
        sink: &Sink,
    ) {
        let mut failed_keys: HashSet<String> = HashSet::new();
        let mut keys_in_flight: HashSet<String> = HashSet::new();
        let mut in_flight = FuturesUnordered::new();
        loop {
            while in_flight.len() < REQUESTS_IN_FLIGHT {
                let request = next_request(&mut entries, &failed_keys, &keys_in_flight, sink);
                if request.is_empty() {
                    break;
                }
                keys_in_flight.extend(
                    request
                        .iter()
                        .filter_map(Entry::ordering_key)
                        .map(str::to_owned),
                );
                let channel = &channel;
                in_flight.push(async move {
                    let results = self.send(channel, &request).await;
                    (request, results)
                });
            }
            let Some((request, results)) = in_flight.next().await else {
                return;
            };
            let mut results = results.into_iter();
            for entry in &request {
                let result = results.next().unwrap_or_else(|| {
                    Err(PublishError::failed(
                        "the destination gave no answer for it",
                    ))
                });
                if let Some(key) = entry.ordering_key() {
                    keys_in_flight.remove(key);
                    if matches!(result, Err(PublishError::Failed { .. })) {
                        failed_keys.insert(key.to_owned());
                    }
                }
                answer(sink, entry.index, result);
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures_util::future::BoxFuture;
    use tokio::sync::Notify;

    use super::super::transport::{Answers, Channel, Message, PublishError, Transport};
    use super::{MAX_BATCH_ENTRIES, Publisher, REQUESTS_IN_FLIGHT};
    use crate::effects::destinations::Destination;
    use crate::effects::outbox::{EventOrder, OutboxRecord};

    /// A destination that records what it was sent. It holds the first request open (when
    /// `hold_first`) until the request after a full window has left, fails the events named in
    /// `fails`, answers the first request for one message fewer than it carried (when
    /// `short_first`), and counts an ordering key found in two requests in flight.
    #[derive(Default)]
    struct RecordingDestination {
        hold_first: bool,
        short_first: bool,
        fails: HashSet<String>,
        sent: Mutex<Vec<String>>,
        requests: Mutex<usize>,
        window_moved: Notify,
        keys_in_flight: Mutex<HashSet<String>>,
        overlaps: Mutex<usize>,
    }

    impl RecordingDestination {
        fn publisher(self: &Arc<Self>) -> Publisher {
            Publisher::over(Shared(self.clone()))
        }

        fn sent(&self) -> Vec<String> {
            self.sent.lock().expect("sent").clone()
        }

        async fn send(&self, messages: &[Message<'_>]) -> Answers {
            let keys: Vec<String> = messages
                .iter()
                .filter_map(|message| message.event.order.as_ref())
                .map(|order| order.key.clone())
                .collect();
            {
                let mut in_flight = self.keys_in_flight.lock().expect("keys");
                for key in &keys {
                    if !in_flight.insert(key.clone()) {
                        *self.overlaps.lock().expect("overlaps") += 1;
                    }
                }
            }
            self.sent
                .lock()
                .expect("sent")
                .extend(messages.iter().map(|message| message.event.id.clone()));
            let request = {
                let mut requests = self.requests.lock().expect("requests");
                *requests += 1;
                *requests
            };
            if request == REQUESTS_IN_FLIGHT + 1 {
                self.window_moved.notify_one();
            }
            if self.hold_first && request == 1 {
                self.window_moved.notified().await;
            } else {
                // In flight beside the others: they are polled before it is answered.
                tokio::task::yield_now().await;
            }
            let mut in_flight = self.keys_in_flight.lock().expect("keys");
            for key in &keys {
                in_flight.remove(key);
            }
            let mut answers: Vec<Result<(), PublishError>> = messages
                .iter()
                .map(|message| match self.fails.contains(&message.event.id) {
                    true => Err(PublishError::failed("throttled")),
                    false => Ok(()),
                })
                .collect();
            if self.short_first && request == 1 {
                answers.pop();
            }
            Ok(answers)
        }
    }

    /// The destination behind an `Arc`, so that the test reads it afterwards.
    struct Shared(Arc<RecordingDestination>);

    impl Transport for Shared {
        fn send<'a>(
            &'a self,
            _: &'a Channel,
            messages: &'a [Message<'a>],
        ) -> BoxFuture<'a, Answers> {
            Box::pin(self.0.send(messages))
        }
    }

    fn event(n: usize, key: Option<String>) -> OutboxRecord {
        OutboxRecord {
            id: format!("event-{n}"),
            name: "placed".into(),
            destination: Destination::Sqs {
                queue_url: "https://sqs.us-east-1.amazonaws.com/123456789012/orders".into(),
            },
            payload: format!("{{\"n\":{n}}}"),
            order: key.map(|key| EventOrder {
                key,
                sequence: n as u64,
            }),
            created_at: None,
            parked: None,
            redriven: None,
        }
    }

    /// `count` events, event `n` of ordering key `k{n % keys}`.
    fn keyed_events(count: usize, keys: usize) -> Vec<OutboxRecord> {
        (0..count)
            .map(|n| event(n, Some(format!("k{}", n % keys))))
            .collect()
    }

    async fn publish(
        destination: &Arc<RecordingDestination>,
        events: &[OutboxRecord],
    ) -> Vec<Result<(), PublishError>> {
        tokio::time::timeout(
            Duration::from_secs(30),
            destination.publisher().publish_batch(events),
        )
        .await
        .expect("every event answered")
    }

    /// A slow request holds up only itself: the next request leaves when any in flight is
    /// answered (in waves, the first request's wave would wait for it, and it for a request
    /// that never leaves).
    #[tokio::test]
    async fn the_next_request_leaves_when_any_in_flight_is_answered() {
        let destination = Arc::new(RecordingDestination {
            hold_first: true,
            ..RecordingDestination::default()
        });
        let events: Vec<OutboxRecord> = (0..MAX_BATCH_ENTRIES * (REQUESTS_IN_FLIGHT + 2))
            .map(|n| event(n, None))
            .collect();
        let answers = publish(&destination, &events).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(
            *destination.requests.lock().expect("requests"),
            REQUESTS_IN_FLIGHT + 2
        );
    }

    /// Thirty keys over ninety events: several requests are in flight while a key's next event
    /// waits, and one ordering key is never in two of them; every event leaves once.
    #[tokio::test]
    async fn an_ordering_key_is_never_in_flight_twice() {
        let destination = Arc::new(RecordingDestination::default());
        let events = keyed_events(90, 30);
        let answers = publish(&destination, &events).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(*destination.overlaps.lock().expect("overlaps"), 0);
        let mut sent = destination.sent();
        sent.sort();
        let mut all: Vec<String> = events.iter().map(|event| event.id.clone()).collect();
        all.sort();
        assert_eq!(sent, all, "each event sent once");
    }

    /// An event that fails holds back the later events of its ordering key (answered failed,
    /// never sent), and nothing of another key.
    #[tokio::test]
    async fn a_failed_event_holds_back_its_key_only() {
        let destination = Arc::new(RecordingDestination {
            fails: HashSet::from(["event-13".to_owned()]),
            ..RecordingDestination::default()
        });
        let events = keyed_events(60, 10);
        let answers = publish(&destination, &events).await;
        let sent = destination.sent();
        for (n, answer) in answers.iter().enumerate() {
            let held = n % 10 == 3 && n > 13;
            match answer {
                Err(PublishError::Failed { .. }) if n == 13 => {}
                Err(PublishError::Held) if held => {}
                Ok(()) if n != 13 && !held => {}
                other => panic!("event {n}: {other:?}"),
            }
            assert_eq!(
                sent.contains(&format!("event-{n}")),
                !held,
                "event {n} sent only if not held"
            );
        }
    }

    /// A destination that answers for fewer events than it was sent: the unanswered event is
    /// failed, and the later events of its key are held, not sent after it.
    #[tokio::test]
    async fn an_event_left_unanswered_fails_and_holds_back_its_key() {
        let destination = Arc::new(RecordingDestination {
            short_first: true,
            ..RecordingDestination::default()
        });
        let events = keyed_events(40, 20);
        let answers = publish(&destination, &events).await;
        // The first request carries events 0 to 9; event 9 (key k9) goes unanswered.
        assert!(matches!(answers[9], Err(PublishError::Failed { .. })));
        assert!(matches!(answers[29], Err(PublishError::Held)));
        assert!(!destination.sent().contains(&"event-29".to_owned()));
        let failed = answers.iter().filter(|answer| answer.is_err()).count();
        assert_eq!(failed, 2, "{answers:?}");
    }
}
