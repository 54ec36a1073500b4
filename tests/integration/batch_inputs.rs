//! Batches under what production gives them, on both stores: a record whose handler panics,
//! records started late in the invocation, a record whose stored state is corrupt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::Operation;
use lambda_idempotency::failure::Panicked;
use lambda_idempotency::key::KeyPolicy;
use lambda_idempotency::lambda::batch::{BatchProcessor, RecordOutcome};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::observe::Observation;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency, OperationScope};
use serde_json::json;

use super::backends::{both, context_with_deadline, sqs_message};

fn scope() -> OperationScope {
    OperationScope::new("batch-inputs", "orders").expect("scope")
}

/// A key function that panics on one record (an `unwrap` on a malformed message) fails that
/// record, for redelivery, as a panicking handler does (on every door: a stream's default
/// poison policy does not drop it); the others run, instead of the whole batch coming back
/// unrun.
#[tokio::test]
async fn a_key_policy_that_panics_on_one_record_fails_that_record_alone() {
    for backend in both().await {
        let (name, _store, clock, idem) = backend.parts();
        let decisions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let idem = idem.with_observer({
            let decisions = std::sync::Arc::clone(&decisions);
            move |observation: &Observation<'_>| {
                if let Observation::Decision {
                    operation,
                    decision,
                } = observation
                {
                    let mut decisions = decisions.lock().expect("unpoisoned");
                    decisions.push(format!("{operation} {}", decision.metric_name()));
                }
            }
        });
        let order_id = |message: &SqsMessage| -> Option<String> {
            let body: serde_json::Value =
                serde_json::from_str(message.body.as_deref()?).expect("a JSON body");
            Some(body["order_id"].as_str()?.to_owned())
        };
        let policy = KeyPolicy::from_fns(order_id, order_id);
        let processor: BatchProcessor<SqsMessage> = Operation::new(idem, scope(), policy).batch();
        let mut malformed = sqs_message("m-2", json!({}));
        malformed.body = Some("not json".to_owned());
        let batch = vec![
            sqs_message("m-1", json!({"order_id": "o-1"})),
            malformed,
            sqs_message("m-3", json!({"order_id": "o-3"})),
        ];
        let runs = AtomicUsize::new(0);
        let deadline = clock.now_plus(Duration::from_secs(60));
        let report = processor
            .process(batch, &context_with_deadline(deadline), |_, _| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(String::from("placed")) }
            })
            .await;

        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "{name}: the readable records ran"
        );
        let outcomes: Vec<_> = report.records.iter().map(|(_, outcome)| outcome).collect();
        assert!(matches!(outcomes[0], RecordOutcome::Executed), "{name}");
        assert!(matches!(outcomes[2], RecordOutcome::Executed), "{name}");
        match outcomes[1] {
            RecordOutcome::Failed(Error::Handler { source }) => {
                assert!(source.is::<Panicked>(), "{name}: {source}")
            }
            other => panic!("{name}: the record fails for redelivery: {other:?}"),
        }
        assert_eq!(
            report.failed_identifiers(),
            vec!["m-2".to_owned()],
            "{name}"
        );
        let mut counted = decisions.lock().expect("unpoisoned").clone();
        counted.sort();
        assert_eq!(
            counted,
            [
                "orders first_execution",
                "orders first_execution",
                "orders handler_failed"
            ],
            "{name}: the record whose key policy panicked is counted too"
        );
    }
}

