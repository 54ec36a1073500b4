//! JSON log lines for CloudWatch: each line carries the idempotency span (operation, key hash,
//! attempt, request id, message id), never a payload.

use tracing_subscriber::filter::LevelFilter;

/// The variable Lambda's advanced logging controls set to the function's log level.
pub const LOG_LEVEL_VAR: &str = "AWS_LAMBDA_LOG_LEVEL";

/// Installs the JSON subscriber at the level `AWS_LAMBDA_LOG_LEVEL` names (`TRACE`, `DEBUG`,
/// `INFO`, `WARN`, `ERROR` or `FATAL`, which is `ERROR` here; default `INFO`).
pub fn init() {
    let level = match std::env::var(LOG_LEVEL_VAR).as_deref() {
        Ok("FATAL") => LevelFilter::ERROR,
        Ok(level) => level.parse().unwrap_or(LevelFilter::INFO),
        Err(_) => LevelFilter::INFO,
    };
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .without_time()
        .with_max_level(level)
        .init();
}
