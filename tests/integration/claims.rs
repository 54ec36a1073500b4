//! Claims the documentation makes, one test each: the default lease caps, request ids cut to
//! their limit, an altered outcome part, a compressed outcome decompressed only when it is
//! answered from, single flight's patience, and the demo's output as the README quotes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::Operation;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::lambda::LeasePolicy;
use lambda_idempotency::record::MAX_REQUEST_ID_BYTES;
use lambda_idempotency::record::{Record, Status};
use lambda_idempotency::store::{MemoryStore, StoreExt};
use lambda_idempotency::testing::conformance::{counted, invocation, start_time};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::outcomes::{compressible, incompressible};
use lambda_idempotency::{
    Error, Idempotency, Invocation, KeyPolicy, OperationKey, OperationScope, Origin, StoreError,
};
use lambda_runtime::tower::{Service, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};
use tokio::sync::oneshot;

fn scope() -> OperationScope {
    OperationScope::new("claims-test", "charge").expect("scope")
}

/// The record an `IdempotencyLayer` with the default lease policy claims for an event of
/// `order` whose context has `deadline` (epoch milliseconds, 0 for none) and `request_id`,
/// read while the handler runs; then the handler finishes.
async fn claimed_through_the_layer(
    order: &str,
    deadline: u64,
    request_id: &str,
) -> (Record, ManualClock) {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let store = db.store();
    let idem = Idempotency::new(store.clone()).with_clock(clock.clone());
    let layer = Operation::new(
        idem,
        scope(),
        KeyPolicy::pointer("/order_id").expect("pointer"),
    )
    .layer();
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let gates = Arc::new(std::sync::Mutex::new(Some((started_tx, finish_rx))));
    let mut service = layer.wrap(service_fn(move |_: LambdaEvent<Value>| {
        let gates = Arc::clone(&gates);
        async move {
            let (started, finish) = gates.lock().expect("lock").take().ok_or("run once")?;
            let _ = started.send(());
            let _ = finish.await;
            Ok::<_, lambda_runtime::Error>(json!({"charged": true}))
        }
    }));
    let mut context = Context::default();
    context.deadline = deadline;
    context.request_id = request_id.to_owned();
    let running = tokio::spawn(
        service
            .ready()
            .await
            .expect("ready")
            .call(LambdaEvent::new(json!({"order_id": order}), context)),
    );
    started_rx.await.expect("the handler runs");
    let key = OperationKey::derive(&scope(), None, &json!(order)).expect("key");
    let record = store.get(&key).await.expect("get").expect("claimed");
    let _ = finish_tx.send(());
    running.await.expect("join").expect("completed");
    (record, clock)
}

fn lease_of(record: &Record, clock: &ManualClock) -> Duration {
    record
        .lease
        .expires_at
        .duration_since(clock.now())
        .expect("a lease ahead")
}

fn epoch_millis_in(clock: &ManualClock, ahead: Duration) -> u64 {
    let deadline = (clock.now() + ahead)
        .duration_since(UNIX_EPOCH)
        .expect("after epoch");
    u64::try_from(deadline.as_millis()).expect("fits")
}

#[tokio::test]
async fn the_default_lease_policy_caps_a_lease_at_15_minutes_and_5_seconds() {
    let clock = ManualClock::new(start_time());
    let an_hour_ahead = epoch_millis_in(&clock, Duration::from_secs(3600));

    let (record, clock) = claimed_through_the_layer("o-1", an_hour_ahead, "req-1").await;

    assert_eq!(
        lease_of(&record, &clock),
        Duration::from_secs(15 * 60 + 5),
        "an hour left, but no invocation runs past 15 minutes"
    );
    assert_eq!(
        LeasePolicy::default().max,
        Duration::from_secs(905),
        "the documented cap"
    );
}

#[tokio::test]
async fn the_default_lease_policy_gives_60_seconds_without_a_deadline() {
    let (record, clock) = claimed_through_the_layer("o-2", 0, "req-2").await;

    assert_eq!(lease_of(&record, &clock), Duration::from_secs(60));
}

