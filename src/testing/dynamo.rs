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
use lambda_idempotency::testing::conformance::{
    Capabilities, Capability, EffectTables, Fixture, Sweeper,
};

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
    /// What the endpoint offers: everything embedded; another endpoint is probed.
    pub capabilities: Capabilities,
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

    /// An empty [`MemoryStore`](crate::store::MemoryStore) that commits the handler's own
    /// writes into this embedded server's tables ([`MemoryStore::with_tables`](crate::store::MemoryStore::with_tables));
    /// `None` on another endpoint ([`embedded_with_clock`] always embeds).
    pub fn memory_store(&self) -> Option<crate::store::MemoryStore> {
        self.db.clone().map(crate::store::MemoryStore::with_tables)
    }

    /// Deletes the records expired by the shared clock, as DynamoDB TTL eventually does:
    /// dynoxide's `sweep_ttl` (every table), or on another endpoint [`sweep_table`] of the
    /// idempotency table.
    pub async fn sweep(&self) -> usize {
        match &self.db {
            Some(db) => db.sweep_ttl().expect("sweep_ttl"),
            None => sweep_table(&self.client, &self.table, "expires_at", self.clock.now()).await,
        }
    }
}

/// Deletes the items of `table` whose `ttl_attribute` (epoch seconds) is before `now`, as
/// DynamoDB TTL eventually does, for an endpoint that has no sweep of its own: a scan, then
/// a delete by the table's key. Returns how many it deleted.
pub async fn sweep_table(
    client: &Client,
    table: &str,
    ttl_attribute: &str,
    now: SystemTime,
) -> usize {
    let keys: Vec<String> = client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .expect("describe the swept table")
        .table
        .and_then(|description| description.key_schema)
        .unwrap_or_default()
        .into_iter()
        .map(|element| element.attribute_name)
        .collect();
    let expired: Vec<_> = client
        .scan()
        .table_name(table)
        .filter_expression("#ttl < :now")
        .expression_attribute_names("#ttl", ttl_attribute)
        .expression_attribute_values(":now", AttributeValue::N(epoch_secs(now).to_string()))
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .expect("scan for expired items");
    for item in &expired {
        let key = keys
            .iter()
            .filter_map(|name| Some((name.clone(), item.get(name)?.clone())))
            .collect();
        client
            .delete_item()
            .table_name(table)
            .set_key(Some(key))
            .send()
            .await
            .expect("delete an expired item");
    }
    expired.len()
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
    match configured_endpoint() {
        Some(endpoint) => open(endpoint, None, clock).await,
        None => embedded_with_clock(clock).await,
    }
}

/// An embedded server in this process, whatever `DYNAMODB_ENDPOINT` says, with fresh
/// tables: for a [`MemoryStore`](crate::store::MemoryStore) whose transactional writes go
/// to the handler's tables in it ([`Dynamo::memory_store`]), an in-process store throughout.
pub async fn embedded_with_clock(clock: ManualClock) -> Dynamo {
    let db = dynoxide::Database::memory_with_clock(Arc::new(SharedClock(clock.clone())))
        .expect("embedded database");
    let endpoint = local::serve(db.clone()).await.expect("serve");
    open(endpoint, Some(db), clock).await
}

/// Connects to `endpoint` (serving `db` when embedded) and creates fresh tables.
async fn open(endpoint: String, db: Option<dynoxide::Database>, clock: ManualClock) -> Dynamo {
    let requests = RequestLog::default();
    let client = Client::from_conf(
        local::config_for(endpoint.clone())
            .interceptor(requests.clone())
            .build(),
    );
    let table = local::unique_table_name("idempotency");
    let uniqueness_table = local::unique_table_name("uniqueness");
    let capabilities = match db {
        Some(_) => Capabilities::ALL,
        None => probed(&endpoint, &uniqueness_table).await,
    };
    let dynamo = Dynamo {
        client,
        table,
        uniqueness_table,
        requests,
        endpoint,
        capabilities,
        db,
        clock,
    };
    dynamo.store().create_table().await.expect("create tables");
    dynamo
}

