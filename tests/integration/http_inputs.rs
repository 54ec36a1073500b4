//! Both HTTP doors (the tower layer over `lambda_http` and the API Gateway v2 event door) under
//! what production gives them, on both stores: a conservative classifier, blank or null
//! principals, damaged stored records.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::event_door::EventDoor;
use aws_lambda_events::encodings::Body as EventBody;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use futures_util::FutureExt;
use http::{Response, StatusCode};
use lambda_http::{Body, Request};
use lambda_idempotency::HttpKeys;
use lambda_idempotency::Operation;
use lambda_idempotency::failure::{Classifier, FailureClass};
use lambda_idempotency::lambda::http::{CallerScope, REPLAYED_HEADER};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::reconcile::{Checked, Takeover};
use lambda_idempotency::store::AnyStore;
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Idempotency, OperationScope};
use lambda_runtime::tower::{Layer, ServiceExt, service_fn};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use super::backends::{Backend, both};

/// A classifier that retains every handler error as a terminal failure.
struct RetainEverything;

impl Classifier for RetainEverything {
    fn classify(&self, _: &(dyn std::error::Error + 'static)) -> FailureClass {
        FailureClass::terminal("conservative")
    }
}

pub(crate) fn scope() -> OperationScope {
    OperationScope::new("http-inputs", "payments").expect("scope")
}

pub(crate) fn engine(backend: Backend) -> Idempotency {
    Idempotency::new(backend.store).with_clock(backend.clock)
}

/// A REST API (v1) request whose authorizer context is `authorizer`.
fn v1(key: &str, authorizer: Value) -> Request {
    lambda_http::request::from_str(
        &json!({
            "resource": "/payments", "path": "/payments", "httpMethod": "POST",
            "headers": {"Idempotency-Key": key, "Content-Type": "application/json"},
            "multiValueHeaders": {"Idempotency-Key": [key], "Content-Type": ["application/json"]},
            "queryStringParameters": null, "multiValueQueryStringParameters": null,
            "pathParameters": null, "stageVariables": null,
            "requestContext": {
                "accountId": "1", "resourceId": "r", "stage": "$default", "requestId": "id",
                "identity": {"sourceIp": "192.0.2.1", "userAgent": "test"},
                "resourcePath": "/payments", "httpMethod": "POST", "apiId": "a",
                "path": "/payments", "authorizer": authorizer
            },
            "body": r#"{"amount":1}"#, "isBase64Encoded": false
        })
        .to_string(),
    )
    .expect("a REST API event")
}

/// An HTTP API (v2) event whose authorizer is `authorizer` (none when null).
fn v2_json(key: &str, authorizer: Value) -> Value {
    let mut context = json!({
        "accountId": "1", "apiId": "a", "domainName": "x.example", "domainPrefix": "x",
        "http": {"method": "POST", "path": "/payments", "protocol": "HTTP/1.1",
            "sourceIp": "192.0.2.1", "userAgent": "test"},
        "requestId": "r", "routeKey": "POST /payments", "stage": "$default",
        "time": "12/Mar/2020:19:03:58 +0000", "timeEpoch": 1_583_348_638_390_i64
    });
    if !authorizer.is_null() {
        context["authorizer"] = authorizer;
    }
    json!({
        "version": "2.0", "routeKey": "POST /payments", "rawPath": "/payments",
        "rawQueryString": "", "requestContext": context, "isBase64Encoded": false,
        "headers": {"content-type": "application/json", "idempotency-key": key},
        "body": r#"{"amount":1}"#
    })
}

pub(crate) fn v2_request(key: &str, authorizer: Value) -> Request {
    lambda_http::request::from_str(&v2_json(key, authorizer).to_string())
        .expect("an HTTP API event")
}

fn v2_event(key: &str, authorizer: Value) -> LambdaEvent<ApiGatewayV2httpRequest> {
    let request = serde_json::from_value(v2_json(key, authorizer)).expect("an HTTP API event");
    LambdaEvent::new(request, Context::default())
}

fn jwt(sub: &str) -> Value {
    json!({"jwt": {"claims": {"sub": sub, "iss": "https://issuer.example"}, "scopes": null}})
}

/// The tower layer's service over a handler answering `statuses` in turn (then 201), counting
/// its runs.
fn layered(
    idem: Idempotency,
    callers: CallerScope,
    statuses: &'static [u16],
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
        let run = counted.fetch_add(1, Ordering::SeqCst);
        let status = statuses.get(run).copied().unwrap_or(201);
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(Body::Text(format!("answer {run}")))
                    .expect("response"),
            )
        }
    });
    let layer = Operation::new(
        idem,
        scope(),
        HttpKeys::new().with_callers(callers).policy(),
    )
    .http_layer();
    (layer.layer(handler), runs)
}

