//! A minimal Lambda Runtime API on 127.0.0.1, for running a function binary end to end:
//! `GET /2018-06-01/runtime/invocation/next`, `POST .../{id}/response` and `.../{id}/error`,
//! with the headers Lambda sends (the tenant's, `Lambda-Runtime-Aws-Tenant-Id`, for an
//! invocation of a function in tenant isolation mode).
//! Shared by the end-to-end tests and the cold-start benchmark.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::sync::{Mutex, mpsc, oneshot, watch};

/// The function's answer to one invocation.
pub type Answer = Result<Value, Value>;

/// One queued invocation: its request id, its tenant (if any) and its event.
type Queued = (String, Option<String>, Value);

#[derive(Clone)]
struct Shared {
    events: Arc<Mutex<mpsc::UnboundedReceiver<Queued>>>,
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Answer>>>>,
    first_poll: Arc<watch::Sender<Option<Instant>>>,
}

/// A running Runtime API.
pub struct RuntimeApi {
    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub address: String,
    queue: mpsc::UnboundedSender<Queued>,
    waiting: Arc<Mutex<HashMap<String, oneshot::Sender<Answer>>>>,
    next_id: AtomicU64,
    first_poll: watch::Receiver<Option<Instant>>,
}

impl RuntimeApi {
    /// Serves the API on a free loopback port for as long as the runtime runs.
    pub async fn start() -> Self {
        let (queue, events) = mpsc::unbounded_channel();
        let (first_poll, polled) = watch::channel(None);
        let shared = Shared {
            events: Arc::new(Mutex::new(events)),
            waiting: Arc::default(),
            first_poll: Arc::new(first_poll),
        };
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/{outcome}",
                post(answer),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            address,
            queue,
            waiting: shared.waiting,
            next_id: AtomicU64::new(0),
            first_poll: polled,
        }
    }

    /// When the function first asked for an invocation (`GET .../next`): it is ready.
    pub async fn ready(&self) -> Instant {
        let mut polled = self.first_poll.clone();
        let first = polled
            .wait_for(Option::is_some)
            .await
            .expect("runtime API running");
        first.expect("a first poll")
    }

    /// Invokes the function with `event` and waits for its answer.
    pub async fn invoke(&self, event: Value) -> Answer {
        self.invoke_in(None, event).await
    }

    /// Invokes the function with `event` for `tenant`, as Lambda invokes a function in tenant
    /// isolation mode, and waits for its answer.
    pub async fn invoke_as_tenant(&self, tenant: &str, event: Value) -> Answer {
        self.invoke_in(Some(tenant.to_owned()), event).await
    }

    async fn invoke_in(&self, tenant: Option<String>, event: Value) -> Answer {
        let id = format!("req-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let (answer_tx, answer_rx) = oneshot::channel();
        self.waiting.lock().await.insert(id.clone(), answer_tx);
        self.queue
            .send((id, tenant, event))
            .expect("runtime API running");
        tokio::time::timeout(Duration::from_secs(120), answer_rx)
            .await
            .expect("the function answered in time")
            .expect("answer delivered")
    }
}

async fn next(State(shared): State<Shared>) -> (HeaderMap, axum::Json<Value>) {
    shared.first_poll.send_if_modified(|first| {
        let unset = first.is_none();
        if unset {
            *first = Some(Instant::now());
        }
        unset
    });
    let (id, tenant, event) = shared
        .events
        .lock()
        .await
        .recv()
        .await
        .expect("events queued");
    let deadline = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after epoch")
        + Duration::from_secs(30);
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        headers.insert(name, HeaderValue::from_str(&value).expect("header value"));
    };
    set("lambda-runtime-aws-request-id", id);
    if let Some(tenant) = tenant {
        set("lambda-runtime-aws-tenant-id", tenant);
    }
    set(
        "lambda-runtime-deadline-ms",
        deadline.as_millis().to_string(),
    );
    set(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:us-east-1:000000000000:function:e2e".into(),
    );
    set(
        "lambda-runtime-trace-id",
        "Root=1-00000000-000000000000000000000000".into(),
    );
    (headers, axum::Json(event))
}

/// `POST .../{id}/response` or `.../{id}/error`: hands the function's answer to its caller.
async fn answer(
    State(shared): State<Shared>,
    Path((id, outcome)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> StatusCode {
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answer = match outcome.as_str() {
        "response" => Ok(body),
        "error" => Err(body),
        _ => return StatusCode::NOT_FOUND,
    };
    match shared.waiting.lock().await.remove(&id) {
        Some(waiter) => {
            let _ = waiter.send(answer);
            StatusCode::ACCEPTED
        }
        None => StatusCode::NOT_FOUND,
    }
}
