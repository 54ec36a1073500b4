//! An outbox event is pending until something publishes it, and nothing loses it: the relay
//! marks what it published; a pending event never expires; the sweeper republishes, under the
//! original id, what the stream never delivered (its 24 hours passed, its retries ran out, a
//! relay published and died before its mark); a poison event is parked and blocks nothing.
//! Real parts only: the embedded server's table, stream and index, moto's SQS, SNS and
//! EventBridge.

use std::time::{Duration, UNIX_EPOCH};

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::effects::{
    Destination, OUTBOX_RETENTION, Outbox, OutboxEvent, OutboxMarks, PublishedBy, Transaction,
};
use lambda_idempotency::lambda::relay::sweeper::{MAX_REDRIVES, Sweeper};
use lambda_idempotency::lambda::relay::{Publisher, Relayed, relay_record};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::dynamo::sweep_table;
use lambda_idempotency::testing::interceptor::{
    FaultInterceptor, SdkFault, SdkOperation, client_with,
};
use lambda_idempotency::{BoxError, ExecutionContext, Idempotency};
use serde_json::json;

use crate::relay::{RELAY_ROLE, Rig, SWEEPER_ROLE, deliver, event_ids};

type Item = std::collections::HashMap<String, AttributeValue>;

/// Every item of the outbox table.
async fn items(rig: &Rig) -> Vec<Item> {
    rig.db
        .client
        .scan()
        .table_name(rig.outbox.table())
        .send()
        .await
        .expect("scan the outbox")
        .items()
        .to_vec()
}

fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

fn number(item: &Item, name: &str) -> Option<u64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

/// The rig's clock, in epoch milliseconds (an outbox item's `created_at`).
fn now_ms(rig: &Rig) -> u128 {
    rig.clock
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_millis()
}

fn epoch_secs(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_secs()
}

/// Past the sweeper's threshold and past the stream's 24 hours: what the stream held is gone.
const A_WEEKEND: Duration = Duration::from_secs(3 * 24 * 3600);

/// Commits, under operation `name`, one event to `destination` with `payload`.
async fn commit(rig: &Rig, name: &str, destination: Destination, payload: serde_json::Value) {
    let idem = Idempotency::new(rig.db.store())
        .with_clock(rig.clock.clone())
        .with_recovery(Recovery::Steps);
    let inv = invocation(name, &json!({"name": name}));
    let outbox: &Outbox = &rig.outbox;
    idem.execute(&inv, |ctx: ExecutionContext| async move {
        ctx.step("place")
            .transact(|_key| async move {
                let event = OutboxEvent::new("placed", destination, &payload)?;
                Ok::<_, BoxError>(Transaction::new(()).publish(outbox, event))
            })
            .await
    })
    .await
    .expect("committed");
}

/// An outbox item with a 300 KB payload for the orders queue, as a producer that does not
/// check sizes (another library, a build before the check) writes it: the crate's own
/// producers cannot ([`OutboxEvent::new`] refuses it).
async fn write_too_large(rig: &Rig, id: &str) {
    let too_large = json!({"blob": "x".repeat(300 * 1024)}).to_string();
    assert!(
        OutboxEvent::new(
            "too-large",
            Destination::Sqs {
                queue_url: rig.orders_queue.clone()
            },
            &serde_json::from_str::<serde_json::Value>(&too_large).expect("json"),
        )
        .is_err(),
        "refused at commit"
    );
    let created = now_ms(rig);
    write_event(rig, id, &rig.orders_queue, created, &too_large).await;
}

#[tokio::test]
async fn an_event_is_pending_without_a_ttl_until_the_relay_marks_it_published() {
    let rig = Rig::open().await;
    rig.place("o-4").await;
    let committed = items(&rig).await;
    assert_eq!(committed.len(), 3);
    for item in &committed {
        assert!(
            text(item, "pending").is_some_and(|shard| shard.starts_with('p')),
            "in the pending index: {item:?}"
        );
        assert_eq!(number(item, "expires_at"), None, "no TTL while pending");
    }
    let marks = rig.marks();
    assert!(marks.oldest_pending().await.expect("oldest").is_some());

    let answer = deliver(&mut rig.relay(), rig.stream_batch().await).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");

    let now = epoch_secs(rig.clock.now());
    for item in items(&rig).await {
        assert_eq!(text(&item, "pending"), None, "out of the index: {item:?}");
        assert_eq!(text(&item, "published_by"), Some("relay"));
        assert!(number(&item, "published_at").is_some());
        assert_eq!(
            number(&item, "expires_at"),
            Some(now + OUTBOX_RETENTION.as_secs()),
            "kept OUTBOX_RETENTION after its publication"
        );
    }
    assert_eq!(marks.oldest_pending().await.expect("oldest"), None);
    assert_eq!(
        marks
            .pending(rig.clock.now(), 10)
            .await
            .expect("pending")
            .events,
        vec![]
    );
}