#[tokio::test]
async fn a_request_id_is_cut_to_256_bytes_on_a_char_boundary() {
    // 1 + 2 × 200 bytes: byte 256 falls inside an 'é', so the cut is at 255.
    let request_id = format!("a{}", "é".repeat(200));
    let clock = ManualClock::new(start_time());
    let deadline = epoch_millis_in(&clock, Duration::from_secs(10));

    let (record, _) = claimed_through_the_layer("o-3", deadline, &request_id).await;

    let stored = record.request_id.expect("the request id is kept");
    assert_eq!(MAX_REQUEST_ID_BYTES, 256);
    assert_eq!(stored.len(), 255, "the longest prefix of whole chars");
    assert!(
        request_id.starts_with(&stored),
        "a prefix of the request id"
    );
    assert_eq!(stored, format!("a{}", "é".repeat(127)));
}

#[tokio::test]
async fn an_altered_outcome_part_is_a_corrupt_record_never_a_replay() {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let inv = invocation("altered-part", &json!({"amount": 1}));
    let runs = AtomicUsize::new(0);
    // Past the 400 KB item limit and incompressible: kept in part items.
    idem.execute(&inv, |_| counted(&runs, incompressible(900 * 1024, 5)))
        .await
        .expect("stored");
    let prefix = format!("{}#outcome#", inv.key().as_str());
    let items = db
        .client
        .scan()
        .table_name(&db.table)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default();
    let mut part = items
        .into_iter()
        .find(|item| item["pk"].as_s().is_ok_and(|pk| pk.starts_with(&prefix)))
        .expect("a part item");
    // One byte changed, the length kept: only the digest can tell.
    let mut bytes = part["outcome"]
        .as_b()
        .expect("the part's bytes")
        .clone()
        .into_inner();
    bytes[1000] ^= 0x01;
    part.insert("outcome".into(), AttributeValue::B(Blob::new(bytes)));
    db.client
        .put_item()
        .table_name(&db.table)
        .set_item(Some(part))
        .send()
        .await
        .expect("alter the part");

    let err = idem
        .execute(&inv, |_| counted(&runs, String::from("again")))
        .await
        .expect_err("no replay of altered bytes");

    assert!(
        matches!(&err, Error::Store(StoreError::CorruptRecord { reason, .. })
            if reason.contains("digest")),
        "the digest check refuses it: {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
    let read = db.store().get(inv.key()).await;
    assert!(
        matches!(read, Err(StoreError::CorruptRecord { .. })),
        "a read gives no altered bytes either: {read:?}"
    );
    let item = db
        .client
        .get_item()
        .table_name(&db.table)
        .key("pk", AttributeValue::S(inv.key().as_str().to_owned()))
        .send()
        .await
        .expect("get the record item")
        .item
        .expect("the record stands");
    assert_eq!(
        item["status"].as_s().map(String::as_str),
        Ok(Status::Completed.as_str()),
        "left for an operator"
    );
}

#[tokio::test]
async fn a_compressed_outcome_is_decompressed_only_when_it_is_answered() {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let inv = invocation("compressed-inline", &json!({"amount": 1}));
    let runs = AtomicUsize::new(0);
    // 16 KB of repetitive JSON: compressed, and kept in the record.
    idem.execute(&inv, |_| counted(&runs, compressible(16 * 1024)))
        .await
        .expect("stored");
    let key = AttributeValue::S(inv.key().as_str().to_owned());
    let mut item = db
        .client
        .get_item()
        .table_name(&db.table)
        .key("pk", key.clone())
        .send()
        .await
        .expect("get the record item")
        .item
        .expect("the record stands");
    let format = item.get("outcome_format").and_then(|f| f.as_m().ok());
    assert!(
        format.is_some_and(|f| f.contains_key("length") && !f.contains_key("parts")),
        "compressed, inline: {format:?}"
    );
    // Bytes that do not decompress, under the same manifest.
    item.insert(
        "outcome".into(),
        AttributeValue::B(Blob::new(vec![0xff; 64])),
    );
    db.client
        .put_item()
        .table_name(&db.table)
        .set_item(Some(item))
        .send()
        .await
        .expect("alter the outcome");

    // Another intent under the key: a payload conflict, whatever the stored outcome holds.
    let other = invocation("compressed-inline", &json!({"amount": 2}));
    let conflict = idem
        .execute(&other, |_| counted(&runs, String::from("other")))
        .await
        .expect_err("another intent");
    assert!(
        matches!(conflict, Error::PayloadConflict { .. }),
        "the outcome is never decompressed for a conflict: {conflict:?}"
    );
    // A duplicate, which is answered from it, meets the corrupt bytes and replays nothing.
    let replay = idem
        .execute(&inv, |_| counted(&runs, String::from("again")))
        .await
        .expect_err("no replay of bytes that do not decompress");
    assert!(
        matches!(&replay, Error::Store(StoreError::CorruptRecord { reason, .. })
            if reason.contains("decompress")),
        "{replay:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again");
}

/// Tokio's clock is paused here: the copy's wait for its turn is measured in Tokio's time, which
/// moves only when every task waits, so the case never waits on the wall clock.
#[tokio::test(start_paused = true)]
async fn single_flight_waits_at_most_the_callers_lease_then_answers_in_progress() {
    let clock = ManualClock::new(start_time());
    let idem = Idempotency::new(MemoryStore::new())
        .with_single_flight()
        .with_clock(clock.clone());
    let leader_inv = invocation("patience", &json!({"amount": 1}));
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let leader = tokio::spawn({
        let (idem, inv) = (idem.clone(), leader_inv.clone());
        async move {
            idem.execute(&inv, |_| async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, std::io::Error>(1_u32)
            })
            .await
        }
    });
    started_rx.await.expect("the leader runs");
    // The same operation, with a lease far shorter than the leader's 30 s.
    let patience = Duration::from_millis(300);
    let copy = Invocation::new(
        leader_inv.key().clone(),
        leader_inv.fingerprint().clone(),
        patience,
    );
    let runs = AtomicUsize::new(0);

    let waited = tokio::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        idem.execute(&copy, |_| counted(&runs, 2_u32)),
    )
    .await
    .expect("single flight gave up waiting");
    let waited = waited.elapsed();

    match answer {
        Err(Error::AlreadyInProgress {
            attempt,
            retry_after,
            ..
        }) => {
            assert_eq!(attempt, 1);
            // The leader's lease: 30 s, less its own (sub-millisecond) wait for the turn.
            assert!(
                retry_after > Duration::from_secs(29) && retry_after <= Duration::from_secs(30),
                "the leader's lease: {retry_after:?}"
            );
        }
        other => panic!("expected AlreadyInProgress after waiting, got {other:?}"),
    }
    assert!(waited >= patience, "it waited its lease first: {waited:?}");
    assert!(
        waited < Duration::from_secs(30),
        "it did not wait for the leader's lease, or for the leader: {waited:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(!leader.is_finished(), "the leader still runs");

    let _ = finish_tx.send(());
    let first = leader.await.expect("join").expect("the leader completes");
    assert_eq!(first.origin(), Origin::Executed { attempt: 1 });
    let replay = idem
        .execute(&copy, |_| counted(&runs, 3_u32))
        .await
        .expect("settled");
    assert!(replay.is_replay());
    assert_eq!(*replay.value(), 1);
}

