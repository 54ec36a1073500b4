//! Kinesis records keyed within their stream: every stream numbers its shards from
//! `shardId-000000000000` and a sequence number is unique within its shard only, so a function
//! reading two streams runs their records apart (0.4 keyed by `eventID` alone, and ran one and
//! answered the other as its replay). A redelivery 0.4 recorded is still not run again, under
//! the 0.4 rule's cut-over. On both stores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use lambda_idempotency::Operation;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::config::Config;
use lambda_idempotency::key::Fingerprint;
use lambda_idempotency::lambda::batch::RecordOutcome;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{BoxError, Idempotency, Invocation, OperationKey, OperationScope};
use lambda_runtime::Context;
use serde_json::json;

use crate::backends::both;

/// Record `sequence` of shard 0 of `stream`, carrying `data` (base64).
fn record(stream: &str, sequence: &str, data: &str) -> KinesisEventRecord {
    serde_json::from_value(
        json!({"kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "p",
        "sequenceNumber": sequence, "data": data, "approximateArrivalTimestamp": 1.0},
        "eventSource": "aws:kinesis", "eventID": format!("shardId-000000000000:{sequence}"),
        "eventName": "aws:kinesis:record",
        "eventSourceARN": format!("arn:aws:kinesis:eu-west-1:1:stream/{stream}")}),
    )
    .expect("record")
}

fn scope() -> OperationScope {
    OperationScope::new("shop", "ingest").expect("scope")
}

#[tokio::test]
async fn two_streams_records_of_one_shard_and_sequence_are_two_operations() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let batch = Operation::new(idem, scope(), sources::kinesis()).batch();
        let runs = AtomicUsize::new(0);
        let ingest = |_: KinesisEventRecord, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(()) }
        };

        for stream in ["orders", "payments", "orders"] {
            let report = batch
                .process(
                    vec![record(stream, "4959", "YQ==")],
                    &Context::default(),
                    ingest,
                )
                .await;
            assert!(!report.records[0].1.is_failure(), "{name}: {report:?}");
        }

        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "{name}: one run per stream's record, its redelivery none"
        );
    }
}

#[tokio::test]
async fn a_redelivery_0_4_keyed_by_its_event_id_alone_is_not_run_again() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let cutover = clock.now() + Duration::from_secs(60);
        let config = Config::builder()
            .keyed_by_0_4_before(cutover)
            .build()
            .expect("config");
        let delivered = record("orders", "4960", "Yg==");
        // 0.4 keyed the record by its `eventID` alone and named no key rule.
        let (today_key, fingerprint) = sources::kinesis()
            .derive(&scope(), &delivered)
            .expect("derive");
        let key_by_0_4 = OperationKey::derive(
            &scope(),
            None,
            delivered.event_id.as_deref().expect("an event id"),
        )
        .expect("key");
        assert_ne!(key_by_0_4, today_key, "{name}: keyed apart today");
        let v0_4 = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let runs = AtomicUsize::new(0);
        v0_4.execute(
            &Invocation::new(
                key_by_0_4,
                Fingerprint::from_stored(fingerprint.as_str()),
                Duration::from_secs(60),
            ),
            |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            },
        )
        .await
        .expect("0.4's run");
        clock.advance(Duration::from_secs(120));
        let v0_5 = Operation::new(
            Idempotency::new(backend.store)
                .with_clock(clock.clone())
                .with_config(config),
            scope(),
            sources::kinesis(),
        )
        .batch();

        let again = v0_5
            .process(vec![delivered], &Context::default(), |_, _| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(()) }
            })
            .await;

        assert!(
            !again.records[0].1.is_failure()
                && !matches!(again.records[0].1, RecordOutcome::Executed),
            "{name}: {:?}",
            again.records[0].1
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: not run again");
    }
}