/// What another endpoint offers: probed once per endpoint and process ([`probe`]).
async fn probed(endpoint: &str, scratch: &str) -> Capabilities {
    static PROBED: Mutex<Vec<(String, Capabilities)>> = Mutex::new(Vec::new());
    let known = |probed: &[(String, Capabilities)]| {
        probed
            .iter()
            .find(|(probed, _)| probed == endpoint)
            .map(|(_, capabilities)| *capabilities)
    };
    if let Some(capabilities) = known(&PROBED.lock().unwrap_or_else(PoisonError::into_inner)) {
        return capabilities;
    }
    let capabilities = probe(endpoint, scratch).await;
    PROBED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((endpoint.to_owned(), capabilities));
    capabilities
}

/// What another endpoint offers, found by trying it on a scratch table named `scratch`
/// (created and deleted here, on a client of its own so that no request log counts it):
/// a conditional transaction sent twice under one `ClientRequestToken` must be answered as
/// committed the second time ([`Capability::RequestTokens`]).
async fn probe(endpoint: &str, scratch: &str) -> Capabilities {
    let client = Client::from_conf(local::config_for(endpoint.to_owned()).build());
    let scratch = format!("{scratch}-probe");
    local::create_key_table(&client, &scratch, false)
        .await
        .expect("create the probe's table");
    let put = aws_sdk_dynamodb::types::Put::builder()
        .table_name(&scratch)
        .item("pk", AttributeValue::S("probe".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .expect("the probe's put");
    let send = || {
        client
            .transact_write_items()
            .transact_items(
                aws_sdk_dynamodb::types::TransactWriteItem::builder()
                    .put(put.clone())
                    .build(),
            )
            .client_request_token("lambda-idempotency-probe")
            .send()
    };
    send().await.expect("the probe's first transaction");
    let replayed = send().await.is_ok();
    let _ = client.delete_table().table_name(&scratch).send().await;
    match replayed {
        true => Capabilities::ALL,
        false => Capabilities::ALL.without(Capability::RequestTokens),
    }
}

/// An empty DynamoDB store on fresh tables whose clock (the server's too) starts at `start`,
/// with fresh tables of the handler's own beside it ([`EffectTables`]).
pub async fn fixture(start: SystemTime) -> Fixture<DynamoDbStore> {
    let clock = ManualClock::new(start);
    let dynamo = Arc::new(start_with_clock(clock.clone()).await);
    let store = dynamo.store();
    let capabilities = dynamo.capabilities;
    let tables = effect_tables(&dynamo.client).await;
    let sweep: Sweeper = Arc::new(move || {
        let dynamo = Arc::clone(&dynamo);
        Box::pin(async move { dynamo.sweep().await })
    });
    let fixture = Fixture::new(store, clock, sweep).with_capabilities(capabilities);
    // A handler's own writes re-sent after a lost answer would be applied twice where the
    // token is ignored: the simulation's transactional handlers then do not run.
    match capabilities.has(Capability::RequestTokens) {
        true => fixture.with_effect_tables(tables),
        false => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("no transactional handlers: the endpoint ignores ClientRequestToken");
            });
            fixture
        }
    }
}

/// An empty [`MemoryStore`](crate::store::MemoryStore) whose clock starts at `start`, with the
/// handler's own tables ([`EffectTables`]) on an embedded server in this process, where the
/// store commits their writes ([`MemoryStore::with_tables`](crate::store::MemoryStore::with_tables)):
/// the in-memory store with its transactional capability, and an outbox its relay reads.
pub async fn memory_fixture_with_tables(start: SystemTime) -> Fixture<crate::store::MemoryStore> {
    let clock = ManualClock::new(start);
    let dynamo = Arc::new(embedded_with_clock(clock.clone()).await);
    let store = dynamo
        .memory_store()
        .expect("an embedded server's database");
    let tables = effect_tables(&dynamo.client).await;
    let sweep: Sweeper = {
        let (store, clock) = (store.clone(), clock.clone());
        Arc::new(move || {
            let swept = store.sweep_expired(clock.now());
            let dynamo = Arc::clone(&dynamo);
            Box::pin(async move { swept + dynamo.sweep().await })
        })
    };
    Fixture::new(store, clock, sweep).with_effect_tables(tables)
}

/// Fresh tables of the handler's own (a key table and an outbox) through `client`.
async fn effect_tables(client: &Client) -> EffectTables {
    let tables = EffectTables {
        client: client.clone(),
        local: local::unique_table_name("local"),
        outbox: local::unique_table_name("outbox"),
    };
    local::create_key_table(&tables.client, &tables.local, false)
        .await
        .expect("create the handler's table");
    local::create_outbox_table(&tables.client, &tables.outbox)
        .await
        .expect("create the handler's outbox");
    tables
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