#[tokio::test]
async fn a_terminal_failures_long_message_is_kept_cut_to_its_limit() {
    use lambda_idempotency::failure::Terminal;
    use lambda_idempotency::record::MAX_FAILURE_MESSAGE_BYTES;

    for backend in super::backends::both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let inv = invocation("long-failure", &json!({"order": "o-long"}));
        // Two-byte characters, so that the limit falls inside one.
        let message = "é".repeat(100_000);
        let failing = message.clone();
        idem.execute(&inv, |_| async move {
            Err::<u32, _>(Terminal::new("card_declined", failing))
        })
        .await
        .expect_err("the handler failed");
        let replayed = idem
            .execute(&inv, |_| async { Ok::<_, std::io::Error>(1_u32) })
            .await
            .expect_err("the failure is replayed");
        let Error::Failed { failure, .. } = replayed else {
            panic!("{name}: expected the retained failure, got {replayed:?}");
        };
        assert!(
            failure.message.len() <= MAX_FAILURE_MESSAGE_BYTES
                && failure.message.len() > MAX_FAILURE_MESSAGE_BYTES - 2,
            "{name}: {} bytes kept",
            failure.message.len()
        );
        assert!(message.contains(&failure.message), "{name}: its start");
    }
}

/// Under `ByErrorType`, a `Terminal` the handler wrapped around its own (retryable) error is
/// retained and replayed, never re-run: the old classifier found the wrapped error first and
/// released the claim, and the next delivery charged again.
#[tokio::test]
async fn a_terminal_wrapping_the_handlers_own_error_is_retained_under_by_error_type() {
    use lambda_idempotency::failure::{ByErrorType, FailureClass, HasFailureClass, Terminal};

    #[derive(Debug, thiserror::Error)]
    #[error("the gateway timed out")]
    struct GatewayTimeout;

    impl HasFailureClass for GatewayTimeout {
        fn failure_class(&self) -> FailureClass {
            FailureClass::Retryable
        }
    }

    for backend in super::backends::both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_classifier(ByErrorType::<GatewayTimeout>::new());
        let inv = invocation("charge-uncertain", &json!({"order": "o-charge"}));
        let runs = AtomicUsize::new(0);
        for _ in 0..2 {
            let answer = idem
                .execute(&inv, |_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<u32, _>(Terminal::new("charge_uncertain", GatewayTimeout))
                })
                .await;
            assert!(
                matches!(answer, Err(Error::Handler { .. } | Error::Failed { .. })),
                "{name}: {answer:?}"
            );
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: retained, not re-run"
        );
    }
}