/// The relay never ran (broken over a weekend): the stream's 24 hours pass, TTL runs, and the
/// events are still pending; the sweeper publishes each once under its id, and marks it.
#[tokio::test]
async fn an_event_the_stream_never_delivered_is_kept_and_republished_by_the_sweeper() {
    let rig = Rig::open().await;
    rig.place("o-5").await;
    let expected: Vec<String> = {
        let mut ids: Vec<String> = items(&rig)
            .await
            .iter()
            .filter_map(|item| text(item, "pk").map(str::to_owned))
            .collect();
        ids.sort();
        ids
    };

    rig.clock.advance(A_WEEKEND);
    let swept = sweep_table(
        &rig.db.client,
        rig.outbox.table(),
        "expires_at",
        rig.clock.now(),
    )
    .await;
    assert_eq!(swept, 0, "a pending event has no TTL");
    let marks = rig.marks();
    let age = marks
        .oldest_pending()
        .await
        .expect("oldest")
        .map(|oldest| rig.clock.now().duration_since(oldest).expect("in the past"));
    assert!(age >= Some(A_WEEKEND), "the oldest pending age: {age:?}");

    let sweeper = Sweeper::new(rig.publisher(), marks.clone());
    let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(
        (report.republished, report.parked, report.failed),
        (3, 0, 0),
        "{report}"
    );
    assert_eq!(report.oldest_pending_age, None, "nothing left pending");

    let orders = rig.drain(&rig.orders_queue).await;
    let topic = rig.drain(&rig.topic_queue).await;
    let bus = rig.drain(&rig.bus_queue).await;
    let mut ids = [
        event_ids(&orders, false),
        event_ids(&topic, false),
        event_ids(&bus, true),
    ]
    .concat();
    ids.sort();
    assert_eq!(ids, expected, "each event once, under its original id");
    for item in items(&rig).await {
        assert_eq!(text(&item, "published_by"), Some("sweeper"));
    }

    // A second sweep finds nothing; the published items expire after their retention.
    let again = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(again.republished, 0);
    rig.clock.advance(OUTBOX_RETENTION + Duration::from_secs(1));
    let swept = sweep_table(
        &rig.db.client,
        rig.outbox.table(),
        "expires_at",
        rig.clock.now(),
    )
    .await;
    assert_eq!(swept, 3, "published items expire by TTL");
}

/// A relay publishes, then cannot mark (its mark's write fails; or it dies right after the
/// publish): the record is reported for the stream to retry, and if the stream never
/// delivers it again, the sweeper republishes it under the same id. A consumer behind the
/// crate's SQS door performs its effect once.
#[tokio::test]
async fn a_relay_that_published_but_never_marked_is_covered_and_the_consumer_acts_once() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "unmarked",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-6"}),
    )
    .await;
    let batch = rig.stream_batch().await;
    let record = batch.records.first().expect("the event's record").clone();
    // The marks point at a table the relay may not write: the publish lands, the mark fails.
    let unmarkable = OutboxMarks::new(rig.db.client.clone(), &Outbox::new("no-such-outbox"));
    let now = rig.clock.now();
    assert!(
        relay_record(&rig.publisher(), &unmarkable, &record, now)
            .await
            .is_err(),
        "reported: the stream retries it"
    );
    let relayed = rig.drain(&rig.orders_queue).await;
    assert_eq!(
        rig.marks()
            .pending(now + Duration::from_secs(1), 10)
            .await
            .expect("pending")
            .events
            .len(),
        1,
        "still pending"
    );

    // The stream's retries ran out: the sweeper publishes it again, under the same id.
    rig.clock.advance(A_WEEKEND);
    let report = Sweeper::new(rig.publisher(), rig.marks())
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!(report.republished, 1, "{report}");
    let swept = rig.drain(&rig.orders_queue).await;
    assert_eq!(
        (relayed.len(), swept.len()),
        (1, 1),
        "published twice: at least once"
    );
    assert_eq!(
        event_ids(&relayed, false),
        event_ids(&swept, false),
        "under one id"
    );

    // A consumer behind the crate's SQS door, each copy sent under its publisher's role: one
    // effect.
    assert_eq!(
        rig.consume(&[(RELAY_ROLE, &relayed), (SWEEPER_ROLE, &swept)])
            .await,
        1,
        "one effect per event"
    );
}

