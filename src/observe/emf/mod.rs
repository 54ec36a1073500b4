//! CloudWatch Embedded Metric Format (feature `emf`): [`MetricsObserver`] records every
//! decision as a counter and every latency as a histogram in milliseconds, through the
//! `metrics` facade, with the operation always a dimension. `metrics_cloudwatch_embedded`
//! (re-exported, without its `lambda` feature) is the recorder that writes them as EMF: flush
//! it after each invocation (one JSON document per operation) to stdout, where CloudWatch
//! picks it up.
//!
//! ```no_run
//! use lambda_idempotency::observe::emf::{MetricsObserver, metrics_cloudwatch_embedded};
//! use lambda_idempotency::{DynamoDbStore, Idempotency};
//!
//! # async fn demo() -> Result<(), lambda_idempotency::BoxError> {
//! let metrics = metrics_cloudwatch_embedded::Builder::new()
//!     .cloudwatch_namespace("Payments")
//!     .with_dimension("service", "checkout")
//!     .init()?;
//! let idem: Idempotency = Idempotency::new(DynamoDbStore::from_env().await?)
//!     .with_observer(MetricsObserver::new());
//! // ... after each invocation ([`Flushed`] does it for a service: the dependency comes
//! // without its `lambda` feature, whose lambda::handler::run would):
//! metrics.flush(std::io::stdout())?;
//! # Ok(()) }
//! ```
//!
//! | metric | unit | dimensions |
//! |---|---|---|
//! | `idempotency.first_execution`, `.replay`, `.payload_conflict`, `.in_progress_collision`, `.takeover`, `.reconciled`, `.indeterminate`, `.key_expired_conflict`, `.lease_lost`, `.handler_failed`, `.failure_replayed`, `.store_error.<kind>` | Count | `operation` (+ yours) |
//! | `idempotency.claim_latency`, `idempotency.completion_latency` | Milliseconds | `operation` (+ yours) |
//! | `idempotency.wait_reads` (the reads a duplicate spent waiting for a result in flight) | Count | `operation` (+ yours) |
//! | `idempotency.wait_latency` (how long it waited) | Milliseconds | `operation` (+ yours) |

pub use metrics_cloudwatch_embedded;

mod flush;
pub use flush::{FlushLayer, Flushed};

use super::{Observation, Observer, Phase};

/// Declares the latency histograms' unit (milliseconds) once, to the recorder installed by then.
fn describe_latencies(prefix: &'static str) {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(|| {
        for step in ["claim_latency", "completion_latency", "wait_latency"] {
            metrics::describe_histogram!(
                format!("{prefix}.{step}"),
                metrics::Unit::Milliseconds,
                "time the idempotency engine spent in this step"
            );
        }
    });
}

/// Records the engine's decisions and latencies through the `metrics` facade.
#[derive(Debug, Clone)]
pub struct MetricsObserver {
    prefix: &'static str,
}

impl Default for MetricsObserver {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsObserver {
    /// Metrics named `idempotency.<decision>`.
    pub fn new() -> Self {
        Self {
            prefix: "idempotency",
        }
    }
}

impl Observer for MetricsObserver {
    fn observe(&self, observation: &Observation<'_>) {
        match observation {
            Observation::Decision {
                operation,
                decision,
            } => {
                let name = format!("{}.{}", self.prefix, decision.metric_name());
                metrics::counter!(name, "operation" => operation.to_string()).increment(1);
            }
            Observation::Latency {
                operation,
                step,
                elapsed,
            } => {
                let step = match step {
                    Phase::Claim => "claim_latency",
                    Phase::Completion => "completion_latency",
                };
                let name = format!("{}.{step}", self.prefix);
                describe_latencies(self.prefix);
                metrics::histogram!(name, "operation" => operation.to_string())
                    .record(elapsed.as_secs_f64() * 1000.0);
            }
            Observation::Waited {
                operation,
                reads,
                elapsed,
            } => {
                let reads_name = format!("{}.wait_reads", self.prefix);
                metrics::counter!(reads_name, "operation" => operation.to_string())
                    .increment(u64::from(*reads));
                let name = format!("{}.wait_latency", self.prefix);
                describe_latencies(self.prefix);
                metrics::histogram!(name, "operation" => operation.to_string())
                    .record(elapsed.as_secs_f64() * 1000.0);
            }
        }
    }
}
