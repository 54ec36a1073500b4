//! The outbox sweeper's binary: an event the stream never delivered (no relay ran) is
//! published by the scheduled sweeper, under its id, and the gauges say so; one whose queue
//! is gone for a while is tried again only after its wait; its requests are recorded for the
//! IAM check. The Pipe path's marker marks what the Pipe carried.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::effects::{Outbox, OutboxMarks};
use serde_json::json;

use super::support::function::{Function, Tables, sample_event};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_publishes_what_the_stream_never_delivered() {
    let tables = Tables::create("e2e-sweeper").await.recorded("e2e-sweeper");
    let client = tables.ledger.client().clone();
    let outbox = lambda_idempotency::testing::local::unique_table_name("e2e-sweeper-outbox");
    lambda_idempotency::testing::local::create_outbox_table(&client, &outbox)
        .await
        .expect("the outbox table");
    let moto = lambda_idempotency::testing::moto::start()
        .await
        .expect("moto's server");
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config());
    let queue = sqs
        .create_queue()
        .queue_name(lambda_idempotency::testing::local::unique_table_name(
            "order-events",
        ))
        .send()
        .await
        .expect("a queue")
        .queue_url()
        .expect("its URL")
        .to_owned();

    let checkout = Function::spawn_with(
        env!("CARGO_BIN_EXE_checkout"),
        "checkout",
        &tables,
        &[
            ("OUTBOX_TABLE", outbox.as_str()),
            ("ORDER_EVENTS_QUEUE_URL", queue.as_str()),
            ("OUTBOX_DESTINATIONS", queue.as_str()),
        ],
    )
    .await;
    checkout
        .api
        .invoke(sample_event("checkout"))
        .await
        .expect("ordered");
    checkout.stop().await;
    // No relay ran, and the event was committed an hour ago (its commit time set back, so
    // that no test waits): past the sweeper's ten minutes.
    let scanned = client
        .scan()
        .table_name(&outbox)
        .send()
        .await
        .expect("scan");
    let [item] = scanned.items() else {
        panic!("one outbox event: {:?}", scanned.items());
    };
    let id = item["pk"].as_s().expect("the event id").clone();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let millis = an_hour_ago
        .duration_since(UNIX_EPOCH)
        .expect("after epoch")
        .as_millis();
    client
        .update_item()
        .table_name(&outbox)
        .key("pk", AttributeValue::S(id.clone()))
        .update_expression("SET created_at = :then")
        .expression_attribute_values(":then", AttributeValue::N(millis.to_string()))
        .send()
        .await
        .expect("set the commit back");

    let sweeper = Function::spawn_with(
        env!("CARGO_BIN_EXE_outbox_sweeper"),
        "outbox-sweeper",
        &tables,
        &[
            ("AWS_ENDPOINT_URL_SQS", moto.endpoint.as_str()),
            ("OUTBOX_TABLE", outbox.as_str()),
            ("OUTBOX_DESTINATIONS", queue.as_str()),
            ("OUTBOX_SWEEP_MODE", "publish"),
            ("OUTBOX_SWEEP_AFTER_SECONDS", "600"),
            ("OUTBOX_SWEEP_LIMIT", "1000"),
        ],
    )
    .await;
    let schedule = json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});

    // The queue is gone for a while: the publish fails, the sweeper records it (a request the
    // IAM check must find allowed), and the next sweep leaves the event to its turn.
    let queue_name = queue.rsplit('/').next().expect("a queue name").to_owned();
    sqs.delete_queue()
        .queue_url(&queue)
        .send()
        .await
        .expect("deleted");
    let failed = sweeper.api.invoke(schedule.clone()).await.expect("swept");
    assert_eq!(failed["OutboxSweepFailed"], 1, "{failed}");
    assert_eq!(failed["OutboxRepublished"], 0, "{failed}");
    let recreated = sqs
        .create_queue()
        .queue_name(&queue_name)
        .send()
        .await
        .expect("the queue again");
    assert_eq!(recreated.queue_url(), Some(queue.as_str()));
    let waiting = sweeper.api.invoke(schedule.clone()).await.expect("swept");
    assert_eq!(
        (
            waiting["OutboxSweepFailed"].as_u64(),
            waiting["OutboxRepublished"].as_u64()
        ),
        (Some(0), Some(0)),
        "not tried again before its wait: {waiting}"
    );
    let item = client
        .get_item()
        .table_name(&outbox)
        .key("pk", AttributeValue::S(id.clone()))
        .send()
        .await
        .expect("read")
        .item()
        .cloned()
        .expect("the event");
    assert_eq!(item["sweep_failures"].as_n().map(String::as_str), Ok("1"));
    // Its wait over (the failure set back, as the commit was).
    client
        .update_item()
        .table_name(&outbox)
        .key("pk", AttributeValue::S(id.clone()))
        .update_expression("SET sweep_failed_at = :then")
        .expression_attribute_values(":then", AttributeValue::N(millis.to_string()))
        .send()
        .await
        .expect("set the failure back");

    let first = sweeper.api.invoke(schedule.clone()).await.expect("swept");
    let second = sweeper.api.invoke(schedule).await.expect("swept");
    sweeper.stop().await;

    assert_eq!(first["OutboxRepublished"], 1, "{first}");
    assert_eq!(first["OutboxOldestPendingAge"], 0, "nothing left pending");
    assert_eq!(first["OutboxParkedEvents"], 0);
    assert_eq!(
        second["OutboxRepublished"], 0,
        "marked: not published again"
    );
    let received = sqs
        .receive_message()
        .queue_url(&queue)
        .max_number_of_messages(10)
        .send()
        .await
        .expect("receive");
    let [message] = received.messages() else {
        panic!("published once: {:?}", received.messages());
    };
    let body: serde_json::Value =
        serde_json::from_str(message.body().expect("a body")).expect("the envelope");
    assert_eq!(body["event_id"], id.as_str(), "under its original id");
}

