//! The engine's decisions and latencies as CloudWatch Embedded Metric Format (the crate's `emf`
//! feature): one document per invocation on stdout, namespace [`NAMESPACE`], dimensions
//! `function` (the Lambda function's name) and `operation`. The stack's alarms read them
//! (lease lost, store errors, indeterminate outcomes, the duplicate rate).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use lambda_idempotency::observe::emf::MetricsObserver;
use lambda_idempotency::observe::emf::metrics_cloudwatch_embedded::{Builder, Collector};
use lambda_runtime::tower::Service;

/// The CloudWatch namespace of the functions' metrics.
pub const NAMESPACE: &str = "LambdaIdempotency";

/// Installs the EMF recorder (once per process) and returns it with the engine's observer.
///
/// # Errors
/// When a recorder is installed already.
pub fn init() -> Result<(&'static Collector, MetricsObserver), lambda_runtime::Error> {
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    let collector = Builder::new()
        .cloudwatch_namespace(NAMESPACE)
        .with_dimension("function", function)
        .init()
        .map_err(|err| format!("the metrics recorder cannot be installed: {err}"))?;
    Ok((collector, MetricsObserver::new()))
}

/// `inner`, flushing the recorder's document to stdout after each request.
#[derive(Clone)]
pub struct Flushed<S> {
    collector: &'static Collector,
    inner: S,
}

impl<S> Flushed<S> {
    /// Wraps `inner`.
    pub fn new(collector: &'static Collector, inner: S) -> Self {
        Self { collector, inner }
    }
}

impl<S, Request> Service<Request> for Flushed<S>
where
    S: Service<Request>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let (collector, answered) = (self.collector, self.inner.call(request));
        Box::pin(async move {
            // Flushed when the invocation ends, however it ends: answered, failed, or a
            // handler's panic unwinding through here.
            let _flush = FlushOnDrop(collector);
            answered.await
        })
    }
}

/// Writes the collector's document when dropped.
struct FlushOnDrop(&'static Collector);

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        // One locked write: no other log line lands inside the document. A document that
        // cannot be written is lost, never the invocation's answer.
        if let Err(err) = self.0.flush(std::io::stdout().lock()) {
            tracing::warn!(error = %err, "the metrics document was not written");
        }
    }
}
