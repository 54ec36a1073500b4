//! A result is stored only once it is known to replay: one whose JSON its own type cannot read
//! (a NaN serialized as `null`, a field skipped when written but required when read) would
//! have answered its first caller and failed every duplicate with `StoredOutcomeUnreadable`.
//! It is retained as FAILED instead, the same answer for every caller, and never run again; on
//! both stores, through the direct door, in a step, and behind the HTTP door (applied, its
//! response not kept: never "failed, send a new key", which would run the effect again).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::FailureKind;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, Error, IdempotencyError, KeyPolicy, Operation, OperationScope};
use lambda_runtime::tower::{Service, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::backends::both;

/// A receipt whose ratio can be NaN and whose note is skipped when empty: neither reads back.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    ratio: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    note: String,
}

fn retained_unserializable(err: &Error) -> bool {
    matches!(err, Error::Failed { failure, .. } if failure.kind == FailureKind::OutcomeUnserializable)
}

#[tokio::test]
async fn a_result_its_own_type_cannot_read_is_retained_for_every_caller_through_the_door() {
    let unreadable = [
        Receipt {
            ratio: f64::NAN,
            note: "n".into(),
        },
        Receipt {
            ratio: 1.0,
            note: String::new(),
        },
    ];
    for backend in both().await {
        let name = backend.name;
        for (case, receipt) in unreadable.iter().enumerate() {
            let idem = lambda_idempotency::Idempotency::new(backend.store.clone())
                .with_clock(backend.clock.clone());
            let scope = OperationScope::new("replayable", "receipt").expect("scope");
            let layer =
                Operation::new(idem, scope, KeyPolicy::pointer("/order").expect("key")).layer();
            let runs = Arc::new(AtomicUsize::new(0));
            let (counted, receipt) = (Arc::clone(&runs), receipt.clone());
            let mut service = layer.wrap(service_fn(move |_: LambdaEvent<Value>| {
                counted.fetch_add(1, Ordering::SeqCst);
                let receipt = receipt.clone();
                async move { Ok::<_, lambda_runtime::Error>(receipt) }
            }));
            let order = json!({"order": format!("o-{case}")});
            let mut answers = Vec::new();
            for _ in 0..2 {
                let event = LambdaEvent::new(order.clone(), Context::default());
                let answer = service.ready().await.expect("ready").call(event).await;
                answers.push(answer);
            }
            for answer in answers {
                let Err(IdempotencyError::Idempotency(err)) = answer else {
                    panic!("{name} case {case}: the retained failure, got {answer:?}");
                };
                assert!(retained_unserializable(&err), "{name} case {case}: {err:?}");
            }
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "{name} case {case}: run once"
            );
        }
    }
}

#[tokio::test]
async fn a_result_that_reads_back_is_replayed_byte_for_byte() {
    for backend in both().await {
        let name = backend.name;
        let idem = lambda_idempotency::Idempotency::new(backend.store).with_clock(backend.clock);
        let inv = invocation("replayable-kept", &json!({"order": "o-kept"}));
        let runs = AtomicUsize::new(0);
        let handler = |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, BoxError>(Receipt {
                    ratio: 0.5,
                    note: "n".into(),
                })
            }
        };
        let first = idem.execute(&inv, handler).await.expect("stored");
        let again = idem.execute(&inv, handler).await.expect("replayed");
        assert!(again.is_replay(), "{name}");
        assert_eq!(first.raw_json().get(), again.raw_json().get(), "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_step_result_its_own_type_cannot_read_holds_the_operation_once() {
    for backend in both().await {
        let name = backend.name;
        let idem = lambda_idempotency::Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let inv = invocation("replayable-step", &json!({"order": "o-step"}));
        let effects = AtomicUsize::new(0);
        let effects = &effects;
        let handler = |ctx: lambda_idempotency::ExecutionContext| async move {
            let ratio = ctx
                .step("measure")
                .run(|_key| async {
                    effects.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(f64::NAN)
                })
                .await?;
            Ok::<_, BoxError>(json!({"ratio": ratio}))
        };
        let first = idem.execute(&inv, handler).await.expect_err("not kept");
        let again = idem.execute(&inv, handler).await.expect_err("replayed");
        for err in [first, again] {
            assert!(retained_unserializable(&err), "{name}: {err:?}");
        }
        assert_eq!(
            effects.load(Ordering::SeqCst),
            1,
            "{name}: the effect ran once"
        );
    }
}

#[tokio::test]
async fn an_http_step_result_that_cannot_be_kept_is_answered_as_applied_not_as_failed() {
    for backend in both().await {
        let name = backend.name;
        let idem = lambda_idempotency::Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let layer = Operation::new(
            idem,
            OperationScope::new("replayable", "payments").expect("scope"),
            lambda_idempotency::lambda::sources::http(),
        )
        .http_layer();
        let charges = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&charges);
        let app = service_fn(move |_request: lambda_http::Request| {
            let counted = Arc::clone(&counted);
            async move {
                let ctx = lambda_idempotency::lambda::current().ok_or("no context")?;
                let rate = ctx
                    .step("charge")
                    .run(|_key| async move {
                        counted.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(f64::NAN)
                    })
                    .await?;
                Ok::<_, BoxError>(lambda_http::Response::new(lambda_http::Body::from(
                    rate.to_string(),
                )))
            }
        });
        let service = lambda_runtime::tower::Layer::layer(&layer, app);
        let request = || {
            crate::http_inputs::v2_request("k-nan", json!({"jwt": {"claims": {"sub": "alice"}}}))
        };
        for attempt in ["first", "retry"] {
            let answer = service.clone().oneshot(request()).await.expect("answer");
            assert_eq!(
                answer.status(),
                http::StatusCode::CONFLICT,
                "{name} {attempt}"
            );
            assert_eq!(
                crate::http_inputs::code(&answer),
                "operation_already_applied",
                "{name} {attempt}"
            );
        }
        assert_eq!(charges.load(Ordering::SeqCst), 1, "{name}: charged once");
    }
}
