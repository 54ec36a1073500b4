//! The real `aws_sdk_dynamodb::Client` over an in-process DynamoDB: an HTTP client of the
//! SDK's (smithy's `HttpClient`) that hands each request to dynoxide's own implementation of
//! the operation it names (`x-amz-target`), and answers with dynoxide's JSON (its error JSON
//! and status as its server renders them), every request a scheduling point where the checker
//! may fail it before it applies or lose its answer after it applied. Nothing here needs a
//! Tokio runtime: no timeouts, no identity cache, and the SDK's retries sleep by yielding to
//! shuttle's scheduler. Also the table's DynamoDB stream, read as Lambda delivers its records.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::dynamodb::EventRecord;
use aws_sdk_dynamodb::config::http::{HttpRequest, HttpResponse};
use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{
    AsyncSleep, BehaviorVersion, Credentials, IdentityCache, Region, SharedAsyncSleep, Sleep,
    StalledStreamProtectionConfig,
};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use dynoxide::{Database, DynoxideError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use shuttle::rand::{Rng, thread_rng};

/// What the checker may do to one request (a publish, a DynamoDB request), shared by the
/// parts it reaches: off for the final sweep, which must meet no fault.
#[derive(Debug, Default)]
pub(super) struct Lossy {
    /// Whether faults are chosen at all.
    pub(super) on: AtomicBool,
    /// Faults chosen, counted.
    pub(super) fired: AtomicUsize,
}

/// One request's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// It applies and is answered.
    None,
    /// It fails before it applies.
    Before,
    /// It applies, and its answer is lost.
    AnswerLost,
}

impl Lossy {
    /// The checker's choice for the next request: each fault one request in eight.
    pub(super) fn draw(&self) -> Fault {
        if !self.on.load(Ordering::SeqCst) {
            return Fault::None;
        }
        let fault = match thread_rng().gen_range(0..8) {
            0 => Fault::Before,
            1 => Fault::AnswerLost,
            _ => Fault::None,
        };
        if fault != Fault::None {
            self.fired.fetch_add(1, Ordering::SeqCst);
        }
        fault
    }
}

/// Called with each request that applied (its operation and body), before its answer leaves:
/// where a case checks what the request did as it did it.
pub(super) type Applied = Arc<dyn Fn(&str, &Value) + Send + Sync>;

/// The in-process DynamoDB as the SDK's HTTP client (and its one connector).
#[derive(Clone)]
struct InProcess {
    db: Database,
    faults: Arc<Lossy>,
    applied: Applied,
    /// A defect, for the harness's own check: each `UpdateItem` answered as applied, never
    /// applied.
    drops_updates: bool,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess").finish_non_exhaustive()
    }
}

