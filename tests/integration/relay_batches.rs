//! The relay's batches on real parts (the embedded server's stream, moto's SQS): how many
//! requests carry a batch, each aggregate's order in its own FIFO group, and an event that
//! fails holding back the later events of its ordering key, never overtaken.
//!
//! The publisher's SQS client carries an interceptor that sees every request's body (and
//! fails the ones that carry a chosen event), so the test counts real requests, not calls.

use std::sync::{Arc, Mutex};

use lambda_idempotency::effects::{Destination, OutboxEvent, Transaction};
use lambda_idempotency::lambda::relay::Publisher;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::local::unique_table_name;
use lambda_idempotency::{BoxError, ExecutionContext, Idempotency};
use serde_json::{Value, json};

use crate::relay::{Rig, deliver};

/// The SQS requests a publisher sent (their bodies), failing each that carries `fail_on`.
#[derive(Debug, Clone, Default)]
struct SqsRequests {
    bodies: Arc<Mutex<Vec<String>>>,
    fail_on: Option<&'static str>,
}

impl SqsRequests {
    fn failing_on(marker: &'static str) -> Self {
        Self {
            fail_on: Some(marker),
            ..Self::default()
        }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies
            .lock()
            .map(|bodies| bodies.clone())
            .unwrap_or_default()
    }

    /// A publisher whose SQS requests go through this interceptor.
    fn publisher(&self, rig: &Rig) -> Publisher {
        let config = rig.moto_config();
        let sqs = aws_sdk_sqs::config::Builder::from(&config)
            .interceptor(self.clone())
            .build();
        Publisher::new(
            aws_sdk_eventbridge::Client::new(&config),
            aws_sdk_sns::Client::new(&config),
            aws_sdk_sqs::Client::from_conf(sqs),
        )
    }
}

impl aws_sdk_sqs::config::Intercept for SqsRequests {
    fn name(&self) -> &'static str {
        "SqsRequests"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &aws_sdk_sqs::config::RuntimeComponents,
        _cfg: &mut aws_sdk_sqs::config::ConfigBag,
    ) -> Result<(), BoxError> {
        let body = context
            .request()
            .body()
            .bytes()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .unwrap_or_default();
        let fail = self.fail_on.is_some_and(|marker| body.contains(marker));
        if let Ok(mut bodies) = self.bodies.lock() {
            bodies.push(body);
        }
        if fail {
            return Err("the test fails this request".into());
        }
        Ok(())
    }
}

/// Commits one operation per event, in order, each with its event for `queue`: `(mark,
/// ordering)`, the mark the event's payload carries.
async fn commit(rig: &Rig, queue: &str, events: &[(&str, Option<(&str, u64)>)]) {
    let idem = Idempotency::new(rig.db.store()).with_recovery(Recovery::Steps);
    for (mark, ordering) in events {
        let inv = invocation(
            &format!("batched-{}", unique_table_name(mark)),
            &json!({"mark": mark}),
        );
        let destination = Destination::Sqs {
            queue_url: queue.to_owned(),
        };
        idem.execute(&inv, |ctx: ExecutionContext| async move {
            ctx.step("place")
                .transact(|_key| async move {
                    let mut event =
                        OutboxEvent::new("placed", destination, &json!({"mark": mark}))?;
                    if let Some((key, sequence)) = ordering {
                        event = event.ordered_by(*key, *sequence)?;
                    }
                    Ok::<_, BoxError>(Transaction::new(()).publish(&rig.outbox, event))
                })
                .await
        })
        .await
        .expect("committed");
    }
}

