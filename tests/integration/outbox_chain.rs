//! One effect at the consumer, end to end, on real parts: a producer commits orders and their
//! events on the embedded server; the relay reads the server's real stream and publishes to
//! moto's SQS and to moto's EventBridge (a rule on the bus feeds a queue); consumers behind the
//! crate's doors (SQS, EventBridge) perform their effect once per event. On the way the relay
//! crashes after publishing and before marking, the stream "expires" (its position discarded:
//! the batch is never delivered again), the sweeper republishes, a destination delivers a
//! message twice, and a poison event sits in the middle of the batch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::effects::{Destination, Destinations, OutboxEvent, Transaction};
use lambda_idempotency::lambda::relay::relay;
use lambda_idempotency::lambda::relay::sweeper::{MAX_SWEEP_FAILURES, Sweeper};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, ExecutionContext, Idempotency, Operation, OperationScope};
use lambda_runtime::Context;
use serde_json::{Value, json};

use crate::relay::{RELAY_ROLE, Rig, SWEEPER_ROLE, deliver, event_ids};

/// Past the sweeper's threshold and the stream's 24 hours.
const A_WEEKEND: std::time::Duration = std::time::Duration::from_secs(3 * 24 * 3600);

/// Commits order `order` (its first version) with its event to each of `destinations`.
async fn place(rig: &Rig, order: &str, destinations: Vec<Destination>) {
    let idem = Idempotency::new(rig.db.store())
        .with_clock(rig.clock.clone())
        .with_recovery(Recovery::Steps);
    let inv = invocation(&format!("chain-{order}"), &json!({"order": order}));
    idem.execute(&inv, |ctx: ExecutionContext| async move {
        ctx.step("place")
            .transact(|_key| async move {
                let mut placed = Transaction::new(());
                for (n, destination) in destinations.into_iter().enumerate() {
                    let event = OutboxEvent::new(
                        format!("order-placed-{n}"),
                        destination,
                        &json!({"order": order}),
                    )?
                    .ordered_by(order, 1)?;
                    placed = placed.publish(&rig.outbox, event);
                }
                Ok::<_, BoxError>(placed)
            })
            .await
    })
    .await
    .expect("placed");
}

/// Runs each EventBridge event (as the bus's rule delivered it to its queue) through a
/// consumer behind the crate's EventBridge door, keyed by the event id in the detail: how often
/// its effect ran, per event id.
async fn consume_bus_events(rig: &Rig, bodies: &[String]) -> HashMap<String, usize> {
    let consumer = Operation::new(
        Idempotency::new(rig.db.store()),
        OperationScope::new("consumer", "bus").expect("scope"),
        sources::eventbridge_detail::<Value>("/event_id").expect("policy"),
    );
    let effects: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    for body in bodies {
        let event: EventBridgeEvent<Value> = serde_json::from_str(body).expect("an event");
        let id = event.detail["event_id"].as_str().expect("an id").to_owned();
        let inv = consumer
            .invocation(&event, &Context::default())
            .expect("keyed");
        let effects = Arc::clone(&effects);
        consumer
            .engine()
            .execute(&inv, |_ctx: ExecutionContext| async move {
                if let Ok(mut effects) = effects.lock() {
                    *effects.entry(id).or_default() += 1;
                }
                Ok::<_, BoxError>(())
            })
            .await
            .expect("consumed");
    }
    let effects = effects.lock().map(|effects| effects.clone());
    effects.unwrap_or_default()
}

