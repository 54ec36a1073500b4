//! The demo's effects: a checkout in two steps whose worker crashes while e-mailing (the
//! charge replays, the uncertain e-mail is checked, nothing is sent twice), and an order
//! written with its outbox event in one transaction, whose stream delivers the event twice to
//! a consumer that runs once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::effects::{Checked, Destination, Outbox, OutboxEvent, Transaction};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::{
    BoxError, ExecutionContext, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use serde_json::{Value, json};

/// The mail provider: the messages it sent, by the key each was sent with.
#[derive(Clone, Default)]
struct Mailer(Arc<Mutex<Vec<String>>>);

impl Mailer {
    fn send(&self, key: &str) -> Result<String, BoxError> {
        let mut sent = self.0.lock().map_err(|_| "mailer poisoned")?;
        sent.push(key.to_owned());
        Ok(format!("mail-{}", &key[..8]))
    }

    fn sent(&self, key: &str) -> bool {
        self.0
            .lock()
            .is_ok_and(|sent| sent.iter().any(|k| k == key))
    }

    fn count(&self) -> usize {
        self.0.lock().map_or(0, |sent| sent.len())
    }
}

/// The checkout: charge (the provider deduplicates on the step's key), then e-mail (checked
/// after a crash). `crash_while_mailing`: the worker dies inside the send.
async fn checkout(
    ctx: ExecutionContext,
    charges: super::Ledger,
    mailer: Mailer,
    order: Value,
    crash_while_mailing: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<Value, BoxError> {
    let charged: Value = ctx
        .step("charge")
        .repeat_safe()
        .run(|_key| {
            let (charges, order, ctx) = (charges.clone(), order.clone(), ctx.clone());
            async move { charges.charge(&order, &ctx) }
        })
        .await?;
    let checker = mailer.clone();
    let mail: String = ctx
        .step("email")
        .checked_by(move |key: String| {
            let found = checker.sent(&key);
            async move {
                Ok::<_, BoxError>(match found {
                    true => Checked::Applied(format!("mail-{}", &key[..8])),
                    false => Checked::NotApplied,
                })
            }
        })
        .run(|key| async move {
            let sent = mailer.send(&key);
            if let Some(crashed) = crash_while_mailing {
                let _ = crashed.send(());
                std::future::pending::<()>().await;
            }
            sent
        })
        .await?;
    Ok(json!({"charged": charged["charged"], "mail": mail, "attempt": ctx.attempt()}))
}

/// Runs the effects part of the demo on `idem`'s store; returns the deliveries it made.
pub async fn run(
    idem: &Idempotency,
    clock: &ManualClock,
    charges: &super::Ledger,
    client: &aws_sdk_dynamodb::Client,
    endpoint: &str,
    mut delivery: usize,
) -> Result<usize, BoxError> {
    // Every effect of the checkout is a step: its steps decide a takeover.
    let steps = idem.clone().with_recovery(Recovery::Steps);
    let mailer = Mailer::default();
    let scope = OperationScope::new("demo", "checkout")?;
    let order = json!({"order_id": "o-7", "amount": 120});
    let key = OperationKey::derive(&scope, None, "o-7")?;
    let invocation = Invocation::new(key, Fingerprint::of(&order)?, super::LEASE);

    println!("-- o-7: a checkout in two steps; the worker crashes while e-mailing");
    let (crashed_tx, crashed_rx) = tokio::sync::oneshot::channel();
    let worker = tokio::spawn({
        let (steps, invocation, charges, mailer, order) = (
            steps.clone(),
            invocation.clone(),
            charges.clone(),
            mailer.clone(),
            order.clone(),
        );
        async move {
            steps
                .execute(&invocation, |ctx| {
                    checkout(ctx, charges, mailer, order, Some(crashed_tx))
                })
                .await
        }
    });
    crashed_rx.await?;
    drop(worker);
    delivery += 1;
    println!(
        "delivery {delivery:>2}  {:<34} -> (no answer)",
        "worker charges, crashes mid-e-mail"
    );
    clock.advance(super::LEASE + Duration::from_secs(1));
    let done = steps
        .execute(&invocation, |ctx| {
            checkout(ctx, charges.clone(), mailer.clone(), order.clone(), None)
        })
        .await?;
    delivery += 1;
    println!(
        "delivery {delivery:>2}  {:<34} -> EXECUTED {} (charge replayed, e-mail checked)",
        "o-7 redelivered after the lease",
        done.raw_json()
    );
    if mailer.count() != 1 {
        return Err("the e-mail was sent more than once".into());
    }

    println!(
        "-- o-8: an order and its order-placed event, in one transaction; the stream delivers the event twice"
    );
    let (orders, outbox) = (
        super::local_dynamodb::unique_table_name("demo-orders"),
        super::local_dynamodb::unique_table_name("demo-outbox"),
    );
    create_table(client, &orders, false).await?;
    create_table(client, &outbox, true).await?;
    let outbox = Outbox::new(outbox);
    let key = OperationKey::derive(&OperationScope::new("demo", "place-order")?, None, "o-8")?;
    let invocation = Invocation::new(key, Fingerprint::of(&"o-8")?, super::LEASE);
    let placed = steps
        .execute(&invocation, |ctx| {
            let (orders, outbox) = (orders.clone(), outbox.clone());
            async move {
                ctx.step("place")
                    .transact(|_key| async move {
                        let put = Put::builder()
                            .table_name(&orders)
                            .item("pk", AttributeValue::S("o-8".into()))
                            .condition_expression("attribute_not_exists(pk)")
                            .build()?;
                        let event = OutboxEvent::new(
                            "order-placed",
                            Destination::Sqs {
                                queue_url: "https://sqs.example/000000000000/orders".into(),
                            },
                            &json!({"order_id": "o-8"}),
                        )?;
                        Ok::<_, BoxError>(
                            Transaction::new(String::from("o-8"))
                                .put(put)
                                .publish(&outbox, event),
                        )
                    })
                    .await
            }
        })
        .await?;
    delivery += 1;
    println!(
        "delivery {delivery:>2}  {:<34} -> EXECUTED {}",
        "o-8 placed with its event",
        placed.raw_json()
    );
    // The outbox's stream, read as an event source mapping reads it, delivered twice.
    let events = stream_event_ids(endpoint, outbox.table()).await?;
    let consumed = AtomicUsize::new(0);
    let consumer = OperationScope::new("demo", "on-order-placed")?;
    for (copy, event_id) in events.iter().chain(events.iter()).enumerate() {
        // The id names the execution (its first claim's time): it differs from run to run.
        let key = OperationKey::derive(&consumer, None, event_id)?;
        let invocation = Invocation::new(key, Fingerprint::of(event_id)?, super::LEASE);
        let answer = idem
            .execute(&invocation, |_ctx| async {
                consumed.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(json!({"consumed": true}))
            })
            .await?;
        delivery += 1;
        let how = match answer.is_replay() {
            true => "replayed (handler not run)",
            false => "EXECUTED",
        };
        println!(
            "delivery {delivery:>2}  {:<34} -> {how}",
            format!("order-placed event, copy {}", copy + 1)
        );
    }
    if events.len() != 1 || consumed.load(Ordering::SeqCst) != 1 {
        return Err("the order-placed event was not consumed exactly once".into());
    }
    Ok(delivery)
}

/// A `pk` table, with a stream of new images when `streamed`.
async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    streamed: bool,
) -> Result<(), BoxError> {
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

/// The event ids the outbox table's stream holds.
async fn stream_event_ids(endpoint: &str, table: &str) -> Result<Vec<String>, BoxError> {
    use aws_sdk_dynamodbstreams::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_dynamodbstreams::types::ShardIteratorType;
    let streams = aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "static"))
            .build(),
    );
    let listed = streams.list_streams().table_name(table).send().await?;
    let arn = listed
        .streams()
        .first()
        .and_then(|stream| stream.stream_arn())
        .ok_or("the outbox has no stream")?
        .to_owned();
    let described = streams.describe_stream().stream_arn(&arn).send().await?;
    let mut ids = Vec::new();
    for shard in described
        .stream_description()
        .map(|description| description.shards())
        .unwrap_or_default()
    {
        let Some(shard_id) = shard.shard_id() else {
            continue;
        };
        let iterator = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await?;
        let Some(iterator) = iterator.shard_iterator() else {
            continue;
        };
        let page = streams
            .get_records()
            .shard_iterator(iterator)
            .send()
            .await?;
        for record in page.records() {
            let id = record
                .dynamodb()
                .and_then(|change| change.new_image())
                .and_then(|image| image.get("pk"))
                .and_then(|pk| pk.as_s().ok());
            ids.extend(id.cloned());
        }
    }
    Ok(ids)
}
