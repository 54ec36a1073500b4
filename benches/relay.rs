//! The outbox relay's events per second, 0.4's and 0.5's side by side in one run, over the same
//! stream records: events committed on the embedded DynamoDB server (or `DYNAMODB_ENDPOINT`),
//! read from its stream in batches of 100 as an event source mapping delivers them, published
//! on loopback to moto's SQS, then to moto's EventBridge.
//!
//! - **0.4's relay**: one operation of the crate's batch door per record (a claim and a
//!   settlement on its own idempotency table) and one publish request per event.
//! - **0.5's relay** ([`relay`]): the batch's marks read in one `BatchGetItem`, the events
//!   published 10 to a `SendMessageBatch` (or a `PutEvents`), each event marked published.
//!
//! Each round commits fresh events to a fresh outbox table on a fresh embedded server (its
//! SQLite store slows every write as earlier rounds' tables and stream records accumulate: a
//! mark took 0.8 to 1.2 ms after six rounds against 0.4 ms on a fresh server, which DynamoDB's
//! per-request latency does not do; an earlier round's server stays in memory, idle; with
//! `DYNAMODB_ENDPOINT` set, every round uses that one server); the figures are the rounds'
//! medians.
//!
//! ```text
//! cargo bench --bench relay --features testing,relay [-- --events 500 --rounds 3]
//! ```

#[path = "../tests/common/streams.rs"]
mod streams;

use std::time::{Duration, Instant};

use aws_lambda_events::event::dynamodb::{Event as DynamoDbEvent, EventRecord as DynamoDbRecord};
use lambda_idempotency::effects::{
    Destination, Outbox, OutboxEvent, OutboxMarks, PublishedBy, Transaction,
};
use lambda_idempotency::lambda::relay::{Publisher, inserted, outbox_stream, relay};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::local::{create_outbox_table, unique_table_name};
use lambda_idempotency::{
    BoxError, ExecutionContext, Fingerprint, Idempotency, Invocation, Operation, OperationKey,
    OperationScope,
};
use lambda_runtime::tower::{Service, ServiceExt};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

/// Records per invocation, as the example stack's event source mapping delivers them.
const BATCH: usize = 100;

// Two workers: the embedded server's work (DynamoDB's, in production on other machines) need
// not wait for the relay's own thread.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let events = flag("--events").unwrap_or(500);
    let rounds = flag("--rounds").unwrap_or(3);
    let moto = match lambda_idempotency::testing::moto::start().await {
        Ok(moto) => moto,
        Err(err) => {
            println!("relay: skipped ({err})");
            return Ok(());
        }
    };
    let config = moto.sdk_config();
    let sqs = aws_sdk_sqs::Client::new(&config);
    let queue_name = unique_table_name("bench-relay");
    let queue = empty(&sqs, &queue_name).await?;
    let publisher = Publisher::from_conf(&config);
    aws_sdk_eventbridge::Client::new(&config)
        .create_event_bus()
        .name("bench")
        .send()
        .await?;
    let destinations = [
        (
            "moto's SQS (the queue emptied before each batch, outside the time measured)",
            Destination::Sqs {
                queue_url: queue.clone(),
            },
        ),
        (
            "moto's EventBridge (a bus without rules)",
            Destination::EventBridge {
                bus: "bench".into(),
                source: "bench.relay".into(),
                detail_type: "Placed".into(),
            },
        ),
    ];
    for (label, destination) in destinations {
        println!(
            "the relay to {label}: {events} events a round, {rounds} rounds, batches of {BATCH}"
        );
        let emptied =
            matches!(destination, Destination::Sqs { .. }).then_some((&sqs, queue_name.as_str()));
        let (mut old, mut new) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // A fresh server each round: see the module's docs.
            let db = dynamo::start().await;
            let outbox = Outbox::new(unique_table_name("bench-relay-outbox"));
            create_outbox_table(&db.client, outbox.table()).await?;
            commit(&db, &outbox, &destination, events).await?;
            let records: Vec<DynamoDbRecord> = serde_json::from_value(Value::Array(
                streams::stream_records(&db.endpoint, outbox.table()).await?,
            ))?;

            let ledger =
                DynamoDbStore::new(db.client.clone(), unique_table_name("bench-relay-ledger"));
            ledger.create_table().await?;
            let per_event = per_event_relay(Idempotency::new(ledger), publisher.clone());
            let old_rate = run(per_event, &records, emptied).await?;

            let batched = relay(
                publisher.clone(),
                OutboxMarks::new(db.client.clone(), &outbox),
            );
            let new_rate = run(batched, &records, emptied).await?;
            println!(
                "  round {round}: 0.4's relay {old_rate:.0} events/s, 0.5's batched relay {new_rate:.0} events/s (x{:.1})",
                new_rate / old_rate
            );
            old.push(old_rate);
            new.push(new_rate);
        }
        let (old, new) = (median(old), median(new));
        println!(
            "  medians: 0.4's relay {old:.0} events/s, 0.5's batched relay {new:.0} events/s: x{:.1}",
            new / old
        );
        breakdown(&dynamo::start().await, &destination, &publisher).await?;
    }
    Ok(())
}

