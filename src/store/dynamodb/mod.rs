//! The DynamoDB store: each primitive is one conditional request.
//!
//! | primitive | request | condition |
//! |---|---|---|
//! | claim | `PutItem`, `ReturnValues=ALL_OLD`, `ReturnValuesOnConditionCheckFailure=ALL_OLD` | `attribute_not_exists(pk) OR expires_at < :now_s OR (status = IN_PROGRESS AND lease_expires_at_ms < :now_ms AND fingerprint = :fp)` |
//! | settle | `UpdateItem` | `status = IN_PROGRESS AND lease_token = :mine` |
//! | release | `DeleteItem` | same |
//! | set_attempt | `UpdateItem` | same |
//! | get | `GetItem`, strongly consistent | — |
//!
//! A duplicate costs one request: the failed claim returns the existing record.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use lambda_idempotency::store::DynamoDbStore;
//!
//! // IDEMPOTENCY_TABLE names the table; DYNAMODB_ENDPOINT, when set, points at a local server.
//! let store = DynamoDbStore::from_env().await?;
//!
//! // Or with a client of your own:
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
//! # Ok(()) }
//! ```

mod error;
mod item;
mod table;

use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

pub use item::{AttributeNames, SortKey};

use self::error::map_sdk_error;
use self::item::{Item, millis, n, s, secs};
use crate::error::{ConfigError, StoreError};
use crate::key::OperationKey;
use crate::record::{Record, Settlement, Status};
use crate::store::{Claim, Fence, Store};

/// The environment variable naming the idempotency table.
pub const TABLE_VAR: &str = "IDEMPOTENCY_TABLE";
/// The environment variable that, when set, points the client at a DynamoDB-compatible endpoint.
pub const ENDPOINT_VAR: &str = "DYNAMODB_ENDPOINT";

/// The fence shared by settle, release and set_attempt.
const FENCE: &str = "#status = :in_progress AND #lease_token = :mine";

/// Records in a DynamoDB table (`pk` string key, TTL on `expires_at` by default).
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: String,
    names: AttributeNames,
}

impl DynamoDbStore {
    /// A store on `table` through `client`, with the default attribute names.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            names: AttributeNames::default(),
        }
    }

    /// A store on the table named by `IDEMPOTENCY_TABLE`, with the default AWS configuration;
    /// `DYNAMODB_ENDPOINT`, when set, overrides the endpoint (a local DynamoDB-compatible server).
    pub async fn from_env() -> Result<Self, ConfigError> {
        let table = std::env::var(TABLE_VAR).map_err(|_| ConfigError::MissingEnv {
            name: TABLE_VAR,
            hint: "set it to the idempotency table's name (template.yaml outputs it)",
        })?;
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Ok(endpoint) = std::env::var(ENDPOINT_VAR) {
            loader = loader.endpoint_url(endpoint);
        }
        Ok(Self::new(Client::new(&loader.load().await), table))
    }

    /// Renames the attributes (the key and TTL attributes must match the table).
    pub fn with_attribute_names(mut self, names: AttributeNames) -> Self {
        self.names = names;
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The names and values of the fence condition.
    fn fence(
        &self,
        lease_token: &str,
    ) -> (HashMap<String, String>, HashMap<String, AttributeValue>) {
        let names = HashMap::from([
            ("#status".to_owned(), self.names.status.clone()),
            ("#lease_token".to_owned(), self.names.lease_token.clone()),
        ]);
        let values = HashMap::from([
            (":in_progress".to_owned(), s(Status::InProgress.as_str())),
            (":mine".to_owned(), s(lease_token)),
        ]);
        (names, values)
    }

    /// The answer to a fenced write: a failed condition means the lease is lost.
    fn fence_answer<O, E>(
        &self,
        operation: &'static str,
        result: Result<O, SdkError<E, HttpResponse>>,
    ) -> Result<Fence, StoreError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        E: AsConditionFailure,
    {
        match result {
            Ok(_) => Ok(Fence::Held),
            Err(err) => match err
                .as_service_error()
                .and_then(AsConditionFailure::condition_failure)
            {
                Some(failed) => Ok(Fence::Lost {
                    current: self.decode_current(failed.item())?,
                }),
                None => Err(map_sdk_error(operation, &self.table, err)),
            },
        }
    }

    fn decode_current(&self, item: Option<&Item>) -> Result<Option<Record>, StoreError> {
        item.filter(|item| !item.is_empty())
            .map(|item| self.names.decode(item))
            .transpose()
    }

    /// Runs a fenced `UpdateItem` that sets `assignments` (`SET ...` with its own values).
    async fn fenced_update(
        &self,
        operation: &'static str,
        key: &OperationKey,
        lease_token: &str,
        update: &str,
        names: HashMap<String, String>,
        values: HashMap<String, AttributeValue>,
    ) -> Result<Fence, StoreError> {
        let (mut all_names, mut all_values) = self.fence(lease_token);
        all_names.extend(names);
        all_values.extend(values);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.names.key(key)))
            .update_expression(update)
            .condition_expression(FENCE)
            .set_expression_attribute_names(Some(all_names))
            .set_expression_attribute_values(Some(all_values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        self.fence_answer(operation, result)
    }
}

