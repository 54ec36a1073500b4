//! The outbox's allow-list of destinations, named once and given to both ends: a producer
//! refuses, at commit, an event for a destination off the list (nothing is written); the relay
//! never publishes an item that names one anyway, and leaves it pending for its retries (a
//! deploy that adds a destination reaches the relay in no particular order). Embedded server,
//! moto's SQS and SNS.

use lambda_idempotency::effects::{
    DESTINATIONS_VAR, Destination, Destinations, OutboxEvent, Transaction,
};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, ExecutionContext, Idempotency};
use serde_json::json;

use crate::relay::{Rig, deliver};

/// Commits, under operation `name`, one event to `destination` through an outbox that allows
/// `allowed`: the engine's answer.
async fn commit(
    rig: &Rig,
    name: &str,
    destination: Destination,
    allowed: Destinations,
) -> Result<lambda_idempotency::Execution<()>, lambda_idempotency::Error> {
    let idem = Idempotency::new(rig.db.store())
        .with_clock(rig.clock.clone())
        .with_recovery(Recovery::Steps);
    let inv = invocation(name, &json!({"name": name}));
    let outbox = rig.outbox.clone().with_destinations(allowed);
    let outbox = &outbox;
    idem.execute(&inv, |ctx: ExecutionContext| async move {
        ctx.step("place")
            .transact(|_key| async move {
                let event = OutboxEvent::new("placed", destination, &json!({"order": name}))?;
                Ok::<_, BoxError>(Transaction::new(()).publish(outbox, event))
            })
            .await
    })
    .await
}

async fn outbox_items(rig: &Rig) -> usize {
    rig.db
        .client
        .scan()
        .table_name(rig.outbox.table())
        .send()
        .await
        .expect("scan the outbox")
        .items()
        .len()
}

#[tokio::test]
async fn a_destination_off_the_list_is_refused_at_commit_and_nothing_is_written() {
    let rig = Rig::open().await;
    let allowed = Destinations::only([rig.orders_queue.clone()]);
    let elsewhere = Destination::Sns {
        topic_arn: rig.topic_arn.clone(),
    };
    let refused = commit(&rig, "off-the-list", elsewhere, allowed.clone()).await;
    let err = refused.expect_err("refused at commit");
    assert!(
        format!("{err:?}").contains(DESTINATIONS_VAR),
        "the error says what to do: {err:?}"
    );
    assert_eq!(outbox_items(&rig).await, 0, "nothing written");

    let on_the_list = Destination::Sqs {
        queue_url: rig.orders_queue.clone(),
    };
    commit(&rig, "on-the-list", on_the_list, allowed)
        .await
        .expect("committed");
    assert_eq!(outbox_items(&rig).await, 1);
}

/// An item naming a destination off the relay's list (a producer that already runs with a
/// longer list, mid-deploy) is not published and stays pending: reported failed for the
/// stream to retry, never parked at once (it waited for an operator's unpark). Once the relay
/// runs with the longer list, the retry publishes it.
#[tokio::test]
async fn the_relay_retries_an_item_naming_a_destination_off_its_list() {
    let rig = Rig::open().await;
    let topic = Destination::Sns {
        topic_arn: rig.topic_arn.clone(),
    };
    commit(&rig, "to-the-topic", topic, Destinations::any())
        .await
        .expect("committed");
    let queue = Destination::Sqs {
        queue_url: rig.orders_queue.clone(),
    };
    commit(&rig, "to-the-queue", queue, Destinations::any())
        .await
        .expect("committed");
    let batch = rig.stream_batch().await;

    let before_the_deploy = rig
        .publisher()
        .with_destinations(Destinations::only([rig.orders_queue.clone()]));
    let mut relay = rig.relay_publishing(before_the_deploy);
    let answer = deliver(&mut relay, batch.clone()).await;
    assert_eq!(answer.batch_item_failures.len(), 1, "{answer:?}");
    assert!(
        rig.drain(&rig.topic_queue).await.is_empty(),
        "never published"
    );
    assert_eq!(rig.drain(&rig.orders_queue).await.len(), 1);
    assert!(
        rig.marks()
            .parked(10)
            .await
            .expect("parked")
            .events
            .is_empty(),
        "not parked"
    );

    let after_the_deploy = rig.publisher().with_destinations(Destinations::only([
        rig.orders_queue.clone(),
        rig.topic_arn.clone(),
    ]));
    let mut relay = rig.relay_publishing(after_the_deploy);
    let answer = deliver(&mut relay, batch).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    assert_eq!(
        rig.drain(&rig.topic_queue).await.len(),
        1,
        "published by the retry"
    );
    assert!(
        rig.drain(&rig.orders_queue).await.is_empty(),
        "the event published before is not published again"
    );
}

/// A payload holding U+FFFE or U+FFFF (which SQS refuses in a message) is committed escaped,
/// the same JSON: the relay publishes it to the queue, and nothing is parked.
#[tokio::test]
async fn a_payload_with_characters_sqs_refuses_is_published_as_the_same_json() {
    let rig = Rig::open().await;
    let queue = Destination::Sqs {
        queue_url: rig.orders_queue.clone(),
    };
    let note = "before\u{ffff}between\u{fffe}after";
    let idem = Idempotency::new(rig.db.store())
        .with_clock(rig.clock.clone())
        .with_recovery(Recovery::Steps);
    let outbox = &rig.outbox;
    idem.execute(
        &invocation("noncharacters", &json!({"note": note})),
        |ctx: ExecutionContext| async move {
            ctx.step("place")
                .transact(|_key| async move {
                    let event = OutboxEvent::new("noted", queue, &json!({"note": note}))?;
                    Ok::<_, BoxError>(Transaction::new(()).publish(outbox, event))
                })
                .await
        },
    )
    .await
    .expect("committed");

    let mut relay = rig.relay();
    let answer = deliver(&mut relay, rig.stream_batch().await).await;

    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    let received = rig.drain(&rig.orders_queue).await;
    assert_eq!(received.len(), 1, "published, not parked");
    let sent = received[0].body().expect("a body");
    // moto takes these characters; SQS refuses a message holding them (InvalidMessageContents).
    assert!(
        !sent.contains(['\u{fffe}', '\u{ffff}']),
        "within SQS's character set: {sent}"
    );
    let body: serde_json::Value = serde_json::from_str(sent).expect("JSON");
    assert_eq!(body["payload"]["note"], note, "the same JSON");
    assert!(
        rig.marks()
            .parked(10)
            .await
            .expect("parked")
            .events
            .is_empty()
    );
}

/// The deployed functions read their allow-list from `OUTBOX_DESTINATIONS`: without it they
/// refuse to start rather than publish wherever an item says; `*` allows any, on purpose.
#[test]
fn the_allow_list_must_be_named_and_any_destination_is_asked_for() {
    let queue = Destination::Sqs {
        queue_url: "https://sqs.eu-west-1.amazonaws.com/1/orders".into(),
    };
    assert_eq!(
        Destinations::parse(""),
        None,
        "unset or empty names nothing"
    );
    assert_eq!(Destinations::parse(" ,\n"), None);
    let any = Destinations::parse("*").expect("any, asked for");
    assert!(any.allows(&queue));
    let only = Destinations::parse("https://sqs.eu-west-1.amazonaws.com/1/other orders-bus")
        .expect("a list");
    assert!(!only.allows(&queue));
    assert_eq!(
        Destinations::parse("https://sqs.eu-west-1.amazonaws.com/1/other, *"),
        None,
        "`*` beside a destination is refused, not taken as any"
    );
}
