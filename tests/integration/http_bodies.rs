//! What the HTTP door answers once the handler has: a body that fails to stream after a status
//! that says done has taken effect (retained as applied, never run again); a refusal took
//! none, and writes that wait for the completion were never written (released: the retry runs
//! and commits them); a completion whose writes fail is never answered as done. On both
//! stores.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use http::{Response, StatusCode};
use lambda_http::{Body, Request};
use lambda_idempotency::effects::Writes;
use lambda_idempotency::lambda::http::CallerScope;
use lambda_idempotency::{BoxError, ExecutionContext, HttpKeys, Idempotency, Operation};
use lambda_runtime::tower::{Layer, ServiceExt, service_fn};
use serde_json::Value;

use super::backends::both;
use super::http_inputs::{code, engine, scope, v2_request};
use super::transactions::Shop;

/// A response body that yields a part, then fails (a stream from elsewhere, cut off) or ends.
struct PartBody {
    sent: bool,
    fails: bool,
}

impl PartBody {
    fn failing() -> Self {
        Self {
            sent: false,
            fails: true,
        }
    }
}

impl http_body::Body for PartBody {
    type Data = &'static [u8];
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match (self.sent, self.fails) {
            (false, _) => {
                self.sent = true;
                Poll::Ready(Some(Ok(http_body::Frame::data(&b"{\"payment\":1}"[..]))))
            }
            (true, true) => Poll::Ready(Some(Err(std::io::Error::other("the stream was cut")))),
            (true, false) => Poll::Ready(None),
        }
    }
}

/// The HTTP door of `idem` over a handler that answers `status` with a body that fails after
/// its first part, counting runs.
fn answering(
    idem: Idempotency,
    status: u16,
) -> (
    impl lambda_runtime::tower::Service<
        Request,
        Response = Response<Body>,
        Error = BoxError,
        Future = impl Send,
    > + Clone,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let handler = service_fn(move |_: Request| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(PartBody::failing())
                    .expect("response"),
            )
        }
    });
    let layer = Operation::new(
        idem,
        scope(),
        HttpKeys::new().with_callers(CallerScope::Shared).policy(),
    )
    .http_layer();
    (layer.layer(handler), runs)
}

/// The HTTP door over `shop`'s engine, its handler's writes committed with the completion.
fn shop_door(shop: &Shop) -> lambda_idempotency::HttpIdempotencyLayer {
    Operation::new(
        shop.engine(shop.store()),
        scope(),
        HttpKeys::new().with_callers(CallerScope::Shared).policy(),
    )
    .with_transactional_writes()
    .http_layer()
}

/// A handler that answered 201 has taken effect, even when its body then fails to stream:
/// retained as applied (a retry is told so, never run again), whatever the classifier says.
#[tokio::test]
async fn a_body_that_fails_after_a_done_status_is_applied_never_run_again() {
    for backend in both().await {
        let name = backend.name;
        let (service, runs) = answering(engine(backend), 201);
        let first = service
            .clone()
            .oneshot(v2_request("k-1", Value::Null))
            .await
            .expect("answer");
        assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR, "{name}");
        assert_eq!(code(&first), "response_not_kept", "{name}");
        for attempt in ["retry", "second retry"] {
            let retry = service
                .clone()
                .oneshot(v2_request("k-1", Value::Null))
                .await
                .expect("answer");
            assert_eq!(retry.status(), StatusCode::CONFLICT, "{name}: {attempt}");
            assert_eq!(
                code(&retry),
                "operation_already_applied",
                "{name}: {attempt}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}

/// A body that fails after a 503 (not stored) or a 422 (a refusal: no effect) is released:
/// the retry runs.
#[tokio::test]
async fn a_body_that_fails_after_a_retry_status_or_a_refusal_is_released() {
    for backend in both().await {
        let name = backend.name;
        let idem = engine(backend);
        for status in [503, 422] {
            let (service, runs) = answering(idem.clone(), status);
            let key = format!("k-{status}");
            for _ in 0..2 {
                let answer = service
                    .clone()
                    .oneshot(v2_request(&key, Value::Null))
                    .await
                    .expect("answer");
                assert_eq!(
                    answer.status(),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "{name}: {status}"
                );
                assert_eq!(code(&answer), "operation_failed", "{name}: {status}");
            }
            assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}: {status} run again");
        }
    }
}

/// A handler whose writes wait for the completion (`complete_with`) has not taken effect
/// when its body fails: the completion is never written, so the claim is released and the
/// retry commits the writes, once.
#[tokio::test]
async fn a_body_that_fails_before_the_completion_writes_is_released_and_the_retry_commits() {
    for shop in Shop::both().await {
        let shop = Arc::new(shop);
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = service_fn({
            let (shop, runs) = (Arc::clone(&shop), Arc::clone(&runs));
            move |request: Request| {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                let shop = Arc::clone(&shop);
                async move {
                    let ctx = request
                        .extensions()
                        .get::<ExecutionContext>()
                        .cloned()
                        .ok_or("no execution context")?;
                    let seen = shop.stock_item("version").await;
                    let writes = (shop.place("h-1", seen).writes().iter())
                        .fold(Writes::default(), |tx, write| tx.write(write.clone()));
                    ctx.complete_with(writes)?;
                    Ok::<_, BoxError>(
                        Response::builder()
                            .status(201)
                            .body(PartBody {
                                sent: false,
                                fails: run == 0,
                            })
                            .expect("response"),
                    )
                }
            }
        });
        let service = shop_door(&shop).layer(handler);
        let first = service
            .clone()
            .oneshot(v2_request("k-1", Value::Null))
            .await
            .expect("answer");
        assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(code(&first), "operation_failed");
        assert!(!shop.has_order("h-1").await, "nothing committed");
        for attempt in ["retry", "replay"] {
            let answer = service
                .clone()
                .oneshot(v2_request("k-1", Value::Null))
                .await
                .expect("answer");
            assert_eq!(answer.status(), StatusCode::CREATED, "{attempt}");
        }
        assert!(shop.has_order("h-1").await, "committed by the retry");
        assert_eq!(shop.reserved().await, 1, "once");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

/// A handler that answered 201 with writes waiting for the completion, whose completion then
/// failed in the store (a write to a table that does not exist): nothing is done, so the
/// caller is told it was not, never given the 201 (it was, while the record stayed in progress
/// and the order unwritten).
#[tokio::test]
async fn a_completion_whose_writes_fail_is_never_answered_as_done() {
    for shop in Shop::both().await {
        let handler = service_fn(move |request: Request| async move {
            let ctx = request
                .extensions()
                .get::<ExecutionContext>()
                .cloned()
                .ok_or("no execution context")?;
            let put = aws_sdk_dynamodb::types::Put::builder()
                .table_name("no-such-table")
                .item(
                    "pk",
                    aws_sdk_dynamodb::types::AttributeValue::S("h-2".into()),
                )
                .build()?;
            ctx.complete_with(Writes::default().put(put))?;
            Ok::<_, BoxError>(
                Response::builder()
                    .status(201)
                    .body(PartBody {
                        sent: false,
                        fails: false,
                    })
                    .expect("response"),
            )
        });
        let service = shop_door(&shop).layer(handler);
        let answer = service
            .oneshot(v2_request("k-1", Value::Null))
            .await
            .expect("answer");
        // No retry clears a missing table: not 503 with `Retry-After`.
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(code(&answer), "service_cannot_store");
        assert!(answer.headers().get("retry-after").is_none());
    }
}
