//! Creating the tables: unprotected for local development, tests and demos
//! ([`DynamoDbStore::create_table`]), protected for AWS ([`DynamoDbStore::create_tables`] with
//! [`TableProtection::production`]), as `template.yaml` deploys them.

use std::time::Duration;

use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, PointInTimeRecoverySpecification,
    ScalarAttributeType, SseSpecification, SseType, TimeToLiveSpecification,
};

use super::DynamoDbStore;
use super::error::map_sdk_error;
use crate::error::StoreError;

/// How long to wait for a new table to become active.
const ACTIVE_WAIT: Duration = Duration::from_secs(300);

/// How [`DynamoDbStore::create_tables`] protects the tables it creates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableProtection {
    deletion_protection: bool,
    point_in_time_recovery: bool,
    kms_key: Option<String>,
}

impl TableProtection {
    /// No protection: local servers and tests (a local server keeps no backups).
    pub fn none() -> Self {
        Self::default()
    }

    /// As `template.yaml` deploys them: deletion protection and point-in-time recovery on
    /// both tables (encryption: DynamoDB's default, unless [`Self::with_kms_key`]). Losing the idempotency table forgets every operation in flight and within
    /// retention (each runs again on its next delivery); losing the uniqueness table forgets
    /// what ran for good.
    pub fn production() -> Self {
        Self {
            deletion_protection: true,
            point_in_time_recovery: true,
            kms_key: None,
        }
    }

    /// Encrypts both tables with the customer-managed KMS key `key` (its ARN, id or alias):
    /// the functions then need its use through DynamoDB.
    pub fn with_kms_key(mut self, key: impl Into<String>) -> Self {
        self.kms_key = Some(key.into());
        self
    }
}

impl DynamoDbStore {
    /// Creates the idempotency table with this store's key schema (on-demand billing, TTL on
    /// the retention attribute) and, when configured, the uniqueness table (no TTL), then waits
    /// until they are active; unprotected ([`TableProtection::none`]), for local work: in AWS,
    /// deploy them from a template or use [`DynamoDbStore::create_tables`].
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// store.create_table().await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(&self) -> Result<(), StoreError> {
        self.create_tables(&TableProtection::none()).await
    }

    /// [`DynamoDbStore::create_table`] with `protection`: deletion protection at creation,
    /// point-in-time recovery once the table is active (`UpdateContinuousBackups`), a
    /// customer-managed key.
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// use lambda_idempotency::store::TableProtection;
    ///
    /// store.create_tables(&TableProtection::production()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_tables(&self, protection: &TableProtection) -> Result<(), StoreError> {
        let names = &self.names;
        let sort_key = names.sort_key.as_ref().map(|sort| sort.attribute.as_str());
        let idempotency = NewTable {
            name: &self.table,
            partition_key: &names.partition_key,
            sort_key,
            ttl: Some(&names.expires_at),
        };
        self.create_one(&idempotency, protection).await?;
        if let Some(uniqueness) = &self.uniqueness_table {
            let uniqueness = NewTable {
                name: uniqueness,
                partition_key: "pk",
                sort_key: None,
                ttl: None,
            };
            self.create_one(&uniqueness, protection).await?;
        }
        Ok(())
    }

    async fn create_one(
        &self,
        new: &NewTable<'_>,
        protection: &TableProtection,
    ) -> Result<(), StoreError> {
        let NewTable {
            name: table,
            partition_key,
            sort_key,
            ttl,
        } = *new;
        let sse = protection.kms_key.as_ref().map(|key| {
            SseSpecification::builder()
                .enabled(true)
                .sse_type(SseType::Kms)
                .kms_master_key_id(key)
                .build()
        });
        let mut request = self
            .client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(string_attribute(partition_key)?)
            .key_schema(key_element(partition_key, KeyType::Hash)?)
            .set_sse_specification(sse);
        if protection.deletion_protection {
            request = request.deletion_protection_enabled(true);
        }
        if let Some(sort_key) = sort_key {
            request = request
                .attribute_definitions(string_attribute(sort_key)?)
                .key_schema(key_element(sort_key, KeyType::Range)?);
        }
        request
            .send()
            .await
            .map_err(|err| map_sdk_error("create_table", table, err))?;
        self.client
            .wait_until_table_exists()
            .table_name(table)
            .wait(ACTIVE_WAIT)
            .await
            .map_err(|err| StoreError::Unavailable {
                operation: "create_table",
                source: Box::new(err),
            })?;
        if let Some(ttl) = ttl {
            self.enable_ttl(table, ttl).await?;
        }
        if protection.point_in_time_recovery {
            self.enable_point_in_time_recovery(table).await?;
        }
        Ok(())
    }

    /// TTL on `ttl`, the retention attribute.
    async fn enable_ttl(&self, table: &str, ttl: &str) -> Result<(), StoreError> {
        let ttl = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(ttl)
            .build()
            .map_err(|err| rejected(err.to_string()))?;
        self.client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(ttl)
            .send()
            .await
            .map_err(|err| map_sdk_error("update_time_to_live", table, err))?;
        Ok(())
    }

    /// Point-in-time recovery, retried while DynamoDB still sets up a new table's backups
    /// (`ContinuousBackupsUnavailableException`, for a while after creation).
    async fn enable_point_in_time_recovery(&self, table: &str) -> Result<(), StoreError> {
        let recovery = PointInTimeRecoverySpecification::builder()
            .point_in_time_recovery_enabled(true)
            .build()
            .map_err(|err| rejected(err.to_string()))?;
        let started = std::time::Instant::now();
        let mut pause = Duration::from_secs(1);
        loop {
            let sent = self
                .client
                .update_continuous_backups()
                .table_name(table)
                .point_in_time_recovery_specification(recovery.clone())
                .send()
                .await;
            let err = match sent {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            let not_yet = err
                .as_service_error()
                .is_some_and(|service| service.is_continuous_backups_unavailable_exception());
            if !not_yet || started.elapsed() >= ACTIVE_WAIT {
                return Err(map_sdk_error("update_continuous_backups", table, err));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(15));
        }
    }
}

/// A table to create: its name, key schema and TTL attribute.
#[derive(Clone, Copy)]
struct NewTable<'a> {
    name: &'a str,
    partition_key: &'a str,
    sort_key: Option<&'a str>,
    ttl: Option<&'a str>,
}

fn string_attribute(name: &str) -> Result<AttributeDefinition, StoreError> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(|err| rejected(err.to_string()))
}

fn key_element(name: &str, key_type: KeyType) -> Result<KeySchemaElement, StoreError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .map_err(|err| rejected(err.to_string()))
}

fn rejected(message: String) -> StoreError {
    StoreError::Rejected {
        operation: "create_table",
        message,
    }
}
