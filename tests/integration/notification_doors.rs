//! The SNS and S3 doors (events as Lambda delivers them, parsed by `aws_lambda_events`), and a
//! replay told apart on the layer and the batch door, on both stores. SNS and S3 read no
//! partial-batch response: a record to deliver again fails the invocation, the retry runs
//! only what did not succeed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::s3::S3Event;
use aws_lambda_events::event::sns::SnsEvent;
use lambda_idempotency::Error;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::lambda::batch::RecordOutcome;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::{
    Execution, ExecutionContext, Idempotency, KeyPolicy, Operation, OperationScope,
};
use lambda_runtime::tower::{ServiceBuilder, ServiceExt, service_fn};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use super::backends::{Backend, both};

fn engine(backend: &Backend) -> Idempotency {
    Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone())
}

fn scope(operation: &str) -> OperationScope {
    OperationScope::new("doors", operation).expect("scope")
}

/// An SNS event as Lambda delivers it, one record per `(message id, message)`.
fn sns_event(messages: &[(&str, Value)]) -> SnsEvent {
    let records: Vec<Value> = messages
        .iter()
        .map(|(id, message)| {
            json!({"EventSource": "aws:sns", "EventVersion": "1.0",
                "EventSubscriptionArn": "arn:aws:sns:us-east-1:123456789012:orders:2bcfbf39",
                "Sns": {"Type": "Notification", "MessageId": id,
                    "TopicArn": "arn:aws:sns:us-east-1:123456789012:orders", "Subject": null,
                    "Message": message.to_string(), "Timestamp": "2026-12-04T05:00:00.000Z",
                    "SignatureVersion": "1", "Signature": "EXAMPLE", "SigningCertUrl": "https://example.com",
                    "UnsubscribeUrl": "https://example.com", "MessageAttributes": {}}})
        })
        .collect();
    serde_json::from_value(json!({"Records": records})).expect("an SNS event")
}

/// An S3 event as Lambda delivers it, one record per `(event name, sequencer, size)` of one
/// object.
fn s3_event(records: &[(&str, &str, i64)]) -> S3Event {
    let records: Vec<Value> = records
        .iter()
        .map(|(name, sequencer, size)| {
            json!({"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
                "eventTime": "2026-12-04T05:00:00.000Z", "eventName": name,
                "userIdentity": {"principalId": "EXAMPLE"}, "requestParameters": {"sourceIPAddress": "127.0.0.1"},
                "responseElements": {"x-amz-request-id": "EXAMPLE123456789", "x-amz-id-2": "EXAMPLE123/5678"},
                "s3": {"s3SchemaVersion": "1.0", "configurationId": "testConfigRule",
                    "bucket": {"name": "invoices", "ownerIdentity": {"principalId": "EXAMPLE"}, "arn": "arn:aws:s3:::invoices"},
                    "object": {"key": "2026/order-418.pdf", "size": size, "eTag": "0123456789abcdef0123456789abcdef",
                        "versionId": "v1", "sequencer": sequencer}}})
        })
        .collect();
    serde_json::from_value(json!({"Records": records})).expect("an S3 event")
}

/// Runs per record key, and a handler that fails the records it is told to, once each.
#[derive(Clone, Default)]
struct Ledger {
    runs: Arc<Mutex<HashMap<String, usize>>>,
    fail_once: Arc<Mutex<Vec<String>>>,
}

impl Ledger {
    fn run(&self, name: String) -> Result<Value, std::io::Error> {
        *self
            .runs
            .lock()
            .expect("runs")
            .entry(name.clone())
            .or_default() += 1;
        let mut fail_once = self.fail_once.lock().expect("fail");
        if let Some(at) = fail_once.iter().position(|failing| *failing == name) {
            fail_once.remove(at);
            return Err(std::io::Error::other("downstream timed out"));
        }
        Ok(json!({"handled": name}))
    }

    fn runs(&self, name: &str) -> usize {
        self.runs
            .lock()
            .expect("runs")
            .get(name)
            .copied()
            .unwrap_or(0)
    }
}