/// On the Pipe path, the rule on the bus hands the marker each event the Pipe published: the
/// marker marks it (once; a repeated event changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_marker_marks_what_the_pipe_published() {
    let tables = Tables::create("e2e-marker").await;
    let client = tables.ledger.client().clone();
    let outbox = Outbox::new(lambda_idempotency::testing::local::unique_table_name(
        "e2e-marker-outbox",
    ));
    lambda_idempotency::testing::local::create_outbox_table(&client, outbox.table())
        .await
        .expect("the outbox table");
    let id = "ab".repeat(32);
    client
        .put_item()
        .table_name(outbox.table())
        .item("pk", AttributeValue::S(id.clone()))
        .item("pending", AttributeValue::S("pa".into()))
        .item("created_at", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("a pending event");
    let marks = OutboxMarks::new(client.clone(), &outbox);
    // What the Pipe's input template makes of the item, as the bus delivers it to the rule.
    let event = json!({
        "source": "lambda-idempotency.outbox",
        "detail-type": "OutboxEvent",
        "detail": {"event_id": id, "event": "order-placed", "payload": "{\"order\":\"o-1\"}"},
    });
    let now = SystemTime::now();
    let first = lambda_idempotency_functions::outbox_marker::mark(&marks, &event, now)
        .await
        .expect("marked");
    let again = lambda_idempotency_functions::outbox_marker::mark(&marks, &event, now)
        .await
        .expect("marked");
    assert_eq!((first, again), (true, false), "marked once");
    let item = client
        .get_item()
        .table_name(outbox.table())
        .key("pk", AttributeValue::S(id))
        .send()
        .await
        .expect("get")
        .item
        .expect("the item");
    assert_eq!(item["published_by"].as_s().map(String::as_str), Ok("pipe"));
    assert!(!item.contains_key("pending"));

    let unmarked = json!({"detail": {}});
    assert!(
        lambda_idempotency_functions::outbox_marker::mark(&marks, &unmarked, now)
            .await
            .is_err(),
        "an event without its id is an error, never a silent success"
    );
}
