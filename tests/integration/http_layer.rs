//! The HTTP tower layer under `lambda_http` requests (API Gateway REST v1, HTTP v2, ALB) with an
//! axum `Router` behind it, on the embedded DynamoDB server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use http::{HeaderMap, StatusCode};
use lambda_http::{Body, Request};
use lambda_idempotency::HttpKeys;
use lambda_idempotency::Operation;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::lambda::LeasePolicy;
use lambda_idempotency::lambda::http::{CallerScope, REPLAYED_HEADER, StoreHeaders};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::testing::outcomes::incompressible;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_runtime::tower::{Service, ServiceExt};
use serde_json::{Value, json};

/// What the endpoint answers, by path.
fn app(runs: Arc<AtomicUsize>) -> Router {
    let payments = {
        let runs = Arc::clone(&runs);
        move |body: String| {
            let runs = Arc::clone(&runs);
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let mut headers = HeaderMap::new();
                headers.append("set-cookie", "session=a; Path=/".parse().expect("cookie"));
                headers.append("set-cookie", "theme=dark".parse().expect("cookie"));
                headers.append("x-trace", "one".parse().expect("header"));
                headers.append("x-trace", "two".parse().expect("header"));
                (
                    StatusCode::CREATED,
                    headers,
                    json!({"payment": format!("p-{n}"), "request": body}).to_string(),
                )
            }
        }
    };
    let limited = {
        let runs = Arc::clone(&runs);
        move || {
            let runs = Arc::clone(&runs);
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                if n == 0 {
                    (StatusCode::TOO_MANY_REQUESTS, "slow down".to_owned())
                } else {
                    (StatusCode::CREATED, format!("done after {n}"))
                }
            }
        }
    };
    let binary = {
        let runs = Arc::clone(&runs);
        move || {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (
                    [("content-type", "application/octet-stream")],
                    vec![0_u8, 159, 146, 150, 255, 10, 0],
                )
            }
        }
    };
    let large = {
        let runs = Arc::clone(&runs);
        move || {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // Over the default outcome limit (6 MiB) once stored.
                (StatusCode::CREATED, "z".repeat(7 * 1024 * 1024))
            }
        }
    };
    let report = {
        let runs = Arc::clone(&runs);
        move || {
            let runs = Arc::clone(&runs);
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) as u64;
                // Past DynamoDB's 400 KB item limit, and different on every run.
                (StatusCode::CREATED, incompressible(1024 * 1024, run))
            }
        }
    };
    let listed = {
        let runs = Arc::clone(&runs);
        move || {
            let runs = Arc::clone(&runs);
            async move { format!("listed {}", runs.fetch_add(1, Ordering::SeqCst)) }
        }
    };
    let answers = {
        let runs = Arc::clone(&runs);
        move |body: String| {
            let runs = Arc::clone(&runs);
            async move {
                // The first run answers the status the body names; every later run 201.
                let status = match runs.fetch_add(1, Ordering::SeqCst) {
                    0 => body.trim().parse().expect("a status in the body"),
                    _ => 201,
                };
                (
                    StatusCode::from_u16(status).expect("a status"),
                    format!("answered {status}"),
                )
            }
        }
    };
    Router::new()
        .route(
            "/payments",
            post(payments.clone()).patch(payments).get(listed),
        )
        .route("/answers", post(answers))
        .route("/limited", post(limited))
        .route("/binary", post(binary))
        .route("/large", post(large))
        .route("/report", post(report))
        .route("/health", get(|| async { "ok" }))
}

struct Endpoint {
    service: lambda_idempotency::lambda::http::HttpIdempotencyService<Router>,
    runs: Arc<AtomicUsize>,
    _db: dynamo::Dynamo,
}

async fn endpoint(callers: CallerScope) -> Endpoint {
    endpoint_with(|keys| keys.with_callers(callers)).await
}

