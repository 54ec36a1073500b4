//! The engine's decisions and latencies as CloudWatch Embedded Metric Format (the crate's `emf`
//! feature): one document per invocation on stdout, namespace [`NAMESPACE`], dimensions
//! `function` (the Lambda function's name) and `operation`, written after each invocation by
//! the crate's [`Flushed`](lambda_idempotency::observe::emf::Flushed). The stack's alarms read
//! them (lease lost, store errors, indeterminate outcomes, the duplicate rate).

use std::time::{SystemTime, UNIX_EPOCH};

use lambda_idempotency::observe::emf::metrics_cloudwatch_embedded::{Builder, Collector};
use lambda_idempotency::observe::emf::{MetricsObserver, document_level};
use serde_json::{Map, Value, json};

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
    Ok((collector, MetricsObserver::new().flushing(collector)))
}

/// One gauge of a scheduled function's document: its name, its CloudWatch unit, its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauge {
    /// The metric's name.
    pub name: &'static str,
    /// Its unit (`Count`, `Seconds`).
    pub unit: &'static str,
    /// Its value.
    pub value: u64,
}

/// A scheduled function's `gauges` at `now` as one Embedded Metric Format document, namespace
/// [`NAMESPACE`], dimension `Function` (the stuck check's and the outbox sweeper's: one log
/// line a run, which CloudWatch turns into the gauges the stack's alarms watch), at the
/// function's log level ([`document_level`]).
pub fn gauges_document(function: &str, gauges: &[Gauge], now: SystemTime) -> Value {
    let millis = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let metrics: Vec<Value> = gauges
        .iter()
        .map(|gauge| json!({"Name": gauge.name, "Unit": gauge.unit}))
        .collect();
    let mut document = Map::new();
    document.insert(
        "_aws".into(),
        json!({
            "Timestamp": millis,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [["Function"]],
                "Metrics": metrics,
            }]
        }),
    );
    // Kept by Lambda's log-level filtering whatever the function's level.
    document.insert("level".into(), json!(document_level()));
    document.insert("Function".into(), json!(function));
    for gauge in gauges {
        document.insert(gauge.name.into(), json!(gauge.value));
    }
    Value::Object(document)
}