#[tokio::test]
async fn a_panicking_record_fails_alone_and_the_rest_of_the_batch_is_answered() {
    for backend in both().await {
        let (name, store, clock, idem) = backend.parts();
        let processor: BatchProcessor<SqsMessage> = Operation::new(
            idem,
            scope(),
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch();
        let batch = vec![
            sqs_message("m-1", json!({"order_id": "o-1"})),
            sqs_message("m-2", json!({"order_id": "poison"})),
            sqs_message("m-3", json!({"order_id": "o-3"})),
        ];
        let runs = AtomicUsize::new(0);
        let deadline = clock.now_plus(Duration::from_secs(60));
        let report = processor
            .process(
                batch,
                &context_with_deadline(deadline),
                |message, _: ExecutionContext| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if message
                            .body
                            .as_deref()
                            .is_some_and(|body| body.contains("poison"))
                        {
                            panic!("a bug in the handler");
                        }
                        Ok::<_, std::io::Error>(String::from("placed"))
                    }
                },
            )
            .await;

        assert_eq!(runs.load(Ordering::SeqCst), 3, "{name}");
        assert_eq!(
            report.failed_identifiers(),
            vec!["m-2".to_owned()],
            "{name}"
        );
        let outcomes: Vec<_> = report.records.iter().map(|(_, outcome)| outcome).collect();
        assert!(matches!(outcomes[0], RecordOutcome::Executed), "{name}");
        assert!(matches!(outcomes[2], RecordOutcome::Executed), "{name}");
        match outcomes[1] {
            RecordOutcome::Failed(Error::Handler { source }) => {
                assert!(source.is::<Panicked>(), "{name}: {source}")
            }
            other => panic!("{name}: the panicking record fails: {other:?}"),
        }
        // Its claim was given back (a short grace), not held for the invocation's lease.
        let key = processor_key(&sqs_message("m-2", json!({"order_id": "poison"})));
        let record = store
            .get(&key)
            .await
            .expect("get")
            .expect("the claim stands");
        assert_eq!(record.status, Status::InProgress, "{name}");
        assert!(
            record.lease.expires_at <= clock.now_plus(Duration::from_secs(5)),
            "{name}: the lease was cut to the grace"
        );
    }
}

/// A handler that panics in its closure's synchronous part, before it returns its future (an
/// `unwrap` on the message's body), is answered as one that panics inside it: the record fails
/// alone and its claim is given back at once. On the old engine the closure was called outside
/// the panic guard: the claim was held for the invocation's whole lease.
#[tokio::test]
async fn a_handler_that_panics_before_its_future_is_answered_as_a_panic() {
    for backend in both().await {
        let (name, store, clock, idem) = backend.parts();
        let processor: BatchProcessor<SqsMessage> = Operation::new(
            idem,
            scope(),
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch();
        let batch = vec![
            sqs_message("m-1", json!({"order_id": "o-1"})),
            sqs_message("m-2", json!({"order_id": "poison"})),
        ];
        let deadline = clock.now_plus(Duration::from_secs(60));
        let report = processor
            .process(
                batch,
                &context_with_deadline(deadline),
                |message, _: ExecutionContext| {
                    let body = message.body.unwrap_or_default();
                    assert!(!body.contains("poison"), "a bug in the handler");
                    async move { Ok::<_, std::io::Error>(body.len()) }
                },
            )
            .await;

        assert_eq!(
            report.failed_identifiers(),
            vec!["m-2".to_owned()],
            "{name}"
        );
        let key = processor_key(&sqs_message("m-2", json!({"order_id": "poison"})));
        let record = store
            .get(&key)
            .await
            .expect("get")
            .expect("the claim stands");
        assert_eq!(record.status, Status::InProgress, "{name}");
        assert!(
            record.lease.expires_at <= clock.now_plus(Duration::from_secs(5)),
            "{name}: the lease was cut to the grace, not held to the deadline"
        );
    }
}

/// The key the processor derives for `message`.
fn processor_key(message: &SqsMessage) -> lambda_idempotency::OperationKey {
    sources::sqs(Some("/order_id"))
        .expect("policy")
        .derive(&scope(), message)
        .expect("key")
        .0
}

/// Moves the clock: `ManualClock::now() + by`.
trait NowPlus {
    fn now_plus(&self, by: Duration) -> std::time::SystemTime;
}

impl NowPlus for lambda_idempotency::clock::ManualClock {
    fn now_plus(&self, by: Duration) -> std::time::SystemTime {
        use lambda_idempotency::clock::Clock;
        self.now() + by
    }
}

#[tokio::test]
async fn a_record_started_late_holds_no_lease_past_the_deadline() {
    for backend in both().await {
        let name = backend.name;
        let store = backend.store.clone();
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store).with_clock(clock.clone());
        let processor: BatchProcessor<SqsMessage> = Operation::new(
            idem,
            scope(),
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch()
        .with_concurrency(1);
        let deadline = clock.now_plus(Duration::from_secs(60));
        let batch = vec![
            sqs_message("m-1", json!({"order_id": "slow"})),
            sqs_message("m-2", json!({"order_id": "late"})),
        ];
        let report = processor
            .process(
                batch,
                &context_with_deadline(deadline),
                |message, _: ExecutionContext| {
                    let clock = clock.clone();
                    async move {
                        if message
                            .body
                            .as_deref()
                            .is_some_and(|body| body.contains("slow"))
                        {
                            clock.advance(Duration::from_secs(40)); // the first record takes 40 s
                        }
                        Ok::<_, std::io::Error>(String::from("placed"))
                    }
                },
            )
            .await;
        assert!(
            report.failed_identifiers().is_empty(),
            "{name}: {:?}",
            report.records
        );

        let late = store
            .get(&processor_key(&sqs_message(
                "m-2",
                json!({"order_id": "late"}),
            )))
            .await
            .expect("get")
            .expect("record");
        let skew = Duration::from_secs(5);
        assert!(
            late.lease.expires_at <= deadline + skew,
            "{name}: the late record's lease ends {:?} after the deadline",
            late.lease
                .expires_at
                .duration_since(deadline)
                .unwrap_or_default()
        );
    }
}

fn kinesis_record(seq: &str) -> KinesisEventRecord {
    serde_json::from_value(json!({
        "eventID": format!("shardId-000:{seq}"), "eventName": "aws:kinesis:record",
        "eventSource": "aws:kinesis", "eventSourceARN": "arn:aws:kinesis:us-east-1:1:stream/s",
        "eventVersion": "1.0", "invokeIdentityArn": "arn:aws:iam::1:role/r", "awsRegion": "us-east-1",
        "kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "p", "sequenceNumber": seq,
            "data": "e30=", "approximateArrivalTimestamp": 1.7e9}
    }))
    .expect("kinesis record")
}

