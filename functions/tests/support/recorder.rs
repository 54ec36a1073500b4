//! A recording proxy between a function binary and its local DynamoDB endpoint: every request
//! the binary sends is forwarded unchanged and kept, raw, as one JSON line (what it called and
//! with what), so that `scripts/iam-check.sh` can evaluate each against the function's policies
//! in template.yaml. The proxy sees what the binary really sent, whichever code path sent it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value, json};

/// Where the recordings go: one file per test, rewritten by each run.
pub fn recordings_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("iam-requests")
}

/// The file of the recordings named `name`, emptied.
pub fn fresh_file(name: &str) -> PathBuf {
    let dir = recordings_dir();
    std::fs::create_dir_all(&dir).expect("the recordings' directory");
    let path = dir.join(format!("{name}.jsonl"));
    File::create(&path).expect("an empty recording");
    path
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    /// What every line says of the function: its binary, name and table variables.
    function: Arc<Map<String, Value>>,
    file: Arc<Mutex<File>>,
}

/// Starts a proxy to `upstream` that appends each request to `file`, tagged with `function`
/// (its `binary`, `function_name` and `env`); the proxy's endpoint, for `DYNAMODB_ENDPOINT`.
pub async fn start(upstream: &str, file: &Path, function: Map<String, Value>) -> String {
    let proxy = Proxy {
        upstream: upstream.trim_end_matches('/').to_owned(),
        client: Client::builder(TokioExecutor::new()).build_http(),
        function: Arc::new(function),
        file: Arc::new(Mutex::new(
            OpenOptions::new()
                .append(true)
                .open(file)
                .expect("the recording opens"),
        )),
    };
    let app = Router::new().fallback(forward).with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    endpoint
}

/// Records `request`, then forwards it as it came (the signature covers its `Host`, kept).
async fn forward(State(proxy): State<Proxy>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|body| body.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST);
    };
    proxy.record(&parts.headers, &body);
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut upstream = axum::http::Request::builder()
        .method(parts.method)
        .uri(format!("{}{path}", proxy.upstream));
    for (name, value) in &parts.headers {
        upstream = upstream.header(name, value);
    }
    let Ok(upstream) = upstream.body(Full::new(body)) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let Ok(response) = proxy.client.request(upstream).await else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let (parts, body) = response.into_parts();
    match body.collect().await {
        Ok(body) => Response::from_parts(parts, Body::from(body.to_bytes())),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(status: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    response
}

impl Proxy {
    /// Appends one line: the function, the service and operation (`X-Amz-Target`), the body.
    fn record(&self, headers: &axum::http::HeaderMap, body: &[u8]) {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let target = header("x-amz-target");
        let service = match target.as_deref().and_then(|target| target.split_once('.')) {
            Some(("DynamoDB_20120810", _)) => "dynamodb",
            Some(("DynamoDBStreams_20120810", _)) => "dynamodbstreams",
            Some(("AmazonSQS", _)) => "sqs",
            Some(("AWSEvents", _)) => "events",
            _ => "unknown",
        };
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let mut line = (*self.function).clone();
        line.insert("service".into(), json!(service));
        line.insert("target".into(), json!(target));
        line.insert("content_type".into(), json!(header("content-type")));
        line.insert("body".into(), body);
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        let mut file = self.file.lock().expect("one writer at a time");
        file.write_all(text.as_bytes())
            .expect("the recording is written");
    }
}
