//! The outbox's far side under the controlled scheduler: while the transactional deliveries
//! commit a charge and its outbox event (as [`super::case`] runs them; or, in a case of its
//! own, two receipts beside it), the ledger table's DynamoDB stream is read as an event source
//! mapping reads it, and the real relay ([`Relay::relay_batch`]) publishes what it holds,
//! beside real sweeper runs; their marks go through the real SDK client to the in-process
//! DynamoDB ([`in_process`]). The destination is in-process too, a consumer behind it that
//! deduplicates on the event id. At each publish and each DynamoDB request of theirs the
//! checker may fail it before it applies, or apply it and lose its answer. Then the stream
//! gives up, and a last sweep, without faults, publishes what is still pending.
//!
//! Checked as it happens: an event is marked published only once it was published (as each
//! mark applies), and every record the relay acknowledges has its event marked (Lambda never
//! delivers it again). After each schedule: every committed event was published at least
//! once and acted on once, none is left pending, and the deliveries' own invariants
//! ([`super::check`]).

mod destination;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::effects::{
    Destination as To, Outbox, OutboxEvent, OutboxMarks, Transaction, Writes,
};
use lambda_idempotency::lambda::current;
use lambda_idempotency::lambda::relay::sweeper::Sweeper;
use lambda_idempotency::lambda::relay::{Publisher, relay};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::store::MemoryStore;
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::{BoxError, Idempotency, Operation};
use lambda_runtime::tower::{Layer, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};
use shuttle::rand::{Rng, thread_rng};
use shuttle::scheduler::{PctScheduler, RandomScheduler, Scheduler};
use shuttle::{Config, Runner};

use super::in_process::{self, Lossy};
use super::ledger::Ledger;
use super::scheduled::{Scheduled, ScheduledClock};
use super::{
    Answer, Faults, Handler, Operations, OrderId, Redelivery, Scenario, answered, assert_found,
    check, committed, deliver, key, order, policy, run, scope,
};
use super::{deliveries, shown};
use destination::{Destination, marked};
use stream::{mapping, outbox, streamed_ledger};

/// The sweeps beside the relay.
const SWEEPS: usize = 2;

/// One case: what the deliveries commit, and a defect.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Whether each charge commits two receipts beside its event
    /// ([`charge_with_receipts`]), else the charge alone (as [`super::transact`]).
    receipts: bool,
    /// A defect put in for the harness's own check.
    defect: Option<Defect>,
}

/// A defect put on the relay's path from the test's side, for the harness's own check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defect {
    /// The transport answers a request that failed before it published as published (a
    /// batch's per-entry failures not read).
    AcknowledgesFailures,
    /// The consumer acts on every delivery, not once per event id.
    ConsumerWithoutDeduplication,
    /// The relay's DynamoDB client answers each mark as applied, and drops it.
    MarksDropped,
}

/// A delivery of o-1 (a trimmed [`deliver`], without crashes, its answer judged as
/// [`deliver`] judges it) whose transactional step
/// commits the charge with its event and, with `receipts`, two more events for one ordering
/// key on an SNS topic: three events of one transaction, on two channels.
async fn deliver_receipts(idem: Idempotency, ledger: Ledger) -> Option<Answer> {
    let clock = idem.clone();
    let operation = Operation::new(idem, scope(), policy()).with_recovery(Recovery::Steps);
    let service = operation
        .layer()
        .executions()
        .layer(service_fn(move |_: LambdaEvent<Value>| {
            charge_with_receipts(ledger.clone())
        }));
    let event = LambdaEvent::new(order(OrderId(1)), Context::default());
    let begun = deliveries::begin();
    let answer = service.oneshot(event).await;
    shown::check(&key(OrderId(1)), clock.now(), &answer, &begun.delivery.seen);
    Some(answered(answer))
}

