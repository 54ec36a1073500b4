//! Engine settings: retention and the outcome size limit, validated once.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use lambda_idempotency::Config;
//!
//! let config = Config::builder().retention(Duration::from_secs(3 * 24 * 3600)).build()?;
//! assert_eq!(config.retention(), Duration::from_secs(3 * 24 * 3600));
//! # Ok::<(), lambda_idempotency::ConfigError>(())
//! ```

use std::time::{Duration, SystemTime};

use crate::error::ConfigError;

/// DynamoDB's item size limit, in bytes.
#[deprecated(
    since = "0.5.0",
    note = "a property of the DynamoDB store: use `store::DYNAMODB_ITEM_LIMIT`"
)]
pub const DYNAMODB_ITEM_LIMIT: usize = 400 * 1024;
/// The largest outcome the engine stores: 16 MiB. Past DynamoDB's item limit the DynamoDB
/// store keeps an outcome compressed in part items beside its record
/// ([`OutcomeStorage`](crate::store::OutcomeStorage)).
pub const MAX_OUTCOME_BYTES: usize = 16 * 1024 * 1024;
/// The default outcome limit: 6 MiB, Lambda's limit on a synchronous invocation's response,
/// so that any result a function can return is stored and replayed.
pub const DEFAULT_MAX_OUTCOME_BYTES: usize = 6 * 1024 * 1024;

/// The longest result reference kept in a business identity's evidence, in bytes.
#[deprecated(
    since = "0.5.0",
    note = "a limit of the record: use `record::MAX_RESULT_REF_BYTES`"
)]
pub const MAX_RESULT_REF_BYTES: usize = 1024;
/// The longest request id kept in a record, in bytes (longer ones are cut).
#[deprecated(
    since = "0.5.0",
    note = "a limit of the record: use `record::MAX_REQUEST_ID_BYTES`"
)]
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// Validated engine settings; build them with [`Config::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    retention: Duration,
    max_outcome_bytes: usize,
    rfc8785_records_before: Option<SystemTime>,
    keyed_by_0_4_before: Option<SystemTime>,
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

    /// The instant before which records that name no [`KeyRule`](crate::key::KeyRule) are read
    /// as 0.1 may have written them ([`ConfigBuilder::rfc8785_records_before`]); `None` (the
    /// default): never.
    pub fn rfc8785_records_before(&self) -> Option<SystemTime> {
        self.rfc8785_records_before
    }

    /// The instant before which a record (or evidence) kept under the key 0.4 derived without
    /// Lambda's tenant answers a tenanted invocation of the same intent
    /// ([`ConfigBuilder::keyed_by_0_4_before`]); `None` (the default): never.
    pub fn keyed_by_0_4_before(&self) -> Option<SystemTime> {
        self.keyed_by_0_4_before
    }

    /// Whether the 0.1 compatibility rule is on.
    #[deprecated(
        since = "0.5.0",
        note = "the 0.1 compatibility rule is off by default and names a cut-over: use `rfc8785_records_before`"
    )]
    pub fn earlier_keys(&self) -> bool {
        self.rfc8785_records_before.is_some()
    }
}

