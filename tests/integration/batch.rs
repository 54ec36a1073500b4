//! Batch processing: partial-batch responses, ordering groups, bounded concurrency, on the
//! embedded DynamoDB server.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::dynamodb::EventRecord as DynamoDbEventRecord;
use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::Operation;
use lambda_idempotency::lambda::batch::{BatchProcessor, BatchRecord, PoisonPolicy, RecordOutcome};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{ErrorKind, ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::Context;
use serde_json::json;
use tokio::sync::watch;

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::testing::dynamo;

use super::backends::context_with_deadline;

fn message(id: &str, queue: &str, group: Option<&str>, body: serde_json::Value) -> SqsMessage {
    let mut attributes = json!({"ApproximateReceiveCount": "1"});
    if let Some(group) = group {
        attributes["MessageGroupId"] = json!(group);
    }
    serde_json::from_value(json!({
        "messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(),
        "attributes": attributes, "messageAttributes": {},
        "eventSourceARN": format!("arn:aws:sqs:us-east-1:1:{queue}")
    }))
    .expect("message")
}

/// A batch processor on the embedded server, its clock (the engine's and the server's) at
/// [`start_time`]: deadlines are set against it, never against the wall clock.
async fn processor() -> BatchProcessor<SqsMessage> {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock);
    let scope = OperationScope::new("batch-test", "orders").expect("scope");
    Operation::new(
        idem,
        scope,
        sources::sqs(Some("/order_id")).expect("policy"),
    )
    .batch()
}

/// The ledger of effects and a handler that fails for orders marked `"fail": true`.
#[derive(Clone, Default)]
struct Orders {
    placed: Arc<Mutex<Vec<String>>>,
}

impl Orders {
    async fn place(
        &self,
        message: SqsMessage,
        _: ExecutionContext,
    ) -> Result<String, std::io::Error> {
        let body: serde_json::Value =
            serde_json::from_str(message.body.as_deref().unwrap_or("{}"))?;
        if body["fail"] == json!(true) {
            return Err(std::io::Error::other("inventory service unavailable"));
        }
        let order = body["order_id"].as_str().unwrap_or("?").to_owned();
        self.placed.lock().expect("lock").push(order.clone());
        Ok(order)
    }

    fn placed(&self) -> Vec<String> {
        self.placed.lock().expect("lock").clone()
    }
}

#[tokio::test]
async fn only_failed_records_come_back_and_replays_are_acknowledged() {
    let processor = processor().await;
    let orders = Orders::default();
    let batch = || {
        vec![
            message("m-1", "orders", None, json!({"order_id": "o-1"})),
            message("m-2", "orders", None, json!({"order_id": "o-2"})),
            message(
                "m-3",
                "orders",
                None,
                json!({"order_id": "o-3", "fail": true}),
            ),
            message(
                "m-4-republished",
                "orders",
                None,
                json!({"order_id": "o-1"}),
            ),
        ]
    };

    let first = processor
        .process(batch(), &Context::default(), |m, ctx| orders.place(m, ctx))
        .await;
    let again = processor
        .process(batch(), &Context::default(), |m, ctx| orders.place(m, ctx))
        .await;

    assert_eq!(
        first.failed_identifiers(),
        ["m-3"],
        "the in-batch duplicate of o-1 is a replay"
    );
    assert_eq!(again.failed_identifiers(), ["m-3"]);
    assert!(matches!(first.records[3].1, RecordOutcome::Replayed));
    assert_eq!(
        orders.placed().into_iter().collect::<BTreeSet<_>>(),
        BTreeSet::from(["o-1".to_owned(), "o-2".to_owned()])
    );
    assert_eq!(
        orders.placed().len(),
        2,
        "each order placed once over 8 deliveries"
    );
    assert!(
        again
            .records
            .iter()
            .take(2)
            .all(|(_, outcome)| matches!(outcome, RecordOutcome::Replayed))
    );
    let response = again.sqs_response();
    assert_eq!(response.batch_item_failures.len(), 1);
    assert_eq!(response.batch_item_failures[0].item_identifier, "m-3");
}

