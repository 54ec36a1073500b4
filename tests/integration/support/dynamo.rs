//! A DynamoDB-compatible endpoint for tests: `DYNAMODB_ENDPOINT` when set, else dynoxide started
//! in-process on 127.0.0.1:0, driven by the real SDK over HTTP.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};
use lambda_idempotency::store::{DynamoDbStore, ENDPOINT_VAR};

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
    /// The fresh table (`pk` string key).
    pub table: String,
    /// Every request the client sent.
    pub requests: RequestLog,
}

impl Dynamo {
    /// A store on the fresh table.
    pub fn store(&self) -> DynamoDbStore {
        DynamoDbStore::new(self.client.clone(), &self.table)
    }

    /// Creates another table with the given key attributes (`pk` and optionally `sk`).
    pub async fn create_table(&self, name: &str, sort_key: Option<&str>) {
        create_table(&self.client, name, "pk", sort_key).await;
    }
}

/// Starts (or connects to) the endpoint and creates a fresh table.
pub async fn start() -> Dynamo {
    let requests = RequestLog::default();
    let endpoint = match std::env::var(ENDPOINT_VAR) {
        Ok(endpoint) => endpoint,
        Err(_) => {
            let db = dynoxide::Database::memory().expect("in-memory dynoxide database");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let endpoint = format!("http://{}", listener.local_addr().expect("local address"));
            tokio::spawn(dynoxide::server::serve_on(listener, db));
            endpoint
        }
    };
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(
            std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        ))
        .credentials_provider(credentials())
        .endpoint_url(endpoint)
        .interceptor(requests.clone())
        .build();
    let client = Client::from_conf(config);
    let table = unique_name("idempotency");
    create_table(&client, &table, "pk", None).await;
    Dynamo {
        client,
        table,
        requests,
    }
}

/// Real credentials from the environment when given, else the placeholder a local server takes.
fn credentials() -> Credentials {
    match (
        std::env::var("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Ok(id), Ok(secret)) => Credentials::new(
            id,
            secret,
            std::env::var("AWS_SESSION_TOKEN").ok(),
            None,
            "env",
        ),
        _ => Credentials::new("test", "test", None, None, "static"),
    }
}

/// A table name unique across processes and tests, for a shared endpoint.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn create_table(client: &Client, name: &str, partition: &str, sort: Option<&str>) {
    let mut request = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute(partition))
        .key_schema(key(partition, KeyType::Hash));
    if let Some(sort) = sort {
        request = request
            .attribute_definitions(attribute(sort))
            .key_schema(key(sort, KeyType::Range));
    }
    request.send().await.expect("create table");
    client
        .wait_until_table_exists()
        .table_name(name)
        .wait(Duration::from_secs(120))
        .await
        .expect("table becomes active");
}

fn attribute(name: &str) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .expect("attribute definition")
}

fn key(name: &str, key_type: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .expect("key schema element")
}