pub(crate) fn code(response: &Response<Body>) -> String {
    let body: Value = serde_json::from_slice(response.body().as_ref()).unwrap_or_default();
    body["error"].as_str().unwrap_or_default().to_owned()
}

fn event_code(response: &ApiGatewayV2httpResponse) -> String {
    let text = match &response.body {
        Some(EventBody::Text(text)) => text.clone(),
        _ => String::new(),
    };
    let body: Value = serde_json::from_str(&text).unwrap_or_default();
    body["error"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_response_the_doors_do_not_store_is_never_retained_whatever_the_classifier_says() {
    for backend in both().await {
        let name = backend.name;
        let idem = engine(backend).with_classifier(RetainEverything);

        let (service, runs) = layered(idem.clone(), CallerScope::Shared, &[503, 429]);
        for expected in [503, 429, 201] {
            let answer = service
                .clone()
                .oneshot(v2_request("k-1", Value::Null))
                .await;
            assert_eq!(
                answer.expect("answer").status().as_u16(),
                expected,
                "{name}: layer"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3, "{name}: every retry ran");

        let door = EventDoor::new(Operation::new(
            idem,
            scope(),
            HttpKeys::new().with_callers(CallerScope::Shared).policy(),
        ));
        let calls = AtomicUsize::new(0);
        for expected in [503, 201] {
            let answer = door
                .handle(v2_event("k-2", Value::Null), |_, _| async {
                    let mut response = ApiGatewayV2httpResponse::default();
                    response.status_code = if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        503
                    } else {
                        201
                    };
                    Ok::<_, std::io::Error>(response)
                })
                .await;
            assert_eq!(answer.status_code, expected, "{name}: event door");
        }
    }
}

#[tokio::test]
async fn a_blank_or_null_principal_is_no_caller_on_either_door() {
    let nobody = [
        ("v1 principalId \"\"", v1("k-1", json!({"principalId": ""}))),
        (
            "v1 principalId null",
            v1("k-1", json!({"principalId": null})),
        ),
        (
            "v1 principalId blank",
            v1("k-1", json!({"principalId": "   "})),
        ),
        (
            "v1 claims sub \"\"",
            v1("k-1", json!({"claims": {"sub": ""}})),
        ),
        ("v2 jwt sub \"\"", v2_request("k-1", jwt(""))),
        (
            "v2 lambda principalId null",
            v2_request("k-1", json!({"lambda": {"principalId": null}})),
        ),
    ];
    for backend in both().await {
        let name = backend.name;
        let idem = engine(backend);
        let (strict, runs) = layered(idem.clone(), CallerScope::Principal, &[]);
        for (case, request) in nobody.iter().map(|(case, request)| (case, clone(request))) {
            let answer = strict.clone().oneshot(request).await.expect("answer");
            assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "{name}: {case}");
            assert_eq!(code(&answer), "caller_unidentified", "{name}: {case}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}");

        // Allowed anonymous callers: a blank principal is the anonymous scope, not a caller
        // named "" of its own.
        let (public, runs) = layered(idem.clone(), CallerScope::PrincipalOrAnonymous, &[]);
        let first = public
            .clone()
            .oneshot(v1("k-2", json!({"principalId": ""})))
            .await;
        let again = public
            .clone()
            .oneshot(v1("k-2", json!({})))
            .await
            .expect("answer");
        assert_eq!(
            first.expect("answer").status(),
            StatusCode::CREATED,
            "{name}"
        );
        assert!(
            again.headers().contains_key(REPLAYED_HEADER),
            "{name}: one anonymous scope"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");

        let door = EventDoor::new(Operation::new(idem, scope(), sources::http()));
        for (case, authorizer) in [
            ("jwt sub \"\"", jwt("")),
            (
                "lambda principalId null",
                json!({"lambda": {"principalId": null}}),
            ),
            (
                "lambda principalId \"\"",
                json!({"lambda": {"principalId": ""}}),
            ),
        ] {
            let answer = door
                .handle(v2_event("k-3", authorizer), |_, _| async {
                    Ok::<_, std::io::Error>(ApiGatewayV2httpResponse::default())
                })
                .await;
            assert_eq!(answer.status_code, 401, "{name}: event door, {case}");
        }
    }
}

/// A request's copy (lambda_http requests are not `Clone`).
fn clone(request: &Request) -> Request {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    if let Some(context) = request
        .extensions()
        .get::<lambda_http::request::RequestContext>()
    {
        copy.extensions_mut().insert(context.clone());
    }
    copy
}

#[tokio::test]
async fn a_corrupt_record_is_an_operators_500_not_a_retry_every_second() {
    for backend in both().await {
        let name = backend.name;
        let store = FaultyStore::new(backend.store);
        let idem = Idempotency::new(AnyStore::new(store.clone())).with_clock(backend.clock);

        let (service, runs) = layered(idem.clone(), CallerScope::Shared, &[]);
        store.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Corrupt));
        let answer = service
            .oneshot(v2_request("k-1", Value::Null))
            .await
            .expect("answer");
        assert_eq!(
            answer.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{name}: layer"
        );
        assert_eq!(code(&answer), "stored_record_corrupt", "{name}");
        assert!(
            answer.headers().get(http::header::RETRY_AFTER).is_none(),
            "{name}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}");

        let door = EventDoor::new(Operation::new(
            idem,
            scope(),
            HttpKeys::new().with_callers(CallerScope::Shared).policy(),
        ));
        store.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Corrupt));
        let answer = door
            .handle(v2_event("k-2", Value::Null), |_, _| async {
                Ok::<_, std::io::Error>(ApiGatewayV2httpResponse::default())
            })
            .await;
        assert_eq!(answer.status_code, 500, "{name}: event door");
        assert_eq!(event_code(&answer), "stored_record_corrupt", "{name}");
        assert!(
            !answer.headers.contains_key(http::header::RETRY_AFTER),
            "{name}"
        );
        assert_eq!(store.pending(), 0, "{name}: both faults fired");
    }
}

