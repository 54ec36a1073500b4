//! Ready key policies for the event sources that deliver at least once.
//!
//! Each chooses a key that names the *operation* (stable across redeliveries) and a fingerprint
//! over the business part of the event (body, detail, image), never over transport fields that
//! change on redelivery (receipt handles, receive counts, timestamps). Each is a [`KeyPolicy`]:
//! override any part with its builder methods.
//!
//! | source | key | fingerprint |
//! |---|---|---|
//! | SQS ([`sqs`]) | `idempotency-key` message attribute, else the body field you name | body |
//! | SQS ([`sqs_message_id`]) | `messageId` (a republish gets a new id: opt in) | body |
//! | SNS ([`sns`]) | `MessageId` | message |
//! | EventBridge ([`eventbridge`], [`eventbridge_detail`]) | `id`, or a `detail` field | detail |
//! | API Gateway HTTP/REST ([`http_api`], [`rest_api`]) | caller + `Idempotency-Key` header | method, path, query, content type, body |
//! | DynamoDB Streams ([`dynamodb_stream`]) | `eventID` | keys and new image |
//! | Kinesis ([`kinesis`]) | shard sequence number (`eventID`) | data |
//! | S3 ([`s3`]) | bucket, key, version, sequencer | the same, with size and ETag |
//!
//! ```
//! use lambda_idempotency::lambda::sources;
//! use aws_lambda_events::event::sqs::SqsMessage;
//!
//! let policy = sources::sqs(Some("/order_id"))?;
//! let mut message = SqsMessage::default();
//! message.body = Some(r#"{"order_id": "o-1", "amount": 10}"#.into());
//! let scope = lambda_idempotency::OperationScope::new("shop", "orders")?;
//! let (key, _) = policy.derive(&scope, &message)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use aws_lambda_events::event::apigw::{ApiGatewayProxyRequest, ApiGatewayV2httpRequest};
use aws_lambda_events::event::dynamodb::EventRecord as DynamoDbRecord;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_lambda_events::event::s3::S3EventRecord;
use aws_lambda_events::event::sns::SnsRecord;
use aws_lambda_events::event::sqs::SqsMessage;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::http_layer::caller::{principal_v1, principal_v2};
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy};

/// The SQS message attribute that carries an explicit idempotency key.
pub const SQS_KEY_ATTRIBUTE: &str = "idempotency-key";
/// The HTTP header that carries the idempotency key (IETF draft).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// A message body as JSON: parsed when it is JSON, else the string itself.
pub(crate) fn body_json(body: Option<&str>) -> Value {
    match body {
        Some(body) => serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned())),
        None => Value::Null,
    }
}

/// SQS: the `idempotency-key` message attribute, else the body field at `body_pointer`.
pub fn sqs(body_pointer: Option<&str>) -> Result<KeyPolicy<SqsMessage>, ConfigError> {
    let pointer = body_pointer.map(JsonPointer::new).transpose()?;
    Ok(KeyPolicy::from_fns(
        move |message: &SqsMessage| {
            let attribute = message
                .message_attributes
                .get(SQS_KEY_ATTRIBUTE)
                .and_then(|attribute| attribute.string_value.clone())
                .map(Value::String);
            attribute.or_else(|| {
                pointer
                    .as_ref()
                    .and_then(|p| p.find(&body_json(message.body.as_deref())).cloned())
            })
        },
        |message: &SqsMessage| Some(body_json(message.body.as_deref())),
    ))
}

/// SQS keyed by `messageId`: right only when producers never republish a message.
pub fn sqs_message_id() -> KeyPolicy<SqsMessage> {
    KeyPolicy::from_fns(
        |message: &SqsMessage| message.message_id.clone(),
        |message: &SqsMessage| Some(body_json(message.body.as_deref())),
    )
}

/// SNS: `MessageId`; fingerprint over the message.
pub fn sns() -> KeyPolicy<SnsRecord> {
    KeyPolicy::from_fns(
        |record: &SnsRecord| Some(record.sns.message_id.clone()),
        |record: &SnsRecord| Some(body_json(Some(&record.sns.message))),
    )
}

/// EventBridge: the event `id`; fingerprint over `detail`.
pub fn eventbridge<T: Serialize + DeserializeOwned + 'static>() -> KeyPolicy<EventBridgeEvent<T>> {
    KeyPolicy::from_fns(
        |event: &EventBridgeEvent<T>| event.id.clone(),
        |event: &EventBridgeEvent<T>| to_json(&event.detail),
    )
}

