//! The tower layer around real `lambda_runtime` services, on the embedded DynamoDB server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_idempotency::Operation;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::lambda::{IdempotencyLayer, current};
use lambda_idempotency::store::{DynamoDbStore, StoreExt};
use lambda_idempotency::{
    Error, Idempotency, IdempotencyError, KeyPolicy, OperationKey, OperationScope,
};
use lambda_runtime::tower::{Service, ServiceBuilder, ServiceExt};
use lambda_runtime::{Context, Diagnostic, LambdaEvent, service_fn};
use serde_json::{Value, json};

use lambda_idempotency::testing::dynamo;

/// A clock on a whole second, so that millisecond deadlines round-trip exactly.
fn whole_second_clock() -> ManualClock {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after epoch");
    ManualClock::new(UNIX_EPOCH + Duration::from_secs(now.as_secs()))
}

fn scope() -> OperationScope {
    OperationScope::new("layer-test", "charge").expect("scope")
}

fn layer(store: DynamoDbStore, clock: &ManualClock) -> IdempotencyLayer<Value> {
    let idem = Idempotency::new(store).with_clock(clock.clone());
    Operation::new(
        idem,
        scope(),
        KeyPolicy::pointer("/order_id").expect("pointer"),
    )
    .layer()
}

fn event(payload: Value, clock: &ManualClock, remaining: Duration) -> LambdaEvent<Value> {
    let mut context = Context::default();
    context.request_id = format!("req-{}", payload["order_id"]);
    context.deadline = u64::try_from(
        (clock.now() + remaining)
            .duration_since(UNIX_EPOCH)
            .expect("after epoch")
            .as_millis(),
    )
    .expect("fits");
    LambdaEvent::new(payload, context)
}

/// A handler that counts its runs and reports what `current()` says.
fn counting_handler(
    runs: Arc<AtomicUsize>,
) -> impl Service<LambdaEvent<Value>, Response = Value, Error = lambda_runtime::Error, Future: Send>
+ Clone
+ Send
+ 'static {
    service_fn(move |event: LambdaEvent<Value>| {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            let ctx = current().ok_or("no execution context")?;
            Ok::<_, lambda_runtime::Error>(json!({
                "charged": event.payload["order_id"],
                "attempt": ctx.attempt(),
                "key": ctx.key().short(),
            }))
        }
    })
}

#[tokio::test]
async fn duplicate_events_run_the_handler_once() {
    let db = dynamo::start().await;
    let clock = whole_second_clock();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = ServiceBuilder::new()
        .layer(layer(db.store(), &clock))
        .service(counting_handler(Arc::clone(&runs)));

    let payload = json!({"order_id": "o-1", "amount": 10});
    let first = service
        .ready()
        .await
        .expect("ready")
        .call(event(payload.clone(), &clock, Duration::from_secs(10)))
        .await
        .expect("first");
    let second = service
        .ready()
        .await
        .expect("ready")
        .call(event(payload, &clock, Duration::from_secs(10)))
        .await
        .expect("duplicate");

    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(first, second);
    assert_eq!(first["attempt"], 1, "the handler read its context");
    assert!(current().is_none(), "no context outside a handler");
}

#[tokio::test]
async fn the_lease_follows_the_invocation_deadline() {
    let db = dynamo::start().await;
    let clock = whole_second_clock();
    let store = db.store();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let started_tx = Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let mut service =
        layer(store.clone(), &clock).wrap(service_fn(move |_: LambdaEvent<Value>| {
            let started_tx = Arc::clone(&started_tx);
            async move {
                if let Some(tx) = started_tx.lock().expect("lock").take() {
                    let _ = tx.send(());
                }
                std::future::pending::<Result<Value, lambda_runtime::Error>>().await
            }
        }));

    let call = service.call(event(
        json!({"order_id": "o-2"}),
        &clock,
        Duration::from_secs(10),
    ));
    let running = tokio::spawn(call);
    started_rx.await.expect("handler started");
    let key = OperationKey::derive(&scope(), None, &json!("o-2")).expect("key");
    let record = store.get(&key).await.expect("get").expect("claimed");
    running.abort();

    let lease = record
        .lease
        .expires_at
        .duration_since(clock.now())
        .expect("in the future");
    assert_eq!(lease, Duration::from_secs(15), "remaining 10 s + 5 s skew");
    assert_eq!(record.request_id.as_deref(), Some("req-\"o-2\""));
}

