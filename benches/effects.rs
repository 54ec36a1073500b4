//! What effects inside the protocol cost, side by side in one run, on the embedded DynamoDB
//! server over loopback HTTP (or `DYNAMODB_ENDPOINT`):
//!
//! - requests per operation for a handler without steps, with 1, 2 and 3 steps (each step's
//!   result merged into the next write), the unmerged count for comparison, and a
//!   transactional step (an order put and an outbox event with the step's record);
//! - the record's size once settled, which sets the write units of every write and of each
//!   duplicate's failed claim;
//! - latency medians (interleaved sample by sample) of the same handlers;
//! - the relay's events per second, publishing to moto's SQS on loopback (moto bounds it).
//!
//! ```text
//! cargo bench --bench effects --features testing,relay
//! ```

use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use lambda_idempotency::effects::relay::{Publisher, relay};
use lambda_idempotency::effects::{Destination, Outbox, OutboxEvent, Transaction};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::local::unique_table_name;
use lambda_idempotency::{
    BoxError, ExecutionContext, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use lambda_runtime::tower::{Service, ServiceExt};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::json;

const SAMPLES: usize = 200;
const RELAYED_EVENTS: usize = 200;

/// The handlers compared.
#[derive(Debug, Clone, Copy)]
enum Handler {
    Plain,
    Steps(usize),
    Transactional,
}

impl Handler {
    fn label(self) -> String {
        match self {
            Self::Plain => "no step".into(),
            Self::Steps(n) => format!("{n} step{}", if n == 1 { "" } else { "s" }),
            Self::Transactional => "1 transactional step (order + outbox event)".into(),
        }
    }
}

struct Rig {
    db: Dynamo,
    idem: Idempotency,
    orders: String,
    outbox: Outbox,
}

impl Rig {
    async fn run(&self, handler: Handler, n: usize) -> Result<(), BoxError> {
        let key = OperationKey::derive(&scope_of(handler)?, None, &format!("o-{n}"))?;
        let invocation = Invocation::new(key, Fingerprint::of(&n)?, Duration::from_secs(30));
        let (orders, outbox) = (self.orders.clone(), self.outbox.clone());
        self.idem
            .execute(&invocation, |ctx: ExecutionContext| async move {
                match handler {
                    Handler::Plain => Ok::<_, BoxError>(json!({"id": n})),
                    Handler::Steps(count) => {
                        for step in 0..count {
                            let _: String = ctx
                                .step(format!("step-{step}"))
                                .run(|key| async move { Ok::<_, BoxError>(key[..16].to_owned()) })
                                .await?;
                        }
                        Ok(json!({"id": n}))
                    }
                    Handler::Transactional => {
                        let placed: String = ctx
                            .step("place")
                            .transact(|_key| async move {
                                let put = Put::builder()
                                    .table_name(&orders)
                                    .item("pk", AttributeValue::S(format!("o-{n}")))
                                    .condition_expression("attribute_not_exists(pk)")
                                    .build()?;
                                let event = OutboxEvent::new(
                                    "order-placed",
                                    Destination::Sqs {
                                        queue_url: "http://127.0.0.1/000000000000/orders".into(),
                                    },
                                    &json!({"order_id": n}),
                                )?;
                                Ok::<_, BoxError>(
                                    Transaction::new(format!("o-{n}"))
                                        .put(put)
                                        .publish(&outbox, event),
                                )
                            })
                            .await?;
                        Ok(json!({"id": placed}))
                    }
                }
            })
            .await?;
        Ok(())
    }
}

/// Each handler's operations in a scope of their own.
fn scope_of(handler: Handler) -> Result<OperationScope, BoxError> {
    let name = format!("{handler:?}").replace(['(', ')'], "-");
    Ok(OperationScope::new("bench", name)?)
}

async fn create_table(db: &Dynamo, table: &str, streamed: bool) -> Result<(), BoxError> {
    let mut create = db
        .client
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

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let db = dynamo::start().await;
    let orders = unique_table_name("bench-orders");
    let outbox = unique_table_name("bench-outbox");
    create_table(&db, &orders, false).await?;
    create_table(&db, &outbox, true).await?;
    let idem = Idempotency::new(db.store()).with_recovery(Recovery::Steps);
    let rig = Rig {
        db,
        idem,
        orders,
        outbox: Outbox::new(outbox),
    };
    let handlers = [
        Handler::Plain,
        Handler::Steps(1),
        Handler::Steps(2),
        Handler::Steps(3),
        Handler::Transactional,
    ];

    println!("requests per operation (first execution), and the settled record's size");
    for (index, handler) in handlers.iter().enumerate() {
        let before = rig.db.requests.count();
        rig.run(*handler, 1_000_000 + index).await?;
        let requests = rig.db.requests.since(before);
        let unmerged = match handler {
            Handler::Steps(n) => format!(" (unmerged: {})", 2 + 2 * n),
            // A transaction bills 2 write units per KB of each item it writes.
            Handler::Transactional => " (the transaction: 3 items, 6 write units)".to_owned(),
            Handler::Plain => String::new(),
        };
        let key = OperationKey::derive(
            &scope_of(*handler)?,
            None,
            &format!("o-{}", 1_000_000 + index),
        )?;
        let item = rig
            .db
            .client
            .get_item()
            .table_name(&rig.db.table)
            .key("pk", AttributeValue::S(key.to_string()))
            .send()
            .await?;
        let size = item.item().map_or(0, dynamo::item_size);
        println!(
            "  {:<46} {} requests{unmerged}: {}; record {size} B ({} write unit{} a write)",
            handler.label(),
            requests.len(),
            requests.join(" + "),
            size.div_ceil(1024),
            if size.div_ceil(1024) == 1 { "" } else { "s" },
        );
    }

    println!("\nlatency on the embedded server ({SAMPLES} samples each, interleaved)");
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); handlers.len()];
    for n in 0..SAMPLES {
        for (index, handler) in handlers.iter().enumerate() {
            let started = Instant::now();
            rig.run(*handler, n).await?;
            samples[index].push(started.elapsed());
        }
    }
    let plain = median(samples[0].clone());
    for (handler, samples) in handlers.iter().zip(samples) {
        let median = median(samples);
        println!(
            "  {:<46} median {:>8.1} µs  ({:+.1} µs over no step, x{:.2})",
            handler.label(),
            micros(median),
            micros(median) - micros(plain),
            median.as_secs_f64() / plain.as_secs_f64()
        );
    }

    // The relay: one outbox event per operation, read back from the stream in batches of 100
    // as an event source mapping delivers them, published to moto's SQS.
    let moto = match lambda_idempotency::testing::moto::start().await {
        Ok(moto) => moto,
        Err(err) => {
            println!("\nrelay: skipped ({err})");
            return Ok(());
        }
    };
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config());
    let queue = sqs
        .create_queue()
        .queue_name(unique_table_name("bench"))
        .send()
        .await?
        .queue_url()
        .unwrap_or_default()
        .to_owned();
    let publisher_outbox = Outbox::new(unique_table_name("bench-relay-outbox"));
    create_table(&rig.db, publisher_outbox.table(), true).await?;
    for n in 0..RELAYED_EVENTS {
        let scope = OperationScope::new("bench", "relayed")?;
        let key = OperationKey::derive(&scope, None, &format!("e-{n}"))?;
        let invocation = Invocation::new(key, Fingerprint::of(&n)?, Duration::from_secs(30));
        let (outbox, queue) = (publisher_outbox.clone(), queue.clone());
        rig.idem
            .execute(&invocation, |ctx: ExecutionContext| async move {
                ctx.step("publish")
                    .transact(|_key| async move {
                        let event = OutboxEvent::new(
                            "placed",
                            Destination::Sqs { queue_url: queue },
                            &json!({"n": n}),
                        )?;
                        Ok::<_, BoxError>(Transaction::new(n).publish(&outbox, event))
                    })
                    .await
            })
            .await?;
    }
    let records = stream(&rig.db.endpoint, publisher_outbox.table()).await?;
    let mut service = relay(
        Idempotency::new(rig.db.store()),
        OperationScope::new("bench", "relay")?,
        Publisher::from_conf(&moto.sdk_config()),
    );
    let started = Instant::now();
    let mut relayed = 0;
    for batch in records.chunks(100) {
        let event: DynamoDbEvent = serde_json::from_value(json!({"Records": batch}))?;
        let answer = service
            .ready()
            .await?
            .call(LambdaEvent::new(event, Context::default()))
            .await?;
        relayed += batch.len() - answer.batch_item_failures.len();
    }
    let elapsed = started.elapsed();
    println!(
        "\nrelay: {relayed} events in {:.2} s: {:.0} events/s (publishing to moto's SQS on loopback, which bounds it)",
        elapsed.as_secs_f64(),
        relayed as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// The stream's records as the Lambda event's JSON.
async fn stream(endpoint: &str, table: &str) -> Result<Vec<serde_json::Value>, BoxError> {
    use aws_sdk_dynamodbstreams::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_dynamodbstreams::types::{AttributeValue as StreamValue, ShardIteratorType};
    let streams = aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "static"))
            .build(),
    );
    let image = |image: Option<&std::collections::HashMap<String, StreamValue>>| {
        serde_json::Value::Object(
            image
                .into_iter()
                .flatten()
                .filter_map(|(name, value)| {
                    let value = match value {
                        StreamValue::S(text) => json!({"S": text}),
                        StreamValue::N(number) => json!({"N": number}),
                        _ => return None,
                    };
                    Some((name.clone(), value))
                })
                .collect(),
        )
    };
    let listed = streams.list_streams().table_name(table).send().await?;
    let arn = listed
        .streams()
        .first()
        .and_then(|stream| stream.stream_arn())
        .ok_or("no stream")?
        .to_owned();
    let described = streams.describe_stream().stream_arn(&arn).send().await?;
    let mut records = Vec::new();
    for shard in described
        .stream_description()
        .map(|description| description.shards())
        .unwrap_or_default()
    {
        let mut iterator = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard.shard_id().unwrap_or_default())
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await?
            .shard_iterator()
            .map(str::to_owned);
        while let Some(current) = iterator {
            let page = streams.get_records().shard_iterator(current).send().await?;
            if page.records().is_empty() {
                break;
            }
            for record in page.records() {
                let change = record.dynamodb().ok_or("no change")?;
                records.push(json!({
                    "eventID": record.event_id(),
                    "eventName": record.event_name().map(|name| name.as_str()),
                    "eventSource": "aws:dynamodb",
                    "eventVersion": "1.1",
                    "awsRegion": "us-east-1",
                    "eventSourceARN": arn,
                    "dynamodb": {
                        "Keys": image(change.keys()),
                        "NewImage": image(change.new_image()),
                        "SequenceNumber": change.sequence_number(),
                        "SizeBytes": change.size_bytes(),
                    },
                }));
            }
            iterator = page.next_shard_iterator().map(str::to_owned);
        }
    }
    Ok(records)
}