impl HttpClient for InProcess {
    fn http_connector(
        &self,
        _: &HttpConnectorSettings,
        _: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

impl HttpConnector for InProcess {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let this = self.clone();
        HttpConnectorFuture::new(async move {
            shuttle::future::yield_now().await;
            let fault = this.faults.draw();
            if fault == Fault::Before {
                let unavailable = DynoxideError::InternalServerError("the checker's fault".into());
                return Ok(response(500, unavailable.to_json()));
            }
            let target = request.headers().get("x-amz-target").unwrap_or_default();
            let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
            if this.drops_updates && operation == "UpdateItem" {
                return Ok(response(200, "{}".to_owned()));
            }
            let body = request.body().bytes().unwrap_or_default();
            let body = std::str::from_utf8(body).expect("the SDK sends JSON");
            let answer = match dispatch(&this.db, &operation, body) {
                Ok(json) => {
                    let sent: Value = serde_json::from_str(body).expect("the SDK sends JSON");
                    (this.applied)(&operation, &sent);
                    response(200, json)
                }
                Err(err) => response(err.status_code(), err.to_json()),
            };
            shuttle::future::yield_now().await;
            match fault {
                Fault::AnswerLost => Err(ConnectorError::timeout(
                    "the checker lost the answer".into(),
                )),
                _ => Ok(answer),
            }
        })
    }
}

/// dynoxide's own implementation of `operation` (those the outbox's marks send), on the body
/// the SDK serialised; its JSON answer.
fn dispatch(db: &Database, operation: &str, body: &str) -> dynoxide::Result<String> {
    match operation {
        "UpdateItem" => serve(body, |request| db.update_item(request)),
        "BatchGetItem" => serve(body, |request| db.batch_get_item(request)),
        "Query" => serve(body, |request| db.query(request)),
        other => panic!("the SDK sent {other}, which the in-process DynamoDB does not serve"),
    }
}

/// `body` read as the operation's request, served by `run`, its answer as JSON.
fn serve<Request: DeserializeOwned, Answer: Serialize>(
    body: &str,
    run: impl FnOnce(Request) -> dynoxide::Result<Answer>,
) -> dynoxide::Result<String> {
    let request = serde_json::from_str(body)
        .map_err(|err| DynoxideError::SerializationException(err.to_string()))?;
    serde_json::to_string(&run(request)?)
        .map_err(|err| DynoxideError::InternalServerError(err.to_string()))
}

/// An HTTP answer with DynamoDB's content type.
fn response(status: u16, body: String) -> HttpResponse {
    let mut response = HttpResponse::new(
        StatusCode::try_from(status).expect("an HTTP status"),
        body.into(),
    );
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    response
}

/// A sleep that yields to shuttle's scheduler (time is the schedule's, not the wall clock's).
#[derive(Debug)]
struct Yield;

impl AsyncSleep for Yield {
    fn sleep(&self, _: Duration) -> Sleep {
        Sleep::new(shuttle::future::yield_now())
    }
}

/// The real SDK client on `db`, its requests meeting the checker's `faults`, each that
/// applied shown to `applied` (with `drops_updates`, a defect: an `UpdateItem` is answered
/// as applied and never applied): static credentials, us-east-1, the SDK's standard retries
/// (a fresh retry quota of its own), no timeouts.
pub(super) fn client(
    db: Database,
    faults: Arc<Lossy>,
    applied: Applied,
    drops_updates: bool,
) -> aws_sdk_dynamodb::Client {
    let partition = RetryPartition::custom("shuttle")
        .token_bucket(TokenBucket::new(500))
        .build();
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .identity_cache(IdentityCache::no_cache())
        .endpoint_url("http://dynamodb.in-process")
        .http_client(InProcess {
            db,
            faults,
            applied,
            drops_updates,
        })
        .sleep_impl(SharedAsyncSleep::new(Yield))
        .retry_config(RetryConfig::standard())
        .retry_partition(partition)
        .timeout_config(TimeoutConfig::disabled())
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// Every record `table`'s stream holds in `db`, oldest first, as the Lambda event's records.
pub(super) fn stream_records(db: &Database, table: &str) -> Vec<EventRecord> {
    use dynoxide::actions::{describe_stream, get_records, get_shard_iterator, list_streams};
    let listed = db
        .list_streams(list_streams::ListStreamsRequest {
            table_name: Some(table.to_owned()),
            ..Default::default()
        })
        .expect("list the streams");
    let arn = listed
        .streams
        .first()
        .expect("the table's stream")
        .stream_arn
        .clone();
    let described = db
        .describe_stream(describe_stream::DescribeStreamRequest {
            stream_arn: arn.clone(),
            ..Default::default()
        })
        .expect("describe the stream");
    let mut records = Vec::new();
    for shard in described.stream_description.shards {
        let mut iterator = db
            .get_shard_iterator(get_shard_iterator::GetShardIteratorRequest {
                stream_arn: arn.clone(),
                shard_id: shard.shard_id,
                shard_iterator_type: "TRIM_HORIZON".into(),
                ..Default::default()
            })
            .expect("a shard iterator")
            .shard_iterator;
        while let Some(current) = iterator {
            let page = db
                .get_records(get_records::GetRecordsRequest {
                    shard_iterator: current,
                    limit: None,
                })
                .expect("the shard's records");
            if page.records.is_empty() {
                break;
            }
            for record in page.records {
                let mut record = serde_json::to_value(record).expect("a stream record");
                record["eventSourceARN"] = Value::String(arn.clone());
                records.push(serde_json::from_value(record).expect("a Lambda stream record"));
            }
            iterator = page.next_shard_iterator;
        }
    }
    records
}
