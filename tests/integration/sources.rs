//! Event-source key policies: stable across redelivery, sensitive to the business payload.

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::s3::S3EventRecord;
use aws_lambda_events::event::sns::SnsRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{Error, KeyPolicy, OperationScope};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn scope() -> OperationScope {
    OperationScope::new("sources", "op").expect("scope")
}

fn parse<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("sample event parses")
}

/// Two deliveries of one operation agree; a changed payload keeps the key, not the fingerprint;
/// another operation (another id or key field, the same payload) gets another key.
fn assert_stable<E: 'static>(
    policy: &KeyPolicy<E>,
    first: &E,
    redelivered: &E,
    changed: &E,
    other: &E,
) {
    let (key, fingerprint) = policy.derive(&scope(), first).expect("derive");
    assert_eq!(
        policy.derive(&scope(), redelivered).expect("derive"),
        (key.clone(), fingerprint.clone())
    );
    let (changed_key, changed_fingerprint) = policy.derive(&scope(), changed).expect("derive");
    assert_eq!(changed_key, key);
    assert_ne!(changed_fingerprint, fingerprint);
    let (other_key, _) = policy.derive(&scope(), other).expect("derive");
    assert_ne!(other_key, key, "another operation, another key");
}

fn sqs(message_id: &str, receipt: &str, body: &str, attribute: Option<&str>) -> SqsMessage {
    let mut attributes = json!({});
    if let Some(key) = attribute {
        attributes = json!({"idempotency-key": {"stringValue": key, "dataType": "String"}});
    }
    parse(json!({
        "messageId": message_id, "receiptHandle": receipt, "body": body,
        "attributes": {"ApproximateReceiveCount": receipt.len().to_string()},
        "messageAttributes": attributes, "eventSourceARN": "arn:aws:sqs:us-east-1:1:orders"
    }))
}