#[tokio::test]
async fn each_event_takes_effect_once_at_its_consumer_through_a_crash_an_expired_stream_a_duplicate_and_a_poison()
 {
    let rig = Rig::open().await;
    let queue = Destination::Sqs {
        queue_url: rig.orders_queue.clone(),
    };
    let bus = Destination::EventBridge {
        bus: "shop".into(),
        source: "shop.orders".into(),
        detail_type: "OrderPlaced".into(),
    };
    // The relay may publish to the orders queue and the bus only; the poison names the topic's
    // feed queue, which the producer (without a list) committed.
    let publisher = rig.publisher().with_destinations(Destinations::only([
        rig.orders_queue.clone(),
        "shop".to_owned(),
    ]));
    place(&rig, "o-1", vec![queue.clone(), bus.clone()]).await;
    place(
        &rig,
        "o-poison",
        vec![Destination::Sqs {
            queue_url: rig.topic_queue.clone(),
        }],
    )
    .await;
    place(&rig, "o-2", vec![queue.clone(), bus.clone()]).await;
    place(&rig, "o-3", vec![queue, bus]).await;
    let batch = rig.stream_batch().await;
    assert_eq!(
        batch.records.len(),
        7,
        "six events and the poison, one batch"
    );

    // The relay publishes, then dies before any mark applies: every record is reported (the
    // poison's too: its destination is off the relay's list, never published, not marked).
    let (faults, unmarked) = rig.failing_marks(6);
    let mut crashed = relay(publisher.clone(), unmarked).with_clock(rig.clock.clone());
    let answer = deliver(&mut crashed, batch).await;
    assert_eq!(answer.batch_item_failures.len(), 7, "{answer:?}");
    assert_eq!(faults.pending(), 0, "every mark failed");
    let relayed = rig.drain(&rig.orders_queue).await;

    // The stream's position is discarded (its 24 hours passed): the batch never comes back. The
    // sweeper finds every event still pending and republishes six under their ids. The poison
    // fails at each sweep its wait allows (its destination may be on the next deploy's list)
    // and is parked at the last.
    rig.clock.advance(A_WEEKEND);
    let sweeper = Sweeper::new(publisher, rig.marks());
    let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(
        (report.republished, report.parked, report.failed),
        (6, 0, 1),
        "{report}"
    );
    let mut parked_later = 0;
    for _ in 1..MAX_SWEEP_FAILURES {
        // Past the longest wait between two tries.
        rig.clock.advance(std::time::Duration::from_secs(11 * 3600));
        let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
        assert_eq!(report.republished, 0, "{report}");
        parked_later += report.parked;
    }
    assert_eq!(parked_later, 1, "parked at the last try");
    let report = sweeper.sweep(rig.clock.now()).await.expect("swept");
    assert_eq!(report.oldest_pending_age, None, "nothing left pending");
    let parked = rig.marks().parked(10).await.expect("parked").events;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].name, "order-placed-0");
    assert!(
        rig.drain(&rig.topic_queue).await.is_empty(),
        "the poison is never published"
    );

    // The orders queue got each event twice (the relay's and the sweeper's, each under its
    // own role), and delivers one message a second time: the SQS consumer acts once per event.
    let swept = rig.drain(&rig.orders_queue).await;
    assert_eq!(
        (relayed.len(), swept.len()),
        (3, 3),
        "three events, each published twice"
    );
    assert_eq!(event_ids(&relayed, false), event_ids(&swept, false));
    let again = [relayed[0].clone()];
    assert_eq!(
        rig.consume(&[
            (RELAY_ROLE, &relayed),
            (SWEEPER_ROLE, &swept),
            (RELAY_ROLE, &again)
        ])
        .await,
        3,
        "one effect per event"
    );

    // The bus's rule fed its queue the same way: the EventBridge consumer acts once per event,
    // each republication (a new EventBridge id and time) a replay.
    let mut bodies: Vec<String> = rig
        .drain(&rig.bus_queue)
        .await
        .iter()
        .filter_map(|message| message.body().map(str::to_owned))
        .collect();
    assert_eq!(bodies.len(), 6, "three events, each published twice");
    bodies.push(bodies[0].clone());
    let effects = consume_bus_events(&rig, &bodies).await;
    assert_eq!(effects.len(), 3, "{effects:?}");
    assert!(effects.values().all(|ran| *ran == 1), "{effects:?}");
}