/// EventBridge: a field of `detail` (a business id that survives re-publishing); fingerprint
/// over `detail`.
pub fn eventbridge_detail<T: Serialize + DeserializeOwned + 'static>(
    detail_pointer: &str,
) -> Result<KeyPolicy<EventBridgeEvent<T>>, ConfigError> {
    let pointer = JsonPointer::new(detail_pointer)?;
    Ok(KeyPolicy::from_fns(
        move |event: &EventBridgeEvent<T>| pointer.find(&to_json(&event.detail)?).cloned(),
        |event: &EventBridgeEvent<T>| to_json(&event.detail),
    ))
}

/// API Gateway HTTP API (v2): the `Idempotency-Key` header, scoped to the caller (the
/// authorizer's principal, when there is one); fingerprint over method, path, query string,
/// content type and body.
pub fn http_api() -> KeyPolicy<ApiGatewayV2httpRequest> {
    KeyPolicy::from_fns(
        |request: &ApiGatewayV2httpRequest| {
            caller_key(principal_v2(&request.request_context), &request.headers)
        },
        |request: &ApiGatewayV2httpRequest| {
            Some(object([
                (
                    "method",
                    request.request_context.http.method.as_str().into(),
                ),
                ("path", request.raw_path.clone().into()),
                ("query", request.raw_query_string.clone().into()),
                ("content_type", content_type(&request.headers)),
                ("body", body_json(request.body.as_deref())),
            ]))
        },
    )
}

/// API Gateway REST API (v1): the `Idempotency-Key` header, scoped to the caller (the
/// authorizer's principal, when there is one); fingerprint over method, path, query string,
/// content type and body.
pub fn rest_api() -> KeyPolicy<ApiGatewayProxyRequest> {
    KeyPolicy::from_fns(
        |request: &ApiGatewayProxyRequest| {
            caller_key(principal_v1(&request.request_context), &request.headers)
        },
        |request: &ApiGatewayProxyRequest| {
            Some(object([
                ("method", request.http_method.as_str().into()),
                ("path", request.path.clone().into()),
                (
                    "query",
                    to_json(&request.multi_value_query_string_parameters)?,
                ),
                ("content_type", content_type(&request.headers)),
                ("body", body_json(request.body.as_deref())),
            ]))
        },
    )
}

/// The key material of a request: its caller (or null) and its `Idempotency-Key` header.
fn caller_key(caller: Option<String>, headers: &http::HeaderMap) -> Option<Value> {
    let key = header(headers)?;
    Some(object([("caller", caller.into()), ("key", key.into())]))
}

fn content_type(headers: &http::HeaderMap) -> Value {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map_or(Value::Null, Value::from)
}

fn header(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// DynamoDB Streams: `eventID`; fingerprint over the keys and the new image.
pub fn dynamodb_stream() -> KeyPolicy<DynamoDbRecord> {
    KeyPolicy::from_fns(
        |record: &DynamoDbRecord| Some(record.event_id.clone()).filter(|id| !id.is_empty()),
        |record: &DynamoDbRecord| {
            Some(object([
                ("keys", to_json(&record.change.keys)?),
                ("new_image", to_json(&record.change.new_image)?),
            ]))
        },
    )
}

/// Kinesis: `eventID` (shard and sequence number); fingerprint over the data.
pub fn kinesis() -> KeyPolicy<KinesisEventRecord> {
    KeyPolicy::from_fns(
        |record: &KinesisEventRecord| {
            record
                .event_id
                .clone()
                .or_else(|| Some(record.kinesis.sequence_number.clone()))
        },
        |record: &KinesisEventRecord| to_json(&record.kinesis.data),
    )
}

/// S3: bucket, key, version and sequencer; fingerprint adds size and ETag.
pub fn s3() -> KeyPolicy<S3EventRecord> {
    KeyPolicy::from_fns(
        |record: &S3EventRecord| {
            let object = &record.s3.object;
            let parts = [
                &record.s3.bucket.name,
                &object.key,
                &object.version_id,
                &object.sequencer,
            ];
            Some(Value::Array(
                parts.into_iter().map(|part| part.clone().into()).collect(),
            ))
        },
        |record: &S3EventRecord| {
            let object = &record.s3.object;
            let names = [
                &record.s3.bucket.name,
                &object.key,
                &object.version_id,
                &object.e_tag,
            ];
            let mut parts: Vec<Value> = names.into_iter().map(|part| part.clone().into()).collect();
            parts.push(object.size.into());
            Some(Value::Array(parts))
        },
    )
}

fn to_json<T: Serialize>(value: &T) -> Option<Value> {
    serde_json::to_value(value).ok()
}

fn object<const N: usize>(fields: [(&str, Value); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
    )
}
