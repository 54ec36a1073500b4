//! The IETF Idempotency-Key draft's wire format on the HTTP door, on both stores: a quoted key
//! is a Structured Field String (the draft's own example, and a bare UUID, are one key), the
//! query is percent-decoded, errors are RFC 9457 problem details, the optional-key mode passes
//! unkeyed requests through; and records 0.4 wrote (raw keys, raw queries) are answered across
//! the deploy, only they.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use lambda_http::{Body, Request};
use lambda_idempotency::clock::Clock;
use lambda_idempotency::config::Config;
use lambda_idempotency::lambda::http::{CallerScope, HttpIdempotencyLayer, REPLAYED_HEADER};
use lambda_idempotency::{
    Fingerprint, HttpKeys, Idempotency, Invocation, Operation, OperationKey, OperationScope,
};
use lambda_runtime::tower::{Layer, ServiceExt, service_fn};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::backends::{Backend, both};

/// The draft's example key (section 2.2).
const DRAFT_KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

fn scope() -> OperationScope {
    OperationScope::new("wire", "payments").expect("scope")
}

fn operation(backend: &Backend, config: Config) -> Operation<Request> {
    let idem = Idempotency::new(backend.store.clone())
        .with_clock(backend.clock.clone())
        .with_config(config);
    Operation::new(
        idem,
        scope(),
        HttpKeys::new().with_callers(CallerScope::Shared).policy(),
    )
}