/// The charge, its event and two receipts committed with a step, the completion with the
/// settlement (as [`super::transact`] does, with the receipts).
async fn charge_with_receipts(ledger: Ledger) -> Result<String, BoxError> {
    let ctx = current().ok_or("no execution context in the handler")?;
    let receipts: Vec<OutboxEvent> = (1..=2)
        .map(|sequence| {
            let topic = To::Sns {
                topic_arn: "arn:aws:sns:us-east-1:000000000000:receipts.fifo".into(),
            };
            OutboxEvent::new(format!("receipt-{sequence}"), topic, &sequence)
                .and_then(|receipt| receipt.ordered_by("o-1", sequence))
                .expect("a receipt")
        })
        .collect();
    let charged = ctx
        .step("charge")
        .transact(|_key| async move {
            let ledger = &ledger;
            let (outbox, event) = Ledger::charged(OrderId(1));
            let run = ledger.charges() + 1;
            let charged = Transaction::new(format!("o-1#{run}"))
                .update(Ledger::charge())
                .publish(&outbox, event);
            let charged = receipts.into_iter().fold(charged, |charged, receipt| {
                charged.publish(&outbox, receipt)
            });
            Ok::<_, BoxError>(charged)
        })
        .await?;
    ctx.complete_with(Writes::default().update(Ledger::complete(OrderId(1))))?;
    Ok(charged)
}

/// The sweeps beside the relay: [`SWEEPS`] runs of a sweeper that takes every pending event,
/// each a second ahead of the schedule's clock (a scheduled run comes later than the commit
/// it finds); a run may fail (a fault at its read of the index). Returns how many events they
/// published.
async fn sweeps(sweeper: Sweeper, clock: ScheduledClock) -> u64 {
    let mut published = 0;
    for _ in 0..SWEEPS {
        shuttle::future::yield_now().await;
        let swept = sweeper.sweep(clock.now() + Duration::from_secs(1)).await;
        published += swept.map_or(0, |report| report.republished);
    }
    published
}

/// What one exploration did.
#[derive(Debug, Default)]
struct Counts {
    /// Schedules run.
    schedules: AtomicUsize,
    /// Events the relay published.
    relayed: AtomicUsize,
    /// Events the sweep beside the relay published.
    early: AtomicUsize,
    /// Events the last sweep published (the relay and the first sweep did not).
    swept: AtomicUsize,
    /// Events delivered to the consumer more than once.
    redelivered: AtomicUsize,
    /// Faults chosen on the relay's side.
    faults: Arc<Lossy>,
}