/// A stored record the build cannot read (a newer build's claim during a rolling deploy or
/// after a rollback, a damaged item) is never acknowledged, on a stream either: its event is
/// not at fault and would be lost. The stream retries it (its iterator age alarms) and the
/// queue hands it to its dead-letter queue. Acknowledged as poison on streams before.
#[tokio::test]
async fn a_corrupt_record_is_never_acknowledged_a_stream_retries_it_and_sqs_hands_to_its_dlq() {
    for backend in both().await {
        let name = backend.name;
        let store = FaultyStore::new(backend.store);
        let idem = Idempotency::new(AnyStore::new(store.clone())).with_clock(backend.clock.clone());
        let runs = AtomicUsize::new(0);
        let run = || {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(String::from("done")) }
        };

        let stream: BatchProcessor<KinesisEventRecord> =
            Operation::new(idem.clone(), scope(), sources::kinesis()).batch();
        store.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Corrupt));
        let report = stream
            .process(
                vec![kinesis_record("1"), kinesis_record("2")],
                &Default::default(),
                |_, _| run(),
            )
            .await;
        assert_eq!(
            report.failed_identifiers(),
            vec!["1".to_owned(), "2".to_owned()],
            "{name}: the stream retries from it, the record behind it in its shard not run"
        );
        assert!(
            matches!(&report.records[0].1, RecordOutcome::Failed(err) if err.is_permanent()),
            "{name}: {:?}",
            report.records[0].1
        );

        let queue: BatchProcessor<SqsMessage> = Operation::new(
            idem,
            scope(),
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch();
        store.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Corrupt));
        let report = queue
            .process(
                vec![sqs_message("m-1", json!({"order_id": "o-9"}))],
                &Default::default(),
                |_, _| run(),
            )
            .await;
        assert!(
            matches!(&report.records[0].1, RecordOutcome::Failed(err) if err.is_permanent()),
            "{name}: SQS retries it until its DLQ takes it: {:?}",
            report.records[0].1
        );
        assert_eq!(
            store.fired().values().sum::<u64>(),
            2,
            "{name}: both faults fired"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "{name}: nothing corrupt ran, nor the record behind it"
        );
    }
}

