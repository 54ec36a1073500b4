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
    /// Creates the table with this store's key schema (on-demand billing) and enables TTL on
    /// the retention attribute, then waits until it is active.
    ///
    /// ```no_run
    /// # async fn demo(store: lambda_idempotency::store::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// store.create_table().await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let names = &self.names;
        let mut request = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(string_attribute(&names.partition_key)?)
            .key_schema(key_element(&names.partition_key, KeyType::Hash)?);
        if let Some(sort) = &names.sort_key {
            request = request
                .attribute_definitions(string_attribute(&sort.attribute)?)
                .key_schema(key_element(&sort.attribute, KeyType::Range)?);
        }
        request
            .send()
            .await
            .map_err(|err| map_sdk_error("create_table", &self.table, err))?;
        self.client
            .wait_until_table_exists()
            .table_name(&self.table)
            .wait(ACTIVE_WAIT)
            .await
            .map_err(|err| StoreError::Unavailable {
                operation: "create_table",
                source: Box::new(err),
            })?;
        let ttl = TimeToLiveSpecification::builder()
            .enabled(true)
            .attribute_name(&names.expires_at)
            .build()
            .map_err(|err| rejected(err.to_string()))?;
        self.client
            .update_time_to_live()
            .table_name(&self.table)
            .time_to_live_specification(ttl)
            .send()
            .await
            .map_err(|err| map_sdk_error("update_time_to_live", &self.table, err))?;
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