/// The marks of the messages `queue` holds, in the order received, with each message's
/// group and envelope.
async fn received(rig: &Rig, queue: &str) -> Vec<(String, Option<String>, Value)> {
    let mut all = Vec::new();
    loop {
        let answer = rig
            .sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive");
        let messages = answer.messages().to_vec();
        if messages.is_empty() {
            return all;
        }
        for message in messages {
            let envelope: Value =
                serde_json::from_str(message.body().expect("a body")).expect("an envelope");
            let group = message
                .attributes()
                .and_then(|attributes| {
                    attributes.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
                })
                .cloned();
            let mark = envelope["payload"]["mark"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            rig.sqs
                .delete_message()
                .queue_url(queue)
                .receipt_handle(message.receipt_handle().expect("a handle"))
                .send()
                .await
                .expect("delete");
            all.push((mark, group, envelope));
        }
    }
}

#[tokio::test]
async fn twenty_five_events_go_out_in_three_requests_and_each_is_marked() {
    let rig = Rig::open().await;
    let marks: Vec<String> = (0..25).map(|n| format!("m-{n}")).collect();
    let events: Vec<(&str, Option<(&str, u64)>)> =
        marks.iter().map(|mark| (mark.as_str(), None)).collect();
    commit(&rig, &rig.orders_queue, &events).await;
    let requests = SqsRequests::default();
    let batch = rig.stream_batch().await;
    assert_eq!(batch.records.len(), 25);

    let answer = deliver(&mut rig.relay_publishing(requests.publisher(&rig)), batch).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    assert_eq!(
        requests.bodies().len(),
        3,
        "10 + 10 + 5 entries: three SendMessageBatch requests, not 25 SendMessage"
    );
    let mut got: Vec<String> = received(&rig, &rig.orders_queue)
        .await
        .into_iter()
        .map(|(mark, _, _)| mark)
        .collect();
    got.sort();
    let mut want = marks.clone();
    want.sort();
    assert_eq!(got, want, "each event once");
    assert_eq!(
        rig.marks().oldest_pending().await.expect("the index"),
        None,
        "every event marked published"
    );
}

#[tokio::test]
async fn each_aggregate_keeps_its_order_in_its_own_fifo_group() {
    let rig = Rig::open().await;
    let fifo = rig.fifo_queue("aggregates").await;
    commit(
        &rig,
        &fifo,
        &[
            ("a-1", Some(("agg-a", 1))),
            ("b-1", Some(("agg-b", 1))),
            ("a-2", Some(("agg-a", 2))),
            ("a-3", Some(("agg-a", 3))),
            ("loose", None),
        ],
    )
    .await;
    let requests = SqsRequests::default();
    let answer = deliver(
        &mut rig.relay_publishing(requests.publisher(&rig)),
        rig.stream_batch().await,
    )
    .await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    assert_eq!(
        requests.bodies().len(),
        3,
        "[a-1 b-1] [a-2 loose] [a-3]: one event of an aggregate a request"
    );

    let got = received(&rig, &fifo).await;
    let of = |group: &str| -> Vec<(String, u64)> {
        got.iter()
            .filter(|(_, received_group, _)| received_group.as_deref() == Some(group))
            .map(|(mark, _, envelope)| {
                assert_eq!(envelope["ordering_key"], group, "the key in the envelope");
                (
                    mark.clone(),
                    envelope["sequence"].as_u64().expect("a sequence"),
                )
            })
            .collect()
    };
    assert_eq!(
        of("agg-a"),
        vec![("a-1".into(), 1), ("a-2".into(), 2), ("a-3".into(), 3)],
        "one aggregate, in commit order, in its own group"
    );
    assert_eq!(of("agg-b"), vec![("b-1".into(), 1)]);
    let loose = got
        .iter()
        .find(|(mark, _, _)| mark == "loose")
        .expect("the event without an ordering key");
    let id = loose.2["event_id"].as_str().expect("an id");
    assert_eq!(
        loose.1.as_deref(),
        id.rsplit('#').next(),
        "without an ordering key, its own group (its id's digest): it holds no other back"
    );
    assert!(loose.2.get("sequence").is_none());
}

#[tokio::test]
async fn an_event_that_fails_holds_back_the_later_events_of_its_ordering_key() {
    let rig = Rig::open().await;
    commit(
        &rig,
        &rig.orders_queue,
        &[
            ("A1-7f3", Some(("agg-a", 1))),
            ("B1-7f3", Some(("agg-b", 1))),
            ("A2-7f3", Some(("agg-a", 2))),
            ("C1-7f3", Some(("agg-c", 1))),
        ],
    )
    .await;
    let batch = rig.stream_batch().await;
    let sequence_of = |mark: &str| {
        batch
            .records
            .iter()
            .find(|record| {
                lambda_idempotency::lambda::relay::inserted(record)
                    .is_some_and(|event| event.payload.contains(mark))
            })
            .and_then(|record| record.change.sequence_number.clone())
            .expect("a record")
    };

    // The request carrying A1 (with B1) fails, with every retry of it.
    let requests = SqsRequests::failing_on("A1-7f3");
    let answer = deliver(
        &mut rig.relay_publishing(requests.publisher(&rig)),
        batch.clone(),
    )
    .await;
    let mut failed: Vec<String> = answer
        .batch_item_failures
        .iter()
        .filter_map(|failure| failure.item_identifier.clone())
        .collect();
    failed.sort();
    let mut expected = vec![
        sequence_of("A1-7f3"),
        sequence_of("B1-7f3"),
        sequence_of("A2-7f3"),
    ];
    expected.sort();
    assert_eq!(failed, expected, "A1 and B1 failed, A2 held behind A1");
    assert!(
        requests
            .bodies()
            .iter()
            .all(|body| !body.contains("A2-7f3")),
        "A2 was never sent ahead of A1"
    );
    let first: Vec<String> = received(&rig, &rig.orders_queue)
        .await
        .into_iter()
        .map(|(mark, _, _)| mark)
        .collect();
    assert_eq!(
        first,
        vec!["C1-7f3".to_owned()],
        "another aggregate is not held"
    );

    // The stream delivers the batch again: A1 before A2, C1 not again.
    let requests = SqsRequests::default();
    let answer = deliver(&mut rig.relay_publishing(requests.publisher(&rig)), batch).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    let bodies = requests.bodies();
    let position = |mark: &str| bodies.iter().position(|body| body.contains(mark));
    assert!(position("A1-7f3") < position("A2-7f3"), "{bodies:?}");
    assert!(
        position("C1-7f3").is_none(),
        "C1 is marked published already"
    );
    let mut again: Vec<String> = received(&rig, &rig.orders_queue)
        .await
        .into_iter()
        .map(|(mark, _, _)| mark)
        .collect();
    again.sort();
    assert_eq!(again, vec!["A1-7f3", "A2-7f3", "B1-7f3"]);
}
