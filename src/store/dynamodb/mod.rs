//! The DynamoDB store: each primitive is one conditional request, or one transaction when the
//! operation keeps permanent evidence in the uniqueness table.
//!
//! | primitive | request | condition on the record |
//! |---|---|---|
//! | claim | `PutItem` (`TransactWriteItems` with the evidence `Put`, condition `attribute_not_exists(pk)`) | `attribute_not_exists(pk) OR (expires_at < :now_s AND status IN (COMPLETED, FAILED))` |
//! | adopt | `TransactWriteItems`: the record `Put` and an evidence `Update` conditioned on the orphan | same as claim |
//! | take_over | `UpdateItem`: new token, attempt, lease, retention | `status = IN_PROGRESS AND lease_token = :previous AND lease_expires_at_ms < :now_ms`, and the step list as read |
//! | settle | `UpdateItem` (+ evidence `Update` in one transaction) | `status = IN_PROGRESS AND lease_token = :mine` |
//! | release | `DeleteItem` (+ evidence `Delete` in one transaction) | same |
//! | shorten | `UpdateItem`: lease expiry | same |
//! | record_steps | `UpdateItem`: the step list | same |
//! | commit (of record_steps) | `TransactWriteItems`: the step list `Update` and the handler's own writes, with a `ClientRequestToken` | same, and the step it adds not in the list yet |
//! | commit (of settle) | `TransactWriteItems`: settle's writes and the handler's own, with a `ClientRequestToken` | same |
//! | get, evidence | `GetItem`, strongly consistent | — |
//!
//! Every conditional write asks for `ReturnValuesOnConditionCheckFailure=ALL_OLD`: a duplicate
//! costs one request, the failed claim returning the existing record, and a cancelled
//! transaction says which condition failed and what stood there.
//!
//! An outcome too large for a small record is kept compressed in part items beside it
//! ([`OutcomeStorage`]): a claim or takeover that finds such a record reads them (one more round
//! trip); a settlement, shortening or release whose fence is lost does not (the record it
//! returns has `outcome: None`, unless the record holds the very bytes that settlement wrote).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use lambda_idempotency::store::DynamoDbStore;
//!
//! // IDEMPOTENCY_TABLE names the table, UNIQUENESS_TABLE (optional) the permanent one;
//! // DYNAMODB_ENDPOINT, when set, points at a local server.
//! let store = DynamoDbStore::from_env().await?;
//!
//! // Or with a client of your own:
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency")
//!     .with_uniqueness_table("idempotency-uniqueness");
//! # Ok(()) }
//! ```

pub(crate) mod client;
mod commit;
mod decode;
mod error;
mod evidence;
mod init;
mod item;
mod outcome;
mod replication;
mod scan;
mod steps;
mod store;
mod stuck;
mod table;
mod writes;

use aws_sdk_dynamodb::Client;

#[cfg(feature = "from-env")]
pub use client::dynamodb_config;
pub use client::{ATTEMPT_TIMEOUT, OPERATION_TIMEOUT};
#[cfg(feature = "testing")]
pub(crate) use item::value_size;
pub use item::{AttributeNames, DYNAMODB_ITEM_LIMIT, SortKey};
pub use outcome::{OutcomeStorage, PART_BYTES, PART_TTL_MARGIN};
pub use replication::Replication;
pub use stuck::{Stuck, stuck_since};
pub use table::TableProtection;
/// What the memory store's transactional capability shares with this store's (feature
/// `testing`).
#[cfg(feature = "testing")]
pub(crate) use {commit::transaction_limits, error::map_cancellation};

use crate::error::StoreError;

/// The environment variable naming the idempotency table.
pub const TABLE_VAR: &str = "IDEMPOTENCY_TABLE";
/// The environment variable naming the uniqueness table (optional).
pub const UNIQUENESS_TABLE_VAR: &str = "UNIQUENESS_TABLE";
/// The environment variable that, when set, points the client at a DynamoDB-compatible endpoint.
pub const ENDPOINT_VAR: &str = "DYNAMODB_ENDPOINT";
/// The AWS SDKs' own variable for DynamoDB's endpoint, honoured beside [`ENDPOINT_VAR`].
pub const SDK_ENDPOINT_VAR: &str = "AWS_ENDPOINT_URL_DYNAMODB";
/// The AWS SDKs' variable for every service's endpoint.
const SDK_GLOBAL_ENDPOINT_VAR: &str = "AWS_ENDPOINT_URL";
/// The AWS SDKs' switch that ignores the two endpoint variables above.
const SDK_IGNORE_ENDPOINTS_VAR: &str = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS";