#[tokio::test]
async fn a_damaged_stored_response_is_a_500_never_an_empty_success() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        // What an operator or a reconciler might record: a response whose body is not base64.
        let damaged = json!({"status": 201, "headers": [], "body": "%%% not base64 %%%"});
        let idem = engine(backend).with_reconciler(move |_: Takeover| {
            let damaged = damaged.clone();
            async move { Ok::<_, BoxError>(Checked::Applied(damaged)) }
        });
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let handler = service_fn(move |_: Request| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                panic!("the handler dies mid-request");
                #[allow(unreachable_code)]
                Ok::<Response<Body>, Infallible>(Response::new(Body::Empty))
            }
        });
        let service = Operation::new(
            idem,
            scope(),
            HttpKeys::new().with_callers(CallerScope::Shared).policy(),
        )
        .http_layer()
        .layer(handler);

        let crashed = AssertUnwindSafe(service.clone().oneshot(v2_request("k-1", Value::Null)))
            .catch_unwind()
            .await;
        assert!(crashed.is_err(), "{name}: the first request panicked");
        clock.advance(Duration::from_secs(6)); // past the given-back claim's grace
        for attempt in ["the takeover", "the replay"] {
            let answer = service
                .clone()
                .oneshot(v2_request("k-1", Value::Null))
                .await;
            let answer = answer.expect("answer");
            assert_eq!(
                answer.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{name}: {attempt}"
            );
            assert_eq!(
                code(&answer),
                "stored_response_unreadable",
                "{name}: {attempt}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

/// Two `Idempotency-Key` field lines (a proxy adding its own, a client sending two) are no one
/// key: refused with 400 whichever door reads them, the handler not run.
#[tokio::test]
async fn two_idempotency_keys_are_refused_not_one_picked() {
    for backend in both().await {
        let name = backend.name;
        let (service, runs) = layered(engine(backend), CallerScope::Shared, &[]);
        let mut request = v2_request("k-1", Value::Null);
        request
            .headers_mut()
            .append("idempotency-key", http::HeaderValue::from_static("k-2"));
        let answer = service.oneshot(request).await.expect("answer");
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{name}");
        assert_eq!(code(&answer), "invalid_request", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not run");
    }
}

/// A reconciler that finds the payment records the response in the door's stored form
/// (`stored_response`): the takeover and every retry are answered with it, byte for byte, and
/// marked a replay (no run of theirs made it).
#[tokio::test]
async fn a_reconciled_response_in_the_stored_form_is_replayed() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        let found = lambda_idempotency::lambda::http::stored_response(
            StatusCode::CREATED,
            &headers,
            br#"{"payment":"p-found"}"#,
        );
        let idem = engine(backend).with_reconciler(move |_: Takeover| {
            let found = found.clone();
            async move { Ok::<_, BoxError>(Checked::Applied(found)) }
        });
        let handler = service_fn(move |_: Request| async move {
            panic!("the handler dies mid-request");
            #[allow(unreachable_code)]
            Ok::<Response<Body>, Infallible>(Response::new(Body::Empty))
        });
        let service = Operation::new(
            idem,
            scope(),
            HttpKeys::new().with_callers(CallerScope::Shared).policy(),
        )
        .http_layer()
        .layer(handler);

        let crashed = AssertUnwindSafe(service.clone().oneshot(v2_request("k-1", Value::Null)))
            .catch_unwind()
            .await;
        assert!(crashed.is_err(), "{name}: the first request panicked");
        clock.advance(Duration::from_secs(6)); // past the given-back claim's grace
        for attempt in ["the takeover", "the replay"] {
            let answer = service
                .clone()
                .oneshot(v2_request("k-1", Value::Null))
                .await
                .expect("answer");
            assert_eq!(answer.status(), StatusCode::CREATED, "{name}: {attempt}");
            assert_eq!(
                answer.headers()[http::header::CONTENT_TYPE],
                "application/json",
                "{name}: {attempt}"
            );
            assert_eq!(
                answer.body().as_ref(),
                br#"{"payment":"p-found"}"#,
                "{name}: {attempt}"
            );
            assert_eq!(
                answer.headers()["idempotent-replayed"],
                "true",
                "{name}: {attempt}: the response is not this request's run"
            );
        }
    }
}

/// An HTTP API (and a Function URL) joins two `Idempotency-Key` field lines with a comma: a
/// bare key holding one is refused as two keys are; a quoted key may hold one.
#[tokio::test]
async fn two_keys_an_http_api_joined_are_refused_and_a_quoted_comma_is_one_key() {
    for backend in both().await {
        let name = backend.name;
        let (service, runs) = layered(engine(backend), CallerScope::Shared, &[]);
        let joined = service
            .clone()
            .oneshot(v2_request("k-1,k-2", Value::Null))
            .await
            .expect("answer");
        assert_eq!(joined.status(), StatusCode::BAD_REQUEST, "{name}");
        assert_eq!(code(&joined), "invalid_request", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not run");

        for attempt in ["first", "retry"] {
            let quoted = service
                .clone()
                .oneshot(v2_request(r#""k-1,k-2""#, Value::Null))
                .await
                .expect("answer");
            assert_eq!(quoted.status(), StatusCode::CREATED, "{name}: {attempt}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: one run");
    }
}

/// An HTTP API request carrying a `multipart/form-data` body under `boundary` (base64, as the
/// API delivers a binary body), its file holding `file`.
fn multipart_upload(key: &str, boundary: &str, file: &str) -> Request {
    use base64::Engine as _;
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nQ3 report\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"q3.csv\"\r\nContent-Type: text/csv\r\n\r\n{file}\r\n--{boundary}--\r\n"
    );
    let mut event = v2_json(key, jwt("alice"));
    event["headers"]["content-type"] = json!(format!("multipart/form-data; boundary={boundary}"));
    event["body"] = json!(base64::engine::general_purpose::STANDARD.encode(form));
    event["isBase64Encoded"] = json!(true);
    lambda_http::request::from_str(&event.to_string()).expect("an HTTP API event")
}

/// A client that sends a form again (a retry after a timeout) builds it anew under another
/// boundary: the same form is a replay, never a changed payload; another file under the key is.
#[tokio::test]
async fn a_form_sent_again_under_another_boundary_is_a_replay() {
    for backend in both().await {
        let name = backend.name;
        let (service, runs) = layered(engine(backend), CallerScope::Principal, &[]);

        let first = service
            .clone()
            .oneshot(multipart_upload(
                "u-1",
                "----WebKitFormBoundary7MA4YWxk",
                "1,2",
            ))
            .await
            .expect("answer");
        let again = service
            .clone()
            .oneshot(multipart_upload("u-1", "a1b2c3d4e5f60718293a4b5c", "1,2"))
            .await
            .expect("answer");
        let changed = service
            .clone()
            .oneshot(multipart_upload(
                "u-1",
                "----9051914041544843365972754266",
                "1,3",
            ))
            .await
            .expect("answer");

        assert_eq!(first.status(), StatusCode::CREATED, "{name}");
        assert_eq!(
            again.status(),
            StatusCode::CREATED,
            "{name}: {}",
            code(&again)
        );
        assert!(again.headers().contains_key(REPLAYED_HEADER), "{name}");
        assert_eq!(changed.status(), StatusCode::UNPROCESSABLE_ENTITY, "{name}");
        assert_eq!(code(&changed), "idempotency_key_reused", "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}