/// The decisions an engine reported, by their metric names, in order.
#[derive(Clone, Default)]
struct Decisions(Arc<std::sync::Mutex<Vec<String>>>);

impl Decisions {
    /// An observer that notes each decision here.
    fn observer(&self) -> impl lambda_idempotency::observe::Observer + use<> {
        let noted = Arc::clone(&self.0);
        move |observation: &lambda_idempotency::observe::Observation<'_>| {
            if let lambda_idempotency::observe::Observation::Decision { decision, .. } = observation
            {
                noted
                    .lock()
                    .expect("unpoisoned")
                    .push(decision.metric_name());
            }
        }
    }

    fn names(&self) -> Vec<String> {
        self.0.lock().expect("unpoisoned").clone()
    }
}

#[tokio::test]
async fn a_result_no_reader_could_replay_is_retained_as_unserializable_once() {
    use lambda_idempotency::record::FailureKind;

    // 200 levels deep: written as JSON, but past the 128 levels serde_json reads back.
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    for backend in super::backends::both().await {
        let name = backend.name;
        let decisions = Decisions::default();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_observer(decisions.observer());
        let inv = invocation("deep-result", &json!({"order": "o-deep"}));
        let runs = AtomicUsize::new(0);
        let handler = |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            let deep = deep.clone();
            async move { Ok::<_, std::io::Error>(deep) }
        };
        let first = idem.execute(&inv, handler).await.expect_err("not kept");
        let again = idem.execute(&inv, handler).await.expect_err("replayed");
        for err in [first, again] {
            let Error::Failed { failure, .. } = err else {
                panic!("{name}: the retained failure, not an invalid event: {err:?}");
            };
            assert_eq!(failure.kind, FailureKind::OutcomeUnserializable, "{name}");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: the effect is not run again"
        );
        // The run that retained the failure is counted as the execution it was; only the
        // retry replays it.
        assert_eq!(
            decisions.names(),
            ["first_execution", "failure_replayed"],
            "{name}"
        );
    }
}

