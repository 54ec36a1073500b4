//! The EMF observer (feature `emf`): what the engine decides comes out as CloudWatch Embedded
//! Metric Format documents, checked against the specification's structure.

use std::collections::BTreeMap;
use std::time::Duration;

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::failure::Terminal;
use lambda_idempotency::observe::emf::{MetricsObserver, metrics_cloudwatch_embedded};
use lambda_idempotency::reconcile::{Checked, Recovery, Takeover};
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{
    BoxError, Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope, Origin,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const LEASE: Duration = Duration::from_secs(30);

fn invocation(material: &str, intent: u32) -> Invocation {
    let scope = OperationScope::new("metrics-test", "charge").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    Invocation::new(key, Fingerprint::of(&intent).expect("fingerprint"), LEASE)
}

/// A worker on `inv` whose handler has started and waits for the returned sender (dropped: it
/// waits for ever, a crashed worker), then returns `value`.
async fn held_worker(
    idem: &Idempotency,
    inv: &Invocation,
    value: u32,
) -> (
    tokio::task::JoinHandle<Result<u32, Error>>,
    oneshot::Sender<()>,
) {
    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let worker = tokio::spawn({
        let (idem, inv) = (idem.clone(), inv.clone());
        async move {
            idem.execute(&inv, |_| async move {
                let _ = started_tx.send(());
                if resume_rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
                Ok::<_, std::io::Error>(value)
            })
            .await
            .map(|done| done.into_value())
        }
    });
    started_rx.await.expect("worker started");
    (worker, resume_tx)
}

/// Every decision the engine reports, driven once each (a takeover with each of its endings),
/// comes out as its counter with the right count.
#[tokio::test]
async fn decisions_and_latencies_come_out_as_embedded_metric_format() {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace("IdempotencyTest")
        .with_dimension("service", "checkout")
        .init()
        .expect("the only recorder in this test binary");
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let engine = |store: DynamoDbStore| {
        Idempotency::new(store)
            .with_clock(clock.clone())
            .with_observer(MetricsObserver::new())
            .with_recovery(Recovery::Rerun)
    };
    let idem = engine(db.store());
    let reconciling = engine(db.store())
        .with_reconciler(|_: Takeover| async { Ok::<_, BoxError>(Checked::Applied(json!(7))) });
    let holding = engine(db.store()).with_recovery(Recovery::Indeterminate);
    let ok = |value: u32| async move { Ok::<_, std::io::Error>(value) };

    // first_execution, replay (twice), payload_conflict.
    idem.execute(&invocation("o-1", 1), |_| ok(1))
        .await
        .expect("first");
    for _ in 0..2 {
        let replay = idem
            .execute(&invocation("o-1", 1), |_| ok(1))
            .await
            .expect("replay");
        assert!(replay.is_replay());
    }
    let err = idem
        .execute(&invocation("o-1", 2), |_| ok(2))
        .await
        .expect_err("conflict");
    assert!(matches!(err, Error::PayloadConflict { .. }), "got {err:?}");

    // in_progress_collision: a live claim; then crashed claims whose leases run out.
    let (_crashed_2, _) = held_worker(&idem, &invocation("o-2", 1), 0).await;
    let (_crashed_3, _) = held_worker(&idem, &invocation("o-3", 1), 0).await;
    let (_crashed_4, _) = held_worker(&idem, &invocation("o-4", 1), 0).await;
    let (zombie, resume_zombie) = held_worker(&idem, &invocation("o-5", 1), 5).await;
    let err = idem
        .execute(&invocation("o-2", 1), |_| ok(2))
        .await
        .expect_err("in progress");
    assert!(
        matches!(err, Error::AlreadyInProgress { .. }),
        "got {err:?}"
    );
    clock.advance(LEASE + Duration::from_secs(1));

    // takeover (4 times): re-run, reconciled, indeterminate, and one that fences a zombie.
    let rerun = idem
        .execute(&invocation("o-2", 1), |_| ok(2))
        .await
        .expect("taken over");
    assert_eq!(rerun.origin(), Origin::Executed { attempt: 2 });
    let reconciled = reconciling
        .execute(&invocation("o-3", 1), |_| ok(3))
        .await
        .expect("reconciled");
    assert_eq!(reconciled.origin(), Origin::Reconciled { attempt: 2 });
    let err = holding
        .execute(&invocation("o-4", 1), |_| ok(4))
        .await
        .expect_err("held for an operator");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    idem.execute(&invocation("o-5", 1), |_| ok(55))
        .await
        .expect("taken over");
    let _ = resume_zombie.send(());
    let err = zombie.await.expect("join").expect_err("fenced");
    assert!(matches!(err, Error::LeaseLost { .. }), "got {err:?}");

    // key_expired_conflict: another operation with a business identity already settled.
    idem.execute(
        &invocation("o-6", 1)
            .with_identity("invoice:6")
            .expect("a valid identity"),
        |_| ok(6),
    )
    .await
    .expect("first execution");
    let err = idem
        .execute(
            &invocation("o-7", 1)
                .with_identity("invoice:6")
                .expect("a valid identity"),
            |_| ok(7),
        )
        .await
        .expect_err("the identity stands");
    assert!(
        matches!(err, Error::KeyExpiredConflict { .. }),
        "got {err:?}"
    );

    // handler_failed (terminal, so retained), then failure_replayed.
    let declined = || async {
        Err::<u32, _>(Terminal::new(
            "card_declined",
            std::io::Error::other("declined"),
        ))
    };
    let err = idem
        .execute(&invocation("o-8", 1), |_| declined())
        .await
        .expect_err("failed");
    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    let err = idem
        .execute(&invocation("o-8", 1), |_| declined())
        .await
        .expect_err("retained");
    assert!(matches!(err, Error::Failed { .. }), "got {err:?}");

    // store_error.<kind>: a table that does not exist.
    let missing = engine(DynamoDbStore::new(db.client.clone(), "no-such-table"));
    let err = missing
        .execute(&invocation("o-9", 1), |_| ok(9))
        .await
        .expect_err("no table");
    assert!(matches!(err, Error::Store(_)), "got {err:?}");

    // wait_reads and wait_latency: a duplicate that waits 2 s for a live claim, then answers
    // in progress (a second in_progress_collision). Pauses of 50 ms doubling, the last cut to
    // the patience: 6 reads.
    let (_held_10, _) = held_worker(&idem, &invocation("o-10", 1), 0).await;
    let err = idem
        .execute(
            &invocation("o-10", 1).with_wait_for_result(Duration::from_secs(2)),
            |_| ok(10),
        )
        .await
        .expect_err("still in progress");
    assert!(
        matches!(err, Error::AlreadyInProgress { .. }),
        "got {err:?}"
    );

    // other.MissingKey: an event without its key, refused before the engine.
    let keyed = lambda_idempotency::Operation::new(
        idem.clone(),
        OperationScope::new("metrics-test", "charge").expect("scope"),
        lambda_idempotency::KeyPolicy::<Value>::pointer("/order_id").expect("policy"),
    );
    let err = keyed
        .invocation(&json!({"amount": 3}), &lambda_runtime::Context::default())
        .expect_err("no key");
    assert!(matches!(err, Error::MissingKey { .. }), "got {err:?}");

    // handler_failed again: a handler that panics is counted before its panic goes on.
    let panicked = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(
        idem.execute(&invocation("o-11", 1), |_| async {
            panic!("a handler bug");
            #[allow(unreachable_code)]
            Ok::<u32, std::io::Error>(0)
        }),
    ))
    .await;
    assert!(panicked.is_err(), "the panic goes on");

    let mut out = Vec::new();
    collector.flush(&mut out).expect("flush");
    let documents: Vec<Value> = String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON document"))
        .collect();
    assert!(!documents.is_empty());

    let mut counts = BTreeMap::new();
    for document in &documents {
        let aws = &document["_aws"];
        assert!(aws["Timestamp"].is_u64(), "epoch milliseconds: {document}");
        let directives = aws["CloudWatchMetrics"].as_array().expect("directives");
        for directive in directives {
            assert_eq!(directive["Namespace"], "IdempotencyTest");
            let dimension_sets = directive["Dimensions"].as_array().expect("dimension sets");
            for set in dimension_sets {
                let names: Vec<&str> = set
                    .as_array()
                    .expect("a set")
                    .iter()
                    .map(|name| name.as_str().expect("a name"))
                    .collect();
                assert!(
                    names.contains(&"operation"),
                    "the operation is a dimension: {names:?}"
                );
                for name in names {
                    assert!(
                        document[name].is_string(),
                        "each dimension has a value: {name}"
                    );
                }
            }
            for metric in directive["Metrics"].as_array().expect("metrics") {
                let name = metric["Name"].as_str().expect("a metric name");
                assert!(!document[name].is_null(), "each metric has a value: {name}");
                if name.ends_with("_latency") {
                    assert_eq!(metric["Unit"], "Milliseconds");
                } else {
                    assert_eq!(metric["Unit"], "Count", "{name} is a count");
                }
                if let Some(count) = document[name].as_u64()
                    && !name.ends_with("_latency")
                {
                    let earlier = counts.insert(name.to_owned(), count);
                    assert_eq!(earlier, None, "{name} comes out once");
                }
            }
        }
        assert_eq!(document["operation"], "charge");
        assert_eq!(document["service"], "checkout");
    }
    let expected: BTreeMap<String, u64> = [
        // o-1, and o-6 (the identity's first operation).
        ("first_execution", 2),
        ("replay", 2),
        ("payload_conflict", 1),
        ("in_progress_collision", 2),
        ("takeover", 4),
        ("reconciled", 1),
        ("indeterminate", 1),
        ("key_expired_conflict", 1),
        ("lease_lost", 1),
        // o-8's terminal failure, o-11's panic.
        ("handler_failed", 2),
        ("failure_replayed", 1),
        ("store_error.table_not_found", 1),
        ("wait_reads", 6),
        ("other.MissingKey", 1),
    ]
    .into_iter()
    .map(|(name, count)| (format!("idempotency.{name}"), count))
    .collect();
    assert_eq!(
        counts, expected,
        "every counter, each decision counted once"
    );

    // More latencies in one invocation than an EMF document holds (a batch of 250 records):
    // the observer writes a document before a histogram passes 100 values, so none is lost.
    let flushing = Idempotency::new(db.store())
        .with_clock(clock.clone())
        .with_observer(MetricsObserver::new().flushing(collector).with_sink(buffer));
    for order in 0..250 {
        flushing
            .execute(&invocation(&format!("batch-{order}"), 1), |_| ok(order))
            .await
            .expect("first execution");
    }
    let mut out = early_documents();
    collector.flush(&mut out).expect("flush");
    let mut claims = 0;
    for line in String::from_utf8(out).expect("utf-8").lines() {
        let document: Value = serde_json::from_str(line).expect("one JSON document a line");
        if let Some(values) = document["idempotency.claim_latency"].as_array() {
            assert!(values.len() <= 100, "EMF's bound: {}", values.len());
            claims += values.len();
        }
    }
    assert_eq!(claims, 250, "every claim's latency, across documents");
}