async fn endpoint_with(configure: impl FnOnce(HttpKeys) -> HttpKeys) -> Endpoint {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let scope = OperationScope::new("http-layer", "payments").expect("scope");
    let layer = Operation::new(idem, scope, configure(HttpKeys::new()).policy()).http_layer();
    let runs = Arc::new(AtomicUsize::new(0));
    Endpoint {
        service: lambda_runtime::tower::Layer::layer(&layer, app(Arc::clone(&runs))),
        runs,
        _db: db,
    }
}

impl Endpoint {
    async fn send(&mut self, request: Request) -> http::Response<Body> {
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

/// An HTTP API (v2) request, with a JWT subject when given.
fn v2(method: &str, path: &str, key: Option<&str>, sub: Option<&str>, body: &str) -> Request {
    let mut headers = json!({"content-type": "application/json"});
    if let Some(key) = key {
        headers["idempotency-key"] = json!(key);
    }
    let mut context = json!({
        "accountId": "1", "apiId": "a", "domainName": "x.example", "domainPrefix": "x",
        "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1", "userAgent": "test"},
        "requestId": "r", "routeKey": format!("{method} {path}"), "stage": "$default",
        "time": "12/Mar/2020:19:03:58 +0000", "timeEpoch": 1583348638390_i64
    });
    if let Some(sub) = sub {
        context["authorizer"] = json!({"jwt": {"claims": {"sub": sub, "iss": "https://issuer.example"}, "scopes": null}});
    }
    let (raw_path, raw_query) = path.split_once('?').unwrap_or((path, ""));
    parse(json!({
        "version": "2.0", "routeKey": format!("{method} {raw_path}"), "rawPath": raw_path,
        "rawQueryString": raw_query, "headers": headers, "requestContext": context,
        "body": body, "isBase64Encoded": false
    }))
}

/// A REST API (v1) request with a Lambda authorizer's principal.
fn v1(key: &str, principal: &str, body: &str) -> Request {
    v1_with_query(key, principal, body, Value::Null)
}

/// A REST API (v1) request with query parameters (API Gateway gives them as a map).
fn v1_with_query(key: &str, principal: &str, body: &str, query: Value) -> Request {
    parse(json!({
        "resource": "/payments", "path": "/payments", "httpMethod": "POST",
        "headers": {"Idempotency-Key": key, "Content-Type": "application/json"},
        "multiValueHeaders": {"Idempotency-Key": [key], "Content-Type": ["application/json"]},
        "queryStringParameters": null, "multiValueQueryStringParameters": query,
        "pathParameters": null, "stageVariables": null,
        "requestContext": {
            "accountId": "1", "resourceId": "r", "stage": "$default", "requestId": "id",
            "identity": {"sourceIp": "192.0.2.1", "userAgent": "test"},
            "resourcePath": "/payments", "httpMethod": "POST", "apiId": "a", "path": "/payments",
            "authorizer": {"principalId": principal}
        },
        "body": body, "isBase64Encoded": false
    }))
}

/// An ALB request: no authorizer.
fn alb(key: &str, body: &str) -> Request {
    parse(json!({
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/t/1"}},
        "httpMethod": "POST", "path": "/payments", "queryStringParameters": {},
        "headers": {"idempotency-key": key, "content-type": "application/json"},
        "body": body, "isBase64Encoded": false
    }))
}

fn parse(event: Value) -> Request {
    lambda_http::request::from_str(&event.to_string()).expect("a Lambda HTTP event")
}

fn body_bytes(response: &http::Response<Body>) -> Vec<u8> {
    response.body().as_ref().to_vec()
}

fn error_code(response: &http::Response<Body>) -> String {
    let body: Value = serde_json::from_slice(&body_bytes(response)).expect("JSON error body");
    body["error"].as_str().unwrap_or_default().to_owned()
}

fn values(response: &http::Response<Body>, name: &str) -> Vec<String> {
    response
        .headers()
        .get_all(name)
        .iter()
        .map(|value| value.to_str().expect("text").to_owned())
        .collect()
}

#[tokio::test]
async fn a_replay_keeps_status_every_stored_header_value_and_the_body() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = || {
        v2(
            "POST",
            "/payments",
            Some("k-1"),
            Some("alice"),
            r#"{"amount":10}"#,
        )
    };