/// A lease of zero (a policy's `without_deadline` set to zero) would write a claim that has
/// already expired: a duplicate at the same instant would take it over and run beside it. A
/// claim holds `MIN_LEASE` instead, on both stores.
#[tokio::test]
async fn a_zero_lease_claims_the_shortest_lease_and_a_duplicate_waits() {
    for backend in crate::backends::both().await {
        let idem = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
        let leader_inv = invocation("zero-lease", &json!({"amount": 1})).with_lease(Duration::ZERO);
        let (started_tx, started_rx) = oneshot::channel();
        let (finish_tx, finish_rx) = oneshot::channel::<()>();
        let runs = Arc::new(AtomicUsize::new(0));
        let leader = tokio::spawn({
            let (idem, inv, runs) = (idem.clone(), leader_inv.clone(), Arc::clone(&runs));
            async move {
                idem.execute(&inv, |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, std::io::Error>(1_u32)
                })
                .await
            }
        });
        started_rx.await.expect("the leader runs");
        let record = backend
            .store
            .get(leader_inv.key())
            .await
            .expect("get")
            .expect("claimed");
        assert_eq!(
            record
                .lease
                .expires_at
                .duration_since(backend.clock.now())
                .expect("ahead"),
            lambda_idempotency::execution::MIN_LEASE,
            "{}",
            backend.name
        );

        let duplicate = idem.execute(&leader_inv, |_| counted(&runs, 2_u32)).await;
        assert!(
            matches!(duplicate, Err(Error::AlreadyInProgress { .. })),
            "{}: {duplicate:?}",
            backend.name
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{}", backend.name);
        let _ = finish_tx.send(());
        let first = leader.await.expect("join").expect("completes");
        assert_eq!(first.origin(), Origin::Executed { attempt: 1 });
    }
}

/// A reconciler's `Applied` value that does not decode as the handler's output says the
/// effect happened, yet cannot be recorded: the operation is held for an operator, not left
/// in progress for another takeover to ask again, lease after lease, without end.
#[tokio::test]
async fn a_reconciled_value_of_another_type_is_held_for_an_operator() {
    use lambda_idempotency::reconcile::{Checked, Takeover};

    for backend in super::backends::both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_reconciler(|_: Takeover| async {
                Ok::<_, lambda_idempotency::BoxError>(Checked::Applied(json!("not a number")))
            });
        let inv = invocation("mistyped-reconciliation", &json!({"order": "o-typed"}));
        let runs = Arc::new(AtomicUsize::new(0));
        lambda_idempotency::testing::conformance::crash_after_run(&idem, &inv, &runs).await;
        clock.advance(Duration::from_secs(3600));

        let first = idem.execute(&inv, |_| counted(&runs, 7_u64)).await;
        assert!(
            matches!(first, Err(Error::Indeterminate { .. })),
            "{name}: {first:?}"
        );
        let held = idem
            .store()
            .get(inv.key())
            .await
            .expect("get")
            .expect("kept");
        assert_eq!(held.status, Status::Indeterminate, "{name}");
        clock.advance(Duration::from_secs(3600));
        let again = idem.execute(&inv, |_| counted(&runs, 7_u64)).await;
        assert!(
            matches!(again, Err(Error::Indeterminate { .. })),
            "{name}: {again:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: only the crashed attempt ran"
        );
    }
}

/// A result over the outcome limit was an execution (the handler ran, its effect applied):
/// counted as one, and its retry as the failure it replays.
#[tokio::test]
async fn a_result_too_large_to_keep_is_counted_as_the_execution_it_was() {
    for backend in super::backends::both().await {
        let name = backend.name;
        let decisions = Decisions::default();
        let config = lambda_idempotency::Config::builder()
            .max_outcome_bytes(64)
            .build()
            .expect("config");
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_config(config)
            .with_observer(decisions.observer());
        let inv = invocation("too-large", &json!({"order": "o-large"}));
        let runs = AtomicUsize::new(0);
        let first = idem
            .execute(&inv, |_| counted(&runs, "x".repeat(200)))
            .await;
        assert!(
            matches!(first, Err(Error::OutcomeTooLarge { .. })),
            "{name}: {first:?}"
        );
        let again = idem
            .execute(&inv, |_| counted(&runs, "x".repeat(200)))
            .await;
        assert!(
            matches!(again, Err(Error::Failed { .. })),
            "{name}: {again:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
        assert_eq!(
            decisions.names(),
            ["first_execution", "failure_replayed"],
            "{name}"
        );
    }
}