/// The DynamoDB endpoint the environment names, for the clients the crate builds without
/// aws-config ([`DynamoDbStore::for_lambda`], the tests' embedded-server fixtures):
/// [`ENDPOINT_VAR`] when set, else the SDKs' [`SDK_ENDPOINT_VAR`], else `AWS_ENDPOINT_URL`
/// (those two ignored, as the SDKs ignore them, when `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is
/// `true`); `None`: the Region's endpoint. With aws-config ([`dynamodb_config`]), the SDK reads
/// its own variables and profiles, and [`ENDPOINT_VAR`] overrides them the same way.
///
/// ```
/// // Nothing set in this process: the Region's endpoint.
/// # if std::env::var_os("DYNAMODB_ENDPOINT").is_none() && std::env::var_os("AWS_ENDPOINT_URL_DYNAMODB").is_none() && std::env::var_os("AWS_ENDPOINT_URL").is_none() {
/// assert_eq!(lambda_idempotency::store::configured_endpoint(), None);
/// # }
/// ```
pub fn configured_endpoint() -> Option<String> {
    endpoint_from(|name| std::env::var(name).ok())
}

/// [`configured_endpoint`] from the variables `var` reads.
fn endpoint_from(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    // Trimmed: a value pasted with a space or a newline names the same endpoint.
    let set = |name: &str| {
        var(name)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    };
    if let Some(endpoint) = set(ENDPOINT_VAR) {
        return Some(endpoint);
    }
    let ignored =
        var(SDK_IGNORE_ENDPOINTS_VAR).is_some_and(|value| value.eq_ignore_ascii_case("true"));
    if ignored {
        return None;
    }
    set(SDK_ENDPOINT_VAR).or_else(|| set(SDK_GLOBAL_ENDPOINT_VAR))
}

/// Records in a DynamoDB table (`pk` string key, TTL on `expires_at` by default), and optional
/// permanent evidence in a uniqueness table (`pk` string key, no TTL).
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: String,
    uniqueness_table: Option<String>,
    names: AttributeNames,
    outcomes: OutcomeStorage,
    unscoped_evidence: bool,
    accept_eventual: bool,
    prime_namespace: Option<String>,
    verdict: replication::Verdict,
    strong: replication::Strong,
    owed: replication::Owed,
}

impl DynamoDbStore {
    fn uniqueness(&self) -> Result<&str, StoreError> {
        self.uniqueness_table
            .as_deref()
            .ok_or(StoreError::NoUniquenessTable)
    }

    /// The not-found error for `table`, named by its role.
    fn not_found(&self, table: &str) -> StoreError {
        let table = table.to_owned();
        if self.uniqueness_table.as_deref() == Some(table.as_str()) {
            StoreError::UniquenessTableNotFound { table }
        } else {
            StoreError::TableNotFound { table }
        }
    }
}

#[cfg(test)]
mod endpoint_tests {
    use std::collections::HashMap;

    use super::endpoint_from;

    fn endpoint(vars: &[(&str, &str)]) -> Option<String> {
        let vars: HashMap<&str, &str> = vars.iter().copied().collect();
        endpoint_from(|name| vars.get(name).map(|value| (*value).to_owned()))
    }

    #[test]
    fn the_crates_variable_then_the_sdks_service_variable_then_the_global_one() {
        assert_eq!(endpoint(&[]), None);
        assert_eq!(
            endpoint(&[("AWS_ENDPOINT_URL", "http://global")]).as_deref(),
            Some("http://global")
        );
        assert_eq!(
            endpoint(&[
                ("AWS_ENDPOINT_URL", "http://global"),
                ("AWS_ENDPOINT_URL_DYNAMODB", "http://service")
            ])
            .as_deref(),
            Some("http://service")
        );
        assert_eq!(
            endpoint(&[
                ("AWS_ENDPOINT_URL_DYNAMODB", "http://service"),
                ("DYNAMODB_ENDPOINT", "http://crate")
            ])
            .as_deref(),
            Some("http://crate")
        );
        assert_eq!(
            endpoint(&[
                ("DYNAMODB_ENDPOINT", " "),
                ("AWS_ENDPOINT_URL_DYNAMODB", "http://service")
            ])
            .as_deref(),
            Some("http://service"),
            "a blank variable is unset"
        );
        assert_eq!(
            endpoint(&[("DYNAMODB_ENDPOINT", " http://127.0.0.1:8000\n")]).as_deref(),
            Some("http://127.0.0.1:8000"),
            "a value pasted with spaces is trimmed"
        );
    }

    #[test]
    fn the_sdks_switch_ignores_its_own_variables_only() {
        let ignored = ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true");
        assert_eq!(
            endpoint(&[ignored, ("AWS_ENDPOINT_URL_DYNAMODB", "http://service")]),
            None
        );
        assert_eq!(
            endpoint(&[ignored, ("DYNAMODB_ENDPOINT", "http://crate")]).as_deref(),
            Some("http://crate")
        );
    }
}