#[tokio::test]
async fn a_fifo_group_stops_at_its_first_failure() {
    let processor = processor().await;
    let orders = Orders::default();
    let batch = vec![
        message(
            "a-1",
            "orders.fifo",
            Some("customer-a"),
            json!({"order_id": "a-1", "fail": true}),
        ),
        message(
            "b-1",
            "orders.fifo",
            Some("customer-b"),
            json!({"order_id": "b-1"}),
        ),
        message(
            "a-2",
            "orders.fifo",
            Some("customer-a"),
            json!({"order_id": "a-2"}),
        ),
        message(
            "b-2",
            "orders.fifo",
            Some("customer-b"),
            json!({"order_id": "b-2"}),
        ),
    ];

    let report = processor
        .process(batch, &Context::default(), |m, ctx| orders.place(m, ctx))
        .await;

    assert_eq!(
        report.failed_identifiers(),
        ["a-1", "a-2"],
        "a-2 must not overtake a-1"
    );
    assert!(matches!(report.records[2].1, RecordOutcome::Skipped));
    assert_eq!(
        orders.placed(),
        ["b-1", "b-2"],
        "the other group ran, in order"
    );
}

/// By default a batch runs at once, up to 64 records: 100 records never have more than 64 in
/// flight, and the first 64 are in flight together (the gate opens only then).
#[tokio::test]
async fn a_default_batch_runs_at_most_64_records_at_once() {
    let processor = processor().await;
    let (active, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let batch = (0..100)
        .map(|i| {
            message(
                &format!("m-{i}"),
                "orders",
                None,
                json!({"order_id": format!("o-{i}")}),
            )
        })
        .collect();
    let (gate_tx, gate_rx) = watch::channel(false);
    let context = Context::default();
    let process = processor.process(batch, &context, |_, _| {
        let (active, peak) = (Arc::clone(&active), Arc::clone(&peak));
        let (gate_tx, mut gate_rx) = (gate_tx.clone(), gate_rx.clone());
        async move {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            if now >= 64 {
                gate_tx.send_replace(true);
            }
            let _ = gate_rx.wait_for(|open| *open).await;
            active.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        }
    });
    let report = tokio::time::timeout(Duration::from_secs(60), process)
        .await
        .expect("64 ran at once");

    assert!(report.failed_identifiers().is_empty());
    assert_eq!(
        peak.load(Ordering::SeqCst),
        64,
        "64 records in flight at most"
    );
}

#[tokio::test]
async fn concurrency_is_bounded() {
    let processor = processor().await.with_concurrency(3);
    let (active, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let batch = (0..12)
        .map(|i| {
            message(
                &format!("m-{i}"),
                "orders",
                None,
                json!({"order_id": format!("o-{i}")}),
            )
        })
        .collect();

    // The first handlers wait until three are in flight together: with a bound below three
    // this never happens and the guard fails the test; above three, the peak shows it.
    let (gate_tx, gate_rx) = watch::channel(false);
    let context = Context::default();
    let process = processor.process(batch, &context, |_, _| {
        let (active, peak) = (Arc::clone(&active), Arc::clone(&peak));
        let (gate_tx, mut gate_rx) = (gate_tx.clone(), gate_rx.clone());
        async move {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            if now >= 3 {
                gate_tx.send_replace(true);
            }
            let _ = gate_rx.wait_for(|open| *open).await;
            active.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        }
    });
    let report = tokio::time::timeout(Duration::from_secs(60), process)
        .await
        .expect("three ran at once");

    assert!(report.failed_identifiers().is_empty());
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "three records in flight at most"
    );
}

#[tokio::test]
async fn a_record_without_a_key_fails_alone_and_writes_nothing() {
    let processor = processor().await;
    let orders = Orders::default();
    let batch = vec![
        message("m-1", "orders", None, json!({"no_order_id": true})),
        message("m-2", "orders", None, json!({"order_id": "o-2"})),
    ];

    let report = processor
        .process(batch, &Context::default(), |m, ctx| orders.place(m, ctx))
        .await;

    assert_eq!(report.failed_identifiers(), ["m-1"]);
    assert!(matches!(
        &report.records[0].1,
        RecordOutcome::Failed(lambda_idempotency::Error::MissingKey { .. })
    ));
    assert_eq!(orders.placed(), ["o-2"]);
}

#[tokio::test]
async fn kinesis_partitions_keep_their_order() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let processor = Operation::new(
        idem,
        OperationScope::new("batch-test", "stream").expect("scope"),
        sources::kinesis(),
    )
    .batch();
    let record = |seq: &str, partition: &str, data: &str| -> KinesisEventRecord {
        serde_json::from_value(json!({"kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": partition,
            "sequenceNumber": seq, "data": data, "approximateArrivalTimestamp": 1.0}, "eventSource": "aws:kinesis",
            "eventID": format!("shard-0:{seq}"), "eventName": "aws:kinesis:record", "eventSourceARN": "arn"}))
        .expect("record")
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let batch = vec![
        record("1", "p", "YQ=="),
        record("2", "q", "Yg=="),
        record("3", "p", "ZmFpbA=="),
        record("4", "p", "Yw=="),
    ];

    let report = processor
        .process(batch, &Context::default(), |r: KinesisEventRecord, _| {
            let seen = Arc::clone(&seen);
            async move {
                let seq = r.kinesis.sequence_number.clone();
                if seq == "3" {
                    return Err(std::io::Error::other("poison record"));
                }
                seen.lock().expect("lock").push(seq);
                Ok(())
            }
        })
        .await;

    assert_eq!(report.failed_identifiers(), ["3", "4"]);
    let response = report.kinesis_response();
    assert_eq!(
        response.batch_item_failures[0].item_identifier.as_deref(),
        Some("3")
    );
    let mut seen = seen.lock().expect("lock").clone();
    seen.sort();
    assert_eq!(seen, ["1", "2"]);
}