    let first = endpoint.send(request()).await;
    let replay = endpoint.send(request()).await;

    assert_eq!(endpoint.runs(), 1, "the handler ran once");
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(
        values(&first, "set-cookie"),
        ["session=a; Path=/", "theme=dark"]
    );
    // Cookies are withheld from storage, so from the replay (WITHHELD_HEADERS).
    assert!(values(&replay, "set-cookie").is_empty());
    assert_eq!(values(&replay, "x-trace"), ["one", "two"]);
    assert_eq!(body_bytes(&replay), body_bytes(&first), "the same bytes");
    assert_eq!(values(&replay, REPLAYED_HEADER), ["true"]);
    assert!(first.headers().get(REPLAYED_HEADER).is_none());
}

#[tokio::test]
async fn two_callers_with_the_same_key_get_their_own_operations() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let body = r#"{"amount":10}"#;

    let alice = endpoint
        .send(v2(
            "POST",
            "/payments",
            Some("k-shared"),
            Some("alice"),
            body,
        ))
        .await;
    let bob = endpoint
        .send(v2("POST", "/payments", Some("k-shared"), Some("bob"), body))
        .await;

    assert_eq!(endpoint.runs(), 2, "one operation per caller");
    assert!(
        bob.headers().get(REPLAYED_HEADER).is_none(),
        "not alice's replay"
    );
    assert_ne!(
        body_bytes(&alice),
        body_bytes(&bob),
        "bob never sees alice's payment"
    );
}