/// One schedule: two concurrent deliveries of o-1 with a relay's invocations and a sweep
/// beside them, the redelivery, the stream given up, a last sweep; then the invariants.
fn case(Setup { receipts, defect }: Setup, counts: &Counts) {
    counts.schedules.fetch_add(1, Ordering::SeqCst);
    deliveries::forget_all();
    let faults = Arc::clone(&counts.faults);
    shuttle::future::block_on(async move {
        let clock = ScheduledClock(ManualClock::new(start_time()));
        let ledger = streamed_ledger();
        let scenario = Scenario {
            faults: Faults::Lossy,
            handler: Handler::Transactional,
            operations: Operations::One,
            defect: None,
            checks_transitions: true,
        };
        let store = Scheduled {
            inner: MemoryStore::with_tables(ledger.db.clone()),
            faults: scenario.faults,
            defect: None,
            fired: Arc::new(AtomicUsize::new(0)),
            watched: Arc::new(vec![key(OrderId(1))]),
            clock: clock.clone(),
            stalled: Arc::new(AtomicBool::new(false)),
            stalls: Arc::new(AtomicUsize::new(0)),
            unwound: Arc::new(AtomicUsize::new(0)),
            broken: Arc::default(),
            checks_transitions: true,
        };
        let idem = Idempotency::new(store.clone())
            .with_clock(clock.clone())
            .with_spawner(|task| drop(shuttle::future::spawn(task)));
        faults.on.store(true, Ordering::SeqCst);
        let destination = Destination {
            received: Arc::default(),
            faults: Arc::clone(&faults),
            defect,
        };
        // The relay's client and the sweepers' (functions of their own).
        let marks = |drops_updates| {
            let applied = marked(&destination);
            let client = in_process::client(
                ledger.db.clone(),
                Arc::clone(&faults),
                applied,
                drops_updates,
            );
            OutboxMarks::new(client, &outbox())
        };
        let publisher = Publisher::over(destination.clone());
        let relay = relay(
            publisher.clone(),
            marks(defect == Some(Defect::MarksDropped)),
        )
        .with_clock(clock.clone());
        let marks = marks(false);
        let runs = Arc::new(AtomicUsize::new(0));
        let delivery = |idem: Idempotency| match receipts {
            true => Box::pin(deliver_receipts(idem, ledger.clone())) as BoxFuture<'static, _>,
            false => Box::pin(deliver(
                idem,
                Handler::Transactional,
                OrderId(1),
                Arc::clone(&runs),
                ledger.clone(),
            )),
        };
        let deliveries = [(); 2].map(|()| shuttle::future::spawn(delivery(idem.clone())));
        let stream = shuttle::future::spawn(mapping(relay, ledger.db.clone()));
        let sweeper = Sweeper::new(publisher.clone(), marks.clone()).after(Duration::ZERO);
        let sweep = shuttle::future::spawn(sweeps(sweeper, clock.clone()));
        let mut answers = Vec::new();
        for delivery in deliveries {
            answers.push(delivery.await.expect("a delivery's task"));
        }
        let redelivery = [
            Redelivery::WithinRetention,
            Redelivery::PastRetention,
            Redelivery::AfterTtl,
        ][thread_rng().gen_range(0..3)];
        clock.advance(redelivery.after());
        if redelivery == Redelivery::AfterTtl {
            store.inner.sweep_expired(clock.now());
        }
        let quiet = Scheduled {
            faults: Faults::None,
            ..store.clone()
        };
        answers.push(delivery(Idempotency::new(quiet).with_clock(clock.clone())).await);
        let relayed = stream.await.expect("the mapping's task");
        let early = sweep.await.expect("the sweeps' task");
        counts.relayed.fetch_add(relayed as usize, Ordering::SeqCst);
        counts.early.fetch_add(early as usize, Ordering::SeqCst);
        let charges = match receipts {
            false => committed(&ledger, &store.inner, &answers).await,
            true => {
                let charges = ledger.charges();
                let events = ledger.events();
                assert_eq!(events, 3 * charges.min(1), "{charges} charges: {answers:?}");
                charges
            }
        };
        let orders = [OrderId(1); 3];
        store.reported();
        check(
            scenario,
            redelivery,
            &store.inner,
            charges,
            orders,
            &answers,
        )
        .await;
        // The stream gave up; past the sweeper's threshold and the longest wait it gives an
        // event whose publish failed (32 times it, for its sixth failure), its last run meets
        // no fault.
        faults.on.store(false, Ordering::SeqCst);
        clock.advance(Duration::from_secs(11 * 3600));
        let swept = Sweeper::new(publisher, marks)
            .sweep(clock.now())
            .await
            .expect("a sweep without faults");
        assert_eq!(swept.failed, 0, "the last sweep, without faults: {swept:?}");
        counts
            .swept
            .fetch_add(swept.republished as usize, Ordering::SeqCst);
        published_once(&ledger, &destination, counts);
    });
}