#[tokio::test]
async fn a_deadline_already_past_at_the_start_is_an_emulators_and_ignored() {
    // `cargo lambda watch` sends a deadline that has passed before the function sees the
    // event; Lambda never does (it stops the sandbox at the deadline).
    let processor = processor()
        .await
        .with_deadline_margin(Duration::from_secs(2));
    let orders = Orders::default();
    let batch = vec![message(
        "m-1",
        "orders",
        None,
        json!({"order_id": "o-emulated"}),
    )];
    let context = context_with_deadline(start_time() - Duration::from_secs(1));

    let report = processor
        .process(batch, &context, |m, ctx| orders.place(m, ctx))
        .await;

    assert_eq!(orders.placed(), ["o-emulated"], "the record ran");
    assert!(
        report.failed_identifiers().is_empty(),
        "{:?}",
        report.records
    );
}

/// An invocation context whose deadline is `deadline`.
fn kinesis_record(seq: &str, partition: &str, data: &str) -> KinesisEventRecord {
    serde_json::from_value(json!({"kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": partition,
        "sequenceNumber": seq, "data": data, "approximateArrivalTimestamp": 1.0}, "eventSource": "aws:kinesis",
        "eventID": format!("shard-0:{seq}"), "eventName": "aws:kinesis:record", "eventSourceARN": "arn"}))
    .expect("record")
}

#[tokio::test]
async fn a_record_that_can_never_succeed_does_not_stall_a_stream() {
    let db = dynamo::start().await;
    let processor = Operation::new(
        Idempotency::new(db.store()),
        OperationScope::new("batch-test", "poison").expect("scope"),
        sources::kinesis(),
    )
    .batch();
    let ok = |_: KinesisEventRecord, _| async { Ok::<_, std::io::Error>(()) };
    processor
        .process(
            vec![kinesis_record("1", "p", "YQ==")],
            &Context::default(),
            ok,
        )
        .await;

    // The same sequence number with other data: a payload conflict, for ever.
    let report = processor
        .process(
            vec![
                kinesis_record("1", "p", "Yg=="),
                kinesis_record("2", "p", "Yw=="),
            ],
            &Context::default(),
            ok,
        )
        .await;

    assert!(
        matches!(
            &report.records[0].1,
            RecordOutcome::Poison(err) if err.kind() == ErrorKind::PayloadConflict
        ),
        "got {:?}",
        report.records
    );
    assert!(matches!(report.records[1].1, RecordOutcome::Executed));
    assert!(report.failed_identifiers().is_empty(), "the shard moves on");

    let retrying = Operation::new(
        Idempotency::new(db.store()),
        OperationScope::new("batch-test", "poison").expect("scope"),
        sources::kinesis(),
    )
    .batch()
    .with_poison_policy(PoisonPolicy::Retry);
    let report = retrying
        .process(
            vec![kinesis_record("1", "p", "Yg==")],
            &Context::default(),
            ok,
        )
        .await;
    assert_eq!(report.failed_identifiers(), ["1"], "retried when asked");
}

