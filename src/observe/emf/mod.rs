//! CloudWatch Embedded Metric Format (feature `emf`): [`MetricsObserver`] records every
//! decision as a counter and every latency as a histogram in milliseconds, through the
//! `metrics` facade, with the operation always a dimension. `metrics_cloudwatch_embedded`
//! (re-exported, without its `lambda` feature) is the recorder that writes them as EMF: flush
//! it after each invocation (one JSON document per operation) to stdout, where CloudWatch
//! picks it up. An invocation recording more than 100 latencies of one operation needs
//! [`MetricsObserver::flushing`]: one EMF document holds at most 100 values of a metric.
//!
//! ```no_run
//! use lambda_idempotency::observe::emf::{self, MetricsObserver, metrics_cloudwatch_embedded};
//! use lambda_idempotency::{DynamoDbStore, Idempotency};
//!
//! # async fn demo() -> Result<(), lambda_idempotency::BoxError> {
//! let metrics = metrics_cloudwatch_embedded::Builder::new()
//!     .cloudwatch_namespace("Payments")
//!     .with_dimension("service", "checkout")
//!     .init()?;
//! // Kept by Lambda's log-level filtering at any level ([`document_level`]).
//! metrics.set_property("level", emf::document_level());
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
//! | `idempotency.other.<kind>` (a call refused before the engine: `MissingKey`, `InvalidEvent`, `TenantMissing`, …; another error's `ErrorKind::name`) | Count | `operation` (+ yours) |
//! | `idempotency.wait_latency` (how long it waited) | Milliseconds | `operation` (+ yours) |

pub use metrics_cloudwatch_embedded;

mod flush;
pub use flush::Flushed;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use metrics_cloudwatch_embedded::Collector;

use super::{Observation, Observer, Phase};

/// EMF's bound on one metric's values in one document, which the recorder's histograms keep:
/// a value past it, before the next flush, is dropped with an error log.
const VALUES_PER_DOCUMENT: usize = 100;

fn stdout() -> Box<dyn Write> {
    Box::new(std::io::stdout().lock())
}

/// The levels Lambda's log-level filtering knows, least severe first.
const LOG_LEVELS: [&str; 6] = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"];

/// The `level` every EMF document carries so that Lambda's log-level filtering never drops
/// it: the function's application log level (`AWS_LAMBDA_LOG_LEVEL`, which Lambda sets when
/// the function filters its JSON logs), else `INFO`. Lambda takes a JSON line without a
/// `level` as INFO and drops it when the function logs at WARN or above: its metrics with it.
/// [`Flushed`] (and its [`layer`](Flushed::layer)) and [`MetricsObserver::flushing`] set it on
/// their collector; a document written otherwise takes it as a property:
///
/// ```no_run
/// # fn demo() -> Result<(), lambda_idempotency::BoxError> {
/// use lambda_idempotency::observe::emf::{document_level, metrics_cloudwatch_embedded};
///
/// let metrics = metrics_cloudwatch_embedded::Builder::new()
///     .cloudwatch_namespace("Payments")
///     .init()?;
/// metrics.set_property("level", document_level());
/// # Ok(()) }
/// ```
pub fn document_level() -> &'static str {
    level_named(&std::env::var("AWS_LAMBDA_LOG_LEVEL").unwrap_or_default())
}

/// The filtering level `name` names (any case), else `INFO`.
fn level_named(name: &str) -> &'static str {
    LOG_LEVELS
        .into_iter()
        .find(|level| level.eq_ignore_ascii_case(name.trim()))
        .unwrap_or("INFO")
}