/// Where 0.5's relay spends its time on [`BATCH`] fresh events, each part alone: the marks
/// read, the events published, the events marked one after another.
async fn breakdown(
    db: &Dynamo,
    destination: &Destination,
    publisher: &Publisher,
) -> Result<(), BoxError> {
    let outbox = Outbox::new(unique_table_name("bench-relay-parts"));
    create_outbox_table(&db.client, outbox.table()).await?;
    commit(db, &outbox, destination, BATCH).await?;
    let records: Vec<DynamoDbRecord> = serde_json::from_value(Value::Array(
        streams::stream_records(&db.endpoint, outbox.table()).await?,
    ))?;
    let events: Vec<_> = records.iter().filter_map(inserted).collect();
    let ids: Vec<&str> = events.iter().map(|event| event.id.as_str()).collect();
    let marks = OutboxMarks::new(db.client.clone(), &outbox);
    let started = Instant::now();
    marks.settled(&ids).await?;
    let read = started.elapsed();
    let started = Instant::now();
    for published in publisher.publish_batch(&events).await {
        published?;
    }
    let published = started.elapsed();
    let started = Instant::now();
    for id in &ids {
        marks
            .published(id, PublishedBy::Relay, std::time::SystemTime::now())
            .await?;
    }
    let marked = started.elapsed();
    println!(
        "  0.5's parts for {BATCH} events: marks read {:.1} ms, published {:.1} ms, marked {:.1} ms ({:.2} ms a mark)",
        millis(read),
        millis(published),
        millis(marked),
        millis(marked) / BATCH as f64
    );
    Ok(())
}

fn millis(spent: Duration) -> f64 {
    spent.as_secs_f64() * 1000.0
}

/// 0.4's relay, rebuilt from the crate's public parts: one operation per record (its claim
/// and settlement on `idem`'s table), one publish request per event, no mark.
fn per_event_relay(
    idem: Idempotency,
    publisher: Publisher,
) -> impl Service<
    LambdaEvent<DynamoDbEvent>,
    Response = aws_lambda_events::event::streams::DynamoDbEventResponse,
    Error = std::convert::Infallible,
> {
    let operation = Operation::new(
        idem.with_recovery(Recovery::Rerun),
        OperationScope::new("bench", "relay-0.4").expect("a valid scope"),
        outbox_stream(),
    );
    operation
        .batch()
        .service(move |record: DynamoDbRecord, _ctx| {
            let publisher = publisher.clone();
            let published: futures_util::future::BoxFuture<'static, Result<(), BoxError>> =
                Box::pin(async move {
                    let event = inserted(&record).ok_or("not an outbox event")?;
                    publisher.publish(&event).await?;
                    Ok(())
                });
            published
        })
}

/// Delivers `records` to `service` in batches of [`BATCH`]; the events per second it relayed
/// (every record must succeed). moto's SQS slows as a queue fills (each send costs more with
/// every message held), so the queue (`emptied`: the client and the queue's name) is emptied
/// before each batch, as a consumer keeps a real one, outside the time measured.
async fn run<S>(
    mut service: S,
    records: &[DynamoDbRecord],
    emptied: Option<(&aws_sdk_sqs::Client, &str)>,
) -> Result<f64, BoxError>
where
    S: Service<
            LambdaEvent<DynamoDbEvent>,
            Response = aws_lambda_events::event::streams::DynamoDbEventResponse,
            Error = std::convert::Infallible,
        >,
{
    let mut spent = Duration::ZERO;
    for batch in records.chunks(BATCH) {
        if let Some((sqs, queue)) = emptied {
            empty(sqs, queue).await?;
        }
        let started = Instant::now();
        let mut event = DynamoDbEvent::default();
        event.records = batch.to_vec();
        let answer = match service.ready().await {
            Ok(ready) => {
                ready
                    .call(LambdaEvent::new(event, Context::default()))
                    .await
            }
            Err(never) => match never {},
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(never) => match never {},
        };
        spent += started.elapsed();
        if batch.is_empty() || !answer.batch_item_failures.is_empty() {
            return Err(format!("{} records failed", answer.batch_item_failures.len()).into());
        }
    }
    Ok(records.len() as f64 / spent.max(Duration::from_micros(1)).as_secs_f64())
}

/// Commits `events` operations, each with one outbox event for `destination`.
async fn commit(
    db: &Dynamo,
    outbox: &Outbox,
    destination: &Destination,
    events: usize,
) -> Result<(), BoxError> {
    let idem = Idempotency::new(db.store()).with_recovery(Recovery::Steps);
    let scope = OperationScope::new("bench", "relayed")?;
    for n in 0..events {
        // One operation per event, table and round: never a replay of an earlier section's.
        let key = OperationKey::derive(&scope, None, &format!("{}-{n}", outbox.table()))?;
        let invocation = Invocation::new(key, Fingerprint::of(&n)?, Duration::from_secs(30));
        let (outbox, destination) = (outbox.clone(), destination.clone());
        idem.execute(&invocation, |ctx: ExecutionContext| async move {
            ctx.step("publish")
                .transact(|_key| async move {
                    let event = OutboxEvent::new("placed", destination, &json!({"n": n}))?;
                    Ok::<_, BoxError>(Transaction::new(n).publish(&outbox, event))
                })
                .await
        })
        .await?;
    }
    Ok(())
}

/// The queue `name`, created anew (empty): its URL, the same each time.
async fn empty(sqs: &aws_sdk_sqs::Client, name: &str) -> Result<String, BoxError> {
    if let Ok(found) = sqs.get_queue_url().queue_name(name).send().await {
        sqs.delete_queue()
            .queue_url(found.queue_url().unwrap_or_default())
            .send()
            .await?;
    }
    let created = sqs.create_queue().queue_name(name).send().await?;
    Ok(created.queue_url().unwrap_or_default().to_owned())
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|arg| arg == name)?;
    args.get(at + 1)?.parse().ok()
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(0.0)
}