#[tokio::test]
async fn an_sns_event_runs_once_and_its_redelivery_replays() {
    for backend in both().await {
        let name = backend.name;
        let ledger = Ledger::default();
        let operation = Operation::new(engine(&backend), scope("sns"), sources::sns());
        let service = operation.clone().batch().service({
            let ledger = ledger.clone();
            move |record: aws_lambda_events::event::sns::SnsRecord, _ctx: ExecutionContext| {
                let ledger = ledger.clone();
                async move { ledger.run(record.sns.message_id) }
            }
        });
        let event = sns_event(&[("m-1", json!({"order_id": "o-1"}))]);

        for delivery in 0..2 {
            let answer = service
                .clone()
                .oneshot(LambdaEvent::new(event.clone(), Context::default()))
                .await;
            assert!(answer.is_ok(), "{name}: delivery {delivery}: {answer:?}");
        }
        assert_eq!(
            ledger.runs("m-1"),
            1,
            "{name}: one effect over two deliveries"
        );

        let report = operation
            .batch()
            .process(event.records, &Context::default(), |record, _ctx| {
                let ledger = ledger.clone();
                async move { ledger.run(record.sns.message_id) }
            })
            .await;
        assert!(
            report.records[0].1.is_replay(),
            "{name}: the batch door tells a replay"
        );
        assert_eq!(ledger.runs("m-1"), 1, "{name}");
    }
}

#[tokio::test]
async fn a_failed_sns_record_fails_the_invocation_and_the_retry_runs_only_it() {
    for backend in both().await {
        let name = backend.name;
        let ledger = Ledger::default();
        ledger.fail_once.lock().expect("fail").push("m-2".into());
        let service = Operation::new(engine(&backend), scope("sns-retry"), sources::sns())
            .batch()
            .service({
                let ledger = ledger.clone();
                move |record: aws_lambda_events::event::sns::SnsRecord, _ctx: ExecutionContext| {
                    let ledger = ledger.clone();
                    async move { ledger.run(record.sns.message_id) }
                }
            });
        let event = sns_event(&[
            ("m-1", json!({"order_id": "o-1"})),
            ("m-2", json!({"order_id": "o-2"})),
        ]);

        let first = service
            .clone()
            .oneshot(LambdaEvent::new(event.clone(), Context::default()))
            .await;
        assert!(
            matches!(
                first,
                Err(Error::RecordsFailed {
                    failed: 1,
                    records: 2
                })
            ),
            "{name}: Lambda must retry the event: {first:?}"
        );
        // Lambda's asynchronous retry delivers the whole event again.
        let retry = service
            .oneshot(LambdaEvent::new(event, Context::default()))
            .await;
        assert!(retry.is_ok(), "{name}: {retry:?}");
        assert_eq!(
            ledger.runs("m-1"),
            1,
            "{name}: the record that succeeded replays"
        );
        assert_eq!(
            ledger.runs("m-2"),
            2,
            "{name}: the failed record runs again"
        );
    }
}

#[tokio::test]
async fn an_s3_event_runs_each_record_in_order_and_refuses_a_changed_object() {
    for backend in both().await {
        let name = backend.name;
        let order = Arc::new(Mutex::new(Vec::new()));
        let service = Operation::new(engine(&backend), scope("s3"), sources::s3())
            .batch()
            .service({
                let order = Arc::clone(&order);
                move |record: aws_lambda_events::event::s3::S3EventRecord,
                      _ctx: ExecutionContext| {
                    let order = Arc::clone(&order);
                    async move {
                        let sequencer = record.s3.object.sequencer.unwrap_or_default();
                        order.lock().expect("order").push(sequencer.clone());
                        Ok::<_, std::io::Error>(json!({"indexed": sequencer}))
                    }
                }
            });
        let event = s3_event(&[
            ("ObjectCreated:Put", "0A1B", 10),
            ("ObjectCreated:Put", "0A1C", 12),
        ]);

        for _ in 0..2 {
            let answer = service
                .clone()
                .oneshot(LambdaEvent::new(event.clone(), Context::default()))
                .await;
            assert!(answer.is_ok(), "{name}: {answer:?}");
        }
        assert_eq!(
            *order.lock().expect("order"),
            ["0A1B", "0A1C"],
            "{name}: each record once, in the object's order"
        );

        // The same sequencer with another size is not the same notification: refused, and the
        // invocation fails so that it reaches the dead-letter queue after Lambda's retries.
        let changed = s3_event(&[("ObjectCreated:Put", "0A1B", 99)]);
        let answer = service
            .oneshot(LambdaEvent::new(changed, Context::default()))
            .await;
        assert!(
            matches!(
                answer,
                Err(Error::RecordsFailed {
                    failed: 1,
                    records: 1
                })
            ),
            "{name}: {answer:?}"
        );
        assert_eq!(
            order.lock().expect("order").len(),
            2,
            "{name}: the handler did not run"
        );
    }
}

