//! API Gateway HTTP API events driven through the one HTTP service: each event is read by
//! `lambda_http` as Lambda delivers it, answered by the HTTP layer, and the response turned
//! back into the event's response. The contract tests send events; the layer decides.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use aws_lambda_events::encodings::Body as EventBody;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use http_body_util::BodyExt;
use lambda_http::{Body, Request, RequestExt};
use lambda_idempotency::lambda::http::HttpIdempotencyLayer;
use lambda_idempotency::{BoxError, ExecutionContext, Operation};
use lambda_runtime::LambdaEvent;
use lambda_runtime::tower::{Layer, ServiceExt, service_fn};
use tokio::sync::oneshot;

/// The HTTP layer of an operation, answering API Gateway v2 events.
#[derive(Clone)]
pub struct EventDoor {
    layer: HttpIdempotencyLayer,
}

impl EventDoor {
    pub fn new(operation: Operation<Request>) -> Self {
        Self {
            layer: operation.http_layer(),
        }
    }

    /// Answers `event`, running `handler` (over the event's own request) at most once per key.
    /// The handler runs beside the service, answering the call the layer makes through a
    /// channel, so that it may borrow what the test holds.
    pub async fn handle<F, Fut, E>(
        &self,
        event: LambdaEvent<ApiGatewayV2httpRequest>,
        handler: F,
    ) -> ApiGatewayV2httpResponse
    where
        F: FnOnce(ApiGatewayV2httpRequest, ExecutionContext) -> Fut,
        Fut: Future<Output = Result<ApiGatewayV2httpResponse, E>>,
        E: Into<BoxError>,
    {
        let (payload, context) = event.into_parts();
        let json = serde_json::to_string(&payload).expect("the event serializes");
        let request = lambda_http::request::from_str(&json)
            .expect("lambda_http reads the event")
            .with_lambda_context(context);
        let (call_tx, call_rx) = oneshot::channel::<(ExecutionContext, Reply)>();
        let call_tx = Arc::new(Mutex::new(Some(call_tx)));
        let inner = service_fn(move |request: Request| {
            let call_tx = call_tx.lock().expect("lock").take();
            async move {
                let ctx = request
                    .extensions()
                    .get::<ExecutionContext>()
                    .cloned()
                    .expect("the layer puts the context in the request");
                let (reply_tx, reply_rx) = oneshot::channel();
                let sent = call_tx
                    .expect("the handler runs at most once per call")
                    .send((ctx, reply_tx));
                assert!(sent.is_ok(), "the test waits for the call");
                let answer: Result<ApiGatewayV2httpResponse, BoxError> =
                    reply_rx.await.expect("the handler answers");
                answer.map(to_http)
            }
        });
        // Boxed as `Send` here, where the error type is known, rather than proven inside a
        // caller's spawned task.
        let service: Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>> =
            Box::pin(self.layer.layer(inner).oneshot(request));
        let driver = async move {
            if let Ok((ctx, reply)) = call_rx.await {
                let answer = handler(payload, ctx).await.map_err(Into::into);
                let _ = reply.send(answer);
            }
        };
        let (response, ()) = tokio::join!(service, driver);
        from_http(response.expect("the layer answers")).await
    }
}

/// Where the handler's answer goes.
type Reply = oneshot::Sender<Result<ApiGatewayV2httpResponse, BoxError>>;

fn to_http(response: ApiGatewayV2httpResponse) -> http::Response<Body> {
    let mut built = http::Response::new(match response.body {
        Some(EventBody::Text(text)) => Body::Text(text),
        Some(EventBody::Binary(bytes)) => Body::Binary(bytes),
        _ => Body::Empty,
    });
    *built.status_mut() =
        http::StatusCode::from_u16(response.status_code as u16).expect("a status");
    *built.headers_mut() = response.headers;
    built
}

async fn from_http(response: http::Response<Body>) -> ApiGatewayV2httpResponse {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("a body").to_bytes();
    let mut answer = ApiGatewayV2httpResponse::default();
    answer.status_code = i64::from(parts.status.as_u16());
    answer.headers = parts.headers;
    answer.body =
        (!bytes.is_empty()).then(|| EventBody::Text(String::from_utf8_lossy(&bytes).into_owned()));
    answer
}
