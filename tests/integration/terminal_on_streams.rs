//! A handler's terminal failure on a stream is poison from its first delivery: the engine has
//! retained it as FAILED, every redelivery would only acknowledge it, so reporting it would
//! hold the shard (Lambda re-reads everything from the lowest failed sequence number) for
//! nothing. A retryable failure is still reported, and SQS still leaves a terminal one to its
//! dead-letter queue by default. On both stores, by the engine's classifier and by the
//! operation's own.

use std::error::Error as StdError;
use std::sync::Mutex;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::failure::{Classifier, FailureClass, Terminal};
use lambda_idempotency::lambda::batch::RecordOutcome;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::{BoxError, ErrorKind, Idempotency, KeyPolicy, Operation, OperationScope};
use lambda_runtime::Context;
use serde_json::json;

use super::backends::both;

fn kinesis_record(seq: &str, data: &str) -> KinesisEventRecord {
    serde_json::from_value(json!({"kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "p",
        "sequenceNumber": seq, "data": data, "approximateArrivalTimestamp": 1.0}, "eventSource": "aws:kinesis",
        "eventID": format!("shard-0:{seq}"), "eventName": "aws:kinesis:record", "eventSourceARN": "arn"}))
    .expect("kinesis record")
}

/// "YQ==" is `a`, which the handler refuses for ever; "Yg==" (`b`) fails for now; the rest pass.
async fn handle(record: KinesisEventRecord, runs: &Mutex<Vec<String>>) -> Result<(), BoxError> {
    runs.lock()
        .expect("runs")
        .push(record.kinesis.sequence_number.clone());
    match record.kinesis.data.0.as_slice() {
        b"a" => Err(Terminal::new("refused", "the order was refused").into()),
        b"b" => Err("the ledger is busy".into()),
        _ => Ok(()),
    }
}

/// Terminal for an `std::io::Error` of kind `InvalidData`, whatever wraps it.
struct InvalidDataIsTerminal;

impl Classifier for InvalidDataIsTerminal {
    fn classify(&self, error: &(dyn StdError + 'static)) -> FailureClass {
        match error.downcast_ref::<std::io::Error>() {
            Some(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                FailureClass::terminal("invalid")
            }
            _ => FailureClass::Retryable,
        }
    }
}

#[tokio::test]
async fn a_terminal_failure_on_a_stream_is_acknowledged_on_its_first_delivery() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
        let scope = OperationScope::new("streams", "terminal").expect("scope");
        let operation = || Operation::new(idem.clone(), scope.clone(), sources::kinesis());
        let processor = operation().batch();
        let runs = Mutex::new(Vec::new());

        let report = processor
            .process(
                vec![kinesis_record("1", "YQ=="), kinesis_record("2", "Yw==")],
                &Context::default(),
                |record, _| handle(record, &runs),
            )
            .await;

        assert!(
            matches!(&report.records[0].1, RecordOutcome::Poison(err) if err.kind() == ErrorKind::Handler),
            "{name}: got {:?}",
            report.records
        );
        assert!(
            matches!(report.records[1].1, RecordOutcome::Executed),
            "{name}: the partition goes on past it: {:?}",
            report.records
        );
        assert!(
            report.failed_identifiers().is_empty(),
            "{name}: the shard is not held for a record that can only be acknowledged"
        );
        assert_eq!(*runs.lock().expect("runs"), ["1", "2"], "{name}");

        // What it was acknowledged on: the engine retained the failure, which a redelivery
        // replays without running the handler.
        let first = operation()
            .invocation(&kinesis_record("1", "YQ=="), &Context::default())
            .expect("invocation");
        let record = backend.store.get(first.key()).await.expect("read");
        assert_eq!(record.map(|r| r.status), Some(Status::Failed), "{name}");
        let again = processor
            .process(
                vec![kinesis_record("1", "YQ==")],
                &Context::default(),
                |record, _| handle(record, &runs),
            )
            .await;
        assert!(again.failed_identifiers().is_empty(), "{name}");
        assert_eq!(runs.lock().expect("runs").len(), 2, "{name}: not run again");

        // A retryable failure is reported, and what follows it on its partition waits.
        let report = processor
            .process(
                vec![kinesis_record("3", "Yg=="), kinesis_record("4", "Yw==")],
                &Context::default(),
                |record, _| handle(record, &runs),
            )
            .await;
        assert_eq!(report.failed_identifiers(), ["3", "4"], "{name}");
        assert!(
            matches!(report.records[1].1, RecordOutcome::Skipped),
            "{name}: {:?}",
            report.records
        );
    }
}