fn post(query: &str, key: Option<&str>) -> Request {
    let mut builder = http::Request::builder()
        .method("POST")
        .uri(format!("https://api.example/payments{query}"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Body::Text(r#"{"amount":10}"#.into()))
        .expect("request")
}

/// What the endpoint answered: status, whether it was a replay, and the body as JSON (or null).
struct Answer {
    status: StatusCode,
    replayed: bool,
    content_type: Option<String>,
    body: Value,
}

async fn send(layer: &HttpIdempotencyLayer, runs: &Arc<AtomicUsize>, request: Request) -> Answer {
    let runs = Arc::clone(runs);
    let service = layer.layer(service_fn(move |_request: Request| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Body::Text(json!({"payment": run}).to_string()))
                    .expect("response"),
            )
        }
    }));
    let response = service.oneshot(request).await.expect("answered");
    let status = response.status();
    let replayed = response.headers().contains_key(REPLAYED_HEADER);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Answer {
        status,
        replayed,
        content_type,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// The intent 0.4 fingerprinted for [`post`]: the query's pairs as sent.
fn fingerprint_by_0_4(query: &[(&str, &str)]) -> Fingerprint {
    let intent = json!({
        "method": "POST",
        "path": "/payments",
        "query": query,
        "content_type": "application/json",
        "body_sha256": hex::encode(Sha256::digest(br#"{"amount":10}"#)),
    });
    Fingerprint::from_stored(Fingerprint::of(&intent).expect("fingerprint").as_str())
}

/// Writes the record 0.4 wrote for a request keyed by `raw_key` (its header as sent) and
/// fingerprinted as `fingerprint`: no key rule, an answered 201.
async fn recorded_by_0_4(backend: &Backend, raw_key: &str, fingerprint: Fingerprint) {
    recorded_by_0_4_answering(backend, raw_key, fingerprint, "").await;
}

/// [`recorded_by_0_4`], the 201 answered with `body`.
async fn recorded_by_0_4_answering(
    backend: &Backend,
    raw_key: &str,
    fingerprint: Fingerprint,
    body: &str,
) {
    let key = OperationKey::derive(&scope(), None, &json!({"caller": null, "key": raw_key}))
        .expect("key");
    let v0_4 = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
    v0_4.execute(
        &Invocation::new(key, fingerprint, Duration::from_secs(60)),
        |_| async move { Ok::<_, Infallible>(json!({"status": 201, "headers": [], "body": body})) },
    )
    .await
    .expect("0.4's run");
}

#[tokio::test]
async fn the_drafts_quoted_key_and_the_bare_key_are_one_key() {
    for backend in both().await {
        let name = backend.name;
        let layer = operation(&backend, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        let quoted = send(&layer, &runs, post("", Some(&format!("\"{DRAFT_KEY}\"")))).await;
        let bare = send(&layer, &runs, post("", Some(DRAFT_KEY))).await;
        let spaced = send(
            &layer,
            &runs,
            post("", Some(&format!("  \"{DRAFT_KEY}\" "))),
        )
        .await;

        assert_eq!(quoted.status, StatusCode::CREATED, "{name}");
        assert!(
            bare.replayed && spaced.replayed,
            "{name}: one key, however it is sent"
        );
        assert_eq!(bare.body, quoted.body, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_quoted_key_that_is_not_a_structured_string_is_refused_as_a_problem() {
    for backend in both().await {
        let name = backend.name;
        let layer = operation(&backend, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        for malformed in ["\"unterminated", "\"a\" \"b\"", "\"tab\tinside\""] {
            let answer = send(&layer, &runs, post("", Some(malformed))).await;
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "{name}: {malformed}"
            );
            assert_eq!(
                answer.content_type.as_deref(),
                Some("application/problem+json"),
                "{name}"
            );
            assert_eq!(answer.body["error"], "invalid_request", "{name}");
            assert_eq!(answer.body["status"], 400, "{name}");
        }
        // An empty String is no key at all.
        let empty = send(&layer, &runs, post("", Some("\"\""))).await;
        assert_eq!(empty.body["error"], "missing_idempotency_key", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}");
    }
}

#[tokio::test]
async fn a_query_is_one_intent_however_it_is_percent_encoded() {
    for backend in both().await {
        let name = backend.name;
        let layer = operation(&backend, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        let first = send(&layer, &runs, post("?a=%41&note=x+y", Some("k-query"))).await;
        let again = send(&layer, &runs, post("?note=x%20y&a=A", Some("k-query"))).await;
        let other = send(&layer, &runs, post("?note=x%2By&a=A", Some("k-query"))).await;

        assert_eq!(first.status, StatusCode::CREATED, "{name}");
        assert!(again.replayed, "{name}: the same decoded query");
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{name}: `+` decodes to a space, `%2B` to a plus: another request"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_retry_of_a_request_0_4_recorded_with_its_raw_query_is_replayed() {
    for backend in both().await {
        let name = backend.name;
        recorded_by_0_4(&backend, "k-raw", fingerprint_by_0_4(&[("a", "%41")])).await;
        let layer = operation(&backend, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        let retry = send(&layer, &runs, post("?a=%41", Some("k-raw"))).await;

        assert_eq!(
            (retry.status, retry.replayed),
            (StatusCode::CREATED, true),
            "{name}: neither run again nor refused across the deploy"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}");
    }
}

#[tokio::test]
async fn a_raw_query_never_matches_a_record_0_5_wrote() {
    for backend in both().await {
        let name = backend.name;
        let layer = operation(&backend, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        // 0.5 records `a=%2541`, which decodes to `%41`: what 0.4's raw rule read `a=%41` as.
        let recorded = send(&layer, &runs, post("?a=%2541", Some("k-rule"))).await;
        let other = send(&layer, &runs, post("?a=%41", Some("k-rule"))).await;

        assert_eq!(recorded.status, StatusCode::CREATED, "{name}");
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{name}: the raw rule answers only for records 0.4 wrote"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_record_0_4_wrote_never_matches_another_request_by_todays_decoded_query() {
    for backend in both().await {
        let name = backend.name;
        // 0.4 recorded `?a=%41` by its raw pair `a=%41`; today `?a=%2541` decodes to that
        // same pair, yet it is another request (0.4 would have recorded `a=%2541`).
        recorded_by_0_4(&backend, "k-other", fingerprint_by_0_4(&[("a", "%41")])).await;
        let layer = operation(&backend, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        let other = send(&layer, &runs, post("?a=%2541", Some("k-other"))).await;

        assert_eq!(
            (other.status, other.replayed),
            (StatusCode::UNPROCESSABLE_ENTITY, false),
            "{name}: today's projection answers only for records 0.5 wrote"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}");
    }
}

#[tokio::test]
async fn a_retry_of_a_quoted_key_0_4_recorded_raw_is_not_run_again_after_the_cut_over() {
    for backend in both().await {
        let name = backend.name;
        let quoted = format!("\"{DRAFT_KEY}\"");
        recorded_by_0_4(&backend, &quoted, fingerprint_by_0_4(&[])).await;
        let cutover = backend.clock.now() + Duration::from_secs(60);
        let config = Config::builder()
            .keyed_by_0_4_before(cutover)
            .build()
            .expect("config");
        let layer = operation(&backend, config).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        let retry = send(&layer, &runs, post("", Some(&quoted))).await;

        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not run again");
        assert_eq!(retry.status, StatusCode::CONFLICT, "{name}");
        assert_eq!(
            retry.body["error"], "operation_already_applied",
            "{name}: answered by the state 0.4 recorded"
        );
    }
}

#[tokio::test]
async fn the_optional_key_mode_passes_unkeyed_requests_through() {
    for backend in both().await {
        let name = backend.name;
        let required = operation(&backend, Config::default()).http_layer();
        let optional = operation(&backend, Config::default())
            .http_layer()
            .with_optional_key();
        let runs = Arc::new(AtomicUsize::new(0));

        let refused = send(&required, &runs, post("", None)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{name}");
        assert_eq!(refused.body["error"], "missing_idempotency_key", "{name}");

        let first = send(&optional, &runs, post("", None)).await;
        let second = send(&optional, &runs, post("", None)).await;
        assert_eq!(
            (first.status, second.status),
            (StatusCode::CREATED, StatusCode::CREATED)
        );
        assert!(!second.replayed, "{name}: no key, no idempotency");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}");

        let keyed = send(&optional, &runs, post("", Some("k-opt"))).await;
        let keyed_again = send(&optional, &runs, post("", Some("k-opt"))).await;
        assert!(
            !keyed.replayed && keyed_again.replayed,
            "{name}: a key still protects"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3, "{name}");
    }
}

/// A request of another intent that meets a record 0.4 wrote leaves no copy of that record
/// without its outcome in the environment's cache: a large outcome is stored compressed, and a
/// store reads it only for a claim that could replay it. The record's own retry, next in the
/// same environment, is replayed, not answered from a cached record missing its outcome.
#[tokio::test]
async fn a_conflict_with_a_record_0_4_wrote_leaves_its_retry_replayable_through_the_cache() {
    use lambda_idempotency::store::{AnyStore, CachedStore};

    for backend in both().await {
        let name = backend.name;
        // Base64, as the door stores a body: long enough to be stored compressed.
        let body = "cmVjZWlw".repeat(400);
        recorded_by_0_4_answering(
            &backend,
            "k-cached",
            fingerprint_by_0_4(&[("a", "%41")]),
            &body,
        )
        .await;
        let cached = Backend {
            name,
            store: AnyStore::new(CachedStore::new(backend.store.clone(), 1 << 20)),
            clock: backend.clock.clone(),
        };
        let layer = operation(&cached, Config::default()).http_layer();
        let runs = Arc::new(AtomicUsize::new(0));

        let other = send(&layer, &runs, post("?a=%2541", Some("k-cached"))).await;
        let retry = send(&layer, &runs, post("?a=%41", Some("k-cached"))).await;

        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{name}");
        assert_eq!(
            (retry.status, retry.replayed),
            (StatusCode::CREATED, true),
            "{name}: the retry is replayed: {}",
            retry.body
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}");
    }
}
