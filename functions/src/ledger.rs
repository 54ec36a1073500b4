//! The examples' business effect: a ledger table where applying an entry increments its
//! `applied` counter. An entry applied twice shows `applied = 2`: duplicates cannot hide.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};

/// The environment variable naming the ledger table.
pub const LEDGER_TABLE_VAR: &str = "LEDGER_TABLE";

/// A ledger of effects in a DynamoDB table (`pk` string key).
#[derive(Debug, Clone)]
pub struct Ledger {
    client: Client,
    table: String,
}

impl Ledger {
    /// The ledger in `table`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// The ledger in the table named by `LEDGER_TABLE`.
    pub fn from_env(client: Client) -> Result<Self, String> {
        let table = crate::settings::required(LEDGER_TABLE_VAR, "the ledger table's name")?;
        Ok(Self::new(client, table))
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The client it writes with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the table (local runs).
    pub async fn create(&self) -> Result<(), aws_sdk_dynamodb::Error> {
        self.client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("pk")
                    .attribute_type(ScalarAttributeType::S)
                    .build()?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("pk")
                    .key_type(KeyType::Hash)
                    .build()?,
            )
            .send()
            .await?;
        Ok(())
    }

    /// Applies `entry` once more, recording `detail`; returns how often it has been applied.
    pub async fn apply(&self, entry: &str, detail: &str) -> Result<u64, aws_sdk_dynamodb::Error> {
        let output = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(entry.to_owned()))
            .update_expression("ADD applied :one SET detail = :detail")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .expression_attribute_values(":detail", AttributeValue::S(detail.to_owned()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await?;
        Ok(applied(output.attributes()))
    }

    /// How often `entry` has been applied.
    pub async fn count(&self, entry: &str) -> Result<u64, aws_sdk_dynamodb::Error> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(entry.to_owned()))
            .consistent_read(true)
            .send()
            .await?;
        Ok(applied(output.item()))
    }
}

/// The `applied` counter of an item (0 when the entry was never applied).
fn applied(item: Option<&std::collections::HashMap<String, AttributeValue>>) -> u64 {
    item.and_then(|item| item.get("applied"))
        .and_then(|value| value.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or_default()
}
