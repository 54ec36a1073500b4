//! The engine over the DynamoDB tables the environment names.

use super::Idempotency;

impl Idempotency {
    /// An engine over the DynamoDB tables the environment names
    /// ([`DynamoDbStore::from_env`](crate::DynamoDbStore::from_env): `IDEMPOTENCY_TABLE`, optionally `UNIQUENESS_TABLE` and
    /// `DYNAMODB_ENDPOINT`), with the default [`Config`](crate::Config).
    ///
    /// # Errors
    /// [`ConfigError`](crate::ConfigError) when `IDEMPOTENCY_TABLE` is unset.
    #[cfg(feature = "from-env")]
    #[cfg_attr(docsrs, doc(cfg(feature = "from-env")))]
    pub async fn from_env() -> Result<Self, crate::ConfigError> {
        Ok(Self::new(crate::DynamoDbStore::from_env().await?))
    }
}
