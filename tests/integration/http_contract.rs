//! The HTTP contract for API Gateway, on the embedded DynamoDB server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::event_door::EventDoor;
use aws_lambda_events::encodings::Body;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use lambda_idempotency::HttpKeys;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::lambda::http::CallerScope;
use lambda_idempotency::lambda::{LeasePolicy, Operation, sources};
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use lambda_idempotency::testing::dynamo;

fn request(key: Option<&str>, body: Value) -> LambdaEvent<ApiGatewayV2httpRequest> {
    request_from(Some("alice"), key, body)
}

/// A request from `caller` (a JWT subject), or from nobody.
fn request_from(
    caller: Option<&str>,
    key: Option<&str>,
    body: Value,
) -> LambdaEvent<ApiGatewayV2httpRequest> {
    let mut headers = json!({"content-type": "application/json"});
    if let Some(key) = key {
        headers["idempotency-key"] = json!(key);
    }
    let mut context = json!({"accountId": "1", "apiId": "a", "domainName": "d",
        "domainPrefix": "d", "http": {"method": "POST", "path": "/payments", "protocol": "HTTP/1.1", "sourceIp": "1.2.3.4",
        "userAgent": "t"}, "requestId": "r", "routeKey": "POST /payments", "stage": "$default", "time": "t", "timeEpoch": 0});
    if let Some(caller) = caller {
        context["authorizer"] = json!({"jwt": {"claims": {"sub": caller}, "scopes": null}});
    }
    let request = serde_json::from_value(
        json!({"version": "2.0", "routeKey": "POST /payments", "rawPath": "/payments",
        "rawQueryString": "", "headers": headers, "requestContext": context,
        "body": body.to_string(), "isBase64Encoded": false}),
    )
    .expect("request");
    LambdaEvent::new(request, Context::default())
}

fn response(status: i64, body: Value) -> ApiGatewayV2httpResponse {
    let mut response = ApiGatewayV2httpResponse::default();
    response.status_code = status;
    response.body = Some(Body::Text(body.to_string()));
    response
}

fn body(response: &ApiGatewayV2httpResponse) -> Value {
    match &response.body {
        Some(Body::Text(text)) => serde_json::from_str(text).expect("JSON body"),
        other => panic!("expected a text body, got {other:?}"),
    }
}

fn header<'a>(response: &'a ApiGatewayV2httpResponse, name: &str) -> Option<&'a str> {
    response
        .headers
        .get(name)
        .and_then(|value| value.to_str().ok())
}

async fn endpoint() -> (EventDoor, dynamo::Dynamo) {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    (
        EventDoor::new(Operation::new(
            idem,
            OperationScope::new("http-test", "pay").expect("scope"),
            sources::http(),
        )),
        db,
    )
}

/// A payment handler that counts its runs and answers `status`.
async fn pay(
    runs: &AtomicUsize,
    status: i64,
    request: ApiGatewayV2httpRequest,
) -> Result<ApiGatewayV2httpResponse, std::io::Error> {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let amount: Value = serde_json::from_str(request.body.as_deref().unwrap_or("null"))?;
    Ok(response(
        status,
        json!({"payment": format!("pay-{run}"), "amount": amount["amount"]}),
    ))
}

