//! A DynamoDB-compatible endpoint on this machine, shared by the examples and the tests:
//! `DYNAMODB_ENDPOINT` when set (DynamoDB Local, a dynoxide binary, a real endpoint), else a
//! dynoxide server embedded in this process on 127.0.0.1:0.

// Shared by the examples and the tests; each uses only part of it.
#![allow(dead_code)]

use aws_sdk_dynamodb::config::{BehaviorVersion, Builder, Credentials, Region};
use lambda_idempotency::store::{DynamoDbStore, configured_endpoint};

/// An SDK configuration aimed at the endpoint; add interceptors, then `build()`.
pub async fn sdk_config() -> Result<Builder, lambda_idempotency::BoxError> {
    Ok(config_for(endpoint().await?))
}

/// The endpoint URL: `DYNAMODB_ENDPOINT` when set, else an embedded server started now.
pub async fn endpoint() -> Result<String, lambda_idempotency::BoxError> {
    Ok(match configured_endpoint() {
        Some(endpoint) => endpoint,
        None => serve(dynoxide::Database::memory()?).await?,
    })
}

/// A store on fresh tables named after `prefix` (idempotency and uniqueness), created on the
/// local endpoint.
pub async fn local_store(prefix: &str) -> Result<DynamoDbStore, lambda_idempotency::BoxError> {
    let client = aws_sdk_dynamodb::Client::from_conf(sdk_config().await?.build());
    let store = DynamoDbStore::new(client, unique_table_name(&format!("{prefix}-idempotency")))
        .with_uniqueness_table(unique_table_name(&format!("{prefix}-uniqueness")));
    store.create_table().await?;
    Ok(store)
}

/// Serves `db` on 127.0.0.1 (a free port) for as long as the Tokio runtime runs; returns the
/// endpoint URL.
pub async fn serve(db: dynoxide::Database) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tokio::spawn(dynoxide::server::serve_on(listener, db));
    Ok(endpoint)
}

/// An SDK configuration aimed at `endpoint`.
pub fn config_for(endpoint: String) -> Builder {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(
            std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        ))
        .credentials_provider(credentials())
        .endpoint_url(endpoint)
}

/// Credentials from the environment when given, else the placeholder a local server accepts.
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

/// Creates `table` with a `pk` string key (on demand), and a stream of new images when
/// `streamed`: the shape of the examples' ledgers (an outbox: [`create_outbox_table`]).
pub async fn create_key_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    streamed: bool,
) -> Result<(), lambda_idempotency::BoxError> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
        StreamSpecification, StreamViewType,
    };
    let mut create = client
        .create_table()
        .table_name(table)
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
        );
    if streamed {
        create = create.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()?,
        );
    }
    create.send().await?;
    Ok(())
}

/// Creates an outbox table as template.yaml declares it: a `pk` table with a stream of new
/// images and the sparse pending index ([`PENDING_INDEX`](lambda_idempotency::effects::PENDING_INDEX):
/// `pending` S, `created_at` N, all attributes projected).
///
/// # Errors
/// The SDK's error.
pub async fn create_outbox_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<(), lambda_idempotency::BoxError> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
        Projection, ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
    };
    let attribute = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
    };
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attribute("pk", ScalarAttributeType::S)?)
        .attribute_definitions(attribute("pending", ScalarAttributeType::S)?)
        .attribute_definitions(attribute("created_at", ScalarAttributeType::N)?)
        .key_schema(key("pk", KeyType::Hash)?)
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(lambda_idempotency::effects::PENDING_INDEX)
                .key_schema(key("pending", KeyType::Hash)?)
                .key_schema(key("created_at", KeyType::Range)?)
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::All)
                        .build(),
                )
                .build()?,
        )
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()?,
        )
        .send()
        .await?;
    Ok(())
}

/// A table name unique across processes, so runs can share one endpoint.
pub fn unique_table_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
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