#[tokio::test]
async fn the_operations_own_classifier_decides_what_is_poison() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
        let scope = OperationScope::new("streams", "classified").expect("scope");
        let processor = Operation::new(idem, scope, sources::kinesis())
            .with_classifier(InvalidDataIsTerminal)
            .batch();
        let invalid = |_: KinesisEventRecord, _| async {
            Err::<(), _>(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not an order",
            ))
        };
        let report = processor
            .process(
                vec![kinesis_record("7", "YQ==")],
                &Context::default(),
                invalid,
            )
            .await;
        assert!(
            matches!(report.records[0].1, RecordOutcome::Poison(_)),
            "{name}: {:?}",
            report.records
        );

        let busy = |_: KinesisEventRecord, _| async {
            Err::<(), _>(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the ledger is busy",
            ))
        };
        let report = processor
            .process(vec![kinesis_record("8", "Yg==")], &Context::default(), busy)
            .await;
        assert_eq!(report.failed_identifiers(), ["8"], "{name}: retryable");
    }
}

/// Terminal for every error: a panic is still no retained failure.
struct EverythingIsTerminal;

impl Classifier for EverythingIsTerminal {
    fn classify(&self, _: &(dyn StdError + 'static)) -> FailureClass {
        FailureClass::terminal("failed")
    }
}

/// A panic, the handler's or the key policy's, is never acknowledged, even by a classifier
/// that calls every error terminal: nothing retained it, and only a redelivery takes its
/// claim over (acknowledged, the record stayed IN_PROGRESS with no delivery left to end it).
#[tokio::test]
async fn a_panic_is_redelivered_whatever_the_classifier_says() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
        let scope = OperationScope::new("streams", "panics").expect("scope");
        let operation = || {
            Operation::new(idem.clone(), scope.clone(), sources::kinesis())
                .with_classifier(EverythingIsTerminal)
        };
        let processor = operation().batch();
        let panics = |_: KinesisEventRecord, _| async {
            if true {
                panic!("a bug a deploy fixes");
            }
            Ok::<(), BoxError>(())
        };
        let report = processor
            .process(
                vec![kinesis_record("5", "YQ==")],
                &Context::default(),
                panics,
            )
            .await;
        assert!(
            matches!(report.records[0].1, RecordOutcome::Failed(_)),
            "{name}: {:?}",
            report.records
        );
        assert_eq!(report.failed_identifiers(), ["5"], "{name}");
        let claimed = operation()
            .invocation(&kinesis_record("5", "YQ=="), &Context::default())
            .expect("invocation");
        let record = backend.store.get(claimed.key()).await.expect("read");
        assert_eq!(
            record.map(|r| r.status),
            Some(Status::InProgress),
            "{name}: the claim waits for the redelivery's takeover"
        );

        let keyless = Operation::new(
            idem.clone(),
            scope.clone(),
            KeyPolicy::from_fns(
                |_: &KinesisEventRecord| -> Option<String> { panic!("a key policy's bug") },
                |record: &KinesisEventRecord| Some(record.kinesis.sequence_number.clone()),
            ),
        )
        .with_classifier(EverythingIsTerminal)
        .batch();
        let report = keyless
            .process(
                vec![kinesis_record("6", "YQ==")],
                &Context::default(),
                |_, _| async { Ok::<(), BoxError>(()) },
            )
            .await;
        assert_eq!(
            report.failed_identifiers(),
            ["6"],
            "{name}: {:?}",
            report.records
        );
    }
}

#[tokio::test]
async fn sqs_still_leaves_a_terminal_failure_to_its_dead_letter_queue() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
        let scope = OperationScope::new("queues", "terminal").expect("scope");
        let processor = Operation::new(
            idem,
            scope,
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch();
        let message: SqsMessage = serde_json::from_value(json!({
            "messageId": "m-1", "receiptHandle": "rh", "body": r#"{"order_id": "o-1"}"#,
            "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
            "eventSourceARN": "arn:aws:sqs:us-east-1:1:orders"
        }))
        .expect("message");
        let refused = |_: SqsMessage, _| async {
            Err::<(), BoxError>(Terminal::new("refused", "the order was refused").into())
        };
        let report = processor
            .process(vec![message], &Context::default(), refused)
            .await;
        assert_eq!(report.failed_identifiers(), ["m-1"], "{name}");
    }
}
