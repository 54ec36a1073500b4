//! What effects inside the protocol cost, side by side in one run, on the embedded DynamoDB
//! server over loopback HTTP (or `DYNAMODB_ENDPOINT`):
//!
//! - requests per operation for a handler without steps, with 1, 2 and 3 steps (each step's
//!   result merged into the next write), the unmerged count for comparison, and a
//!   transactional step (an order put and an outbox event with the step's record), and the same
//!   writes carried by the completion instead (a transactional settlement against a plain one);
//! - the record's size once settled, which sets the write units of every write and of each
//!   duplicate's failed claim;
//! - latency medians (interleaved sample by sample) of the same handlers.
//!
//! The relay's throughput is `benches/relay.rs`.
//!
//! ```text
//! cargo bench --bench effects --features testing,relay
//! ```

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::effects::{Destination, Outbox, OutboxEvent, Transaction};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::local::{
    create_key_table, create_outbox_table, unique_table_name,
};
use lambda_idempotency::{
    BoxError, ExecutionContext, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use serde_json::json;

const SAMPLES: usize = 200;

/// The handlers compared.
#[derive(Debug, Clone, Copy)]
enum Handler {
    Plain,
    Steps(usize),
    Transactional,
    Completion,
}

impl Handler {
    fn label(self) -> String {
        match self {
            Self::Plain => "no step".into(),
            Self::Steps(n) => format!("{n} step{}", if n == 1 { "" } else { "s" }),
            Self::Transactional => "1 transactional step (order + outbox event)".into(),
            Self::Completion => "the same writes carried by the completion".into(),
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
                            .transact(
                                |_key| async move { place(&orders, &outbox, &format!("o-{n}")) },
                            )
                            .await?;
                        Ok(json!({"id": placed}))
                    }
                    Handler::Completion => {
                        let placed = place(&orders, &outbox, &format!("c-{n}"))?;
                        let writes = placed
                            .writes()
                            .iter()
                            .fold(Transaction::new(()), |tx, write| tx.write(write.clone()));
                        ctx.complete_with(writes)?;
                        Ok(json!({"id": format!("o-{n}")}))
                    }
                }
            })
            .await?;
        Ok(())
    }
}

/// Order `order`'s put and its outbox event's item, as a transaction's writes.
fn place(orders: &str, outbox: &Outbox, order: &str) -> Result<Transaction<String>, BoxError> {
    let put = Put::builder()
        .table_name(orders)
        .item("pk", AttributeValue::S(order.to_owned()))
        .condition_expression("attribute_not_exists(pk)")
        .build()?;
    let event = OutboxEvent::new(
        "order-placed",
        Destination::Sqs {
            queue_url: "http://127.0.0.1/000000000000/orders".into(),
        },
        &json!({"order_id": order}),
    )?;
    Ok(Transaction::new(order.to_owned())
        .put(put)
        .publish(outbox, event))
}

/// Each handler's operations in a scope of their own.
fn scope_of(handler: Handler) -> Result<OperationScope, BoxError> {
    let name = format!("{handler:?}").replace(['(', ')'], "-");
    Ok(OperationScope::new("bench", name)?)
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
    create_key_table(&db.client, &orders, false).await?;
    create_outbox_table(&db.client, &outbox).await?;
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
        Handler::Completion,
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
            Handler::Completion => " (the completion: 3 items, 6 write units)".to_owned(),
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

    Ok(())
}
