//! One EMF document per invocation: [`Flushed`] wraps the function's service and writes the
//! recorder's document when each invocation ends, however it ends (answered, failed, or a
//! handler's panic unwinding through it), so that no function has to write this wrapper itself.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use lambda_runtime::tower::{Layer, Service};
use metrics_cloudwatch_embedded::Collector;

fn stdout() -> Box<dyn Write> {
    Box::new(std::io::stdout().lock())
}

/// `inner`, writing the collector's document after each request ([`Flushed::layer`] builds it
/// in a `ServiceBuilder`).
///
/// ```no_run
/// # async fn run() -> Result<(), lambda_runtime::Error> {
/// use lambda_idempotency::observe::emf::{Flushed, MetricsObserver, metrics_cloudwatch_embedded};
/// use lambda_idempotency::{Idempotency, KeyPolicy};
/// use lambda_runtime::tower::ServiceBuilder;
/// use lambda_runtime::{LambdaEvent, service_fn};
/// use serde_json::Value;
///
/// let collector = metrics_cloudwatch_embedded::Builder::new()
///     .cloudwatch_namespace("Payments")
///     .with_dimension("function", std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default())
///     .init()?;
/// let idem = Idempotency::from_env().await?.with_observer(MetricsObserver::new());
/// let charge_once = idem.operation("charge", KeyPolicy::pointer("/order_id")?)?.layer();
/// let service = ServiceBuilder::new()
///     .layer(charge_once)
///     .service(service_fn(|event: LambdaEvent<Value>| async move {
///         Ok::<_, lambda_runtime::Error>(event.payload)
///     }));
/// lambda_runtime::run(Flushed::new(collector, service)).await
/// # }
/// ```
#[derive(Clone)]
pub struct Flushed<S> {
    collector: &'static Collector,
    inner: S,
    sink: fn() -> Box<dyn Write>,
}

impl<S> Flushed<S> {
    /// Wraps `inner`, writing to stdout; every document carries
    /// [`document_level`](super::document_level).
    pub fn new(collector: &'static Collector, inner: S) -> Self {
        super::level_every_document(collector);
        Self {
            collector,
            inner,
            sink: stdout,
        }
    }

    /// Writes each document to what `sink` gives (asked once per document: a test's buffer)
    /// instead of stdout, which is locked for the one write so that no other log line lands
    /// inside a document, and where CloudWatch Logs picks it up.
    pub fn with_sink(mut self, sink: fn() -> Box<dyn Write>) -> Self {
        self.sink = sink;
        self
    }
}

impl<S> std::fmt::Debug for Flushed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flushed").finish_non_exhaustive()
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
        let flush = FlushOnDrop {
            collector: self.collector,
            sink: self.sink,
        };
        let answered = self.inner.call(request);
        Box::pin(async move {
            let _flush = flush;
            answered.await
        })
    }
}

impl Flushed<()> {
    /// The layer of [`Flushed`], for a `ServiceBuilder`: flushes `collector` to stdout after
    /// each request; every document carries [`document_level`](super::document_level).
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), lambda_idempotency::BoxError> {
    /// use lambda_idempotency::observe::emf::{Flushed, metrics_cloudwatch_embedded};
    /// use lambda_runtime::tower::ServiceBuilder;
    ///
    /// let collector = metrics_cloudwatch_embedded::Builder::new()
    ///     .cloudwatch_namespace("Payments")
    ///     .init()?;
    /// let builder = ServiceBuilder::new().layer(Flushed::layer(collector));
    /// # Ok(()) }
    /// ```
    pub fn layer(collector: &'static Collector) -> Self {
        Self::new(collector, ())
    }
}

impl<S> Layer<S> for Flushed<()> {
    type Service = Flushed<S>;

    fn layer(&self, inner: S) -> Flushed<S> {
        Flushed {
            collector: self.collector,
            inner,
            sink: self.sink,
        }
    }
}

/// Writes the collector's document when dropped: when the invocation's future ends or is
/// dropped, a panic unwinding included.
struct FlushOnDrop {
    collector: &'static Collector,
    sink: fn() -> Box<dyn Write>,
}

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        // A document that cannot be written is lost, never the invocation's answer.
        if let Err(err) = self.collector.flush((self.sink)()) {
            tracing::warn!(error = %err, "the metrics document was not written");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use lambda_runtime::tower::{ServiceExt, service_fn};

    use super::*;

    static WRITTEN: Mutex<Vec<u8>> = Mutex::new(Vec::new());

    struct Buffer;

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            WRITTEN
                .lock()
                .expect("one writer at a time")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn buffer() -> Box<dyn Write> {
        Box::new(Buffer)
    }

    /// The EMF documents written so far.
    fn documents() -> Vec<serde_json::Value> {
        let written = WRITTEN.lock().expect("read").clone();
        String::from_utf8_lossy(&written)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|document| document.get("_aws").is_some())
            .collect()
    }

    #[tokio::test]
    async fn every_invocation_writes_its_document_however_it_ends() {
        let collector = metrics_cloudwatch_embedded::Builder::new()
            .cloudwatch_namespace("FlushTest")
            .init()
            .expect("the only recorder of the crate's unit tests");
        let service = Flushed::layer(collector)
            .layer(service_fn(|ending: &'static str| async move {
                metrics::counter!("calls", "ending" => ending).increment(1);
                match ending {
                    "panics" => panic!("a handler bug"),
                    "fails" => Err("failed"),
                    _ => Ok(ending),
                }
            }))
            .with_sink(buffer);

        assert_eq!(service.clone().oneshot("answers").await, Ok("answers"));
        assert_eq!(documents().len(), 1, "written when the answer is");
        assert_eq!(service.clone().oneshot("fails").await, Err("failed"));
        assert_eq!(documents().len(), 2, "written when the error is");
        let panicked = tokio::spawn(service.oneshot("panics")).await;
        assert!(panicked.expect_err("the panic goes on").is_panic());
        let documents = documents();
        assert_eq!(documents.len(), 3, "written as the panic unwinds");
        for (document, ending) in documents.iter().zip(["answers", "fails", "panics"]) {
            assert_eq!(document["ending"], ending);
            assert_eq!(document["calls"], 1);
            assert_eq!(
                document["level"], "INFO",
                "kept by Lambda's log-level filtering"
            );
        }
    }
}