/// An event its destination refuses (larger than a message may be) is parked with its reason
/// and acknowledged: the event behind it on the shard is published in the same batch, and the
/// sweeper leaves the parked one alone.
#[tokio::test]
async fn a_poison_event_is_parked_and_never_blocks_the_events_behind_it() {
    let rig = Rig::open().await;
    let queue = Destination::Sqs {
        queue_url: rig.orders_queue.clone(),
    };
    write_too_large(&rig, &"7".repeat(64)).await;
    commit(&rig, "behind", queue, json!({"order": "o-8"})).await;
    let batch = rig.stream_batch().await;
    assert_eq!(batch.records.len(), 2);

    let answer = deliver(&mut rig.relay(), batch.clone()).await;
    assert!(
        answer.batch_item_failures.is_empty(),
        "nothing blocks the shard: {answer:?}"
    );
    let received = rig.drain(&rig.orders_queue).await;
    assert_eq!(received.len(), 1, "the event behind it is published");

    let marks = rig.marks();
    let parked = marks.parked(10).await.expect("parked").events;
    assert_eq!(parked.len(), 1);
    let (_, reason) = parked[0].parked.clone().expect("parked with its reason");
    assert!(reason.contains("bytes"), "{reason}");
    assert!(
        parked[0].payload.len() > 300 * 1024,
        "kept with its payload"
    );
    assert_eq!(marks.oldest_pending().await.expect("oldest"), None);

    rig.clock.advance(A_WEEKEND);
    let report = Sweeper::new(rig.publisher(), marks.clone())
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!((report.republished, report.parked), (0, 0), "{report}");
    let swept = sweep_table(
        &rig.db.client,
        rig.outbox.table(),
        "expires_at",
        rig.clock.now(),
    )
    .await;
    assert_eq!(
        swept, 0,
        "a parked event has no TTL; the published one is kept its retention"
    );
    assert_eq!(marks.parked(10).await.expect("parked").events.len(), 1);
}

/// A mark is idempotent: the relay and the sweeper both published an event; the second mark
/// changes nothing.
#[tokio::test]
async fn a_second_mark_changes_nothing() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "marked-twice",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-9"}),
    )
    .await;
    let batch: DynamoDbEvent = rig.stream_batch().await;
    let record = batch.records.first().expect("record");
    let marks = rig.marks();
    let relayed = relay_record(&rig.publisher(), &marks, record, rig.clock.now())
        .await
        .expect("relayed");
    let Relayed::Published { event_id } = relayed else {
        panic!("published: {relayed:?}");
    };
    let first = items(&rig).await;
    rig.clock.advance(Duration::from_secs(60));
    let again = marks
        .published(&event_id, PublishedBy::Sweeper, rig.clock.now())
        .await
        .expect("marked");
    assert!(!again, "marked already");
    assert_eq!(items(&rig).await, first, "the first mark stands");
}

/// The pending index is read eventually consistent: it may still list an event the relay
/// published and marked a moment ago. The sweeper reads the found events' marks strongly
/// consistent first and publishes only those still pending.
#[tokio::test]
async fn the_sweeper_never_republishes_what_the_index_lists_but_the_relay_marked() {
    let rig = Rig::open().await;
    for (name, order) in [("listed-but-published", "o-1"), ("still-pending", "o-2")] {
        commit(
            &rig,
            name,
            Destination::Sqs {
                queue_url: rig.orders_queue.clone(),
            },
            json!({"order": order}),
        )
        .await;
    }
    let pending = rig
        .marks()
        .pending(rig.clock.now() + Duration::from_secs(1), 10)
        .await
        .expect("pending")
        .events;
    assert_eq!(pending.len(), 2);
    // The relay's mark as the item has it, before the index catches up: published, still
    // listed (the index follows `pending`, which the mark's write removes).
    let published = &pending[0].id;
    rig.db
        .client
        .update_item()
        .table_name(rig.outbox.table())
        .key("pk", AttributeValue::S(published.clone()))
        .update_expression("SET published_at = :now, published_by = :by")
        .expression_attribute_values(":now", AttributeValue::N("1".into()))
        .expression_attribute_values(":by", AttributeValue::S("relay".into()))
        .send()
        .await
        .expect("the relay's mark");

    rig.clock.advance(A_WEEKEND);
    let report = Sweeper::new(rig.publisher(), rig.marks())
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!((report.found, report.republished), (2, 1), "{report}");
    let sent = rig.drain(&rig.orders_queue).await;
    assert_eq!(
        event_ids(&sent, false),
        [pending[1].id.clone()],
        "only the event still pending is published"
    );
}

/// The marks read failing (refused, throttled past its retries): every event the sweep found
/// is published, at least once, as before the read existed.
#[tokio::test]
async fn a_sweep_whose_marks_read_fails_publishes_what_it_found() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "marks-unread",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-7"}),
    )
    .await;
    let faults = FaultInterceptor::new();
    faults.inject_times(
        SdkOperation::BatchGetItem,
        SdkFault::Error {
            status: 400,
            code: "AccessDeniedException",
        },
        1,
    );
    let marks = OutboxMarks::new(client_with(rig.db.endpoint.clone(), &faults), &rig.outbox);

    rig.clock.advance(A_WEEKEND);
    let report = Sweeper::new(rig.publisher(), marks)
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!(faults.pending(), 0, "the marks read failed");
    assert_eq!(report.republished, 1, "{report}");
    assert_eq!(rig.drain(&rig.orders_queue).await.len(), 1, "published");
}