#[tokio::test]
async fn the_layer_tells_a_replay_without_changing_the_stored_bytes() {
    for backend in both().await {
        let name = backend.name;
        let operation = Operation::new(
            engine(&backend),
            scope("charge"),
            KeyPolicy::pointer("/order_id").expect("policy"),
        );
        let runs = Arc::new(Mutex::new(0));
        let service = ServiceBuilder::new()
            .map_response(|done: Execution<Value>| {
                let replayed = done.is_replay();
                let mut answer = done.into_value();
                answer["replayed"] = replayed.into();
                answer
            })
            .layer(operation.clone().layer().executions())
            .service(service_fn({
                let runs = Arc::clone(&runs);
                move |event: LambdaEvent<Value>| {
                    let runs = Arc::clone(&runs);
                    async move {
                        *runs.lock().expect("runs") += 1;
                        Ok::<_, lambda_runtime::Error>(
                            json!({"charged": event.payload["order_id"]}),
                        )
                    }
                }
            }));
        let event = json!({"order_id": "o-7", "amount": 10});
        let call = |service: &_| {
            let service = Clone::clone(service);
            let event = event.clone();
            async move {
                ServiceExt::oneshot(service, LambdaEvent::new(event, Context::default()))
                    .await
                    .expect("answered")
            }
        };

        let first: Value = call(&service).await;
        let again: Value = call(&service).await;
        assert_eq!(
            first,
            json!({"charged": "o-7", "replayed": false}),
            "{name}"
        );
        assert_eq!(again, json!({"charged": "o-7", "replayed": true}), "{name}");
        assert_eq!(*runs.lock().expect("runs"), 1, "{name}");

        let key = operation
            .invocation(&event, &Context::default())
            .expect("invocation")
            .key()
            .clone();
        let stored = backend
            .store
            .get(&key)
            .await
            .expect("get")
            .expect("a record");
        assert_eq!(
            stored.outcome.as_deref(),
            Some(br#"{"charged":"o-7"}"#.as_slice()),
            "{name}: the stored outcome is the handler's, without the caller's marker"
        );
    }
}

#[test]
fn a_batch_outcome_says_whether_it_replayed() {
    assert!(RecordOutcome::Replayed.is_replay());
    assert!(!RecordOutcome::Executed.is_replay());
    assert!(!RecordOutcome::AlreadyDone.is_replay());
}

/// An S3 event of the object `s3_event` uploads, other than its creation or removal: a
/// restore, a lifecycle transition or a tagging, carrying `sequencer` (S3 gives such an event
/// the object version's sequencer, its upload's, or none: `""`).
fn object_event(event_name: &str, time: &str, request_id: &str, sequencer: &str) -> S3Event {
    let mut event = serde_json::to_value(s3_event(&[(event_name, "", 10)])).expect("json");
    let record = &mut event["Records"][0];
    record["eventTime"] = json!(time);
    record["responseElements"]["x-amz-request-id"] = json!(request_id);
    record["s3"]["object"]["sequencer"] = match sequencer {
        "" => Value::Null,
        sequencer => json!(sequencer),
    };
    serde_json::from_value(event).expect("an S3 event")
}

/// An object's upload, its restore's start and the restore's completion name one object and
/// version, and the restore's events carry the upload's sequencer (as S3 sends them) or none:
/// three operations (0.4 answered the restore as a replay of the upload, and its completion as
/// a replay of its start: neither ran), each of whose redeliveries is a replay.
#[tokio::test]
async fn an_s3_restore_is_told_apart_from_the_upload_by_its_name_and_time() {
    for backend in both().await {
        for (restore_sequencer, operation) in [
            ("0055AED6DCD90281E5", "s3-restore"),
            ("", "s3-unsequenced-restore"),
        ] {
            let name = format!("{} (restore sequencer {restore_sequencer:?})", backend.name);
            let ledger = Ledger::default();
            let service = Operation::new(engine(&backend), scope(operation), sources::s3())
                .batch()
                .service({
                    let ledger = ledger.clone();
                    move |record: aws_lambda_events::event::s3::S3EventRecord,
                          _ctx: ExecutionContext| {
                        let ledger = ledger.clone();
                        async move { ledger.run(record.event_name.unwrap_or_default()) }
                    }
                });
            let mut uploaded = s3_event(&[("ObjectCreated:Put", "0055AED6DCD90281E5", 10)]);
            uploaded.records[0].event_time = "2026-12-01T05:00:00.000Z".parse().expect("time");
            let started = object_event(
                "ObjectRestore:Post",
                "2026-12-04T05:00:00.000Z",
                "REQ1",
                restore_sequencer,
            );
            let completed = object_event(
                "ObjectRestore:Completed",
                "2026-12-04T09:12:00.000Z",
                "REQ2",
                restore_sequencer,
            );

            for event in [
                &uploaded, &started, &completed, &uploaded, &started, &completed,
            ] {
                let answer = service
                    .clone()
                    .oneshot(LambdaEvent::new(event.clone(), Context::default()))
                    .await;
                assert!(answer.is_ok(), "{name}: {answer:?}");
            }
            assert_eq!(ledger.runs("ObjectCreated:Put"), 1, "{name}");
            assert_eq!(
                ledger.runs("ObjectRestore:Post"),
                1,
                "{name}: the restore is an operation of its own, run once"
            );
            assert_eq!(
                ledger.runs("ObjectRestore:Completed"),
                1,
                "{name}: the completion is an operation of its own, run once"
            );
        }
    }
}

/// 0.4 keyed an S3 event other than a creation or removal by its object, version and sequencer
/// (the upload's, or none) alone: the cut-over rule does not read those records, so that the
/// object's next event (a restore's completion after 0.4 recorded its start) runs, even with
/// the rule on.
#[tokio::test]
async fn the_next_s3_object_event_runs_where_0_4_recorded_its_object() {
    for sequencer in ["0055AED6DCD90281E5", ""] {
        for backend in both().await {
            let name = format!("{} (sequencer {sequencer:?})", backend.name);
            let clock = backend.clock.clone();
            let config = lambda_idempotency::Config::builder()
                .keyed_by_0_4_before(clock.now() + std::time::Duration::from_secs(60))
                .build()
                .expect("config");
            // 0.4's `sources::s3`: the object's bucket, key, version and sequencer alone.
            let by_0_4 = KeyPolicy::from_fns(
                |record: &aws_lambda_events::event::s3::S3EventRecord| {
                    let object = &record.s3.object;
                    Some(json!([
                        record.s3.bucket.name,
                        object.key,
                        object.version_id,
                        object.sequencer
                    ]))
                },
                |record: &aws_lambda_events::event::s3::S3EventRecord| {
                    let object = &record.s3.object;
                    Some(json!([
                        record.s3.bucket.name,
                        object.key,
                        object.version_id,
                        object.e_tag,
                        object.size
                    ]))
                },
            );
            let v0_4 = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
            let started = object_event(
                "ObjectRestore:Post",
                "2026-12-04T05:00:00.000Z",
                "REQ1",
                sequencer,
            );
            let event = object_event(
                "ObjectRestore:Completed",
                "2026-12-04T09:12:00.000Z",
                "REQ2",
                sequencer,
            );
            let today = Operation::new(v0_4.clone(), scope("s3-upgrade"), by_0_4)
                .invocation(&started.records[0], &Context::default())
                .expect("invocation");
            let recorded_by_0_4 = lambda_idempotency::Invocation::new(
                today.key().clone(),
                lambda_idempotency::key::Fingerprint::from_stored(today.fingerprint().as_str()),
                std::time::Duration::from_secs(60),
            );
            let ledger = Ledger::default();
            v0_4.execute(&recorded_by_0_4, |_| async {
                ledger.run("restored".into())
            })
            .await
            .expect("0.4's run");
            clock.advance(std::time::Duration::from_secs(120));

            let v0_5 = Operation::new(
                engine(&backend).with_config(config),
                scope("s3-upgrade"),
                sources::s3(),
            );
            let report = v0_5
                .batch()
                .process(event.records, &Context::default(), |_record, _ctx| {
                    let ledger = ledger.clone();
                    async move { ledger.run("restored".into()) }
                })
                .await;
            assert!(
                matches!(report.records[0].1, RecordOutcome::Executed),
                "{name}: {:?}",
                report.records[0].1
            );
            assert_eq!(ledger.runs("restored"), 2, "{name}: the completion ran");
        }
    }
}
