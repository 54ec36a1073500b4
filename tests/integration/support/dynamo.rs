//! A DynamoDB-compatible endpoint for tests: `DYNAMODB_ENDPOINT` when set, else dynoxide started
//! in-process on 127.0.0.1:0, driven by the real SDK over HTTP.

use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use lambda_idempotency::store::DynamoDbStore;

pub use super::local_dynamodb;

/// Counts the HTTP requests the SDK sends, by DynamoDB operation name.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    operations: Arc<Mutex<Vec<String>>>,
}

impl RequestLog {
    /// How many requests were sent so far.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// The operations sent since `from` (an earlier `count()`), e.g. `["PutItem", "UpdateItem"]`.
    pub fn since(&self, from: usize) -> Vec<String> {
        self.lock()[from..].to_vec()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.operations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Intercept for RequestLog {
    fn name(&self) -> &'static str {
        "RequestLog"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context
            .request()
            .headers()
            .get("x-amz-target")
            .unwrap_or("?");
        let operation = target.rsplit('.').next().unwrap_or(target).to_owned();
        self.lock().push(operation);
        Ok(())
    }
}

/// A running endpoint with a fresh table.
pub struct Dynamo {
    /// A client with the request log installed.
    pub client: Client,
    /// The fresh table (`pk` string key, TTL on `expires_at`).
    pub table: String,
    /// Every request the client sent.
    pub requests: RequestLog,
}

impl Dynamo {
    /// A store on the fresh table.
    pub fn store(&self) -> DynamoDbStore {
        DynamoDbStore::new(self.client.clone(), &self.table)
    }
}

/// Starts (or connects to) the endpoint and creates a fresh table.
pub async fn start() -> Dynamo {
    let requests = RequestLog::default();
    let config = local_dynamodb::sdk_config()
        .await
        .expect("endpoint")
        .interceptor(requests.clone())
        .build();
    let client = Client::from_conf(config);
    let table = local_dynamodb::unique_table_name("idempotency");
    DynamoDbStore::new(client.clone(), &table)
        .create_table()
        .await
        .expect("create table");
    Dynamo {
        client,
        table,
        requests,
    }
}