/// `idemctl outbox` on the same table: what is pending (oldest first), what is parked and why
/// (escaped: an outbox holds what producers wrote), and a sweep on demand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idemctl_lists_pending_and_parked_events_and_sweeps() {
    let rig = Rig::open().await;
    let queue = Destination::Sqs {
        queue_url: rig.orders_queue.clone(),
    };
    write_too_large(&rig, &"a".repeat(64)).await;
    commit(&rig, "idemctl-waiting", queue, json!({"order": "o-10"})).await;
    let idemctl = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemctl"))
            .args(args)
            .env("DYNAMODB_ENDPOINT", &rig.db.endpoint)
            .env("OUTBOX_TABLE", rig.outbox.table())
            .env("OUTBOX_DESTINATIONS", &rig.orders_queue)
            .env("AWS_ENDPOINT_URL_SQS", rig.moto_endpoint())
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .env_remove("IDEMPOTENCY_TABLE")
            .output()
            .expect("idemctl runs");
        assert!(
            output.status.success(),
            "idemctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("utf-8");
        (text(output.stdout), text(output.stderr))
    };
    let stdout = |args: &[&str]| idemctl(args).0;

    // Under --json, stdout is one JSON object per line and nothing else (a script pipes it
    // to jq); the count goes to stderr, and says when --limit cut the list short.
    let (pending, counted) = idemctl(&["outbox", "pending", "--json"]);
    let lines: Vec<serde_json::Value> = pending
        .lines()
        .map(|line| serde_json::from_str(line).expect("every stdout line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2, "{pending}");
    assert!(lines.iter().all(|line| line["destination"] == "sqs"));
    assert!(counted.ends_with("2 pending\n"), "{counted}");
    let (first, counted) = idemctl(&["outbox", "pending", "--json", "--limit", "1"]);
    assert_eq!(first.lines().count(), 1, "at most --limit: {first}");
    assert!(counted.contains("more may wait"), "{counted}");

    // The poison event is parked by a sweep; the other is published.
    rig.clock.advance(A_WEEKEND);
    let swept = stdout(&["outbox", "sweep", "--older-than", "0s"]);
    assert!(
        swept.starts_with("republished 1, parked 1, failed 0"),
        "{swept}"
    );
    assert_eq!(rig.drain(&rig.orders_queue).await.len(), 1);
    let parked = stdout(&["outbox", "parked"]);
    assert!(
        parked.contains("refused: the event is") && parked.contains("bytes as published"),
        "{parked}"
    );
    assert!(parked.ends_with("1 parked\n"), "{parked}");
    assert!(stdout(&["outbox", "pending"]).ends_with("0 pending\n"));
}

/// On the Pipe path the sweeper publishes nothing itself: it redrives a pending event (a
/// modification carrying `redriven_at`, which the Pipe's filter passes), the event stays
/// pending until the Pipe's marker marks it, and the mark removes `redriven_at`.
#[tokio::test]
async fn a_redriving_sweeper_hands_a_pending_event_back_to_the_stream() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "redriven",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-11"}),
    )
    .await;
    rig.clock.advance(A_WEEKEND);
    let marks = rig.marks();
    let sweeper = Sweeper::redriving(marks.clone());
    let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(report.republished, 1, "{report}");
    assert!(
        rig.drain(&rig.orders_queue).await.is_empty(),
        "published nothing itself"
    );

    let batch = rig.stream_batch().await;
    let redriven: Vec<_> = batch
        .records
        .iter()
        .filter(|record| record.event_name == "MODIFY")
        .collect();
    assert_eq!(redriven.len(), 1, "one modification for the Pipe");
    let image = serde_json::to_value(&redriven[0].change.new_image).expect("the new image");
    assert!(image.get("redriven_at").is_some(), "{image}");
    assert!(
        marks.oldest_pending().await.expect("oldest").is_some(),
        "still pending"
    );

    let [item] = items(&rig).await.try_into().expect("one item");
    let id = text(&item, "pk").expect("id").to_owned();
    marks
        .published(&id, PublishedBy::Pipe, rig.clock.now())
        .await
        .expect("marked");
    let [item] = items(&rig).await.try_into().expect("one item");
    assert_eq!(text(&item, "published_by"), Some("pipe"));
    assert!(
        !item.contains_key("redriven_at"),
        "the mark removes the redrive"
    );
    let again = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(again.republished, 0);
}

/// A Pipe that never publishes an event (its destination refuses it, its marker keeps failing)
/// is not handed it forever: the sweeper waits its threshold between redrives and parks the
/// event after `MAX_REDRIVES`.
#[tokio::test]
async fn a_redriving_sweeper_waits_between_redrives_and_parks_after_the_last() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "never-published",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-12"}),
    )
    .await;
    let marks = rig.marks();
    let sweeper = Sweeper::redriving(marks.clone());
    let eleven_minutes = Duration::from_secs(11 * 60);
    for redrive in 1..=MAX_REDRIVES {
        rig.clock.advance(eleven_minutes);
        let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
        assert_eq!(report.republished, 1, "redrive {redrive}: {report}");
        let again = sweeper.sweep(rig.clock.now()).await.expect("swept");
        assert_eq!(again.republished, 0, "not again before the threshold");
    }
    rig.clock.advance(eleven_minutes);
    let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!((report.republished, report.parked), (0, 1), "{report}");
    let parked = marks.parked(10).await.expect("parked").events;
    let (_, reason) = parked[0].parked.clone().expect("its reason");
    assert!(reason.contains("redrives"), "{reason}");

    // Once the Pipe is fixed, an operator unparks it: pending again, redriven afresh.
    assert!(marks.unpark(&parked[0].id).await.expect("unparked"));
    rig.clock.advance(eleven_minutes);
    let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(report.republished, 1, "{report}");
}