/// Has `collector` write [`document_level`] into every document it writes from now on.
fn level_every_document(collector: &'static Collector) {
    collector.set_property("level", document_level());
}

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
    early_flush: Option<EarlyFlush>,
    sink: fn() -> Box<dyn Write>,
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
            early_flush: None,
            sink: stdout,
        }
    }

    /// Writes `collector`'s document to stdout before a latency histogram passes EMF's 100
    /// values, so that an invocation recording more (a batch of hundreds of records) loses
    /// none: without it, the recorder drops each value past the 100th until the next flush.
    ///
    /// ```no_run
    /// use lambda_idempotency::observe::emf::{MetricsObserver, metrics_cloudwatch_embedded};
    ///
    /// # fn demo() -> Result<(), lambda_idempotency::BoxError> {
    /// let collector = metrics_cloudwatch_embedded::Builder::new()
    ///     .cloudwatch_namespace("Orders")
    ///     .init()?;
    /// let observer = MetricsObserver::new().flushing(collector);
    /// # Ok(()) }
    /// ```
    pub fn flushing(mut self, collector: &'static Collector) -> Self {
        level_every_document(collector);
        self.early_flush = Some(EarlyFlush {
            collector,
            recorded: Arc::default(),
        });
        self
    }

    /// Writes the documents [`flushing`](Self::flushing) writes early to what `sink` gives
    /// instead of stdout (a test's buffer).
    pub fn with_sink(mut self, sink: fn() -> Box<dyn Write>) -> Self {
        self.sink = sink;
        self
    }

    fn count(&self, name: String, operation: &str, increment: u64) {
        metrics::describe_counter!(
            name.clone(),
            metrics::Unit::Count,
            "what the idempotency engine decided"
        );
        metrics::counter!(name, "operation" => operation.to_owned()).increment(increment);
    }

    fn time(&self, name: String, operation: &str, elapsed: std::time::Duration) {
        describe_latencies(self.prefix);
        let record = || {
            metrics::histogram!(name.clone(), "operation" => operation.to_owned())
                .record(elapsed.as_secs_f64() * 1000.0);
        };
        match &self.early_flush {
            Some(early_flush) => early_flush.record(&name, operation, self.sink, record),
            None => record(),
        }
    }
}

/// The collector [`MetricsObserver::flushing`] writes before a histogram overflows, and the
/// values each histogram holds since the observer's last write (a flush by anyone else only
/// makes the next early one smaller).
#[derive(Clone)]
struct EarlyFlush {
    collector: &'static Collector,
    recorded: Arc<Mutex<HashMap<(String, String), usize>>>,
}

impl std::fmt::Debug for EarlyFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyFlush").finish_non_exhaustive()
    }
}

impl EarlyFlush {
    fn record(
        &self,
        name: &str,
        operation: &str,
        sink: fn() -> Box<dyn Write>,
        record: impl FnOnce(),
    ) {
        // One value at a time, so that no other thread's value lands between the count and
        // the write; a poisoned count only ever held counts.
        let mut recorded = self
            .recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = recorded
            .entry((name.to_owned(), operation.to_owned()))
            .or_default();
        if *held >= VALUES_PER_DOCUMENT {
            // The flush empties every histogram of the recorder.
            if let Err(err) = self.collector.flush(sink()) {
                tracing::warn!(error = %err, "the metrics document was not written");
            }
            recorded.clear();
        }
        record();
        *recorded
            .entry((name.to_owned(), operation.to_owned()))
            .or_default() += 1;
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
                self.count(name, operation, 1);
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
                self.time(format!("{}.{step}", self.prefix), operation, *elapsed);
            }
            Observation::Waited {
                operation,
                reads,
                elapsed,
            } => {
                self.count(
                    format!("{}.wait_reads", self.prefix),
                    operation,
                    u64::from(*reads),
                );
                self.time(format!("{}.wait_latency", self.prefix), operation, *elapsed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::level_named;

    #[test]
    fn a_document_carries_the_functions_log_level_so_filtering_keeps_it() {
        assert_eq!(level_named("WARN"), "WARN");
        assert_eq!(level_named("fatal"), "FATAL", "any case");
        assert_eq!(level_named(""), "INFO", "no filtering: INFO");
        assert_eq!(
            level_named("VERBOSE"),
            "INFO",
            "a level Lambda does not know"
        );
    }
}