#[tokio::test]
async fn two_tenants_records_with_the_same_identity_each_run() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let body = |message: &SqsMessage| -> serde_json::Value {
            serde_json::from_str(message.body.as_deref().unwrap_or("{}")).unwrap_or_default()
        };
        let policy = sources::sqs(Some("/order_id"))
            .expect("policy")
            .with_tenant(move |message: &SqsMessage| {
                body(message)["tenant"].as_str().map(str::to_owned)
            })
            .with_identity(move |message: &SqsMessage| {
                Some(format!("invoice:{}", body(message)["order_id"].as_str()?))
            });
        let processor: BatchProcessor<SqsMessage> = Operation::new(idem, scope(), policy).batch();
        let runs = AtomicUsize::new(0);
        let report = processor
            .process(
                vec![
                    sqs_message("m-1", json!({"tenant": "acme", "order_id": "o-1"})),
                    sqs_message("m-2", json!({"tenant": "globex", "order_id": "o-1"})),
                ],
                &Default::default(),
                |_, _: ExecutionContext| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, std::io::Error>(String::from("invoiced")) }
                },
            )
            .await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "{name}: each tenant's invoice"
        );
        assert!(
            report
                .records
                .iter()
                .all(|(_, outcome)| matches!(outcome, RecordOutcome::Executed)),
            "{name}: neither acknowledged as done by the other: {:?}",
            report.records
        );
    }
}

/// Two messages of one business identity under two keys (a producer that sent the invoice
/// twice, each send its own message id) in one batch run one after the other: the second finds
/// the first's evidence settled and is acknowledged as done, not failed for meeting it in
/// progress (and, on a FIFO queue, holding its message group back until a redelivery). On the
/// old batch they ran side by side and the second was reported failed.
#[tokio::test]
async fn two_keys_of_one_identity_in_a_batch_run_one_after_the_other() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let policy = sources::sqs(Some("/request_id"))
            .expect("policy")
            .with_identity(|message: &SqsMessage| {
                let body: serde_json::Value =
                    serde_json::from_str(message.body.as_deref()?).ok()?;
                Some(format!("invoice:{}", body["order_id"].as_str()?))
            });
        let processor: BatchProcessor<SqsMessage> = Operation::new(idem, scope(), policy).batch();
        let runs = AtomicUsize::new(0);
        let report = processor
            .process(
                vec![
                    sqs_message("m-1", json!({"request_id": "r-1", "order_id": "o-7"})),
                    sqs_message("m-2", json!({"request_id": "r-2", "order_id": "o-7"})),
                ],
                &Default::default(),
                |_, _: ExecutionContext| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async {
                        // Long enough for the other record to start, were it run beside it.
                        for _ in 0..20 {
                            tokio::task::yield_now().await;
                        }
                        Ok::<_, std::io::Error>(String::from("invoiced"))
                    }
                },
            )
            .await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: one invoice: {:?}",
            report.records
        );
        assert!(
            report.failed_identifiers().is_empty(),
            "{name}: {:?}",
            report.records
        );
        assert!(
            matches!(report.records[1].1, RecordOutcome::AlreadyDone),
            "{name}: {:?}",
            report.records[1].1
        );
    }
}

/// Joining by identity orders, and stops nothing: when the first key of an identity fails
/// (retryably, its claim released), the second key still runs in this batch instead of being
/// skipped after it (which would hold back its own FIFO group and count toward its receives).
#[tokio::test]
async fn a_failed_key_of_an_identity_does_not_skip_the_others() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let policy = sources::sqs(Some("/request_id"))
            .expect("policy")
            .with_identity(|message: &SqsMessage| {
                let body: serde_json::Value =
                    serde_json::from_str(message.body.as_deref()?).ok()?;
                Some(format!("invoice:{}", body["order_id"].as_str()?))
            });
        let processor: BatchProcessor<SqsMessage> = Operation::new(idem, scope(), policy).batch();
        let runs = AtomicUsize::new(0);
        let report = processor
            .process(
                vec![
                    sqs_message("m-1", json!({"request_id": "r-1", "order_id": "o-8"})),
                    sqs_message("m-2", json!({"request_id": "r-2", "order_id": "o-8"})),
                ],
                &Default::default(),
                |message, _: ExecutionContext| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let first = message.message_id.as_deref() == Some("m-1");
                    async move {
                        match first {
                            true => Err(std::io::Error::other("the invoicing API timed out")),
                            false => Ok(String::from("invoiced")),
                        }
                    }
                },
            )
            .await;
        assert_eq!(
            report.failed_identifiers(),
            vec!["m-1".to_owned()],
            "{name}: {:?}",
            report.records
        );
        assert!(
            matches!(report.records[1].1, RecordOutcome::Executed),
            "{name}: {:?}",
            report.records[1].1
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}");
    }
}

