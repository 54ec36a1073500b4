//! Engine settings: retention and the outcome size limit, validated once.
//!
//! ```
//! use std::time::Duration;
//! use lambda_idempotency::Config;
//!
//! let config = Config::builder().retention(Duration::from_secs(3 * 24 * 3600)).build()?;
//! assert_eq!(config.retention(), Duration::from_secs(3 * 24 * 3600));
//! # Ok::<(), lambda_idempotency::ConfigError>(())
//! ```

use std::time::Duration;

use crate::error::ConfigError;

/// DynamoDB's item size limit, in bytes.
pub const DYNAMODB_ITEM_LIMIT: usize = 400 * 1024;
/// The largest outcome the engine stores: 16 MiB. Past DynamoDB's item limit the DynamoDB
/// store keeps an outcome compressed in part items beside its record
/// ([`OutcomeStorage`](crate::store::OutcomeStorage)).
pub const MAX_OUTCOME_BYTES: usize = 16 * 1024 * 1024;
/// The default outcome limit: 6 MiB, Lambda's limit on a synchronous invocation's response,
/// so that any result a function can return is stored and replayed.
pub const DEFAULT_MAX_OUTCOME_BYTES: usize = 6 * 1024 * 1024;

/// The longest result reference kept in a business identity's evidence, in bytes.
pub const MAX_RESULT_REF_BYTES: usize = 1024;
/// The longest request id kept in a record, in bytes (longer ones are cut).
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// Validated engine settings; build them with [`Config::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    retention: Duration,
    max_outcome_bytes: usize,
    earlier_keys: bool,
}

impl Config {
    /// Default retention of a settled record: 24 hours.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

    /// A builder starting from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Self::default(),
        }
    }

    /// How long a settled record (and its replayable outcome) is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The largest serialized outcome that is stored (a larger one is retained as FAILED,
    /// `outcome_too_large`: the effect happened, so it is not run again).
    pub fn max_outcome_bytes(&self) -> usize {
        self.max_outcome_bytes
    }

    /// Whether an operation whose key material holds an integer past ±2^53 is first looked up
    /// under the key versions before 0.2 derived for it ([`ConfigBuilder::earlier_keys`]).
    pub fn earlier_keys(&self) -> bool {
        self.earlier_keys
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retention: Self::DEFAULT_RETENTION,
            max_outcome_bytes: DEFAULT_MAX_OUTCOME_BYTES,
            earlier_keys: true,
        }
    }
}

/// Builds a [`Config`]; [`ConfigBuilder::build`] checks the ranges.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    config: Config,
}

impl ConfigBuilder {
    /// How long settled records are kept (1 second to 366 days; default 24 h). Size it against
    /// how late a duplicate can arrive: queue retention, DLQ redrive, manual replays.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// The largest serialized outcome to store (1 byte to [`MAX_OUTCOME_BYTES`]; default
    /// [`DEFAULT_MAX_OUTCOME_BYTES`]).
    pub fn max_outcome_bytes(mut self, bytes: usize) -> Self {
        self.config.max_outcome_bytes = bytes;
        self
    }

    /// Whether an operation whose key material holds an integer past ±2^53 (whose key 0.2
    /// derives otherwise than 0.1 did) is first looked up under the key 0.1 derived, and
    /// continued there when a record of its intent stands (default `true`: one more `GetItem`
    /// for such keys only). A record 0.1 wrote cannot tell two ids it keyed alike apart, so for
    /// as long as such records live, a second id is answered as the first was, as 0.1 did.
    /// Turn it off once one retention has passed since no 0.1 instance writes.
    pub fn earlier_keys(mut self, look_up: bool) -> Self {
        self.config.earlier_keys = look_up;
        self
    }

    /// The checked configuration.
    pub fn build(self) -> Result<Config, ConfigError> {
        let config = self.config;
        if config.retention < Duration::from_secs(1)
            || config.retention > Duration::from_secs(366 * 24 * 3600)
        {
            return Err(ConfigError::InvalidSetting {
                setting: "retention",
                reason: format!("{:?} is outside 1 s ..= 366 days", config.retention),
            });
        }
        if config.max_outcome_bytes == 0 || config.max_outcome_bytes > MAX_OUTCOME_BYTES {
            return Err(ConfigError::InvalidSetting {
                setting: "max_outcome_bytes",
                reason: format!(
                    "{} is outside 1 ..= {MAX_OUTCOME_BYTES}",
                    config.max_outcome_bytes
                ),
            });
        }
        Ok(config)
    }
}