#[tokio::test]
async fn sqs_retries_a_poison_record_by_default() {
    let processor = processor().await;
    let orders = Orders::default();
    processor
        .process(
            vec![message(
                "m-1",
                "orders",
                None,
                json!({"order_id": "o-p", "amount": 1}),
            )],
            &Context::default(),
            |m, ctx| orders.place(m, ctx),
        )
        .await;

    let report = processor
        .process(
            vec![message(
                "m-2",
                "orders",
                None,
                json!({"order_id": "o-p", "amount": 2}),
            )],
            &Context::default(),
            |m, ctx| orders.place(m, ctx),
        )
        .await;

    assert_eq!(report.failed_identifiers(), ["m-2"], "left to the DLQ");
}

#[tokio::test]
async fn a_default_sqs_batch_runs_in_one_wave() {
    const BATCH: usize = 10; // SQS's default batch size
    let processor = processor().await;
    let (gate_tx, gate_rx) = watch::channel(0_usize);
    let batch = (0..BATCH)
        .map(|i| {
            message(
                &format!("m-{i}"),
                "orders",
                None,
                json!({"order_id": format!("w-{i}")}),
            )
        })
        .collect();

    // Every handler waits until all ten are in flight: below ten at once this never happens.
    let context = Context::default();
    let process = processor.process(batch, &context, |_, _| {
        let (gate_tx, mut gate_rx) = (gate_tx.clone(), gate_rx.clone());
        async move {
            gate_tx.send_modify(|n| *n += 1);
            let _ = gate_rx.wait_for(|n| *n == BATCH).await;
            Ok::<_, std::io::Error>(())
        }
    });
    let report = tokio::time::timeout(Duration::from_secs(60), process)
        .await
        .expect("all ten ran at once");

    assert!(report.failed_identifiers().is_empty());
}

#[test]
fn dynamodb_stream_groups_name_an_item_the_same_whatever_its_key_order() {
    let change = |order: &[&str]| -> DynamoDbEventRecord {
        let mut keys = serde_json::Map::new();
        for name in order {
            keys.insert((*name).to_owned(), json!({"S": format!("{name}-value")}));
        }
        serde_json::from_value(json!({
            "eventID": "e", "eventName": "MODIFY", "eventSource": "aws:dynamodb", "awsRegion": "eu-west-1",
            "dynamodb": {"Keys": keys, "SequenceNumber": "1", "SizeBytes": 1, "StreamViewType": "KEYS_ONLY"}
        }))
        .expect("record")
    };
    let groups: BTreeSet<Option<String>> = [
        ["tenant", "order", "line"],
        ["line", "order", "tenant"],
        ["order", "tenant", "line"],
    ]
    .iter()
    .cycle()
    .take(30)
    .map(|order| change(order).ordering_group())
    .collect();

    assert_eq!(groups.len(), 1, "one group for one item: {groups:?}");
}

#[test]
fn failed_evidence_is_permanent_in_progress_evidence_is_not() {
    use lambda_idempotency::record::{Evidence, Status};
    use lambda_idempotency::{Error, Fingerprint, OperationKey};

    let scope = OperationScope::new("batch-test", "evidence").expect("scope");
    let key = OperationKey::derive(&scope, None, "o-1").expect("key");
    let conflict = |status| Error::KeyExpiredConflict {
        key: key.clone(),
        evidence: Box::new(Evidence {
            identity: "invoice:o-1".into(),
            key: key.clone(),
            fingerprint: Fingerprint::of(&1).expect("fingerprint"),
            status,
            result_ref: None,
            created_at: std::time::UNIX_EPOCH,
            completed_at: None,
            audit: None,
        }),
    };

    assert!(
        conflict(Status::Failed).is_permanent(),
        "evidence never expires"
    );
    assert!(!conflict(Status::InProgress).is_permanent());
    assert!(
        !conflict(Status::Completed).is_permanent(),
        "acknowledged as done instead"
    );
    assert!(conflict(Status::Completed).already_took_effect());
}

