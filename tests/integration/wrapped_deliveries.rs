//! Outbox events that reach a queue wrapped by another service, consumed behind the crate's
//! SQS door: a topic's subscription without raw message delivery (each delivery an SNS
//! notification with a new `MessageId`, `Timestamp` and `Signature`) and an EventBridge rule's
//! queue target (each delivery an event with a new `id` and `time`). The relay publishes to
//! moto's SNS and EventBridge, which wrap as AWS does; an event published twice (a relay that
//! died before its marks) takes effect once.

use aws_sdk_sqs::types::Message;
use lambda_idempotency::lambda::relay::relay;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::testing::local::unique_table_name;
use serde_json::Value;

use crate::relay::{RELAY_ROLE, Rig, deliver, new_queue};

/// Places an order, publishes its events twice (the first relay's marks fail, so the stream's
/// retry publishes again): what the wrapped queues received, the SNS notifications (from a
/// subscription without raw message delivery) and the EventBridge events.
async fn published_twice(rig: &Rig, order: &str) -> (Vec<Message>, Vec<Message>) {
    let (notifications, arn) = new_queue(&rig.sqs, unique_table_name("enveloped")).await;
    let sns = aws_sdk_sns::Client::new(&rig.moto_config());
    sns.subscribe()
        .topic_arn(&rig.topic_arn)
        .protocol("sqs")
        .endpoint(arn)
        .send()
        .await
        .expect("subscribe without raw message delivery");
    rig.place(order).await;
    let batch = rig.stream_batch().await;
    let (_faults, unmarked) = rig.failing_marks(3);
    let mut crashed = relay(rig.publisher(), unmarked).with_clock(rig.clock.clone());
    let answer = deliver(&mut crashed, batch.clone()).await;
    assert_eq!(answer.batch_item_failures.len(), 3, "{answer:?}");
    let answer = deliver(&mut rig.relay(), batch).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    (
        rig.drain(&notifications).await,
        rig.drain(&rig.bus_queue).await,
    )
}

fn bodies(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|message| serde_json::from_str(message.body().expect("body")).expect("json"))
        .collect()
}

#[tokio::test]
async fn an_event_sns_or_eventbridge_wrapped_twice_takes_effect_once_behind_the_sqs_door() {
    let rig = Rig::open().await;
    let (notifications, events) = published_twice(&rig, "o-w").await;

    let wrapped = bodies(&notifications);
    assert_eq!(wrapped.len(), 2, "published twice");
    assert_eq!(wrapped[0]["Type"], "Notification", "{:?}", wrapped[0]);
    assert_ne!(
        wrapped[0]["MessageId"], wrapped[1]["MessageId"],
        "wrapped anew"
    );
    assert!(
        notifications[0]
            .message_attributes()
            .is_none_or(|a| a.is_empty()),
        "without raw message delivery, the key attribute is in the body only"
    );
    for (operation, policy) in [
        (
            "across-senders",
            sources::sqs_across_senders(None).expect("policy"),
        ),
        ("by-sender", sources::sqs(None).expect("policy")),
        (
            "by-field",
            sources::sqs_across_senders(Some("/event_id")).expect("policy"),
        ),
    ] {
        assert_eq!(
            rig.consume_keyed(operation, policy, &[(RELAY_ROLE, &notifications)])
                .await,
            1,
            "one effect per event, keyed by the notification's attribute or the message"
        );
    }

    let wrapped = bodies(&events);
    assert_eq!(wrapped.len(), 2, "published twice");
    assert_ne!(wrapped[0]["id"], wrapped[1]["id"], "wrapped anew");
    for (operation, pointer) in [("in-detail", "/event_id"), ("in-event", "/detail/event_id")] {
        let policy = sources::sqs_across_senders(Some(pointer)).expect("policy");
        assert_eq!(
            rig.consume_keyed(operation, policy, &[(RELAY_ROLE, &events)])
                .await,
            1,
            "one effect per event, keyed by {pointer}"
        );
    }
}
