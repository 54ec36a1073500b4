//! Lambda Managed Instances: one execution environment runs several invocations at once
//! (`lambda_runtime::run_concurrent`, one Tokio task per worker, each with a clone of the
//! service). Every door's service meets `run_concurrent`'s bounds (lambda_http's for the HTTP
//! door), and concurrent workers of one
//! environment given the same operation run it once, on both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{ExecutionContext, Idempotency, KeyPolicy, Operation, OperationScope};
use lambda_runtime::tower::{ServiceBuilder, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::backends::{Backend, both};

fn operation(backend: &Backend) -> Operation<Value> {
    Operation::new(
        Idempotency::new(backend.store.clone())
            .with_clock(backend.clock.clone())
            .with_single_flight(),
        OperationScope::new("managed", "charge").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("policy"),
    )
}

#[tokio::test]
async fn every_door_runs_under_run_concurrent() {
    // `run_concurrent` takes a service that is `Clone + Send + 'static` with a `Send` future;
    // building its future (never polled: there is no Runtime API here) checks each door.
    let backend = both().await.into_iter().next().expect("memory");
    let charge = service_fn(|event: LambdaEvent<Value>| async move {
        Ok::<_, lambda_runtime::Error>(json!({"charged": event.payload["order_id"]}))
    });
    let layered = ServiceBuilder::new()
        .layer(operation(&backend).layer())
        .service(charge);
    let batch = Operation::new(
        Idempotency::new(backend.store.clone()).with_single_flight(),
        OperationScope::new("managed", "ship").expect("scope"),
        sources::sqs(Some("/order_id")).expect("policy"),
    )
    .batch()
    .service(|message: SqsMessage, _ctx: ExecutionContext| async move {
        Ok::<_, lambda_runtime::Error>(json!({"shipped": message.message_id}))
    });
    let http = lambda_runtime::tower::Layer::layer(
        &Operation::new(
            Idempotency::new(backend.store.clone()).with_single_flight(),
            OperationScope::new("managed", "pay").expect("scope"),
            sources::http(),
        )
        .http_layer(),
        axum::Router::new().route(
            "/payments",
            axum::routing::post(|body: String| async move { body }),
        ),
    );
    drop(lambda_runtime::run_concurrent(layered.clone()));
    drop(lambda_runtime::run_concurrent(batch));
    drop(lambda_http::run_concurrent(http));

    // And a clone answers as the original does.
    let answer = layered
        .clone()
        .oneshot(LambdaEvent::new(
            json!({"order_id": "o-1"}),
            Context::default(),
        ))
        .await
        .expect("charged");
    assert_eq!(answer, json!({"charged": "o-1"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_workers_of_one_environment_run_an_operation_once() {
    for backend in both().await {
        let name = backend.name;
        let runs = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Notify::new());
        let charge = {
            let (runs, release) = (Arc::clone(&runs), Arc::clone(&release));
            service_fn(move |event: LambdaEvent<Value>| {
                let (runs, release) = (Arc::clone(&runs), Arc::clone(&release));
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                    Ok::<_, lambda_runtime::Error>(json!({"charged": event.payload["order_id"]}))
                }
            })
        };
        // Duplicates wait for the first worker's result, as a synchronous caller would rather.
        let service = ServiceBuilder::new()
            .layer(
                operation(&backend)
                    .with_wait_for_result(Duration::from_secs(30))
                    .layer(),
            )
            .service(charge);

        // Eight workers, each with its clone of the service, get the same order at once.
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let service = service.clone();
                tokio::spawn(service.oneshot(LambdaEvent::new(
                    json!({"order_id": "o-2", "amount": 30}),
                    Context::default(),
                )))
            })
            .collect();
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        release.notify_one();

        for worker in workers {
            let answer = worker.await.expect("joined").expect("answered");
            assert_eq!(answer, json!({"charged": "o-2"}), "{name}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: one execution");
    }
}