/// A record whose effect happened but whose result is over the outcome limit is acknowledged
/// (with its error log), never left to a DLQ whose late redrive would run it again: on SQS,
/// whose poison policy retries, on its first delivery and on a redelivery alike.
#[tokio::test]
async fn a_record_applied_but_not_kept_is_acknowledged_not_sent_to_the_dlq() {
    let db = dynamo::start().await;
    let config = lambda_idempotency::Config::builder()
        .max_outcome_bytes(64)
        .build()
        .expect("config");
    let idem = Idempotency::new(db.store()).with_config(config);
    let scope = OperationScope::new("batch-test", "unkept").expect("scope");
    let processor = Operation::new(
        idem,
        scope,
        sources::sqs(Some("/order_id")).expect("policy"),
    )
    .batch();
    let runs = AtomicUsize::new(0);
    let oversized = |_: SqsMessage, _: ExecutionContext| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, std::io::Error>("x".repeat(1024)) }
    };
    let batch = || vec![message("m-1", "q", None, json!({"order_id": "o-big"}))];

    for delivery in ["first", "redelivery"] {
        let report = processor
            .process(batch(), &Context::default(), oversized)
            .await;
        assert!(
            matches!(&report.records[0].1, RecordOutcome::AppliedNotKept(err) if err.applied_but_not_kept()),
            "{delivery}: {:?}",
            report.records
        );
        assert!(
            report.failed_identifiers().is_empty(),
            "{delivery}: acknowledged, not retried into the DLQ"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect happened once");
}

/// A stream record (Kinesis, DynamoDB Streams) that took effect but whose result cannot be
/// kept is acknowledged too, whatever the poison policy: a stream retries it into nothing but
/// a stall.
#[tokio::test]
async fn a_stream_record_applied_but_not_kept_is_acknowledged() {
    let kinesis = || vec![kinesis_record("9", "p", "YQ==")];
    let runs = applied_not_kept_twice(sources::kinesis(), kinesis).await;
    assert_eq!(runs, 1, "Kinesis: the effect happened once");

    let change = || -> Vec<DynamoDbEventRecord> {
        vec![serde_json::from_value(json!({
            "eventID": "e-9", "eventName": "INSERT", "eventSource": "aws:dynamodb", "awsRegion": "eu-west-1",
            "dynamodb": {"Keys": {"pk": {"S": "order-9"}}, "NewImage": {"pk": {"S": "order-9"}},
                "SequenceNumber": "9", "SizeBytes": 1, "StreamViewType": "NEW_IMAGE"}
        }))
        .expect("record")]
    };
    let runs = applied_not_kept_twice(sources::dynamodb_stream(), change).await;
    assert_eq!(runs, 1, "DynamoDB Streams: the effect happened once");
}

/// Delivers `records()` twice to a handler whose result is over the outcome limit; asserts
/// each delivery's record is acknowledged as applied but not kept; how often the handler ran.
async fn applied_not_kept_twice<R: BatchRecord>(
    policy: lambda_idempotency::KeyPolicy<R>,
    records: impl Fn() -> Vec<R>,
) -> usize {
    let db = dynamo::start().await;
    let config = lambda_idempotency::Config::builder()
        .max_outcome_bytes(64)
        .build()
        .expect("config");
    let processor = Operation::new(
        Idempotency::new(db.store()).with_config(config),
        OperationScope::new("batch-test", "unkept-stream").expect("scope"),
        policy,
    )
    .batch()
    .with_poison_policy(PoisonPolicy::Retry);
    let runs = AtomicUsize::new(0);
    let oversized = |_: R, _: ExecutionContext| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, std::io::Error>("x".repeat(1024)) }
    };
    for delivery in ["first", "redelivery"] {
        let report = processor
            .process(records(), &Context::default(), oversized)
            .await;
        assert!(
            matches!(&report.records[0].1, RecordOutcome::AppliedNotKept(_)),
            "{delivery}: {:?}",
            report.records
        );
        assert!(report.failed_identifiers().is_empty(), "{delivery}");
    }
    runs.load(Ordering::SeqCst)
}

