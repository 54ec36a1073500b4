//! A DynamoDB-compatible endpoint for tests, with fresh tables and a request log: `DYNAMODB_ENDPOINT` when set, else dynoxide started
//! in-process on 127.0.0.1:0, driven by the real SDK over HTTP.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::record::epoch_secs;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::store::configured_endpoint;
use lambda_idempotency::testing::conformance::{EffectTables, Fixture, Sweeper};

use super::local;

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

/// A running endpoint with fresh tables.
pub struct Dynamo {
    /// A client with the request log installed.
    pub client: Client,
    /// The fresh idempotency table (`pk` string key, TTL on `expires_at`).
    pub table: String,
    /// The fresh uniqueness table (`pk` string key, no TTL).
    pub uniqueness_table: String,
    /// Every request the client sent.
    pub requests: RequestLog,
    /// The endpoint URL, for other processes.
    pub endpoint: String,
    /// The embedded database (None with `DYNAMODB_ENDPOINT`).
    db: Option<dynoxide::Database>,
    clock: ManualClock,
}

impl std::fmt::Debug for Dynamo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dynamo")
            .field("table", &self.table)
            .field("uniqueness_table", &self.uniqueness_table)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Dynamo {
    /// A store on the fresh tables.
    pub fn store(&self) -> DynamoDbStore {
        DynamoDbStore::new(self.client.clone(), &self.table)
            .with_uniqueness_table(&self.uniqueness_table)
    }

    /// Deletes the records expired by the shared clock, as DynamoDB TTL eventually does:
    /// dynoxide's `sweep_ttl`, or a scan and delete on another endpoint.
    pub async fn sweep(&self) -> usize {
        if let Some(db) = &self.db {
            return db.sweep_ttl().expect("sweep_ttl");
        }
        let now = epoch_secs(self.clock.now());
        let items = self
            .client
            .scan()
            .table_name(&self.table)
            .filter_expression("expires_at < :now")
            .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
            .send()
            .await
            .expect("scan")
            .items
            .unwrap_or_default();
        for item in &items {
            self.client
                .delete_item()
                .table_name(&self.table)
                .key("pk", item["pk"].clone())
                .send()
                .await
                .expect("delete expired item");
        }
        items.len()
    }
}

/// The size DynamoDB bills for `item` (a write unit per started KB, a strongly consistent
/// read unit per started 4 KB): each attribute's name plus its value.
pub fn item_size(item: &std::collections::HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + lambda_idempotency::store::value_size(value))
        .sum()
}

/// Starts (or connects to) the endpoint and creates fresh tables; time from a fresh clock.
pub async fn start() -> Dynamo {
    start_with_clock(ManualClock::new(SystemTime::now())).await
}

/// Starts (or connects to) the endpoint and creates fresh tables. The embedded server reads
/// `clock` too, so that its TTL sweep agrees with the engine about what has expired.
pub async fn start_with_clock(clock: ManualClock) -> Dynamo {
    let (endpoint, db) = match configured_endpoint() {
        Some(endpoint) => (endpoint, None),
        None => {
            let db = dynoxide::Database::memory_with_clock(Arc::new(SharedClock(clock.clone())))
                .expect("embedded database");
            (local::serve(db.clone()).await.expect("serve"), Some(db))
        }
    };
    let requests = RequestLog::default();
    let client = Client::from_conf(
        local::config_for(endpoint.clone())
            .interceptor(requests.clone())
            .build(),
    );
    let table = local::unique_table_name("idempotency");
    let uniqueness_table = local::unique_table_name("uniqueness");
    let dynamo = Dynamo {
        client,
        table,
        uniqueness_table,
        requests,
        endpoint,
        db,
        clock,
    };
    dynamo.store().create_table().await.expect("create tables");
    dynamo
}

/// An empty DynamoDB store on fresh tables whose clock (the server's too) starts at `start`,
/// with fresh tables of the handler's own beside it ([`EffectTables`]).
pub async fn fixture(start: SystemTime) -> Fixture<DynamoDbStore> {
    let clock = ManualClock::new(start);
    let dynamo = Arc::new(start_with_clock(clock.clone()).await);
    let store = dynamo.store();
    let tables = EffectTables {
        client: dynamo.client.clone(),
        local: local::unique_table_name("local"),
        outbox: local::unique_table_name("outbox"),
    };
    for table in [&tables.local, &tables.outbox] {
        local::create_key_table(&tables.client, table, false)
            .await
            .expect("create a table of the handler's");
    }
    let sweep: Sweeper = Arc::new(move || {
        let dynamo = Arc::clone(&dynamo);
        Box::pin(async move { dynamo.sweep().await })
    });
    Fixture::new(store, clock, sweep).with_effect_tables(tables)
}

/// Our manual clock, as dynoxide's clock.
struct SharedClock(ManualClock);

impl dynoxide::storage_backend::Clock for SharedClock {
    fn now_unix_secs(&self) -> u64 {
        epoch_secs(self.0.now())
    }

    fn now_unix_secs_f64(&self) -> f64 {
        self.0
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    }
}