#[tokio::test]
async fn a_rest_api_principal_keys_the_operation() {
    let mut endpoint = endpoint(CallerScope::Principal).await;

    let first = endpoint.send(v1("k-2", "user-42", r#"{"amount":5}"#)).await;
    let replay = endpoint.send(v1("k-2", "user-42", r#"{"amount":5}"#)).await;
    let other = endpoint.send(v1("k-2", "user-7", r#"{"amount":5}"#)).await;

    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(values(&replay, REPLAYED_HEADER), ["true"]);
    assert!(other.headers().get(REPLAYED_HEADER).is_none());
    assert_eq!(endpoint.runs(), 2);
}

#[tokio::test]
async fn a_request_without_a_principal_is_refused_unless_anonymous_callers_are_allowed() {
    let mut strict = endpoint(CallerScope::Principal).await;
    let refused = strict.send(alb("k-3", r#"{"amount":1}"#)).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&refused), "caller_unidentified");
    assert_eq!(strict.runs(), 0);

    let mut public = endpoint(CallerScope::PrincipalOrAnonymous).await;
    let first = public.send(alb("k-3", r#"{"amount":1}"#)).await;
    let replay = public.send(alb("k-3", r#"{"amount":1}"#)).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(values(&replay, REPLAYED_HEADER), ["true"]);
    assert_eq!(public.runs(), 1);
}

#[tokio::test]
async fn the_fingerprint_covers_query_content_type_and_body() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    endpoint
        .send(v2(
            "POST",
            "/payments?currency=eur",
            Some("k-4"),
            Some("alice"),
            "{}",
        ))
        .await;

    let other_query = endpoint
        .send(v2(
            "POST",
            "/payments?currency=usd",
            Some("k-4"),
            Some("alice"),
            "{}",
        ))
        .await;
    let other_body = endpoint
        .send(v2(
            "POST",
            "/payments?currency=eur",
            Some("k-4"),
            Some("alice"),
            r#"{"x":1}"#,
        ))
        .await;

    assert_eq!(other_query.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(error_code(&other_query), "idempotency_key_reused");
    assert_eq!(other_body.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(endpoint.runs(), 1);
}

#[tokio::test]
async fn retry_statuses_are_passed_through_and_not_stored() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = || v2("POST", "/limited", Some("k-5"), Some("alice"), "{}");

    let limited = endpoint.send(request()).await;
    let retried = endpoint.send(request()).await;

    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retried.status(), StatusCode::CREATED, "the retry ran");
    assert_eq!(endpoint.runs(), 2);
}

#[tokio::test]
async fn a_binary_body_replays_byte_for_byte() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = || v2("POST", "/binary", Some("k-6"), Some("alice"), "{}");

    let first = endpoint.send(request()).await;
    let replay = endpoint.send(request()).await;

    assert_eq!(body_bytes(&first), [0_u8, 159, 146, 150, 255, 10, 0]);
    assert_eq!(body_bytes(&replay), body_bytes(&first));
    assert_eq!(endpoint.runs(), 1);
}

#[tokio::test]
async fn reads_pass_through_and_a_write_without_a_key_is_refused() {
    let mut endpoint = endpoint(CallerScope::Principal).await;

    let listed = endpoint
        .send(v2("GET", "/payments", None, Some("alice"), ""))
        .await;
    let again = endpoint
        .send(v2("GET", "/payments", None, Some("alice"), ""))
        .await;
    let unkeyed = endpoint
        .send(v2("POST", "/payments", None, Some("alice"), "{}"))
        .await;

    assert_eq!(listed.status(), StatusCode::OK);
    assert_ne!(
        body_bytes(&listed),
        body_bytes(&again),
        "a GET runs every time"
    );
    assert_eq!(unkeyed.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&unkeyed), "missing_idempotency_key");
    assert_eq!(endpoint.runs(), 2);
}

#[tokio::test]
async fn a_rest_api_retry_matches_whatever_order_the_gateway_gives_its_query() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let query = json!({"a": ["1"], "b": ["2"], "c": ["3", "4"], "d": ["5"]});

    let first = endpoint
        .send(v1_with_query("k-7", "user-42", "{}", query.clone()))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    for _ in 0..8 {
        let retry = endpoint
            .send(v1_with_query("k-7", "user-42", "{}", query.clone()))
            .await;
        assert_eq!(values(&retry, REPLAYED_HEADER), ["true"], "not a 422");
    }
    assert_eq!(endpoint.runs(), 1);
}

#[tokio::test]
async fn a_response_too_large_to_keep_still_reaches_its_caller_and_is_not_run_again() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = || v2("POST", "/large", Some("k-8"), Some("alice"), "{}");

    let first = endpoint.send(request()).await;
    let retry = endpoint.send(request()).await;

    assert_eq!(first.status(), StatusCode::CREATED, "the applied response");
    assert_eq!(body_bytes(&first).len(), 7 * 1024 * 1024);
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert_eq!(error_code(&retry), "operation_already_applied");
    assert_eq!(endpoint.runs(), 1);
}

#[tokio::test]
async fn a_response_past_the_item_limit_is_replayed_byte_for_byte() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = || v2("POST", "/report", Some("k-8b"), Some("alice"), "{}");

    let first = endpoint.send(request()).await;
    let retry = endpoint.send(request()).await;

    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(body_bytes(&first).len(), 1024 * 1024);
    assert_eq!(body_bytes(&retry), body_bytes(&first), "byte for byte");
    assert_eq!(values(&retry, REPLAYED_HEADER), ["true"]);
    assert_eq!(endpoint.runs(), 1);
}

#[tokio::test]
async fn a_principal_read_by_the_application_scopes_keys() {
    let mut endpoint = endpoint_with(|keys| {
        keys.with_principal(|request| {
            let identity = request.headers().get("x-amzn-oidc-identity")?;
            identity.to_str().ok().map(str::to_owned)
        })
    })
    .await;
    let from = |identity: &str| {
        let mut request = alb("k-9", r#"{"amount":2}"#);
        request
            .headers_mut()
            .insert("x-amzn-oidc-identity", identity.parse().expect("header"));
        request
    };

    let carol = endpoint.send(from("carol")).await;
    let carol_again = endpoint.send(from("carol")).await;
    let dave = endpoint.send(from("dave")).await;
    let nobody = endpoint.send(alb("k-9", r#"{"amount":2}"#)).await;

    assert_eq!(carol.status(), StatusCode::CREATED);
    assert_eq!(values(&carol_again, REPLAYED_HEADER), ["true"]);
    assert!(
        dave.headers().get(REPLAYED_HEADER).is_none(),
        "dave's own operation"
    );
    assert_eq!(nobody.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(endpoint.runs(), 2);
}

#[tokio::test]
async fn a_store_failure_is_503_temporarily_unavailable_with_retry_after() {
    let db = dynamo::start().await;
    let store = FaultyStore::new(db.store());
    let idem = Idempotency::new(store.clone()).with_clock(ManualClock::new(start_time()));
    let layer = Operation::new(
        idem,
        OperationScope::new("http-layer", "payments").expect("scope"),
        sources::http(),
    )
    .http_layer();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = lambda_runtime::tower::Layer::layer(&layer, app(Arc::clone(&runs)));
    // Every try the engine makes before the handler (five) fails.
    for _ in 0..5 {
        store.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Unavailable));
    }
    let request = || {
        v2(
            "POST",
            "/payments",
            Some("k-20"),
            Some("alice"),
            r#"{"amount":3}"#,
        )
    };

    let answer = service
        .ready()
        .await
        .expect("ready")
        .call(request())
        .await
        .expect("answer");

    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&answer), "temporarily_unavailable");
    assert_eq!(values(&answer, "retry-after"), ["1"]);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(store.pending(), 0, "every failure met a claim");
    let retry = service
        .ready()
        .await
        .expect("ready")
        .call(request())
        .await
        .expect("answer");
    assert_eq!(retry.status(), StatusCode::CREATED, "the retry runs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retry_after_is_the_leases_remaining_time_up_to_the_lease_policys_longest() {
    for (lease, retry_after) in [
        (Duration::from_secs(600), "600"),
        (Duration::from_secs(2 * 3600), "7200"),
    ] {
        let db = dynamo::start().await;
        let clock = ManualClock::new(start_time());
        let idem = Idempotency::new(db.store()).with_clock(clock.clone());
        // The requests carry no Lambda deadline: the lease is `without_deadline`.
        let layer = Operation::new(
            idem,
            OperationScope::new("http-layer", "payments").expect("scope"),
            sources::http(),
        )
        .with_lease_policy(LeasePolicy {
            without_deadline: lease,
            max: lease,
            ..LeasePolicy::default()
        })
        .http_layer();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
        let gates = Arc::new(std::sync::Mutex::new(Some((started_tx, finish_rx))));
        let held = Router::new().route(
            "/payments",
            post(move || {
                let gates = Arc::clone(&gates);
                async move {
                    let gate = gates.lock().expect("lock").take();
                    if let Some((started, finish)) = gate {
                        let _ = started.send(());
                        let _ = finish.await;
                    }
                    (StatusCode::CREATED, "paid")
                }
            }),
        );
        let service = lambda_runtime::tower::Layer::layer(&layer, held);
        let request = || {
            v2(
                "POST",
                "/payments",
                Some("k-21"),
                Some("alice"),
                r#"{"amount":4}"#,
            )
        };
        let original = tokio::spawn({
            let mut service = service.clone();
            let request = request();
            async move { service.ready().await?.call(request).await }
        });
        started_rx.await.expect("the original runs");
        let (records, _, _) = db.store().scan_page(None).await.expect("scan");
        assert_eq!(
            records[0].lease.expires_at.duration_since(clock.now()).ok(),
            Some(lease),
            "the claim holds the whole lease"
        );

        let answer = service
            .clone()
            .ready()
            .await
            .expect("ready")
            .call(request())
            .await
            .expect("answer");

        assert_eq!(answer.status(), StatusCode::CONFLICT);
        assert_eq!(error_code(&answer), "request_in_progress");
        assert_eq!(
            values(&answer, "retry-after"),
            [retry_after],
            "a lease of {lease:?}"
        );
        let _ = finish_tx.send(());
        let original = original.await.expect("join").expect("answer");
        assert_eq!(original.status(), StatusCode::CREATED);
    }
}

#[tokio::test]
async fn a_patch_is_keyed_like_a_post() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = || v2("PATCH", "/payments", Some("k-patch"), Some("alice"), "{}");

    let first = endpoint.send(request()).await;
    let replay = endpoint.send(request()).await;

    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(values(&replay, REPLAYED_HEADER), ["true"]);
    assert_eq!(body_bytes(&replay), body_bytes(&first));
    assert_eq!(endpoint.runs(), 1, "the PATCH ran once");
}

#[tokio::test]
async fn statuses_that_ask_for_a_retry_are_not_stored_and_the_others_are() {
    for (status, stored) in [
        (401, false),
        (403, false),
        (407, false),
        (412, false),
        (428, false),
        (408, false),
        (409, false),
        (425, false),
        (429, false),
        (500, false),
        (503, false),
        (200, true),
        (302, true),
        (400, true),
        (404, true),
        (422, true),
    ] {
        let mut endpoint = endpoint(CallerScope::Principal).await;
        let request = || {
            v2(
                "POST",
                "/answers",
                Some("k-status"),
                Some("alice"),
                &status.to_string(),
            )
        };

        let first = endpoint.send(request()).await;
        let again = endpoint.send(request()).await;

        assert_eq!(first.status().as_u16(), status);
        match stored {
            true => {
                assert_eq!(again.status().as_u16(), status, "{status} replayed");
                assert_eq!(values(&again, REPLAYED_HEADER), ["true"], "{status}");
                assert_eq!(endpoint.runs(), 1, "{status}: stored, not run again");
            }
            false => {
                assert_eq!(
                    again.status(),
                    StatusCode::CREATED,
                    "{status}: the retry ran"
                );
                assert_eq!(endpoint.runs(), 2, "{status}: not stored");
            }
        }
    }
}

#[tokio::test]
async fn the_same_body_under_another_content_type_is_another_request() {
    let mut endpoint = endpoint(CallerScope::Principal).await;
    let request = |content_type: &str| {
        let mut request = v2("POST", "/payments", Some("k-ct"), Some("alice"), "{}");
        request.headers_mut().insert(
            "content-type",
            content_type.parse().expect("a header value"),
        );
        request
    };

    let first = endpoint.send(request("application/json")).await;
    let other = endpoint.send(request("text/plain")).await;

    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(error_code(&other), "idempotency_key_reused");
    assert_eq!(endpoint.runs(), 1);
}

/// The endpoint `/payments` (a cookie, a session token, another header) on `store`, its
/// response opting `opt_in` in.
fn cookie_endpoint(
    store: lambda_idempotency::store::AnyStore,
    clock: ManualClock,
    opt_in: Option<StoreHeaders>,
) -> (
    lambda_idempotency::lambda::http::HttpIdempotencyService<Router>,
    Arc<AtomicUsize>,
) {
    let idem = Idempotency::new(store).with_clock(clock);
    let scope = OperationScope::new("http-layer", "sessions").expect("scope");
    let layer = Operation::new(idem, scope, HttpKeys::new().policy()).http_layer();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let sessions = move || {
        let runs = Arc::clone(&counted);
        let opt_in = opt_in.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut response = http::Response::new(Body::Text(r#"{"session":"created"}"#.into()));
            *response.status_mut() = StatusCode::CREATED;
            let headers = response.headers_mut();
            headers.append(
                "set-cookie",
                "session=c00k1e-v4lue; Path=/; HttpOnly"
                    .parse()
                    .expect("cookie"),
            );
            headers.append(
                "x-amz-security-token",
                "t0k3n-v4lue".parse().expect("token"),
            );
            headers.append("x-trace", "kept".parse().expect("header"));
            if let Some(opt_in) = opt_in {
                response.extensions_mut().insert(opt_in);
            }
            response
        }
    };
    let router = Router::new().route("/payments", post(sessions));
    (lambda_runtime::tower::Layer::layer(&layer, router), runs)
}

async fn call(
    service: &mut lambda_idempotency::lambda::http::HttpIdempotencyService<Router>,
    request: Request,
) -> http::Response<Body> {
    service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("answer")
}

/// The record of the request as the store reads it back, its outcome as text.
async fn stored_outcome(store: &lambda_idempotency::store::AnyStore, request: &Request) -> String {
    use lambda_idempotency::store::StoreExt;
    let scope = OperationScope::new("http-layer", "sessions").expect("scope");
    let (key, _) = HttpKeys::new()
        .policy()
        .derive(&scope, request)
        .expect("a key");
    let record = store.get(&key).await.expect("read").expect("a record");
    String::from_utf8(record.outcome.expect("an outcome")).expect("JSON text")
}

#[tokio::test]
async fn a_cookie_reaches_the_first_caller_only_and_is_never_stored() {
    for backend in super::backends::both().await {
        let name = backend.name;
        let (mut service, runs) = cookie_endpoint(backend.store.clone(), backend.clock, None);
        let request = || v2("POST", "/payments", Some("k-cookie"), Some("alice"), "{}");

        let first = call(&mut service, request()).await;
        let replay = call(&mut service, request()).await;
        let outcome = stored_outcome(&backend.store, &request()).await;

        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: ran once");
        assert_eq!(
            values(&first, "set-cookie"),
            ["session=c00k1e-v4lue; Path=/; HttpOnly"],
            "{name}: the first caller gets its cookie"
        );
        assert_eq!(values(&first, "x-amz-security-token"), ["t0k3n-v4lue"]);
        assert_eq!(values(&replay, REPLAYED_HEADER), ["true"], "{name}");
        assert!(
            values(&replay, "set-cookie").is_empty(),
            "{name}: no cookie replayed"
        );
        assert!(values(&replay, "x-amz-security-token").is_empty(), "{name}");
        assert_eq!(
            values(&replay, "x-trace"),
            ["kept"],
            "{name}: the other headers"
        );
        assert_eq!(body_bytes(&replay), body_bytes(&first), "{name}");
        assert!(
            outcome.contains("x-trace"),
            "{name}: the record read is the response: {outcome}"
        );
        assert!(
            !outcome.contains("c00k1e") && !outcome.contains("set-cookie"),
            "{name}: no cookie stored: {outcome}"
        );
        assert!(
            !outcome.contains("t0k3n"),
            "{name}: no token stored: {outcome}"
        );
    }
}

#[tokio::test]
async fn the_raw_dynamodb_item_holds_no_cookie() {
    let db = dynamo::start().await;
    let clock = ManualClock::new(start_time());
    let store = lambda_idempotency::store::AnyStore::new(db.store());
    let (mut service, _) = cookie_endpoint(store, clock, None);
    let request = || v2("POST", "/payments", Some("k-raw"), Some("alice"), "{}");

    let first = call(&mut service, request()).await;
    let items = db
        .client
        .scan()
        .table_name(&db.table)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default();

    assert_eq!(values(&first, "set-cookie").len(), 1);
    assert_eq!(items.len(), 1, "one record");
    let item = format!("{:?}", items[0]);
    // A small outcome is stored uncompressed, as text or as bytes.
    let outcome = match items[0].get("outcome") {
        Some(aws_sdk_dynamodb::types::AttributeValue::S(text)) => text.clone(),
        Some(aws_sdk_dynamodb::types::AttributeValue::B(bytes)) => {
            String::from_utf8_lossy(bytes.as_ref()).into_owned()
        }
        _ => panic!("no outcome: {item}"),
    };
    assert!(outcome.contains("x-trace"), "{outcome}");
    assert!(
        !outcome.contains("c00k1e") && !outcome.contains("t0k3n"),
        "{outcome}"
    );
    assert!(
        !item.contains("c00k1e") && !item.contains("t0k3n"),
        "{item}"
    );
}

#[tokio::test]
async fn a_cookie_the_response_opts_in_is_stored_and_replayed() {
    for backend in super::backends::both().await {
        let name = backend.name;
        let opt_in = StoreHeaders::new().with(http::header::SET_COOKIE);
        let (mut service, _) = cookie_endpoint(backend.store.clone(), backend.clock, Some(opt_in));
        let request = || v2("POST", "/payments", Some("k-opted"), Some("alice"), "{}");

        let first = call(&mut service, request()).await;
        let replay = call(&mut service, request()).await;
        let outcome = stored_outcome(&backend.store, &request()).await;

        assert_eq!(
            values(&first, "set-cookie"),
            values(&replay, "set-cookie"),
            "{name}"
        );
        assert_eq!(
            values(&replay, "set-cookie"),
            ["session=c00k1e-v4lue; Path=/; HttpOnly"],
            "{name}"
        );
        assert!(
            outcome.contains("c00k1e"),
            "{name}: stored, as opted: {outcome}"
        );
        assert!(
            values(&replay, "x-amz-security-token").is_empty(),
            "{name}: not opted in"
        );
        assert!(!outcome.contains("t0k3n"), "{name}: {outcome}");
    }
}

/// A terminal failure whose message is huge: the FAILED record keeps a bounded start of it,
/// and no caller sees it.
#[tokio::test]
async fn a_huge_handler_error_is_stored_cut_to_its_limit_on_dynamodb() {
    use lambda_idempotency::failure::Terminal;
    use lambda_idempotency::record::MAX_FAILURE_MESSAGE_BYTES;
    use lambda_idempotency::record::{RetainedFailure, Status};
    use lambda_idempotency::store::StoreExt;

    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let scope = OperationScope::new("http-layer", "payments").expect("scope");
    let layer = Operation::new(idem, scope.clone(), HttpKeys::new().policy()).http_layer();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    // 2 MB of error text, past DynamoDB's item limit, different at its end.
    let message = format!("{}card 4111 declined", "why ".repeat(512 * 1024));
    let failing = message.clone();
    let inner = lambda_runtime::tower::service_fn(move |_: Request| {
        counted.fetch_add(1, Ordering::SeqCst);
        let failing = failing.clone();
        async move {
            Err::<http::Response<Body>, _>(lambda_idempotency::BoxError::from(Terminal::new(
                "card_declined",
                failing,
            )))
        }
    });
    let mut service = lambda_runtime::tower::Layer::layer(&layer, inner);
    let request = || v2("POST", "/payments", Some("k-huge"), Some("alice"), "{}");

    let first = service
        .ready()
        .await
        .expect("ready")
        .call(request())
        .await
        .expect("answer");
    let retry = service
        .ready()
        .await
        .expect("ready")
        .call(request())
        .await
        .expect("answer");
    let (key, _) = HttpKeys::new()
        .policy()
        .derive(&scope, &request())
        .expect("key");
    let record = db.store().get(&key).await.expect("read").expect("a record");
    let item = db
        .client
        .get_item()
        .table_name(&db.table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(key.as_str().to_owned()),
        )
        .send()
        .await
        .expect("get")
        .item
        .expect("the item");

    assert_eq!(runs.load(Ordering::SeqCst), 1, "retained, not run again");
    for answer in [&first, &retry] {
        assert_eq!(answer.status(), StatusCode::CONFLICT);
        assert_eq!(error_code(answer), "operation_previously_failed");
        assert!(!String::from_utf8_lossy(&body_bytes(answer)).contains("why why"));
    }
    assert_eq!(record.status, Status::Failed);
    let failure: RetainedFailure =
        serde_json::from_slice(&record.outcome.expect("the failure")).expect("a retained failure");
    assert!(
        failure.message.len() <= MAX_FAILURE_MESSAGE_BYTES
            && failure.message.len() > MAX_FAILURE_MESSAGE_BYTES - 4,
        "{} bytes kept",
        failure.message.len()
    );
    assert!(message.starts_with(&failure.message), "its start");
    assert!(!failure.message.contains("4111"), "its end is cut");
    assert!(
        dynamo::item_size(&item) < 2 * MAX_FAILURE_MESSAGE_BYTES,
        "the raw item is small: {} bytes",
        dynamo::item_size(&item)
    );
}