/// A record whose operation another delivery still runs comes back in `batchItemFailures`,
/// so that the source delivers it again later, and is not run beside it.
#[tokio::test]
async fn a_record_still_in_progress_elsewhere_comes_back_as_a_failure() {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock);
    let operation = Operation::new(
        idem.clone(),
        OperationScope::new("batch-test", "held").expect("scope"),
        sources::sqs(Some("/order_id")).expect("policy"),
    );
    let held = message("m-held", "orders", None, json!({"order_id": "o-held"}));
    let invocation = operation
        .invocation(&held, &Context::default())
        .expect("invocation");
    lambda_idempotency::testing::conformance::crash_after_claim(&idem, &invocation).await;
    let runs = AtomicUsize::new(0);
    let report = operation
        .batch()
        .process(vec![held], &Context::default(), |_, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(()) }
        })
        .await;
    assert_eq!(report.failed_identifiers(), ["m-held"]);
    assert!(
        matches!(&report.records[0].1, RecordOutcome::Failed(err) if err.kind() == ErrorKind::AlreadyInProgress),
        "{:?}",
        report.records
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "not run beside the holder");
}

/// A deploy that changes the handler's output type still acknowledges what an earlier build
/// completed: the batch door never decodes a stored result (it answers only which records to
/// deliver again), so the redelivery is a replay, not an unreadable record sent to the DLQ and
/// run again after a redrive. On both stores.
#[tokio::test]
async fn a_new_output_type_still_replays_the_records_an_earlier_build_completed() {
    #[derive(serde::Serialize)]
    struct Placed {
        order: u64,
        lines: Vec<String>,
    }
    for backend in super::backends::both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let scope = OperationScope::new("deploys", "orders").expect("scope");
        let batch =
            Operation::new(idem, scope, sources::sqs(Some("/order_id")).expect("sqs")).batch();
        let context = Context::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let order = || super::backends::sqs_message("m-1", json!({"order_id": "o-1"}));

        let before = batch
            .process(vec![order()], &context, |_, _| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, lambda_idempotency::BoxError>("placed o-1".to_owned())
                }
            })
            .await;
        assert!(
            matches!(before.records[0].1, RecordOutcome::Executed),
            "{name}"
        );

        let after = batch
            .process(vec![order()], &context, |_, _| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, lambda_idempotency::BoxError>(Placed {
                        order: 1,
                        lines: vec![],
                    })
                }
            })
            .await;
        assert!(
            matches!(after.records[0].1, RecordOutcome::Replayed),
            "{name}: {:?}",
            after.records[0].1
        );
        assert!(
            after.sqs_response().batch_item_failures.is_empty(),
            "{name}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}

/// A reconciler's `Applied` value, given in the handler's place on a batch door, is stored as
/// given: the door reads results as JSON, whatever the handler's type, and keeps them so.
#[tokio::test]
async fn a_reconcilers_value_is_stored_as_given_on_a_batch_door() {
    for backend in super::backends::both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let store = backend.store.clone();
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let scope = OperationScope::new("reconciled", "orders").expect("scope");
        let policy = sources::sqs(Some("/order_id")).expect("sqs");
        let order = super::backends::sqs_message("m-1", json!({"order_id": "o-9"}));
        let (key, _) = policy.derive(&scope, &order).expect("key");
        let context = Context::default();

        // The first delivery's process dies mid-handler: its claim stays.
        let crashed = Operation::new(idem.clone(), scope.clone(), policy.clone()).batch();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let started_tx = Arc::new(Mutex::new(Some(started_tx)));
        let worker = tokio::spawn({
            let order = order.clone();
            async move {
                crashed
                    .process(
                        vec![order],
                        &context_with_deadline(start_time() + Duration::from_secs(60)),
                        |_, _| {
                            let started_tx = Arc::clone(&started_tx);
                            async move {
                                if let Some(started) = started_tx.lock().expect("started").take() {
                                    let _ = started.send(());
                                }
                                std::future::pending::<Result<u64, lambda_idempotency::BoxError>>()
                                    .await
                            }
                        },
                    )
                    .await
            }
        });
        started_rx.await.expect("started");
        drop(worker); // detached, pending for ever: a crash, not a cancellation
        clock.advance(Duration::from_secs(3600));

        let reconciled = Operation::new(idem, scope, policy)
            .with_reconciler(|_: lambda_idempotency::reconcile::Takeover| async {
                Ok::<_, lambda_idempotency::BoxError>(
                    lambda_idempotency::effects::Checked::Applied(json!({"charge": "ch_9"})),
                )
            })
            .batch();
        let report = reconciled
            .process(vec![order], &context, |_, _| async {
                Ok::<_, lambda_idempotency::BoxError>(0_u64)
            })
            .await;
        assert!(
            matches!(report.records[0].1, RecordOutcome::AlreadyDone),
            "{name}: {:?}",
            report.records[0].1
        );
        let record = lambda_idempotency::store::StoreExt::get(&store, &key)
            .await
            .expect("read")
            .expect("the record");
        assert_eq!(
            record.outcome.as_deref(),
            Some(br#"{"charge":"ch_9"}"#.as_slice()),
            "{name}: stored as the reconciler gave it"
        );
    }
}

/// Code the handler calls reads its record's context with `lambda::current()`, as it does
/// behind the layer and the HTTP door: each record's own, and none outside the handler.
#[tokio::test]
async fn a_batch_handler_reads_its_records_context_with_current() {
    let processor = processor().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let records = vec![
        message("m-1", "orders", None, json!({"order_id": "o-1"})),
        message("m-2", "orders", None, json!({"order_id": "o-2"})),
    ];
    let report = processor
        .process(records, &Context::default(), |_message, ctx| {
            let seen = Arc::clone(&seen);
            async move {
                let current = lambda_idempotency::lambda::current()
                    .ok_or_else(|| std::io::Error::other("no execution context"))?;
                seen.lock()
                    .expect("seen")
                    .push((current.key().clone(), ctx.key().clone()));
                Ok::<_, std::io::Error>(())
            }
        })
        .await;

    assert!(report.sqs_response().batch_item_failures.is_empty());
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|(current, own)| current == own), "{seen:?}");
    assert_ne!(seen[0].0, seen[1].0, "each record's own");
    assert!(lambda_idempotency::lambda::current().is_none());
}