impl Config {
    /// These settings with an operation's own retention and outcome limit, where it declares
    /// them (checked when declared).
    pub(crate) fn for_operation(&self, retention: Option<Duration>, max: Option<usize>) -> Self {
        Self {
            retention: retention.unwrap_or(self.retention),
            max_outcome_bytes: max.unwrap_or(self.max_outcome_bytes),
            ..self.clone()
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retention: Self::DEFAULT_RETENTION,
            max_outcome_bytes: DEFAULT_MAX_OUTCOME_BYTES,
            rfc8785_records_before: None,
            keyed_by_0_4_before: None,
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

    /// Answers an invocation that 0.5 keys otherwise than 0.4 did from what 0.4 kept for the
    /// same event before `cutover`. 0.4 read neither the tenant Lambda's tenant isolation mode
    /// gives an invocation nor an SQS message's producer (`SenderId`,
    /// [`sources::sqs`](crate::lambda::sources::sqs)), a Kinesis record's stream, nor an
    /// EventBridge event's source and account
    /// ([`sources::eventbridge_detail`](crate::lambda::sources::eventbridge_detail)): it keyed
    /// every tenant's and producer's operations alike, and 0.5 keys them apart. It also took a quoted HTTP `Idempotency-Key`
    /// with its quotes, where 0.5 reads the Structured Field String inside
    /// ([`sources::http`](crate::lambda::sources::http)). Without the rule, a redelivery (or a
    /// client's retry) that spans the upgrade runs again.
    ///
    /// With it, such an invocation whose new key holds no live record first reads under the
    /// key 0.4 derived (one or two more `GetItem`s, for those invocations only). Only what 0.4
    /// wrote counts: a record or evidence that names no key rule and was created before
    /// `cutover`. A record of the same intent answers by its state alone, never with its result
    /// (0.4 did not record whose it was): applied or failed
    /// ([`Error::KeyExpiredConflict`](crate::Error::KeyExpiredConflict), which a batch door
    /// acknowledges when it took effect), still running
    /// ([`Error::AlreadyInProgress`](crate::Error::AlreadyInProgress)), or held for an operator
    /// ([`Error::Indeterminate`](crate::Error::Indeterminate), also for a 0.4 attempt that
    /// crashed: it is never re-run blind under the new key). The evidence 0.4 kept for a
    /// business identity keeps holding it: its own operation is answered by its state, another
    /// learns only that the identity is held. While such records and evidence live, another
    /// tenant's or producer's operation of the very same intent, or with the same identity, is
    /// answered alike instead of running; one of another intent without an identity is never
    /// affected.
    ///
    /// Off by default. Turn it on for a function that ran 0.4 and gets tenants from Lambda,
    /// reads SQS messages with [`sources::sqs`](crate::lambda::sources::sqs), Kinesis records
    /// with [`sources::kinesis`](crate::lambda::sources::kinesis) or EventBridge events with
    /// [`sources::eventbridge_detail`](crate::lambda::sources::eventbridge_detail), or serves HTTP
    /// clients that quote their `Idempotency-Key`, naming the instant
    /// its last 0.4 instance stopped writing (in a rolling deploy, when the deploy ends). Turn it
    /// off one retention later, unless the function declares business identities: their
    /// evidence is permanent, and protects only while the rule is on.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use lambda_idempotency::Config;
    ///
    /// // The deploy that replaced the last 0.4 instance ended at 2026-12-01T09:00:00Z.
    /// let cutover = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_115_600);
    /// let config = Config::builder().keyed_by_0_4_before(cutover).build()?;
    /// assert_eq!(config.keyed_by_0_4_before(), Some(cutover));
    /// # Ok::<(), lambda_idempotency::ConfigError>(())
    /// ```
    pub fn keyed_by_0_4_before(mut self, cutover: SystemTime) -> Self {
        self.config.keyed_by_0_4_before = Some(cutover);
        self
    }

    /// Reads records that name no [`KeyRule`](crate::key::KeyRule) and were created before
    /// `cutover` as 0.1 may have written them: 0.1 read every integer as a double, so an
    /// operation whose key material holds an integer past ±2^53 is first looked up under the key
    /// 0.1 derived (one more `GetItem`, for such keys only) and continued there, and such a
    /// record's fingerprint also matches the digest 0.1 derived for the same intent.
    ///
    /// Off by default. Turn it on only when records 0.1 wrote may still live (one retention after
    /// the last 0.1 instance stopped), and name the instant the last 0.1 instance stopped
    /// writing: records 0.2 to 0.4 wrote after it, and every record 0.5 on writes (marked
    /// [`KeyRule::ExactIntegers`](crate::key::KeyRule::ExactIntegers)), are never read under the
    /// old rule, so two ids that differ above 2^53 stay two operations. A record 0.1 wrote
    /// cannot tell two ids it keyed alike apart: while it lives, a second such id is answered as
    /// 0.1 answered it. In a rolling deploy straight from 0.1, name the instant the deploy
    /// ends (records 0.1 writes meanwhile are read under its rule; 0.5's own never are). 0.1
    /// read neither Lambda's tenant nor an SQS producer: a function that gets tenants from
    /// Lambda or reads [`sources::sqs`](crate::lambda::sources::sqs) also turns on
    /// [`ConfigBuilder::keyed_by_0_4_before`] (the same instant will do), under which a record
    /// 0.1 wrote where it keyed the event answers by its state.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use lambda_idempotency::Config;
    ///
    /// // The last 0.1 instance stopped writing at 2026-11-30T12:00:00Z.
    /// let cutover = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_040_000);
    /// let config = Config::builder().rfc8785_records_before(cutover).build()?;
    /// assert_eq!(config.rfc8785_records_before(), Some(cutover));
    /// assert_eq!(Config::default().rfc8785_records_before(), None);
    /// # Ok::<(), lambda_idempotency::ConfigError>(())
    /// ```
    pub fn rfc8785_records_before(mut self, cutover: SystemTime) -> Self {
        self.config.rfc8785_records_before = Some(cutover);
        self
    }

    /// `false` turns the 0.1 compatibility rule off; `true` leaves the setting as it is (the rule
    /// now needs a cut-over instant).
    #[deprecated(
        since = "0.5.0",
        note = "off by default now; to read 0.1's records, name when 0.1 stopped writing with `rfc8785_records_before`"
    )]
    pub fn earlier_keys(mut self, look_up: bool) -> Self {
        if !look_up {
            self.config.rfc8785_records_before = None;
        }
        self
    }

    /// The checked configuration.
    pub fn build(self) -> Result<Config, ConfigError> {
        let config = self.config;
        check_retention(config.retention)?;
        check_max_outcome_bytes(config.max_outcome_bytes)?;
        Ok(config)
    }
}

/// Refuses a retention outside 1 s ..= 366 days.
pub(crate) fn check_retention(retention: Duration) -> Result<(), ConfigError> {
    if retention < Duration::from_secs(1) || retention > Duration::from_secs(366 * 24 * 3600) {
        return Err(ConfigError::InvalidSetting {
            setting: "retention",
            reason: format!("{retention:?} is outside 1 s ..= 366 days"),
        });
    }
    Ok(())
}

/// Refuses an outcome limit outside 1 ..= [`MAX_OUTCOME_BYTES`].
pub(crate) fn check_max_outcome_bytes(bytes: usize) -> Result<(), ConfigError> {
    if bytes == 0 || bytes > MAX_OUTCOME_BYTES {
        return Err(ConfigError::InvalidSetting {
            setting: "max_outcome_bytes",
            reason: format!("{bytes} is outside 1 ..= {MAX_OUTCOME_BYTES}"),
        });
    }
    Ok(())
}
