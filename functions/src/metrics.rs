//! The engine's decisions and latencies as CloudWatch Embedded Metric Format (the crate's `emf`
//! feature): one document per invocation on stdout, namespace [`NAMESPACE`], dimensions
//! `function` (the Lambda function's name) and `operation`, written after each invocation by
//! the crate's [`Flushed`](lambda_idempotency::observe::emf::Flushed). The stack's alarms read
//! them (lease lost, store errors, indeterminate outcomes, the duplicate rate).

use lambda_idempotency::observe::emf::MetricsObserver;
use lambda_idempotency::observe::emf::metrics_cloudwatch_embedded::{Builder, Collector};

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