#[tokio::test]
async fn a_repeated_request_gets_the_original_response_marked_replayed() {
    let (http, _db) = endpoint().await;
    let runs = AtomicUsize::new(0);

    let first = http
        .handle(request(Some("k-1"), json!({"amount": 5})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;
    let again = http
        .handle(request(Some("k-1"), json!({"amount": 5})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!((first.status_code, again.status_code), (201, 201));
    assert_eq!(body(&first), body(&again));
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&first, "idempotent-replayed"), None);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_request_without_a_key_is_400_and_writes_nothing() {
    let (http, db) = endpoint().await;
    let runs = AtomicUsize::new(0);
    let before = db.requests.count();

    let answer = http
        .handle(request(None, json!({"amount": 5})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!(answer.status_code, 400);
    assert_eq!(body(&answer)["error"], "missing_idempotency_key");
    assert_eq!(
        header(&answer, "content-type"),
        Some("application/problem+json"),
        "an RFC 9457 problem detail, as the Idempotency-Key draft asks"
    );
    let problem = body(&answer);
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["title"], "Bad Request");
    assert_eq!(problem["status"], 400);
    assert_eq!(problem["detail"], problem["message"]);
    assert_eq!(db.requests.count(), before, "nothing sent to the table");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_same_key_with_another_payload_is_422() {
    let (http, _db) = endpoint().await;
    let runs = AtomicUsize::new(0);

    http.handle(request(Some("k-2"), json!({"amount": 5})), |r, _| {
        pay(&runs, 201, r)
    })
    .await;
    let answer = http
        .handle(request(Some("k-2"), json!({"amount": 500})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!(answer.status_code, 422);
    assert_eq!(body(&answer)["error"], "idempotency_key_reused");
    assert_eq!(body(&answer)["title"], "Unprocessable Entity");
    assert_eq!(body(&answer)["status"], 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A first request for `key` whose handler has started and waits: its claim is held until
/// the sender is used (or dropped).
async fn held_original(
    http: &EventDoor,
    key: &str,
) -> (
    tokio::task::JoinHandle<ApiGatewayV2httpResponse>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let original = tokio::spawn({
        let (http, key) = (http.clone(), key.to_owned());
        async move {
            http.handle(
                request(Some(&key), json!({"amount": 5})),
                |_, _: ExecutionContext| async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, std::io::Error>(response(201, json!({"payment": "p"})))
                },
            )
            .await
        }
    });
    started_rx.await.expect("original started");
    (original, finish_tx)
}

#[tokio::test]
async fn a_request_still_running_is_409_with_retry_after() {
    let (http, _db) = endpoint().await;
    let (original, finish_tx) = held_original(&http, "k-3").await;
    let runs = AtomicUsize::new(0);

    let answer = http
        .handle(request(Some("k-3"), json!({"amount": 5})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!(answer.status_code, 409);
    assert_eq!(body(&answer)["error"], "request_in_progress");
    assert!(header(&answer, "retry-after").is_some_and(|s| s.parse::<u32>().is_ok_and(|s| s >= 1)));
    let _ = finish_tx.send(());
    assert_eq!(original.await.expect("join").status_code, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn server_errors_and_handler_failures_are_not_stored() {
    let (http, _db) = endpoint().await;
    let runs = Arc::new(AtomicUsize::new(0));

    let unavailable = http
        .handle(request(Some("k-4"), json!({"amount": 5})), |r, _| {
            pay(&runs, 503, r)
        })
        .await;
    let failed = http
        .handle(request(Some("k-4"), json!({"amount": 5})), |_, _| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<ApiGatewayV2httpResponse, _>(std::io::Error::other("ledger down"))
        })
        .await;
    let succeeded = http
        .handle(request(Some("k-4"), json!({"amount": 5})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!(
        unavailable.status_code, 503,
        "the handler's own 5xx passes through"
    );
    assert_eq!(failed.status_code, 500);
    assert_eq!(body(&failed)["error"], "operation_failed");
    assert_eq!(succeeded.status_code, 201, "each retry executed");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_retained_failure_is_answered_truthfully_without_its_internal_message() {
    let (http, _db) = endpoint().await;
    let secret = "arn:aws:dynamodb:eu-west-1:123456789012:table/ledger refused";
    let declined = || async {
        Err::<ApiGatewayV2httpResponse, _>(lambda_idempotency::failure::Terminal::new(
            "card_declined",
            std::io::Error::other(secret),
        ))
    };

    let first = http
        .handle(request(Some("k-9"), json!({"amount": 9})), |_, _| {
            declined()
        })
        .await;
    let retry = http
        .handle(request(Some("k-9"), json!({"amount": 9})), |_, _| {
            declined()
        })
        .await;

    for (response, who) in [(&first, "the first caller"), (&retry, "the retry")] {
        assert_eq!(
            response.status_code, 409,
            "{who}: retained, not a retryable 5xx"
        );
        assert_eq!(
            body(response)["error"],
            "operation_previously_failed",
            "{who}"
        );
    }
    for response in [&first, &retry] {
        let text = body(response).to_string();
        assert!(!text.contains("arn:aws"), "internal message leaked: {text}");
        assert!(
            !text.contains("card_declined"),
            "internal kind leaked: {text}"
        );
    }
}

#[tokio::test]
async fn keys_are_scoped_to_the_caller_and_an_unidentified_caller_is_refused() {
    let (http, _db) = endpoint().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let send = |caller: Option<&'static str>| {
        let (http, runs) = (http.clone(), Arc::clone(&runs));
        async move {
            http.handle(
                request_from(caller, Some("k-shared"), json!({"amount": 3})),
                |r, _| async move { pay(&runs, 201, r).await },
            )
            .await
        }
    };

    let alice = send(Some("alice")).await;
    let bob = send(Some("bob")).await;
    let nobody = send(None).await;

    assert_eq!((alice.status_code, bob.status_code), (201, 201));
    assert_eq!(
        header(&bob, "idempotent-replayed"),
        None,
        "not alice's response"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one operation per caller");
    assert_eq!(nobody.status_code, 401);
    assert_eq!(body(&nobody)["error"], "caller_unidentified");
    assert_eq!(
        header(&nobody, "www-authenticate"),
        Some("Bearer"),
        "a 401 carries a challenge"
    );
}

#[tokio::test]
async fn a_429_from_the_handler_is_not_stored() {
    let (http, _db) = endpoint().await;
    let runs = Arc::new(AtomicUsize::new(0));

    let limited = http
        .handle(request(Some("k-10"), json!({"amount": 4})), |r, _| {
            pay(&runs, 429, r)
        })
        .await;
    let retried = http
        .handle(request(Some("k-10"), json!({"amount": 4})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!(limited.status_code, 429);
    assert_eq!(retried.status_code, 201, "the retry ran");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_blank_key_is_no_key_and_a_shared_scope_ignores_the_caller() {
    let (http, db) = endpoint().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let blank = http
        .handle(request(Some("   "), json!({"amount": 6})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;
    assert_eq!(blank.status_code, 400);
    assert_eq!(body(&blank)["error"], "missing_idempotency_key");

    let shared = EventDoor::new(Operation::new(
        Idempotency::new(db.store()),
        OperationScope::new("http-test", "pay").expect("scope"),
        HttpKeys::new().with_callers(CallerScope::Shared).policy(),
    ));
    let alice = shared
        .handle(
            request_from(Some("alice"), Some("k-11"), json!({"amount": 6})),
            |r, _| pay(&runs, 201, r),
        )
        .await;
    let bob = shared
        .handle(
            request_from(Some("bob"), Some("k-11"), json!({"amount": 6})),
            |r, _| pay(&runs, 201, r),
        )
        .await;
    assert_eq!(alice.status_code, 201);
    assert_eq!(
        header(&bob, "idempotent-replayed"),
        Some("true"),
        "one operation"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A store refusal no retry clears (no permission, no table, a request refused as built) is
/// not answered "retry in a second" (503 with `Retry-After`, as it was): 500, no `Retry-After`.
#[tokio::test]
async fn a_store_refusal_no_retry_clears_is_500_without_retry_after() {
    let db = dynamo::start().await;
    for (kind, status, code) in [
        (FaultKind::Rejected, 500, "service_cannot_store"),
        (FaultKind::Unavailable, 503, "temporarily_unavailable"),
    ] {
        let store = FaultyStore::new(db.store());
        let idem = Idempotency::new(store.clone()).with_clock(ManualClock::new(start_time()));
        let http = EventDoor::new(Operation::new(
            idem,
            OperationScope::new("http-test", "pay").expect("scope"),
            sources::http(),
        ));
        let runs = AtomicUsize::new(0);
        // Every try the engine makes before the handler: five of a transient failure, one of
        // a refusal.
        let tries = if status == 503 { 5 } else { 1 };
        for _ in 0..tries {
            store.inject(Primitive::Claim, Fault::FailBefore(kind));
        }

        let answer = http
            .handle(
                request(Some(&format!("k-{code}")), json!({"amount": 7})),
                |r, _| pay(&runs, 201, r),
            )
            .await;

        assert_eq!(answer.status_code, status, "{kind:?}");
        assert_eq!(body(&answer)["error"], code, "{kind:?}");
        assert_eq!(
            header(&answer, "retry-after").is_some(),
            status == 503,
            "{kind:?}"
        );
        assert!(
            !body(&answer).to_string().contains("injected"),
            "no store message"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn a_store_failure_is_503_temporarily_unavailable_with_retry_after() {
    let db = dynamo::start().await;
    let store = FaultyStore::new(db.store());
    let idem = Idempotency::new(store.clone()).with_clock(ManualClock::new(start_time()));
    let http = EventDoor::new(Operation::new(
        idem,
        OperationScope::new("http-test", "pay").expect("scope"),
        sources::http(),
    ));
    let runs = AtomicUsize::new(0);
    // Every try the engine makes before the handler (five) fails.
    for _ in 0..5 {
        store.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Unavailable));
    }

    let answer = http
        .handle(request(Some("k-12"), json!({"amount": 7})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;

    assert_eq!(answer.status_code, 503);
    assert_eq!(body(&answer)["error"], "temporarily_unavailable");
    assert_eq!(header(&answer, "retry-after"), Some("1"));
    assert!(
        !body(&answer).to_string().contains("injected"),
        "no store message"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(store.pending(), 0, "every failure met a claim");
    let retry = http
        .handle(request(Some("k-12"), json!({"amount": 7})), |r, _| {
            pay(&runs, 201, r)
        })
        .await;
    assert_eq!(retry.status_code, 201, "the retry with the same key runs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An endpoint whose leases last `lease` (its requests carry no deadline), on a clock that
/// stands still.
async fn endpoint_leasing(lease: Duration) -> (EventDoor, dynamo::Dynamo, ManualClock) {
    let db = dynamo::start().await;
    let clock = ManualClock::new(start_time());
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let operation = Operation::new(
        idem,
        OperationScope::new("http-test", "pay").expect("scope"),
        sources::http(),
    )
    .with_lease_policy(LeasePolicy {
        without_deadline: lease,
        max: lease,
        ..LeasePolicy::default()
    });
    (EventDoor::new(operation), db, clock)
}

#[tokio::test]
async fn retry_after_is_the_leases_remaining_time_up_to_the_lease_policys_longest() {
    for (lease, retry_after) in [
        (Duration::from_secs(600), "600"),
        (Duration::from_secs(2 * 3600), "7200"),
    ] {
        let (http, db, clock) = endpoint_leasing(lease).await;
        let (original, finish_tx) = held_original(&http, "k-13").await;
        let (records, _, _) = db.store().scan_page(None).await.expect("scan");
        assert_eq!(
            records[0].lease.expires_at.duration_since(clock.now()).ok(),
            Some(lease),
            "the claim holds the whole lease"
        );
        let runs = AtomicUsize::new(0);

        let answer = http
            .handle(request(Some("k-13"), json!({"amount": 5})), |r, _| {
                pay(&runs, 201, r)
            })
            .await;

        assert_eq!(answer.status_code, 409);
        assert_eq!(body(&answer)["error"], "request_in_progress");
        assert_eq!(
            header(&answer, "retry-after"),
            Some(retry_after),
            "a lease of {lease:?}"
        );
        let _ = finish_tx.send(());
        assert_eq!(original.await.expect("join").status_code, 201);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn a_replayed_event_response_carries_no_cookie_of_the_first() {
    let (http, _db) = endpoint().await;
    let runs = AtomicUsize::new(0);
    let with_cookie = |request| {
        let runs = &runs;
        async move {
            let mut answer = pay(runs, 201, request).await?;
            answer.headers.append(
                "set-cookie",
                "session=ev3nt-c00kie; Secure".parse().expect("cookie"),
            );
            answer
                .headers
                .append("x-request-trace", "t-1".parse().expect("header"));
            Ok::<_, std::io::Error>(answer)
        }
    };

    let first = http
        .handle(request(Some("k-cookie"), json!({"amount": 5})), |r, _| {
            with_cookie(r)
        })
        .await;
    let again = http
        .handle(request(Some("k-cookie"), json!({"amount": 5})), |r, _| {
            with_cookie(r)
        })
        .await;

    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        header(&first, "set-cookie"),
        Some("session=ev3nt-c00kie; Secure")
    );
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(
        header(&again, "set-cookie"),
        None,
        "withheld from the replay"
    );
    assert_eq!(header(&again, "x-request-trace"), Some("t-1"));
    assert_eq!(body(&again), body(&first));
}

/// What the store's SDK said (an error's type and message, a table's name) never reaches the
/// caller: each store failure is answered from the one error table.
#[tokio::test]
async fn a_store_failure_never_puts_the_sdks_message_in_the_body() {
    use lambda_idempotency::store::DynamoDbStore;
    use lambda_idempotency::testing::interceptor::{
        self, FaultInterceptor, SdkFault, SdkOperation,
    };

    let db = dynamo::start().await;
    for fault in [
        SdkFault::Error {
            status: 400,
            code: "ValidationException",
        },
        SdkFault::Error {
            status: 400,
            code: "AccessDeniedException",
        },
        SdkFault::Error {
            status: 400,
            code: "ResourceNotFoundException",
        },
    ] {
        let faults = FaultInterceptor::new();
        faults.inject_times(SdkOperation::PutItem, fault, 10);
        faults.inject_times(SdkOperation::TransactWriteItems, fault, 10);
        let client = interceptor::client_with(db.endpoint.clone(), &faults);
        let store = DynamoDbStore::new(client, &db.table);
        let http = EventDoor::new(Operation::new(
            Idempotency::new(store),
            OperationScope::new("http-test", "pay").expect("scope"),
            sources::http(),
        ));
        let runs = AtomicUsize::new(0);
        let answer = http
            .handle(request(Some("k-sdk"), json!({"amount": 5})), |r, _| {
                pay(&runs, 201, r)
            })
            .await;
        assert!(faults.fired_total() >= 1, "{fault:?} fired");
        faults.clear();
        let text = match &answer.body {
            Some(Body::Text(text)) => text.clone(),
            other => panic!("a JSON body, got {other:?}"),
        };
        assert!(
            answer.status_code >= 500,
            "{fault:?}: {} {text}",
            answer.status_code
        );
        for internal in ["injected", "Exception", &db.table, "dynamodb"] {
            assert!(!text.contains(internal), "{fault:?}: {internal} in {text}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

/// A completion that cannot be written (every try failed, the lease run out meanwhile): the
/// payment happened, so the caller gets the handler's response, not a 503 asking for a retry
/// that would find the operation in progress.
#[tokio::test]
async fn a_response_whose_completion_failed_still_reaches_its_caller() {
    let db = dynamo::start().await;
    let store = FaultyStore::new(db.store());
    let clock = ManualClock::new(start_time());
    let lease = Duration::from_secs(30);
    let idem = Idempotency::new(store.clone()).with_clock(clock.clone());
    let http = EventDoor::new(
        Operation::new(
            idem,
            OperationScope::new("http-test", "pay").expect("scope"),
            sources::http(),
        )
        .with_lease_policy(LeasePolicy {
            without_deadline: lease,
            max: lease,
            ..LeasePolicy::default()
        }),
    );
    let runs = AtomicUsize::new(0);
    store.inject(Primitive::Settle, Fault::FailBefore(FaultKind::Unavailable));

    let answer = http
        .handle(request(Some("k-30"), json!({"amount": 30})), |r, _| async {
            let paid = pay(&runs, 201, r).await;
            // The handler ran to the end of its lease: no time is left to retry the write.
            clock.advance(lease + Duration::from_secs(1));
            paid
        })
        .await;

    assert_eq!(answer.status_code, 201, "the response the handler produced");
    assert_eq!(body(&answer)["payment"], "pay-1");
    assert_eq!(header(&answer, "idempotent-replayed"), None);
    assert_eq!(store.pending(), 0, "the completion failed");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