/// A step's recorded result this build cannot read (its type changed in a deploy) holds the
/// operation INDETERMINATE for an operator: its stream record is reported failed, never
/// acknowledged as poison (the operator's release would find no delivery left to run it, the
/// operation half applied). Acknowledged on streams before.
#[tokio::test]
async fn a_step_result_the_build_cannot_read_is_never_acknowledged_on_a_stream() {
    for backend in both().await {
        let (name, store, clock, idem) = backend.parts();
        let operation = Operation::new(idem, scope(), sources::kinesis());
        let key = operation
            .invocation(&kinesis_record("1"), &Default::default())
            .expect("invocation")
            .key()
            .clone();
        let stream: BatchProcessor<KinesisEventRecord> = operation.batch();

        // The earlier build records the step's result as text, then fails retryably: the
        // claim is given back with its step for the next delivery to take over.
        let earlier = stream
            .process(
                vec![kinesis_record("1")],
                &Default::default(),
                |_, ctx: ExecutionContext| async move {
                    ctx.step("charge")
                        .run(|_key| async { Ok::<_, BoxError>(String::from("ch-1")) })
                        .await?;
                    Err::<String, BoxError>(BoxError::from("the next call timed out"))
                },
            )
            .await;
        assert_eq!(earlier.failed_identifiers(), vec!["1".to_owned()], "{name}");

        // The given-back lease runs out; this build reads the step's result as a number.
        clock.advance(Duration::from_secs(3600));
        let report = stream
            .process(
                vec![kinesis_record("1")],
                &Default::default(),
                |_, ctx: ExecutionContext| async move {
                    let charge: u64 = ctx
                        .step("charge")
                        .run(|_key| async { Ok::<_, BoxError>(7) })
                        .await?;
                    Ok::<_, BoxError>(charge.to_string())
                },
            )
            .await;
        assert!(
            matches!(
                &report.records[0].1,
                RecordOutcome::Failed(Error::StoredOutcomeUnreadable { .. })
            ),
            "{name}: {:?}",
            report.records[0].1
        );
        assert_eq!(report.failed_identifiers(), vec!["1".to_owned()], "{name}");
        let held = store.get(&key).await.expect("read").expect("held");
        assert_eq!(held.status, Status::Indeterminate, "{name}");
    }
}

/// A function whose timeout is the deadline margin or shorter (a batch starting with 1.5 s
/// left, under the default 2 s margin) still runs its records, keeping half the time left:
/// every record was reported not started, on every delivery, until its dead-letter queue took
/// it unrun. A record reached with less than that left is not started, and reported failed
/// for redelivery.
#[tokio::test]
async fn a_batch_with_less_time_than_its_margin_still_runs_its_records() {
    use lambda_idempotency::clock::Clock;
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let processor: BatchProcessor<SqsMessage> = Operation::new(
            idem,
            scope(),
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch()
        .with_concurrency(1);
        let deadline = clock.now() + Duration::from_millis(1500);
        let batch = vec![
            sqs_message("m-1", json!({"order_id": "o-1"})),
            sqs_message("m-2", json!({"order_id": "o-2"})),
        ];
        let runs = AtomicUsize::new(0);

        let report = processor
            .process(
                batch,
                &context_with_deadline(deadline),
                |_, _: ExecutionContext| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // The first record takes a second: 0.5 s is left, under half of 1.5 s.
                    clock.advance(Duration::from_secs(1));
                    async { Ok::<_, std::io::Error>(String::from("placed")) }
                },
            )
            .await;

        assert!(
            matches!(report.records[0].1, RecordOutcome::Executed),
            "{name}: {:?}",
            report.records[0].1
        );
        assert!(
            matches!(report.records[1].1, RecordOutcome::NotStarted),
            "{name}: {:?}",
            report.records[1].1
        );
        assert_eq!(
            report.failed_identifiers(),
            ["m-2"],
            "{name}: it comes back"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}