/// Two FIFO message groups that carry one operation key run one after the other: the second
/// is a replay, not reported in progress (which skipped the rest of its group until
/// redelivered), and a failure stops only its own group.
#[tokio::test]
async fn two_fifo_groups_sharing_a_key_run_one_after_the_other() {
    for backend in super::backends::both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let scope = OperationScope::new("batch-test", "fifo-keys").expect("scope");
        let batch = Operation::new(
            idem,
            scope,
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let records = vec![
            message("m-1", "orders.fifo", Some("A"), json!({"order_id": "o-1"})),
            message("m-2", "orders.fifo", Some("B"), json!({"order_id": "o-1"})),
            message("m-3", "orders.fifo", Some("B"), json!({"order_id": "o-2"})),
            message(
                "m-4",
                "orders.fifo",
                Some("C"),
                json!({"order_id": "o-3", "fail": true}),
            ),
            message("m-5", "orders.fifo", Some("C"), json!({"order_id": "o-4"})),
            message("m-6", "orders.fifo", Some("D"), json!({"order_id": "o-5"})),
        ];
        let report = batch
            .process(records, &Context::default(), |message: SqsMessage, _ctx| {
                let runs = Arc::clone(&runs);
                async move {
                    // Still running when another group's record is started.
                    tokio::task::yield_now().await;
                    let body: serde_json::Value =
                        serde_json::from_str(message.body.as_deref().unwrap_or("{}"))?;
                    if body["fail"] == json!(true) {
                        return Err(std::io::Error::other("inventory service unavailable"));
                    }
                    runs.lock().expect("runs").push(body["order_id"].clone());
                    Ok::<_, std::io::Error>(())
                }
            })
            .await;

        let outcomes: Vec<&RecordOutcome> = report.records.iter().map(|(_, o)| o).collect();
        assert!(
            matches!(outcomes[1], RecordOutcome::Replayed),
            "{name}: {outcomes:?}"
        );
        assert!(matches!(outcomes[2], RecordOutcome::Executed), "{name}");
        assert!(
            outcomes[3].is_failure() && outcomes[4].is_failure(),
            "{name}"
        );
        assert!(
            matches!(outcomes[5], RecordOutcome::Executed),
            "{name}: another group is not stopped"
        );
        let mut runs = runs.lock().expect("runs").clone();
        runs.sort_by_key(ToString::to_string);
        assert_eq!(runs, [json!("o-1"), json!("o-2"), json!("o-5")], "{name}");
    }
}
