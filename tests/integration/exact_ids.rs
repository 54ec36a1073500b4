//! 64-bit ids are exact for records this version writes, on every path: two ids that differ
//! only above 2^53 are two operations and two such amounts under one key are a payload
//! conflict, in either order, through the layer, a batch and the HTTP door, on the memory
//! store, the embedded server and the cached store, with the 0.1 compatibility rule off (the
//! default) and on. The pairs are the rounding anchors (ids whose exact digits are the digits
//! RFC 8785 prints for their double) and their neighbours.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::lambda::batch::{BatchProcessor, RecordOutcome};
use lambda_idempotency::lambda::http::CallerScope;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::store::{AnyStore, CachedStore};
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{
    Config, Error, ExecutionContext, HttpKeys, Idempotency, IdempotencyError, KeyPolicy, Operation,
    OperationScope,
};
use lambda_runtime::tower::{Layer, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};

use super::backends::{Backend, both, sqs_message};
use crate::event_door::EventDoor;

/// Pairs of integers that differ only above 2^53 and that RFC 8785 alone writes alike: the
/// first of most is an anchor (RFC 8785 writes its exact digits), the second a neighbour.
const PAIRS: [(i128, i128); 8] = [
    (9_007_199_254_740_992, 9_007_199_254_740_993),
    (1_152_921_504_606_847_000, 1_152_921_504_606_847_001),
    (1_152_921_504_606_847_000, 1_152_921_504_606_846_999),
    (1_152_921_504_606_847_000, 1 << 60),
    (-9_007_199_254_740_992, -9_007_199_254_740_993),
    (-1_152_921_504_606_847_000, -1_152_921_504_606_847_001),
    (18_446_744_073_709_551_000, 18_446_744_073_709_551_615),
    (-9_223_372_036_854_775_808, -9_223_372_036_854_775_807),
];

/// An integer as JSON (`serde_json` holds it as an `i64` or a `u64`).
fn int(value: i128) -> Value {
    match u64::try_from(value) {
        Ok(unsigned) => json!(unsigned),
        Err(_) => json!(i64::try_from(value).expect("fits an i64")),
    }
}

/// The memory store, the embedded server, and the cached store in front of the embedded server.
async fn stores() -> Vec<Backend> {
    let [memory, dynamodb] = both().await;
    let fixture = dynamo::fixture(start_time()).await;
    let cached = Backend {
        name: "cached dynamodb",
        store: AnyStore::new(CachedStore::new(fixture.store, 1 << 20)),
        clock: fixture.clock,
    };
    vec![memory, dynamodb, cached]
}

/// The engine on `backend`, with the 0.1 compatibility rule on when `compatible` (every record
/// this test writes is created before the cut-over, so only the rule marker keeps it exact).
fn engine(backend: &Backend, compatible: bool) -> Idempotency {
    let mut config = Config::builder();
    if compatible {
        config = config.rfc8785_records_before(start_time() + Duration::from_secs(365 * 24 * 3600));
    }
    Idempotency::new(backend.store.clone())
        .with_clock(backend.clock.clone())
        .with_config(config.build().expect("config"))
}

fn scope(operation: &str) -> OperationScope {
    OperationScope::new("exact-ids", operation).expect("scope")
}

/// Each pair in both orders, with a label for messages.
fn ordered_pairs() -> impl Iterator<Item = (String, i128, i128)> {
    PAIRS.into_iter().flat_map(|(a, b)| {
        [
            (format!("{a} then {b}"), a, b),
            (format!("{b} then {a}"), b, a),
        ]
    })
}

