//! Business identities on the HTTP door, on both stores: only a stored success holds one, a
//! request the application refused never does, and a caller that meets an identity another
//! request holds learns nothing about that operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use lambda_http::{Body, Request};
use lambda_idempotency::lambda::http::{CallerScope, HttpIdempotencyService, REPLAYED_HEADER};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{HttpKeys, Idempotency, MemoryStore, Operation, OperationScope};
use lambda_runtime::tower::{Layer, Service, ServiceExt};
use serde_json::{Value, json};

/// An order endpoint: an amount of zero or less is refused (422), any other is created (201).
fn orders(runs: Arc<AtomicUsize>) -> Router {
    let create = move |body: String| {
        let runs = Arc::clone(&runs);
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let order: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            match order["amount"].as_i64() {
                Some(amount) if amount > 0 => (
                    StatusCode::CREATED,
                    json!({"order": order["order"], "created": n}).to_string(),
                ),
                _ => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({"refused": "amount", "run": n}).to_string(),
                ),
            }
        }
    };
    Router::new().route("/orders", post(create))
}

struct Endpoint {
    service: HttpIdempotencyService<Router>,
    runs: Arc<AtomicUsize>,
}

/// The order endpoint on `idem`, keyed per caller (the `x-caller` header stands for the
/// authorizer's principal), with the order in the body as its business identity.
fn endpoint(idem: Idempotency) -> Endpoint {
    let keys = HttpKeys::new()
        .with_callers(CallerScope::Principal)
        .with_principal(|request: &Request| {
            let caller = request.headers().get("x-caller")?;
            caller.to_str().ok().map(str::to_owned)
        });
    let policy = keys.policy().with_identity(|request: &Request| {
        let order: Value = serde_json::from_slice(request.body().as_ref()).ok()?;
        order["order"]
            .as_str()
            .map(|order| format!("order:{order}"))
    });
    let scope = OperationScope::new("http-identities", "orders").expect("scope");
    let layer = Operation::new(idem, scope, policy).http_layer();
    let runs = Arc::new(AtomicUsize::new(0));
    Endpoint {
        service: layer.layer(orders(Arc::clone(&runs))),
        runs,
    }
}

impl Endpoint {
    async fn send(&mut self, caller: &str, key: &str, body: Value) -> http::Response<Body> {
        let request = http::Request::builder()
            .method("POST")
            .uri("https://api.example/orders")
            .header("idempotency-key", key)
            .header("x-caller", caller)
            .header("content-type", "application/json")
            .body(Body::Text(body.to_string()))
            .expect("request");
        self.service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("answer")
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn json_body(response: &http::Response<Body>) -> Value {
    serde_json::from_slice(response.body().as_ref()).expect("a JSON body")
}

fn replayed(response: &http::Response<Body>) -> bool {
    response.headers().get(REPLAYED_HEADER).is_some()
}

/// A 422 is replayed to its key, but the corrected request under a new key runs: the refusal
/// held no identity. The success then holds it for good.
async fn a_refusal_holds_no_identity_and_a_success_does(idem: Idempotency) {
    let mut orders = endpoint(idem);

    let refused = orders
        .send("alice", "k-1", json!({"order": "o-1", "amount": 0}))
        .await;
    let again = orders
        .send("alice", "k-1", json!({"order": "o-1", "amount": 0}))
        .await;
    assert_eq!(
        (refused.status(), again.status()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            StatusCode::UNPROCESSABLE_ENTITY
        )
    );
    assert!(replayed(&again), "the refusal is replayed to its key");
    assert_eq!(json_body(&refused), json_body(&again));
    assert_eq!(orders.runs(), 1);

    let corrected = orders
        .send("alice", "k-2", json!({"order": "o-1", "amount": 5}))
        .await;
    assert_eq!(
        corrected.status(),
        StatusCode::CREATED,
        "the refusal held no identity"
    );
    assert_eq!(orders.runs(), 2);

    let twice = orders
        .send("alice", "k-3", json!({"order": "o-1", "amount": 5}))
        .await;
    assert_eq!(twice.status(), StatusCode::CONFLICT);
    assert_eq!(json_body(&twice)["error"], "business_identity_taken");
    assert_eq!(orders.runs(), 2, "the success holds the identity");
}

#[tokio::test]
async fn a_refusal_holds_no_identity_on_the_memory_store() {
    a_refusal_holds_no_identity_and_a_success_does(Idempotency::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn a_refusal_holds_no_identity_on_dynamodb() {
    let db = dynamo::start().await;
    a_refusal_holds_no_identity_and_a_success_does(Idempotency::new(db.store())).await;
}

/// Bob's refused request cannot block Alice's order, and Bob, meeting the identity that
/// Alice's success holds, learns one code whatever that operation's state or result.
async fn another_caller_neither_blocks_nor_reads_the_identity(idem: Idempotency) {
    let mut orders = endpoint(idem);

    let bob_refused = orders
        .send("bob", "b-1", json!({"order": "o-7", "amount": -1}))
        .await;
    assert_eq!(bob_refused.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let alice = orders
        .send("alice", "a-1", json!({"order": "o-7", "amount": 9}))
        .await;
    assert_eq!(
        alice.status(),
        StatusCode::CREATED,
        "Bob's refusal blocked nothing"
    );

    let bob_again = orders
        .send("bob", "b-2", json!({"order": "o-7", "amount": 9}))
        .await;
    assert_eq!(bob_again.status(), StatusCode::CONFLICT);
    let answer = json_body(&bob_again);
    assert_eq!(answer["error"], "business_identity_taken");
    let text = answer.to_string();
    assert!(
        !text.contains("created") && !text.contains("o-7") && !text.contains("applied"),
        "nothing about Alice's operation reaches Bob: {text}"
    );
    assert_eq!(orders.runs(), 2);
}

#[tokio::test]
async fn another_caller_neither_blocks_nor_reads_an_identity_on_the_memory_store() {
    another_caller_neither_blocks_nor_reads_the_identity(Idempotency::new(MemoryStore::new()))
        .await;
}

#[tokio::test]
async fn another_caller_neither_blocks_nor_reads_an_identity_on_dynamodb() {
    let db = dynamo::start().await;
    another_caller_neither_blocks_nor_reads_the_identity(Idempotency::new(db.store())).await;
}