/// An item in the pending index that this build cannot read (a destination kind a later
/// build added) is reported and left as it is; the events beside it are still published.
#[tokio::test]
async fn an_unreadable_pending_item_is_reported_and_never_stops_a_sweep() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "readable",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-13"}),
    )
    .await;
    let s = |value: &str| AttributeValue::S(value.to_owned());
    rig.db
        .client
        .put_item()
        .table_name(rig.outbox.table())
        .item("pk", s(&"0".repeat(64)))
        .item("event", s("from-the-future"))
        .item("destination", s("carrier-pigeon"))
        .item("target", s("loft-7"))
        .item("payload", s("{}"))
        .item("created_at", AttributeValue::N("1".into()))
        .item("pending", s("p0"))
        .send()
        .await
        .expect("written");
    rig.clock.advance(A_WEEKEND);
    let report = Sweeper::new(rig.publisher(), rig.marks())
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!((report.republished, report.unreadable), (1, 1), "{report}");
    assert_eq!(rig.drain(&rig.orders_queue).await.len(), 1);
    // Still pending, and the oldest: its age is what the pending-age alarm watches (on the old
    // sweeper it was read past, and the gauge said nothing was pending).
    let age = report.oldest_pending_age.expect("an item is still pending");
    assert!(
        age >= rig
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .expect("after epoch")
            - Duration::from_secs(1),
        "the unreadable item's age (committed at the epoch's first millisecond): {age:?}"
    );
}

/// Writes a pending event `id` for the SQS queue `queue_url`, committed at `created` (epoch
/// milliseconds), with `payload`, as a producer writes it.
pub(super) async fn write_event(
    rig: &Rig,
    id: &str,
    queue_url: &str,
    created: u128,
    payload: &str,
) {
    let s = |value: &str| AttributeValue::S(value.to_owned());
    rig.db
        .client
        .put_item()
        .table_name(rig.outbox.table())
        .item("pk", s(id))
        .item("event", s("placed"))
        .item("operation", s("elsewhere"))
        .item("destination", s("sqs"))
        .item("target", s(queue_url))
        .item("payload", s(payload))
        .item("created_at", AttributeValue::N(created.to_string()))
        .item("pending", s(&format!("p{}", &id[..1])))
        .send()
        .await
        .expect("written");
}

