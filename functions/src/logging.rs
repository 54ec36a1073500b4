//! JSON log lines for CloudWatch: each line carries the idempotency span (operation, key hash,
//! attempt, request id, message id), never a payload, an outcome or a credential, at any level.
//!
//! The level is the function's: `AWS_LAMBDA_LOG_LEVEL`, which Lambda's advanced logging
//! controls set (`LoggingConfig.ApplicationLogLevel`); `RUST_LOG` is not read. Whatever the
//! level, the crates that print what they send and receive are capped at `INFO`
//! ([`QUIET_TARGETS`]): at `DEBUG` and `TRACE` the AWS SDK prints every request and response
//! (items and outcomes included) and what it signs, and the Lambda runtime prints every raw
//! event and a streamed response's headers (cookies included).
//!
//! ```
//! use lambda_idempotency_functions::logging;
//! use tracing::Level;
//! use tracing_subscriber::filter::LevelFilter;
//!
//! let filter = logging::filter(LevelFilter::TRACE);
//! assert!(filter.would_enable("lambda_idempotency::engine", &Level::TRACE));
//! assert!(!filter.would_enable("aws_smithy_runtime::client::orchestrator", &Level::TRACE));
//! ```

use tracing::Subscriber;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The variable Lambda's advanced logging controls set to the function's log level.
pub const LOG_LEVEL_VAR: &str = "AWS_LAMBDA_LOG_LEVEL";

/// Target prefixes whose `DEBUG` and `TRACE` output carries payloads, outcomes or credentials:
/// never logged past [`QUIET_MAX`], whatever the function's level.
///
/// | prefix | what it prints below `INFO` |
/// |---|---|
/// | `aws_` | the SDK (`aws_smithy_*`, `aws_sdk_*`, `aws_sigv4`, `aws_config`, `aws_runtime`): each request and response with its body, the canonical request it signs |
/// | `lambda_runtime` | every raw event received (`TRACE`), a streamed response's headers |
/// | `lambda_http` | the HTTP adapter of the payment endpoint |
/// | `hyper`, `h2`, `rustls`, `tower` | connections, frames and headers |
pub const QUIET_TARGETS: [&str; 7] = [
    "aws_",
    "lambda_runtime",
    "lambda_http",
    "hyper",
    "h2",
    "rustls",
    "tower",
];

/// The most [`QUIET_TARGETS`] ever log.
pub const QUIET_MAX: LevelFilter = LevelFilter::INFO;

/// The level `AWS_LAMBDA_LOG_LEVEL` names: `TRACE`, `DEBUG`, `INFO`, `WARN`, `ERROR` or `FATAL`
/// (which is `ERROR` here), in any case; `INFO` when unset or unknown.
///
/// ```
/// use lambda_idempotency_functions::logging::level;
/// use tracing_subscriber::filter::LevelFilter;
///
/// assert_eq!(level(Some("FATAL")), LevelFilter::ERROR);
/// assert_eq!(level(Some("debug")), LevelFilter::DEBUG);
/// assert_eq!(level(None), LevelFilter::INFO);
/// ```
pub fn level(value: Option<&str>) -> LevelFilter {
    match value {
        Some(value) if value.eq_ignore_ascii_case("FATAL") => LevelFilter::ERROR,
        Some(value) => value.parse().unwrap_or(LevelFilter::INFO),
        None => LevelFilter::INFO,
    }
}

/// What is logged at `level`: everything at that level, except [`QUIET_TARGETS`], which never
/// pass [`QUIET_MAX`].
pub fn filter(level: LevelFilter) -> Targets {
    let quiet = level.min(QUIET_MAX);
    Targets::new()
        .with_default(level)
        .with_targets(QUIET_TARGETS.map(|target| (target, quiet)))
}

/// The JSON subscriber at `level` ([`filter`]), writing to `writer`.
pub fn subscriber<W>(level: LevelFilter, writer: W) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .without_time()
        .with_max_level(level)
        .with_writer(writer)
        .finish()
        .with(filter(level))
}