static EARLY: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct EarlyBuffer;

impl std::io::Write for EarlyBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        EARLY.lock().expect("one writer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn buffer() -> Box<dyn std::io::Write> {
    Box::new(EarlyBuffer)
}

/// The documents the observer wrote early, taken.
fn early_documents() -> Vec<u8> {
    std::mem::take(&mut *EARLY.lock().expect("read"))
}

/// The completion's latency covers what a call stores after its handler, whatever the ending:
/// an outcome, a terminal failure kept, a retryable one released (on both stores), a
/// completion refused and held (on DynamoDB): each one observation of `Phase::Completion`.
#[tokio::test]
async fn every_ending_of_a_run_is_timed_as_its_completion() {
    use lambda_idempotency::observe::{Observation, Phase};
    use std::sync::{Arc, Mutex};

    for backend in crate::backends::both().await {
        let (name, _store, _clock, idem) = backend.parts();
        let timed = Arc::new(Mutex::new(0_usize));
        let idem = idem.with_observer({
            let timed = Arc::clone(&timed);
            move |observation: &Observation<'_>| {
                if let Observation::Latency {
                    step: Phase::Completion,
                    ..
                } = observation
                {
                    *timed.lock().expect("unpoisoned") += 1;
                }
            }
        });
        let completions = || *timed.lock().expect("unpoisoned");

        idem.execute(&invocation("ends-ok", 1), |_| async {
            Ok::<_, std::io::Error>(1_u32)
        })
        .await
        .expect("completed");
        assert_eq!(completions(), 1, "{name}: an outcome stored");

        let err = idem
            .execute(&invocation("ends-terminal", 1), |_| async {
                Err::<u32, _>(Terminal::new(
                    "card_declined",
                    std::io::Error::other("declined"),
                ))
            })
            .await
            .expect_err("failed");
        assert!(matches!(err, Error::Handler { .. }), "{name}: {err:?}");
        assert_eq!(completions(), 2, "{name}: a terminal failure kept");

        idem.execute(&invocation("ends-retryable", 1), |_| async {
            Err::<u32, _>(std::io::Error::other("the provider timed out"))
        })
        .await
        .expect_err("failed");
        assert_eq!(completions(), 3, "{name}: a retryable failure released");
    }

    // A completion whose writes' condition fails (on DynamoDB, where such writes commit): one
    // ending, held for an operator, one observation.
    let db = dynamo::start_with_clock(ManualClock::new(start_time())).await;
    let timed = Arc::new(Mutex::new(0_usize));
    let idem = Idempotency::new(db.store()).with_observer({
        let timed = Arc::clone(&timed);
        move |observation: &Observation<'_>| {
            if let Observation::Latency {
                step: Phase::Completion,
                ..
            } = observation
            {
                *timed.lock().expect("unpoisoned") += 1;
            }
        }
    });
    let table = db.table.clone();
    let err = idem
        .execute(&invocation("ends-refused", 1), |ctx| async move {
            let put = aws_sdk_dynamodb::types::Put::builder()
                .table_name(table)
                .item(
                    "pk",
                    aws_sdk_dynamodb::types::AttributeValue::S("stock#sku-1".into()),
                )
                .condition_expression("attribute_exists(pk)")
                .build()?;
            ctx.complete_with(lambda_idempotency::effects::Writes::default().put(put))?;
            Ok::<_, BoxError>(1_u32)
        })
        .await
        .expect_err("refused");
    assert!(
        matches!(err, Error::Indeterminate { .. }),
        "held for an operator, got {err:?}"
    );
    assert_eq!(
        *timed.lock().expect("unpoisoned"),
        1,
        "a refused completion, timed once"
    );
}