/// The invariants of the far side: every committed event delivered at least once, acted on
/// once, marked published (none left pending or parked); no other event acted on.
fn published_once(ledger: &Ledger, destination: &Destination, counts: &Counts) {
    let scan = dynoxide::actions::scan::ScanRequest {
        table_name: outbox().table().to_owned(),
        consistent_read: Some(true),
        ..Default::default()
    };
    let items = ledger
        .db
        .scan(scan)
        .expect("scan the ledger")
        .items
        .unwrap_or_default();
    let events: Vec<_> = items
        .iter()
        .filter(|item| item.contains_key("event"))
        .collect();
    let received = destination.received();
    for item in &events {
        let Some(dynoxide::AttributeValue::S(id)) = item.get("pk") else {
            panic!("an outbox item without its id: {item:?}");
        };
        let delivered = received.deliveries.get(id).copied().unwrap_or(0);
        assert!(
            delivered > 0,
            "the committed event {id} was never published"
        );
        if delivered > 1 {
            counts.redelivered.fetch_add(1, Ordering::SeqCst);
        }
        let acted = received.acted.get(id).copied().unwrap_or(0);
        assert_eq!(
            acted, 1,
            "the consumer acted on the event {id} {acted} times"
        );
        assert!(
            item.contains_key("published_at") && !item.contains_key("pending"),
            "the event {id} is left unpublished after the last sweep: {item:?}"
        );
    }
    assert_eq!(
        received.acted.len(),
        events.len(),
        "the consumer acted on events never committed: {:?}",
        received.acted
    );
}

/// What an exploration did, for its assertions: [`Counts`] read at its end.
#[derive(Debug)]
struct Explored {
    /// Schedules run.
    schedules: usize,
    /// Events the relay published.
    relayed: usize,
    /// Events the sweeps beside the relay published.
    early: usize,
    /// Events the last sweep published.
    swept: usize,
    /// Events that reached the consumer more than once.
    redelivered: usize,
    /// Faults chosen on the relay's side.
    faults: usize,
}

/// Runs [`case`] under `scheduler` (stacks deep enough for the SDK's futures).
fn explore(scheduler: impl Scheduler + 'static, setup: Setup) -> Explored {
    let counts = Arc::new(Counts::default());
    let explored = Arc::clone(&counts);
    run(scheduler, 4 << 20, move || case(setup, &explored));
    let explored = Explored {
        schedules: counts.schedules.load(Ordering::SeqCst),
        relayed: counts.relayed.load(Ordering::SeqCst),
        early: counts.early.load(Ordering::SeqCst),
        swept: counts.swept.load(Ordering::SeqCst),
        redelivered: counts.redelivered.load(Ordering::SeqCst),
        faults: counts.faults.fired.load(Ordering::SeqCst),
    };
    eprintln!("{setup:?}: {explored:?}");
    explored
}

/// How many schedules [`relay_publishes_every_committed_event_once`] runs, a third of them:
/// `SHUTTLE_RELAY_SCHEDULES` (a longer hunt), else 100.
fn relay_schedules() -> usize {
    std::env::var("SHUTTLE_RELAY_SCHEDULES").map_or(100, |n| {
        n.parse().expect("SHUTTLE_RELAY_SCHEDULES is a number")
    })
}

/// Random and PCT schedules of the deliveries, the relay and the sweeps, with faults at every
/// publish and every request of the relay's, the charge committing its event alone or with
/// two receipts: every committed event published, acted on once, and marked. The relay and the last sweep each publish in some schedules, and some event
/// reaches the consumer twice (which it deduplicates).
#[test]
fn relay_publishes_every_committed_event_once() {
    let alone = Setup {
        receipts: false,
        defect: None,
    };
    let receipts = Setup {
        receipts: true,
        ..alone
    };
    let base = relay_schedules();
    let runs = [
        explore(RandomScheduler::new(base * 3 / 2), alone),
        explore(PctScheduler::new(3, base / 2), alone),
        explore(RandomScheduler::new(base), receipts),
    ];
    let total = |count: fn(&Explored) -> usize| runs.iter().map(count).sum::<usize>();
    assert_eq!(total(|e| e.schedules), base * 3, "{runs:?}");
    assert!(
        total(|e| e.relayed) > 0 && total(|e| e.early) > 0 && total(|e| e.swept) > 0,
        "one publisher never published: {runs:?}"
    );
    assert!(
        total(|e| e.redelivered) > 0,
        "no event reached the consumer twice: {runs:?}"
    );
    assert!(
        runs.iter().all(|e| e.faults > e.schedules),
        "hardly a fault: {runs:?}"
    );
}

