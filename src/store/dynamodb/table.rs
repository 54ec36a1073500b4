//! Creating the idempotency table: for local development, tests and demos. In AWS, deploy it
//! with `template.yaml` instead.

use std::time::Duration;

use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};

use super::DynamoDbStore;
use super::error::map_sdk_error;
use crate::error::StoreError;

/// How long to wait for a new table to become active.
const ACTIVE_WAIT: Duration = Duration::from_secs(300);

impl DynamoDbStore {
    /// Creates the idempotency table with this store's key schema (on-demand billing, TTL on
    /// the retention attribute) and, when configured, the uniqueness table (no TTL), then waits
    /// until they are active.
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// store.create_table().await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let names = &self.names;
        let sort_key = names.sort_key.as_ref().map(|sort| sort.attribute.as_str());
        self.create_one(
            &self.table,
            &names.partition_key,
            sort_key,
            Some(&names.expires_at),
        )
        .await?;
        if let Some(uniqueness) = &self.uniqueness_table {
            self.create_one(uniqueness, "pk", None, None).await?;
        }
        Ok(())
    }

    async fn create_one(
        &self,
        table: &str,
        partition_key: &str,
        sort_key: Option<&str>,
        ttl: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut request = self
            .client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(string_attribute(partition_key)?)
            .key_schema(key_element(partition_key, KeyType::Hash)?);
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
        let Some(ttl) = ttl else {
            return Ok(());
        };
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