/// Installs the JSON subscriber on stdout at the level `AWS_LAMBDA_LOG_LEVEL` names ([`level`]).
pub fn init() {
    let level = level(std::env::var(LOG_LEVEL_VAR).ok().as_deref());
    subscriber(level, std::io::stdout).init();
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex, PoisonError};

    use aws_sdk_dynamodb::types::AttributeValue;
    use lambda_idempotency::testing::local;
    use tracing::Level;
    use tracing::instrument::WithSubscriber;

    use super::*;

    #[test]
    fn the_sdk_and_the_runtime_never_log_below_info_at_any_level() {
        for name in ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "bogus"] {
            let filter = filter(level(Some(name)));
            for target in [
                "aws_smithy_runtime::client::orchestrator",
                "aws_smithy_runtime::client::orchestrator::http",
                "aws_sigv4::http_request::sign",
                "aws_sdk_dynamodb::config",
                "lambda_runtime::layers::api_response",
                "lambda_runtime::requests",
                "lambda_runtime_api_client",
                "hyper_util::client::legacy::client",
            ] {
                for below_info in [Level::DEBUG, Level::TRACE] {
                    assert!(
                        !filter.would_enable(target, &below_info),
                        "{name}: {target} at {below_info}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_functions_own_lines_follow_the_level() {
        let trace = filter(level(Some("TRACE")));
        assert!(trace.would_enable("lambda_idempotency::engine", &Level::TRACE));
        assert!(trace.would_enable("lambda_idempotency_functions::payments", &Level::DEBUG));
        assert!(trace.would_enable("aws_smithy_runtime", &Level::INFO));
        let warn = filter(level(Some("WARN")));
        assert!(!warn.would_enable("lambda_idempotency::engine", &Level::INFO));
        assert!(
            !warn.would_enable("aws_smithy_runtime", &Level::INFO),
            "never above the level"
        );
        assert!(warn.would_enable("aws_smithy_runtime", &Level::WARN));
        let fatal = filter(level(Some("FATAL")));
        assert!(fatal.would_enable("lambda_idempotency::engine", &Level::ERROR));
        assert!(!fatal.would_enable("lambda_idempotency::engine", &Level::WARN));
    }

    /// What a subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
                .into_owned()
        }
    }

    impl io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'writer> MakeWriter<'writer> for Captured {
        type Writer = Self;

        fn make_writer(&'writer self) -> Self {
            self.clone()
        }
    }

    /// A real SDK read of an item from the embedded server, logged at `TRACE`: unfiltered, the
    /// item read is in the log (the response body); through the functions' subscriber, no line
    /// of the SDK is.
    #[tokio::test]
    async fn a_trace_level_function_logs_no_item_the_sdk_sends_or_receives()
    -> Result<(), lambda_idempotency::BoxError> {
        let endpoint = local::endpoint().await?;
        let client = aws_sdk_dynamodb::Client::from_conf(local::config_for(endpoint).build());
        let table = local::unique_table_name("logging");
        local::create_key_table(&client, &table, false).await?;
        client
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S("k".into()))
            .item("outcome", AttributeValue::S("card-4111-outcome".into()))
            .send()
            .await?;
        let read = || {
            client
                .get_item()
                .table_name(&table)
                .key("pk", AttributeValue::S("k".into()))
                .send()
        };

        let unfiltered = Captured::default();
        let everything = tracing_subscriber::fmt()
            .json()
            .with_max_level(LevelFilter::TRACE)
            .with_writer(unfiltered.clone())
            .finish();
        read().with_subscriber(everything).await?;
        let captured = Captured::default();
        read()
            .with_subscriber(subscriber(level(Some("TRACE")), captured.clone()))
            .await?;
        tracing::subscriber::with_default(
            subscriber(level(Some("TRACE")), captured.clone()),
            || tracing::trace!(target: "lambda_idempotency::engine", "a line of the function's own"),
        );
        let (unfiltered, captured) = (unfiltered.text(), captured.text());

        assert!(
            unfiltered.contains("card-4111-outcome"),
            "the SDK prints the item it reads at TRACE: {unfiltered}"
        );
        assert!(!captured.contains("card-4111"), "{captured}");
        assert!(!captured.contains("aws_smithy"), "{captured}");
        assert!(
            captured.contains("a line of the function's own"),
            "{captured}"
        );
        Ok(())
    }
}