/// The harness finds the relay's path gone wrong, put in from the test's side or behind the
/// crate's switch, each by the invariant it breaks, in 300 seeded random schedules: a
/// transport that takes a failed request for published (its event is marked, never sent), a
/// consumer that acts on every delivery of an event published twice, a relay whose marks
/// are answered as applied and dropped (it acknowledges a record whose event is still
/// pending: the sweeper would cover it, the stream's contract does not), and 0.4's outbox
/// without a sweeper (`defects::NO_SWEEPER`: an event the stream gave up on stays pending,
/// never published, or published and never marked).
#[test]
fn defects_on_the_relay_path_are_found() {
    use lambda_idempotency::defects;
    let cases = [
        (
            "a transport that takes a failed request for published",
            Some(Defect::AcknowledgesFailures),
            0,
            &["was marked published, and was never published"][..],
        ),
        (
            "a consumer that does not deduplicate",
            Some(Defect::ConsumerWithoutDeduplication),
            0,
            &["the consumer acted on the event"],
        ),
        (
            "a relay whose marks are answered and dropped",
            Some(Defect::MarksDropped),
            0,
            &["the relay acknowledged the record of"],
        ),
        (
            "an outbox without a sweeper",
            None,
            defects::NO_SWEEPER,
            &[
                "the committed event",
                "left unpublished after the last sweep",
            ],
        ),
    ];
    for (name, defect, switch, broken) in cases {
        assert_found(name, "300 schedules", broken, || {
            defects::reintroduced(switch, || {
                let setup = Setup {
                    receipts: false,
                    defect,
                };
                explore(RandomScheduler::new_from_seed(3, 300), setup)
            })
        });
    }
}

/// The real marks meet dynoxide through the in-process client as they would DynamoDB: a
/// pending event is marked once, then refused by the mark's condition
/// (`ConditionalCheckFailedException`, read as already marked) and read back as settled; a
/// missing table is DynamoDB's `ResourceNotFoundException`.
#[test]
fn the_marks_meet_dynoxide_as_they_would_dynamodb() {
    use lambda_idempotency::effects::{OutboxError, PublishedBy};
    let mut config = Config::new();
    config.stack_size = 4 << 20;
    let scheduler = RandomScheduler::new(1);
    Runner::new(scheduler, config).run(|| {
        shuttle::future::block_on(async {
            let ledger = streamed_ledger();
            let put = serde_json::from_value(json!({
                "TableName": outbox().table(),
                "Item": {"pk": {"S": "e-1"}, "pending": {"S": "p0"}, "created_at": {"N": "1"}},
            }))
            .expect("a put");
            ledger.db.put_item(put).expect("an event");
            let client = |outbox: &Outbox| {
                let client = in_process::client(
                    ledger.db.clone(),
                    Arc::default(),
                    Arc::new(|_: &str, _: &Value| {}),
                    false,
                );
                OutboxMarks::new(client, outbox)
            };
            let marks = client(&outbox());
            let at = start_time();
            for expected in [true, false] {
                let marked = marks.published("e-1", PublishedBy::Relay, at).await;
                assert_eq!(marked.expect("a mark"), expected);
            }
            let settled = marks.settled(&["e-1", "e-2"]).await.expect("the marks");
            assert_eq!(settled.into_iter().collect::<Vec<_>>(), ["e-1"]);
            assert_eq!(marks.oldest_pending().await.expect("the index"), None);
            let missing = client(&Outbox::new("missing"))
                .published("e-1", PublishedBy::Relay, at)
                .await;
            assert!(
                matches!(&missing, Err(OutboxError::Request { code, .. }) if code == "ResourceNotFoundException"),
                "{missing:?}"
            );
        });
    });
}
