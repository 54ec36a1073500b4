//! Whose key: the callers the HTTP door reads from each event kind, on the embedded DynamoDB
//! server. A Function URL with IAM auth (its event is an HTTP API's, payload 2.0), and a REST
//! API's IAM caller and API key id: the same `Idempotency-Key` from two callers is two
//! operations, and a caller's retry is a replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lambda_http::{Body, Request};
use lambda_idempotency::lambda::http::REPLAYED_HEADER;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{BoxError, Idempotency, Operation, OperationScope};
use lambda_runtime::tower::{Layer, Service, ServiceExt, service_fn};
use serde_json::{Value, json};

/// A Function URL request with `AWS_IAM` auth, signed by `caller` (an IAM user's ARN).
fn function_url(key: &str, caller: &str) -> Value {
    json!({
        "version": "2.0", "routeKey": "$default", "rawPath": "/payments", "rawQueryString": "",
        "headers": {"idempotency-key": key, "content-type": "application/json", "host": "abc.lambda-url.eu-west-1.on.aws"},
        "requestContext": {
            "accountId": "123456789012", "apiId": "abc", "domainName": "abc.lambda-url.eu-west-1.on.aws",
            "domainPrefix": "abc", "requestId": "r", "routeKey": "$default", "stage": "$default",
            "time": "03/Dec/2026:18:00:00 +0000", "timeEpoch": 1_796_320_800_000_u64,
            "http": {"method": "POST", "path": "/payments", "protocol": "HTTP/1.1", "sourceIp": "192.0.2.1", "userAgent": "test"},
            "authorizer": {"iam": {"accessKey": "AKIA", "accountId": "123456789012", "callerId": "AIDA", "userArn": caller, "userId": "AIDA"}}
        },
        "body": "{\"amount\":5}", "isBase64Encoded": false
    })
}

/// A REST API request whose `identity` names the caller as API Gateway does for IAM auth
/// (`userArn`) or an API key (`apiKeyId`).
fn rest(key: &str, identity: Value) -> Value {
    let mut context_identity = json!({"sourceIp": "192.0.2.1", "userAgent": "test"});
    if let (Some(target), Some(fields)) = (context_identity.as_object_mut(), identity.as_object()) {
        target.extend(fields.clone());
    }
    json!({
        "resource": "/payments", "path": "/payments", "httpMethod": "POST",
        "headers": {"Idempotency-Key": key, "Content-Type": "application/json"},
        "multiValueHeaders": {"Idempotency-Key": [key], "Content-Type": ["application/json"]},
        "queryStringParameters": null, "multiValueQueryStringParameters": null,
        "pathParameters": null, "stageVariables": null,
        "requestContext": {
            "accountId": "1", "resourceId": "r", "stage": "prod", "requestId": "id",
            "identity": context_identity, "resourcePath": "/payments", "httpMethod": "POST",
            "apiId": "a", "path": "/payments"
        },
        "body": "{\"amount\":5}", "isBase64Encoded": false
    })
}

/// Sends each event in turn; what each answered (its body and whether it was a replay) and
/// how often the handler ran.
async fn answers(events: Vec<Value>) -> (Vec<(String, bool)>, usize) {
    let db = dynamo::start().await;
    let operation = Operation::new(
        Idempotency::new(db.store()),
        OperationScope::new("http-principals", "pay").expect("scope"),
        sources::http(),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = service_fn(move |_: Request| {
        let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, BoxError>(
                http::Response::builder()
                    .status(201)
                    .body(Body::Text(format!("payment {run}")))
                    .expect("response"),
            )
        }
    });
    let mut service = operation.http_layer().layer(app);
    let mut answered = Vec::new();
    for event in events {
        let request = lambda_http::request::from_str(&event.to_string()).expect("an HTTP event");
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("answered");
        assert_eq!(response.status(), 201, "{event}");
        let replayed = response.headers().contains_key(REPLAYED_HEADER);
        let body = String::from_utf8(response.body().to_vec()).expect("text");
        answered.push((body, replayed));
    }
    (answered, runs.load(Ordering::SeqCst))
}

fn expect_two_callers(answered: &[(String, bool)], runs: usize) {
    assert_eq!(runs, 2, "{answered:?}");
    assert_eq!(answered[0], ("payment 1".to_owned(), false));
    assert_eq!(
        answered[1],
        ("payment 1".to_owned(), true),
        "the caller's retry replays"
    );
    assert_eq!(
        answered[2],
        ("payment 2".to_owned(), false),
        "another caller with the same key is another operation"
    );
}

#[tokio::test]
async fn a_function_url_keys_by_its_iam_caller() {
    let alice = "arn:aws:iam::123456789012:user/alice";
    let bob = "arn:aws:iam::123456789012:user/bob";
    let (answered, runs) = answers(vec![
        function_url("k-1", alice),
        function_url("k-1", alice),
        function_url("k-1", bob),
    ])
    .await;
    expect_two_callers(&answered, runs);
}

#[tokio::test]
async fn a_rest_api_keys_by_its_iam_caller_and_by_its_api_key() {
    let iam = |arn: &str| json!({"userArn": arn});
    let (answered, runs) = answers(vec![
        rest("k-1", iam("arn:aws:iam::1:user/alice")),
        rest("k-1", iam("arn:aws:iam::1:user/alice")),
        rest("k-1", iam("arn:aws:iam::1:user/bob")),
    ])
    .await;
    expect_two_callers(&answered, runs);

    let key = |id: &str| json!({"apiKeyId": id});
    let (answered, runs) = answers(vec![
        rest("k-1", key("key-a")),
        rest("k-1", key("key-a")),
        rest("k-1", key("key-b")),
    ])
    .await;
    expect_two_callers(&answered, runs);
}