impl Store for DynamoDbStore {
    async fn claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        let names = HashMap::from([
            ("#pk".to_owned(), self.names.partition_key.clone()),
            ("#status".to_owned(), self.names.status.clone()),
            ("#expires_at".to_owned(), self.names.expires_at.clone()),
            (
                "#lease_expires_at".to_owned(),
                self.names.lease_expires_at.clone(),
            ),
            ("#fingerprint".to_owned(), self.names.fingerprint.clone()),
        ]);
        let values = HashMap::from([
            (":now_s".to_owned(), secs(now)),
            (":now_ms".to_owned(), millis(now)),
            (":in_progress".to_owned(), s(Status::InProgress.as_str())),
            (":fp".to_owned(), s(record.fingerprint.as_str())),
        ]);
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(self.names.encode(record)))
            .condition_expression(
                "attribute_not_exists(#pk) OR #expires_at < :now_s \
                 OR (#status = :in_progress AND #lease_expires_at < :now_ms AND #fingerprint = :fp)",
            )
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(output) => Ok(Claim::Acquired {
                previous: self.decode_current(output.attributes())?,
            }),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    let existing = self.decode_current(failed.item())?.ok_or_else(|| {
                        StoreError::CorruptRecord {
                            key_short: record.key.short().to_owned(),
                            reason:
                                "the claim's condition failed but no existing item was returned"
                                    .into(),
                        }
                    })?;
                    Ok(Claim::Existing(existing))
                }
                _ => Err(map_sdk_error("claim", &self.table, err)),
            },
        }
    }

    async fn set_attempt(
        &self,
        key: &OperationKey,
        lease_token: &str,
        attempt: u32,
    ) -> Result<Fence, StoreError> {
        self.fenced_update(
            "set_attempt",
            key,
            lease_token,
            "SET #attempt = :attempt",
            HashMap::from([("#attempt".to_owned(), self.names.attempt.clone())]),
            HashMap::from([(":attempt".to_owned(), n(u64::from(attempt)))]),
        )
        .await
    }

    async fn settle(
        &self,
        key: &OperationKey,
        lease_token: &str,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        let outcome = AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(
            settlement.outcome.clone(),
        ));
        self.fenced_update(
            "settle",
            key,
            lease_token,
            "SET #status = :status, #outcome = :outcome, #expires_at = :expires_at, #completed_at = :completed_at",
            HashMap::from([
                ("#outcome".to_owned(), self.names.outcome.clone()),
                ("#expires_at".to_owned(), self.names.expires_at.clone()),
                ("#completed_at".to_owned(), self.names.completed_at.clone()),
            ]),
            HashMap::from([
                (":status".to_owned(), s(settlement.status.as_str())),
                (":outcome".to_owned(), outcome),
                (":expires_at".to_owned(), secs(settlement.expires_at)),
                (":completed_at".to_owned(), millis(settlement.completed_at)),
            ]),
        )
        .await
    }

    async fn release(&self, key: &OperationKey, lease_token: &str) -> Result<Fence, StoreError> {
        let (names, values) = self.fence(lease_token);
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.names.key(key)))
            .condition_expression(FENCE)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        self.fence_answer("release", result)
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<Record>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.names.key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|err| map_sdk_error("get", &self.table, err))?;
        self.decode_current(output.item())
    }
}

/// The operation errors whose condition can fail.
trait AsConditionFailure {
    fn condition_failure(&self) -> Option<&ConditionalCheckFailedException>;
}

impl AsConditionFailure for UpdateItemError {
    fn condition_failure(&self) -> Option<&ConditionalCheckFailedException> {
        match self {
            Self::ConditionalCheckFailedException(failed) => Some(failed),
            _ => None,
        }
    }
}

impl AsConditionFailure for DeleteItemError {
    fn condition_failure(&self) -> Option<&ConditionalCheckFailedException> {
        match self {
            Self::ConditionalCheckFailedException(failed) => Some(failed),
            _ => None,
        }
    }
}