#[test]
fn sqs_prefers_the_attribute_then_the_named_body_field() {
    let policy = sources::sqs(Some("/order_id")).expect("policy");
    assert_stable(
        &policy,
        &sqs("m-1", "r-1", r#"{"order_id":"o-1","amount":1}"#, None),
        &sqs(
            "m-2-republished",
            "r-22",
            r#"{"amount":1, "order_id":"o-1"}"#,
            None,
        ),
        &sqs("m-3", "r-3", r#"{"order_id":"o-1","amount":2}"#, None),
        &sqs("m-1", "r-1", r#"{"order_id":"o-2","amount":1}"#, None),
    );
    let by_attribute = policy
        .derive(
            &scope(),
            &sqs("m-1", "r", r#"{"order_id":"o-1"}"#, Some("k-9")),
        )
        .expect("derive");
    let by_body = policy
        .derive(&scope(), &sqs("m-1", "r", r#"{"order_id":"o-1"}"#, None))
        .expect("derive");
    assert_ne!(by_attribute.0, by_body.0, "the attribute wins");
    let (other_attribute, _) = policy
        .derive(
            &scope(),
            &sqs("m-1", "r", r#"{"order_id":"o-1"}"#, Some("k-10")),
        )
        .expect("derive");
    assert_ne!(
        other_attribute, by_attribute.0,
        "another attribute, another key"
    );
    let err = policy
        .derive(&scope(), &sqs("m-1", "r", "not json", None))
        .expect_err("no key");
    assert!(matches!(err, Error::MissingKey { .. }));
}

#[test]
fn sqs_message_id_is_opt_in() {
    let policy = sources::sqs_message_id();
    let (a, _) = policy
        .derive(&scope(), &sqs("m-1", "r-1", "{}", None))
        .expect("derive");
    let (b, _) = policy
        .derive(&scope(), &sqs("m-1", "r-2", "{}", None))
        .expect("derive");
    let (c, _) = policy
        .derive(&scope(), &sqs("m-2", "r-1", "{}", None))
        .expect("derive");
    assert_eq!(a, b);
    assert_ne!(a, c, "a republished message is a new key: why it is opt-in");
}

#[test]
fn sns_keys_by_message_id() {
    let record = |id: &str, ts: &str, message: &str| -> SnsRecord {
        parse(
            json!({"EventSource": "aws:sns", "EventVersion": "1.0", "EventSubscriptionArn": "arn", "Sns": {
                "Type": "Notification", "MessageId": id, "TopicArn": "arn:t", "Message": message,
                "Timestamp": ts, "SignatureVersion": "1", "Signature": "sig", "SigningCertUrl": "u", "UnsubscribeUrl": "u",
                "MessageAttributes": {}
            }}),
        )
    };
    assert_stable(
        &sources::sns(),
        &record("n-1", "2026-01-01T00:00:00Z", r#"{"a":1}"#),
        &record("n-1", "2026-01-01T00:05:00Z", r#"{"a":1}"#),
        &record("n-1", "2026-01-01T00:00:00Z", r#"{"a":2}"#),
        &record("n-2", "2026-01-01T00:00:00Z", r#"{"a":1}"#),
    );
}

#[test]
fn eventbridge_keys_by_id_or_detail_field() {
    let event = |id: &str, time: &str, detail: Value| -> EventBridgeEvent<Value> {
        parse(
            json!({"version": "0", "id": id, "detail-type": "OrderPlaced", "source": "shop", "account": "1",
            "time": time, "region": "us-east-1", "resources": [], "detail": detail}),
        )
    };
    assert_stable(
        &sources::eventbridge(),
        &event(
            "e-1",
            "2026-01-01T00:00:00Z",
            json!({"order": "o-1", "n": 1}),
        ),
        &event(
            "e-1",
            "2026-01-01T00:09:00Z",
            json!({"n": 1, "order": "o-1"}),
        ),
        &event(
            "e-1",
            "2026-01-01T00:00:00Z",
            json!({"order": "o-1", "n": 2}),
        ),
        &event(
            "e-2",
            "2026-01-01T00:00:00Z",
            json!({"order": "o-1", "n": 1}),
        ),
    );
    assert_stable(
        &sources::eventbridge_detail::<Value>("/order").expect("policy"),
        &event(
            "e-1",
            "2026-01-01T00:00:00Z",
            json!({"order": "o-1", "n": 1}),
        ),
        &event(
            "e-2-republished",
            "2026-01-01T00:09:00Z",
            json!({"order": "o-1", "n": 1}),
        ),
        &event(
            "e-3",
            "2026-01-01T00:00:00Z",
            json!({"order": "o-1", "n": 2}),
        ),
        &event(
            "e-1",
            "2026-01-01T00:00:00Z",
            json!({"order": "o-2", "n": 1}),
        ),
    );
}

/// An outbox event's EventBridge consumer (the effects guide's recipe): keyed by the event id
/// in the relay's envelope and fingerprinted by the envelope alone, so that the same event
/// published again (a new EventBridge `id` and `time`) is a replay, never a conflict.
#[test]
fn an_outbox_events_eventbridge_consumer_replays_a_republished_event() {
    let delivered = |id: &str, time: &str, payload: &str| -> EventBridgeEvent<Value> {
        parse(
            json!({"version": "0", "id": id, "detail-type": "OrderPlaced", "source": "shop.orders",
            "account": "1", "time": time, "region": "us-east-1", "resources": [],
            "detail": {"event_id": "evt-7f3a", "event": "order-placed", "payload": payload}}),
        )
    };
    assert_stable(
        &sources::eventbridge_detail::<Value>("/event_id").expect("policy"),
        &delivered("e-1", "2026-01-01T00:00:00Z", "{\"order\":\"o-1\"}"),
        &delivered(
            "e-9-republished",
            "2026-01-02T08:00:00Z",
            "{\"order\":\"o-1\"}",
        ),
        &delivered("e-1", "2026-01-01T00:00:00Z", "{\"order\":\"o-2\"}"),
        &parse(
            json!({"version": "0", "id": "e-1", "detail-type": "OrderPlaced", "source": "shop.orders",
            "account": "1", "time": "2026-01-01T00:00:00Z", "region": "us-east-1", "resources": [],
            "detail": {"event_id": "evt-other", "event": "order-placed", "payload": "{\"order\":\"o-1\"}"}}),
        ),
    );
}

/// An HTTP API event as `lambda_http` reads it (with a JWT caller).
fn http_request(key: Option<&str>, request_id: &str, body: &str) -> lambda_http::Request {
    let mut headers = json!({"content-type": "application/json", "x-amzn-trace-id": request_id});
    if let Some(key) = key {
        headers["idempotency-key"] = json!(key);
    }
    let event = json!({"version": "2.0", "routeKey": "POST /payments", "rawPath": "/payments", "rawQueryString": "",
        "headers": headers, "requestContext": {"accountId": "1", "apiId": "a", "domainName": "d", "domainPrefix": "d",
        "http": {"method": "POST", "path": "/payments", "protocol": "HTTP/1.1", "sourceIp": "1.2.3.4", "userAgent": "t"},
        "requestId": request_id, "routeKey": "POST /payments", "stage": "$default", "time": "t", "timeEpoch": 0,
        "authorizer": {"jwt": {"claims": {"sub": "customer-1"}, "scopes": null}}},
        "body": body, "isBase64Encoded": false});
    lambda_http::request::from_str(&event.to_string()).expect("an HTTP API event")
}

#[test]
fn http_keys_by_the_caller_and_the_idempotency_key_header() {
    assert_stable(
        &sources::http(),
        &http_request(Some("k-1"), "req-1", r#"{"amount":5}"#),
        &http_request(Some("k-1"), "req-2", r#"{"amount":5}"#),
        &http_request(Some("k-1"), "req-3", r#"{"amount":6}"#),
        &http_request(Some("k-2"), "req-1", r#"{"amount":5}"#),
    );
    let err = sources::http()
        .derive(&scope(), &http_request(None, "r", "{}"))
        .expect_err("no header");
    assert!(matches!(err, Error::MissingKey { .. }));
}

#[test]
fn dynamodb_stream_keys_by_event_id() {
    let record = |id: &str, when: f64, name: &str| -> EventRecord {
        parse(
            json!({"eventID": id, "eventName": "INSERT", "eventVersion": "1.1", "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1", "dynamodb": {"ApproximateCreationDateTime": when, "Keys": {"id": {"S": "u-1"}},
            "NewImage": {"id": {"S": "u-1"}, "name": {"S": name}}, "SequenceNumber": "111", "SizeBytes": 26,
            "StreamViewType": "NEW_IMAGE"}, "eventSourceARN": "arn"}),
        )
    };
    assert_stable(
        &sources::dynamodb_stream(),
        &record("ev-1", 1.0, "Ann"),
        &record("ev-1", 9.0, "Ann"),
        &record("ev-1", 1.0, "Bob"),
        &record("ev-2", 1.0, "Ann"),
    );
}

#[test]
fn kinesis_keys_by_event_id() {
    let record = |id: &str, arrival: f64, data: &str| -> KinesisEventRecord {
        parse(
            json!({"kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "p", "sequenceNumber": "4959",
            "data": data, "approximateArrivalTimestamp": arrival}, "eventSource": "aws:kinesis", "eventVersion": "1.0",
            "eventID": id, "eventName": "aws:kinesis:record", "invokeIdentityArn": "arn", "awsRegion": "us-east-1",
            "eventSourceARN": "arn"}),
        )
    };
    assert_stable(
        &sources::kinesis(),
        &record("shard-0:4959", 1.0, "aGVsbG8="),
        &record("shard-0:4959", 5.0, "aGVsbG8="),
        &record("shard-0:4959", 1.0, "Ynll"),
        &record("shard-0:4960", 1.0, "aGVsbG8="),
    );
}

#[test]
fn s3_keys_by_object_version_and_sequencer() {
    let record = |time: &str, size: i64, sequencer: &str| -> S3EventRecord {
        parse(
            json!({"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1", "eventTime": time,
            "eventName": "ObjectCreated:Put", "userIdentity": {"principalId": "p"}, "requestParameters": {"sourceIPAddress": "1.2.3.4"},
            "responseElements": {}, "s3": {"s3SchemaVersion": "1.0", "configurationId": "c", "bucket": {"name": "b", "arn": "arn"},
            "object": {"key": "k.csv", "size": size, "eTag": "e", "versionId": "v1", "sequencer": sequencer}}}),
        )
    };
    assert_stable(
        &sources::s3(),
        &record("2026-01-01T00:00:00Z", 10, "0A1"),
        &record("2026-01-02T00:00:00Z", 10, "0A1"),
        &record("2026-01-01T00:00:00Z", 11, "0A1"),
        // The same object written again: a later sequencer.
        &record("2026-01-01T00:00:00Z", 10, "0A2"),
    );
}