#[tokio::test]
async fn the_layer_runs_each_id_and_refuses_each_changed_amount() {
    for compatible in [false, true] {
        for backend in stores().await {
            let name = format!("{} (compatibility {compatible})", backend.name);
            let runs = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&runs);
            let handler = service_fn(move |event: LambdaEvent<Value>| {
                let runs = Arc::clone(&counted);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, lambda_runtime::Error>(json!({"charged": event.payload["order_id"]}))
                }
            });
            let idem = engine(&backend, compatible);
            for (index, (order, first, second)) in ordered_pairs().enumerate() {
                // A scope per round: the pairs share ids.
                let by_id = Operation::new(
                    idem.clone(),
                    scope(&format!("by-id-{index}")),
                    KeyPolicy::pointer("/order_id").expect("pointer"),
                )
                .layer()
                .layer(handler.clone());
                let by_order = Operation::new(
                    idem.clone(),
                    scope(&format!("by-order-{index}")),
                    KeyPolicy::<Value>::pointer("/order")
                        .expect("pointer")
                        .with_intent(
                            lambda_idempotency::key::JsonPointer::new("/amount").expect("pointer"),
                        ),
                )
                .layer()
                .layer(handler.clone());
                let before = runs.load(Ordering::SeqCst);
                for id in [first, second] {
                    let event = LambdaEvent::new(json!({"order_id": int(id)}), Context::default());
                    let answer = by_id.clone().oneshot(event).await.expect("an order");
                    assert_eq!(
                        answer["charged"],
                        int(id),
                        "{name}, {order}: its own answer"
                    );
                }
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    before + 2,
                    "{name}, {order}: two ids, two runs"
                );

                let charge = |amount: i128| {
                    let event = LambdaEvent::new(
                        json!({"order": format!("o-{index}"), "order_id": 1, "amount": int(amount)}),
                        Context::default(),
                    );
                    by_order.clone().oneshot(event)
                };
                charge(first).await.expect("the first amount");
                let err = charge(second)
                    .await
                    .expect_err("the amount changed above 2^53");
                assert!(
                    matches!(
                        err,
                        IdempotencyError::Idempotency(Error::PayloadConflict { .. })
                    ),
                    "{name}, {order}: {err:?}"
                );
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    before + 3,
                    "{name}, {order}: the conflict did not run"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_batch_runs_each_id_and_refuses_each_changed_amount() {
    for compatible in [false, true] {
        for backend in stores().await {
            let name = format!("{} (compatibility {compatible})", backend.name);
            let idem = engine(&backend, compatible);
            for (index, (order, first, second)) in ordered_pairs().enumerate() {
                // A scope per round: the pairs share ids.
                let by_id: BatchProcessor<SqsMessage> = Operation::new(
                    idem.clone(),
                    scope(&format!("batch-by-id-{index}")),
                    sources::sqs(Some("/order_id")).expect("policy"),
                )
                .batch();
                let by_order: BatchProcessor<SqsMessage> = Operation::new(
                    idem.clone(),
                    scope(&format!("batch-by-order-{index}")),
                    sources::sqs(Some("/order")).expect("policy"),
                )
                .batch();
                let runs = AtomicUsize::new(0);
                let ids = vec![
                    sqs_message(&format!("a-{index}"), json!({"order_id": int(first)})),
                    sqs_message(&format!("b-{index}"), json!({"order_id": int(second)})),
                ];
                let report = by_id
                    .process(ids, &Context::default(), |_, _: ExecutionContext| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(String::from("placed"))
                    })
                    .await;
                assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}, {order}");
                assert!(
                    report
                        .records
                        .iter()
                        .all(|(_, outcome)| matches!(outcome, RecordOutcome::Executed)),
                    "{name}, {order}: {:?}",
                    report.records
                );

                let amounts = vec![
                    sqs_message(
                        &format!("c-{index}"),
                        json!({"order": format!("o-{index}"), "amount": int(first)}),
                    ),
                    sqs_message(
                        &format!("d-{index}"),
                        json!({"order": format!("o-{index}"), "amount": int(second)}),
                    ),
                ];
                let report = by_order
                    .process(
                        amounts,
                        &Context::default(),
                        |_, _: ExecutionContext| async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::io::Error>(String::from("charged"))
                        },
                    )
                    .await;
                assert_eq!(runs.load(Ordering::SeqCst), 3, "{name}, {order}");
                assert!(
                    matches!(
                        &report.records[1].1,
                        RecordOutcome::Poison(Error::PayloadConflict { .. })
                            | RecordOutcome::Failed(Error::PayloadConflict { .. })
                    ),
                    "{name}, {order}: {:?}",
                    report.records
                );
            }
        }
    }
}

fn http_request(key: &str, amount: i128) -> LambdaEvent<ApiGatewayV2httpRequest> {
    let request = serde_json::from_value(json!({
        "version": "2.0", "routeKey": "POST /payments", "rawPath": "/payments",
        "rawQueryString": "", "isBase64Encoded": false,
        "headers": {"content-type": "application/json", "idempotency-key": key},
        "requestContext": {"accountId": "1", "apiId": "a", "domainName": "d",
            "domainPrefix": "d", "http": {"method": "POST", "path": "/payments",
            "protocol": "HTTP/1.1", "sourceIp": "1.2.3.4", "userAgent": "t"},
            "requestId": "r", "routeKey": "POST /payments", "stage": "$default",
            "time": "t", "timeEpoch": 0},
        "body": json!({"amount": int(amount)}).to_string(),
    }))
    .expect("request");
    LambdaEvent::new(request, Context::default())
}

#[tokio::test]
async fn the_http_door_refuses_each_amount_changed_above_2_53() {
    for compatible in [false, true] {
        for backend in stores().await {
            let name = format!("{} (compatibility {compatible})", backend.name);
            let http = EventDoor::new(Operation::new(
                engine(&backend, compatible),
                scope("http"),
                HttpKeys::new().with_callers(CallerScope::Shared).policy(),
            ));
            let runs = AtomicUsize::new(0);
            let pay = |_, _| async {
                runs.fetch_add(1, Ordering::SeqCst);
                let mut response = ApiGatewayV2httpResponse::default();
                response.status_code = 201;
                Ok::<_, std::io::Error>(response)
            };
            for (index, (order, first, second)) in ordered_pairs().enumerate() {
                let key = format!("k-{index}");
                let created = http.handle(http_request(&key, first), pay).await;
                assert_eq!(created.status_code, 201, "{name}, {order}");
                let refused = http.handle(http_request(&key, second), pay).await;
                assert_eq!(refused.status_code, 422, "{name}, {order}: another amount");
                assert_eq!(runs.load(Ordering::SeqCst), index + 1, "{name}, {order}");
            }
        }
    }
}