/// Orders in flight at once in [`concurrent_invocations_through_one_service_instance`].
const ORDERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_invocations_through_one_service_instance() {
    let db = dynamo::start().await;
    let clock = whole_second_clock();
    let runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    // The first ORDERS executions hold until the gate opens: every duplicate below arrives
    // while the first delivery of its order is in flight. A duplicate that ran (a broken
    // layer) would not wait, and would answer as an execution.
    let handler = {
        let runs = Arc::clone(&runs);
        service_fn(move |event: LambdaEvent<Value>| {
            let (runs, started_tx, mut open_rx) =
                (Arc::clone(&runs), started_tx.clone(), open_rx.clone());
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = started_tx.send(run);
                if run <= ORDERS {
                    open_rx.wait_for(|open| *open).await?;
                }
                let ctx = current().ok_or("no execution context")?;
                Ok::<_, lambda_runtime::Error>(json!({
                    "charged": event.payload["order_id"],
                    "attempt": ctx.attempt(),
                    "run": run,
                }))
            }
        })
    };
    let service = layer(db.store(), &clock).wrap(handler);
    // As run_concurrent does: one clone per invocation, all in flight at once.
    let call = |order: usize| {
        let mut service = service.clone();
        let event = event(
            json!({"order_id": format!("o-{order}")}),
            &clock,
            Duration::from_secs(10),
        );
        tokio::spawn(async move { service.ready().await?.call(event).await })
    };

    let firsts: Vec<_> = (0..ORDERS).map(&call).collect();
    for _ in 0..ORDERS {
        started_rx.recv().await.expect("a first delivery started");
    }
    // Two more deliveries of each order while its first is held in its handler.
    let duplicates: Vec<_> = (0..2 * ORDERS).map(|i| call(i % ORDERS)).collect();
    for duplicate in duplicates {
        match duplicate.await.expect("join") {
            Err(IdempotencyError::Idempotency(Error::AlreadyInProgress { attempt, .. })) => {
                assert_eq!(attempt, 1)
            }
            other => panic!("a duplicate in flight must be told to wait, got {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        ORDERS,
        "no duplicate ran beside its first delivery"
    );

    open_tx.send(true).expect("the handlers wait");
    let mut answers = Vec::new();
    for (order, first) in firsts.into_iter().enumerate() {
        let answer = first.await.expect("join").expect("the first delivery");
        assert_eq!(answer["charged"], format!("o-{order}"));
        assert_eq!(answer["attempt"], 1);
        answers.push(answer);
    }
    // Redelivered once settled: the stored answers, nothing run.
    let redeliveries: Vec<_> = (0..2 * ORDERS).map(|i| call(i % ORDERS)).collect();
    for (i, redelivery) in redeliveries.into_iter().enumerate() {
        let answer = redelivery.await.expect("join").expect("replayed");
        assert_eq!(answer, answers[i % ORDERS], "the first answer, replayed");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        ORDERS,
        "one execution per order over 3 deliveries each"
    );
}

#[tokio::test]
async fn an_event_without_a_key_is_refused_before_the_claim() {
    let db = dynamo::start().await;
    let clock = whole_second_clock();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = layer(db.store(), &clock).wrap(counting_handler(Arc::clone(&runs)));

    let before = db.requests.count();
    let err = service
        .call(event(
            json!({"amount": 10}),
            &clock,
            Duration::from_secs(10),
        ))
        .await
        .expect_err("no key");

    assert!(
        matches!(err, IdempotencyError::Idempotency(Error::MissingKey { .. })),
        "got {err:?}"
    );
    assert_eq!(db.requests.count(), before, "nothing sent to the table");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let diagnostic = Diagnostic::from(err);
    assert_eq!(diagnostic.error_type, "Idempotency.MissingKey");
}

/// The layer's error tells the engine's answers from the handler's, and gives a
/// `lambda_runtime::Error` handler its own error back; an error of another type is reached by
/// its type, and Lambda reports it under that type's name.
#[tokio::test]
async fn a_handlers_own_error_comes_back_through_the_layer() {
    let db = dynamo::start().await;
    let clock = whole_second_clock();
    let declined = service_fn(|_: LambdaEvent<Value>| async {
        Err::<Value, lambda_runtime::Error>("the card was declined".into())
    });
    let err = layer(db.store(), &clock)
        .wrap(declined)
        .oneshot(event(
            json!({"order_id": "o-boxed"}),
            &clock,
            Duration::from_secs(10),
        ))
        .await
        .expect_err("the handler failed");
    match &err {
        IdempotencyError::Handler(source) => {
            assert_eq!(source.to_string(), "the card was declined")
        }
        other => panic!("the handler's own error, got {other:?}"),
    }
    assert_eq!(Diagnostic::from(err).error_message, "the card was declined");

    let typed = || {
        let handler = service_fn(|_: LambdaEvent<Value>| async {
            Err::<Value, std::io::Error>(std::io::Error::other("the ledger is read-only"))
        });
        let event = event(
            json!({"order_id": "o-typed"}),
            &clock,
            Duration::from_secs(10),
        );
        layer(db.store(), &clock).wrap(handler).oneshot(event)
    };
    let err = typed().await.expect_err("the handler failed");
    assert_eq!(
        Diagnostic::from(err),
        Diagnostic {
            error_type: "std::io::error::Error".into(),
            error_message: "the ledger is read-only".into(),
        }
    );
    // Retryable by default: released, so the retry runs (and fails) again.
    let err = typed().await.expect_err("the handler failed again");
    let io = err
        .downcast_handler::<std::io::Error>()
        .expect("reached by its type");
    assert_eq!(io.to_string(), "the ledger is read-only");
}

/// Writes the store refused with the completion are the engine's answer, not the handler's
/// error, also when the handler's error type is `lambda_runtime::Error` (which the layer
/// otherwise gives back as the handler returned it): Lambda reports them as `StepError`.
#[tokio::test]
async fn a_refused_completion_is_the_engines_answer_through_the_layer() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put};
    use lambda_idempotency::effects::{StepError, Writes};
    use lambda_idempotency::reconcile::Recovery;

    let db = dynamo::start().await;
    let clock = whole_second_clock();
    let table = db.table.clone();
    let refused = service_fn(move |_: LambdaEvent<Value>| {
        let table = table.clone();
        async move {
            // A stock item that is not there: the completion's condition fails.
            let put = Put::builder()
                .table_name(table)
                .item("pk", AttributeValue::S("stock#sku-1".into()))
                .condition_expression("attribute_exists(pk)")
                .build()?;
            current()
                .expect("run by the engine")
                .complete_with(Writes::default().put(put))?;
            Ok::<Value, lambda_runtime::Error>(json!("placed"))
        }
    });
    let idem = Idempotency::new(db.store())
        .with_clock(clock.clone())
        .with_recovery(Recovery::Rerun);
    let err = Operation::new(
        idem,
        scope(),
        KeyPolicy::pointer("/order_id").expect("pointer"),
    )
    .layer()
    .wrap(refused)
    .oneshot(event(
        json!({"order_id": "o-refused"}),
        &clock,
        Duration::from_secs(10),
    ))
    .await
    .expect_err("the completion was refused");
    assert!(
        matches!(
            &err,
            IdempotencyError::Idempotency(Error::Handler { source }) if source.is::<StepError>()
        ),
        "the engine's refusal, got {err:?}"
    );
    let diagnostic = Diagnostic::from(err);
    assert!(
        diagnostic.error_type.ends_with("StepError"),
        "{diagnostic:?}"
    );
}