/// Events of one partition of the index are all found while the limit allows: a partition
/// keeps to its share only where others hold events too (two events of one partition and a
/// limit of ten found one).
#[tokio::test]
async fn events_of_one_partition_are_all_found_within_the_limit() {
    let rig = Rig::open().await;
    let committed = now_ms(&rig);
    let ids: Vec<String> = (0..3u128)
        .map(|n| format!("5{}", n.to_string().repeat(63)))
        .collect();
    for (n, id) in (0u128..).zip(&ids) {
        write_event(&rig, id, &rig.orders_queue, committed + n, "{}").await;
    }
    let found = |limit| {
        let marks = rig.marks();
        let before = rig.clock.now() + Duration::from_secs(1);
        async move {
            let found = marks.pending(before, limit).await.expect("pending");
            found
                .events
                .iter()
                .map(|event| event.id.clone())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(found(10).await, ids, "every event, oldest first, once");
    assert_eq!(found(2).await, ids[..2], "the two oldest");
}

/// Two partitions holding every event, one more than the other: what the emptier leaves is
/// given to the fuller, round after round, until the limit or the events run out (one round
/// listed 70 of 80 events under a limit of 100, and said nothing of the 10).
#[tokio::test]
async fn what_a_partition_leaves_goes_to_the_fuller_round_after_round() {
    let rig = Rig::open().await;
    let committed = now_ms(&rig);
    for (first, count) in [("3", 60u128), ("7", 20)] {
        for n in 0..count {
            let id = format!("{first}{n:063x}");
            write_event(&rig, &id, &rig.orders_queue, committed + n, "{}").await;
        }
    }
    let before = rig.clock.now() + Duration::from_secs(1);
    let found = rig.marks().pending(before, 100).await.expect("pending");
    assert_eq!(found.events.len(), 80, "every event under the limit");
    let distinct: std::collections::HashSet<&str> =
        found.events.iter().map(|event| event.id.as_str()).collect();
    assert_eq!(distinct.len(), 80, "each once");
    let found = rig.marks().pending(before, 50).await.expect("pending");
    assert_eq!(found.events.len(), 50, "the limit");
}

/// Events whose destination keeps failing (a queue deleted but still allowed) never stand
/// before the events behind them: a failed event leaves its partition for the retry partition
/// and waits longer after each failure, so that a sweep reads past it. On the old sweeper the
/// three failing events at the head of the partition took its share at every sweep and the
/// event behind them was never published.
#[tokio::test]
async fn events_whose_destination_keeps_failing_never_stand_before_the_others() {
    let rig = Rig::open().await;
    let deleted = format!("{}-deleted", rig.orders_queue);
    let committed = now_ms(&rig);
    for n in 0..3u128 {
        let id = format!("3{}", n.to_string().repeat(63));
        write_event(&rig, &id, &deleted, committed + n, "{}").await;
    }
    let behind = format!("3{}", "f".repeat(63));
    write_event(&rig, &behind, &rig.orders_queue, committed + 10, "{}").await;

    // One event per partition and sweep: the smallest share, the hardest case.
    let sweeper = Sweeper::new(rig.publisher(), rig.marks()).limit(16);
    rig.clock.advance(A_WEEKEND);
    let mut failed = 0;
    let mut sweeps = 0;
    while rig.drain(&rig.orders_queue).await.is_empty() {
        sweeps += 1;
        assert!(
            sweeps <= 4,
            "the event behind is published within four sweeps"
        );
        let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
        failed += report.failed;
        rig.clock.advance(Duration::from_secs(60));
    }
    assert_eq!(
        failed, 3,
        "each failing event tried once, none again before its wait"
    );
    let stuck: Vec<Item> = items(&rig)
        .await
        .into_iter()
        .filter(|item| text(item, "target") == Some(deleted.as_str()))
        .collect();
    assert_eq!(stuck.len(), 3);
    for item in &stuck {
        assert_eq!(text(item, "pending"), Some("r3"), "in the retry partition");
        assert_eq!(number(item, "sweep_failures"), Some(1));
        assert!(item.get("expires_at").is_none(), "still pending, no TTL");
    }
    assert!(
        rig.marks()
            .oldest_pending()
            .await
            .expect("oldest")
            .is_some(),
        "still counted pending"
    );

    // After the sweeper's threshold they are tried again (by a sweeper whose share of the
    // retry partition takes all three), and wait twice as long after that.
    let sweeper = Sweeper::new(rig.publisher(), rig.marks());
    rig.clock.advance(Duration::from_secs(10 * 60));
    let again = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(again.failed, 3, "{again}");
    let next = sweeper
        .sweep(rig.clock.now() + Duration::from_secs(11 * 60))
        .await
        .expect("swept");
    assert_eq!(next.failed, 0, "the second wait is twice the first: {next}");
}

/// One aggregate's events of one commit share their `created_at`, and their ids' hashes pick
/// their partitions: the sweeper still publishes them in their sequence.
#[tokio::test]
async fn one_commits_events_of_one_aggregate_are_swept_in_their_sequence() {
    let rig = Rig::open().await;
    let committed = now_ms(&rig);
    // The second event's id sorts before the first's, in an earlier partition.
    for (id, sequence) in [("9".repeat(64), 1), ("2".repeat(64), 2)] {
        write_event(&rig, &id, &rig.orders_queue, committed, "{}").await;
        rig.db
            .client
            .update_item()
            .table_name(rig.outbox.table())
            .key("pk", AttributeValue::S(id.clone()))
            .update_expression("SET ordering_key = :key, #sequence = :sequence")
            .expression_attribute_names("#sequence", "sequence")
            .expression_attribute_values(":key", AttributeValue::S("order-1".into()))
            .expression_attribute_values(":sequence", AttributeValue::N(sequence.to_string()))
            .send()
            .await
            .expect("ordered");
    }
    rig.clock.advance(A_WEEKEND);
    let report = Sweeper::new(rig.publisher(), rig.marks())
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!(report.republished, 2, "{report}");
    let received: Vec<String> = rig
        .drain(&rig.orders_queue)
        .await
        .iter()
        .map(|message| {
            let body: serde_json::Value =
                serde_json::from_str(message.body().unwrap_or_default()).expect("json");
            body["sequence"].to_string()
        })
        .collect();
    assert_eq!(received, ["1", "2"]);
}

/// Parked events are counted and listed up to the limit asked, large ones too: the parked
/// partition was read with one partition's share of the bytes (1 MiB), which five events of
/// 200 KB filled, so `OutboxParkedEvents` and `idemctl outbox parked` said 5 of 8.
#[tokio::test]
async fn large_parked_events_are_all_counted() {
    let rig = Rig::open().await;
    let committed = now_ms(&rig);
    let payload = json!({"blob": "x".repeat(200 * 1024)}).to_string();
    let marks = rig.marks();
    for n in 0..8u128 {
        let id = format!("{n:x}{}", "0".repeat(63));
        write_event(&rig, &id, &rig.orders_queue, committed + n, &payload).await;
        assert!(
            marks
                .park(&id, "refused", rig.clock.now())
                .await
                .expect("parked")
        );
    }

    let parked = marks.parked(100).await.expect("parked");

    assert_eq!(parked.events.len(), 8);
}

/// A destination that never comes back: its events are tried at longer and longer waits, then
/// parked with a reason an operator can act on (and alarmed through the parked count), so that
/// the retry partitions neither grow for ever nor hide the events behind them.
#[tokio::test]
async fn events_whose_destination_never_comes_back_are_parked_after_the_last_try() {
    let rig = Rig::open().await;
    let deleted = format!("{}-deleted", rig.orders_queue);
    let committed = now_ms(&rig);
    write_event(&rig, &"5".repeat(64), &deleted, committed, "{}").await;
    let sweeper = Sweeper::new(rig.publisher(), rig.marks());
    rig.clock.advance(A_WEEKEND);
    let (mut failed, mut parked, mut sweeps) = (0, 0, 0);
    while parked == 0 {
        sweeps += 1;
        assert!(
            sweeps <= 200,
            "parked within a day of sweeps every five minutes"
        );
        let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
        failed += report.failed;
        parked += report.parked;
        rig.clock.advance(Duration::from_secs(5 * 60));
    }
    assert_eq!(
        failed + 1,
        u64::from(lambda_idempotency::lambda::relay::sweeper::MAX_SWEEP_FAILURES),
        "tried at each of its turns, parked at the last"
    );
    let parked = rig.marks().parked(10).await.expect("parked").events;
    assert_eq!(parked.len(), 1);
    let (_, reason) = parked[0].parked.clone().expect("parked with its reason");
    assert!(reason.contains("unpark"), "{reason}");
    assert_eq!(rig.marks().oldest_pending().await.expect("oldest"), None);
}

/// A backlog of large events is read a part at a time, every partition of the index in each
/// read: a partition is read up to its share of `MAX_FOUND_BYTES` (stopping at the event that
/// reaches it), so that a sweeper meeting hundreds of events near 256 KiB neither exhausts its
/// memory nor fails on the same oldest events at every run, and large events in one partition
/// never leave the others unread. On the old sweeper the read took all 96 events (29 MB of
/// payloads) at once.
#[tokio::test]
async fn a_backlog_of_large_events_is_read_a_part_at_a_time() {
    use lambda_idempotency::effects::{MAX_FOUND_BYTES, PENDING_SHARDS};

    let rig = Rig::open().await;
    let committed = now_ms(&rig);
    let payload = "x".repeat(300 * 1024);
    let per_partition = 6u128;
    let partitions = PENDING_SHARDS.len() as u128;
    for n in 0..per_partition * partitions {
        let id = format!("{:x}{:063x}", n % partitions, n);
        write_event(&rig, &id, &rig.orders_queue, committed + n, &payload).await;
    }
    rig.clock.advance(A_WEEKEND);

    let found = rig
        .marks()
        .pending(rig.clock.now(), 1000)
        .await
        .expect("read");
    let bytes: usize = found.events.iter().map(|e| e.payload.len()).sum();
    assert!(bytes <= MAX_FOUND_BYTES, "{bytes} bytes read at once");
    let mut from: Vec<&str> = found.events.iter().map(|event| &event.id[..1]).collect();
    from.sort_unstable();
    from.dedup();
    assert_eq!(
        from.len(),
        PENDING_SHARDS.len(),
        "every partition read: {from:?}"
    );
    assert!(found.events.len() < (per_partition * partitions) as usize);
}

/// Writes event `id` as a 0.4 producer writes it (no `pending`, a TTL from its commit), for
/// the queue `target`.
async fn write_as_0_4(rig: &Rig, id: &str, target: &str) {
    let committed = rig
        .clock
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch");
    let s = |value: &str| AttributeValue::S(value.to_owned());
    rig.db
        .client
        .put_item()
        .table_name(rig.outbox.table())
        .item("pk", s(id))
        .item("event", s("placed"))
        .item("operation", s("elsewhere"))
        .item("destination", s("sqs"))
        .item("target", s(target))
        .item("payload", s("{}"))
        .item(
            "created_at",
            AttributeValue::N(committed.as_millis().to_string()),
        )
        .item(
            "expires_at",
            AttributeValue::N((committed.as_secs() + OUTBOX_RETENTION.as_secs()).to_string()),
        )
        .send()
        .await
        .expect("written as 0.4 writes it");
}

/// During a rolling deploy a 0.4 producer writes an item with no `pending` and a TTL from its
/// commit, out of the sweeper's sight. The relay puts it in the pending index and drops its
/// TTL before it publishes it: when the publish fails (its destination down), once the stream
/// gives up on the record, the sweeper publishes it, where the TTL would have deleted it
/// unpublished.
#[tokio::test]
async fn an_event_0_4_wrote_that_the_relay_fails_to_publish_is_left_to_the_sweeper() {
    let rig = Rig::open().await;
    let down = format!("{}-recreated-later", rig.orders_queue);
    let id = format!("7{}", "0".repeat(63));
    write_as_0_4(&rig, &id, &down).await;

    let answer = deliver(&mut rig.relay(), rig.stream_batch().await).await;
    assert_eq!(answer.batch_item_failures.len(), 1, "{answer:?}");
    let item = items(&rig)
        .await
        .into_iter()
        .find(|item| text(item, "pk") == Some(id.as_str()))
        .expect("the item");
    assert_eq!(text(&item, "pending"), Some("p7"), "in the pending index");
    assert_eq!(number(&item, "expires_at"), None, "no TTL while pending");
    let found = rig
        .marks()
        .pending(rig.clock.now() + Duration::from_secs(1), 10)
        .await
        .expect("pending");
    let found: Vec<&str> = found.events.iter().map(|event| event.id.as_str()).collect();
    assert_eq!(found, vec![id.as_str()], "the sweeper finds it");

    // Past the 0.4 TTL it is still there, and still pending.
    rig.clock.advance(OUTBOX_RETENTION + A_WEEKEND);
    sweep_table(
        &rig.db.client,
        rig.outbox.table(),
        "expires_at",
        rig.clock.now(),
    )
    .await;
    let kept = items(&rig).await;
    assert!(
        kept.iter()
            .any(|item| text(item, "pk") == Some(id.as_str()) && item.contains_key("pending")),
        "not deleted by the TTL 0.4 gave it"
    );
}

/// A relay cut off while its publish is on the way (Lambda's timeout: the destination never
/// answers) is no error it could adopt on: the 0.4 item it was publishing is in the pending
/// index already, without its TTL, for the sweeper.
#[tokio::test]
async fn an_event_0_4_wrote_is_in_the_pending_index_before_the_relay_publishes_it() {
    let rig = Rig::open().await;
    let id = format!("7{}", "1".repeat(63));
    write_as_0_4(&rig, &id, &rig.orders_queue).await;
    // A destination that takes the request and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let endpoint = format!("http://{}", silent.local_addr().expect("address"));
    let config = rig
        .moto_config()
        .to_builder()
        .endpoint_url(endpoint)
        .build();
    let mut relay = rig.relay_publishing(Publisher::from_conf(&config));
    let batch = rig.stream_batch().await;

    tokio::select! {
        answer = deliver(&mut relay, batch) => panic!("answered by a silent destination: {answer:?}"),
        accepted = silent.accept() => {
            let (_held_open, _) = accepted.expect("the publish request's connection");
            // The relay is cut off here, its publish unanswered.
        }
    }
    drop(relay);

    let item = items(&rig)
        .await
        .into_iter()
        .find(|item| text(item, "pk") == Some(id.as_str()))
        .expect("the item");
    assert_eq!(text(&item, "pending"), Some("p7"), "in the pending index");
    assert_eq!(number(&item, "expires_at"), None, "no TTL while pending");
}

/// The marks' own writes, when one applies and loses its answer (the SDK retries it; the
/// retry's condition meets the write itself): a redrive is counted once, so that the event
/// keeps its `MAX_REDRIVES` chances; an operator's unpark is reported done, not "not parked".
#[tokio::test]
async fn a_redrive_or_unpark_that_lost_its_answer_counts_once_and_is_done() {
    let rig = Rig::open().await;
    commit(
        &rig,
        "lost-answers",
        Destination::Sqs {
            queue_url: rig.orders_queue.clone(),
        },
        json!({"order": "o-13"}),
    )
    .await;
    rig.clock.advance(A_WEEKEND);
    let faults = FaultInterceptor::new();
    let faulty = OutboxMarks::new(client_with(rig.db.endpoint.clone(), &faults), &rig.outbox);
    faults.inject(SdkOperation::UpdateItem, SdkFault::DropResponse);
    let report = Sweeper::redriving(faulty.clone())
        .sweep(rig.clock.now())
        .await
        .expect("swept");
    assert_eq!(report.republished, 1, "{report}");
    assert_eq!(
        faults.fired(SdkOperation::UpdateItem, SdkFault::DropResponse),
        1
    );
    let [item] = items(&rig).await.try_into().expect("one item");
    assert_eq!(number(&item, "redrives"), Some(1), "counted once");

    let id = text(&item, "pk").expect("id").to_owned();
    assert!(
        rig.marks()
            .park(&id, "its queue is gone", rig.clock.now())
            .await
            .expect("parked")
    );
    faults.inject(SdkOperation::UpdateItem, SdkFault::DropResponse);
    assert!(
        faulty.unpark(&id).await.expect("unparked"),
        "its own write, not an event that is not parked"
    );
    assert_eq!(
        faults.fired(SdkOperation::UpdateItem, SdkFault::DropResponse),
        2
    );
    let [item] = items(&rig).await.try_into().expect("one item");
    assert!(
        text(&item, "pending").is_some_and(|pending| pending.starts_with('p')),
        "pending again: {item:?}"
    );
    assert!(!item.contains_key("parked_at"));
    assert!(
        !rig.marks().unpark(&id).await.expect("answered"),
        "a second unpark finds it not parked"
    );
}
