//! A result within the outcome limit that the store refuses to keep (DynamoDB's
//! `ValidationException` on the settlement) on both stores: retained FAILED
//! `outcome_unstorable`, and its first caller told what every later caller is — applied, its
//! result not kept — never that it was too large; the HTTP door's first caller still gets the
//! response its handler gave.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use lambda_idempotency::key::{Fingerprint, OperationKey};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::record::{FailureKind, Status};
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, Operation, OperationScope};
use lambda_runtime::tower::{Layer, ServiceExt};
use serde_json::json;

use crate::backends::both;
use crate::http_inputs::{code, v2_request};

fn invocation(order: &str) -> Invocation {
    let scope = OperationScope::new("unkept", "orders").expect("scope");
    let key = OperationKey::derive(&scope, None, &json!(order)).expect("key");
    let fingerprint = Fingerprint::of(&json!({"order": order})).expect("fingerprint");
    Invocation::new(key, fingerprint, Duration::from_secs(60))
}

fn is_unstorable(result: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(
        result,
        Err(err @ Error::Failed { failure, .. })
            if failure.kind == FailureKind::OutcomeUnstorable && err.applied_but_not_kept()
    )
}

#[tokio::test]
async fn a_result_the_store_refuses_is_failed_unstorable_for_its_first_caller_and_every_later_one()
{
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        let idem = Idempotency::new(AnyStore::new(faulty.clone())).with_clock(backend.clock);
        let order = invocation("o-1");
        let runs = AtomicUsize::new(0);
        let run = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(json!({"invoice": "i-1"}))
        };
        faulty.inject(Primitive::Settle, Fault::FailBefore(FaultKind::Rejected));

        let first = idem.execute(&order, |_ctx| run()).await;
        let again = idem.execute(&order, |_ctx| run()).await;

        assert!(is_unstorable(&first), "{name}: {first:?}");
        assert!(is_unstorable(&again), "{name}: {again:?}");
        let record = backend
            .store
            .get(order.key())
            .await
            .expect("read")
            .expect("retained");
        assert_eq!(record.status, Status::Failed, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: never run again");
        assert_eq!(faulty.pending(), 0, "{name}: the rejection was met");
    }
}

#[tokio::test]
async fn the_http_doors_first_caller_gets_its_response_when_the_store_refuses_it() {
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        let idem = Idempotency::new(AnyStore::new(faulty.clone())).with_clock(backend.clock);
        let layer = Operation::new(
            idem,
            OperationScope::new("unkept", "payments").expect("scope"),
            sources::http(),
        )
        .http_layer();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let app = lambda_runtime::tower::service_fn(move |_request: lambda_http::Request| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(StatusCode::CREATED)
                        .body(lambda_http::Body::from("paid"))
                        .expect("response"),
                )
            }
        });
        let service = layer.layer(app);
        faulty.inject(Primitive::Settle, Fault::FailBefore(FaultKind::Rejected));

        let request = || v2_request("k-1", json!({"jwt": {"claims": {"sub": "alice"}}}));
        let first = service.clone().oneshot(request()).await.expect("answer");
        let retry = service.clone().oneshot(request()).await.expect("answer");

        assert_eq!(first.status(), StatusCode::CREATED, "{name}: its response");
        assert_eq!(retry.status(), StatusCode::CONFLICT, "{name}");
        assert_eq!(code(&retry), "operation_already_applied", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}
