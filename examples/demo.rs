//! At-least-once delivery, simulated: duplicates, a concurrent race, a crash after the claim and
//! a changed payload, against a DynamoDB-compatible server (embedded, or `DYNAMODB_ENDPOINT`).
//!
//! Each "charge" handler appends to a ledger of effects. However the events arrive, the ledger
//! must hold exactly one effect per distinct order.
//!
//! ```text
//! cargo run --example demo
//! ```

#[path = "support/local_dynamodb.rs"]
mod local_dynamodb;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::{
    Config, Error, Execution, Idempotency, Invocation, KeyPolicy, OperationScope,
};
use serde_json::{Value, json};

const LEASE: Duration = Duration::from_secs(30);

type Ledger = Arc<Mutex<Vec<String>>>;

/// The business effect: charge an order, once.
async fn charge(ledger: Ledger, order: Value, attempt: u32) -> Result<Value, std::io::Error> {
    let id = order["order_id"].as_str().unwrap_or("?").to_owned();
    ledger
        .lock()
        .map_err(|_| std::io::Error::other("ledger poisoned"))?
        .push(id.clone());
    Ok(json!({"charged": id, "amount": order["amount"], "attempt": attempt}))
}

struct Demo {
    idem: Idempotency<DynamoDbStore>,
    clock: ManualClock,
    policy: KeyPolicy<Value>,
    scope: OperationScope,
    ledger: Ledger,
    delivery: usize,
}

impl Demo {
    fn invocation(&self, event: &Value) -> Result<Invocation, Error> {
        let (key, fingerprint) = self.policy.derive(&self.scope, event)?;
        Ok(Invocation::new(key, fingerprint, LEASE))
    }

    async fn deliver(&mut self, event: Value, note: &str) -> Result<(), Error> {
        self.delivery += 1;
        let invocation = self.invocation(&event)?;
        let ledger = Arc::clone(&self.ledger);
        let result = self
            .idem
            .execute(&invocation, |ctx| {
                charge(ledger, event.clone(), ctx.attempt())
            })
            .await;
        report(self.delivery, &event, note, &result);
        Ok(())
    }
}

fn report(delivery: usize, event: &Value, note: &str, result: &Result<Execution<Value>, Error>) {
    let order = event["order_id"].as_str().unwrap_or("?");
    let answer = match result {
        Ok(done) if done.is_replay() => format!("replayed {} (handler not run)", done.raw_json()),
        Ok(done) => format!("EXECUTED {}", done.raw_json()),
        Err(Error::AlreadyInProgress {
            attempt,
            retry_after,
            ..
        }) => {
            format!(
                "in progress (attempt {attempt}), retry in {:.0}s",
                retry_after.as_secs_f64().ceil()
            )
        }
        Err(Error::PayloadConflict { .. }) => "refused: payload conflict".to_owned(),
        Err(other) => format!("error: {other}"),
    };
    println!("delivery {delivery:>2}  {order:<5} {note:<34} -> {answer}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = aws_sdk_dynamodb::Client::from_conf(local_dynamodb::sdk_config().await?.build());
    let store = DynamoDbStore::new(
        client,
        local_dynamodb::unique_table_name("demo-idempotency"),
    );
    store.create_table().await?;
    println!("idempotency table `{}` ready\n", store.table());

    let clock = ManualClock::new(SystemTime::now());
    let mut demo = Demo {
        idem: Idempotency::new(store, Config::default()).with_clock(clock.clone()),
        clock,
        policy: KeyPolicy::pointer("/order_id")?,
        scope: OperationScope::new("demo", "charge")?,
        ledger: Ledger::default(),
        delivery: 0,
    };
    let order = |id: &str, amount: u32| json!({"order_id": id, "amount": amount});

    // Plain duplicates, as SQS, SNS and EventBridge deliver them.
    demo.deliver(order("o-1", 100), "first delivery").await?;
    demo.deliver(order("o-2", 250), "first delivery").await?;
    demo.deliver(order("o-1", 100), "redelivered").await?;
    demo.deliver(order("o-2", 250), "redelivered").await?;
    demo.deliver(order("o-1", 999), "same key, changed amount")
        .await?;

    // A race: four copies of one event arrive at once on four workers.
    let invocation = demo.invocation(&order("o-3", 40))?;
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let (idem, invocation, ledger) = (
                demo.idem.clone(),
                invocation.clone(),
                Arc::clone(&demo.ledger),
            );
            tokio::spawn(async move {
                idem.execute(&invocation, |ctx| {
                    charge(
                        ledger,
                        json!({"order_id": "o-3", "amount": 40}),
                        ctx.attempt(),
                    )
                })
                .await
            })
        })
        .collect();
    for racer in racers {
        demo.delivery += 1;
        report(
            demo.delivery,
            &order("o-3", 40),
            "concurrent copy",
            &racer.await?,
        );
    }

    // A crash after the claim: the worker dies before completing; its lease must run out
    // before anyone else may run the operation.
    let event = order("o-4", 75);
    let invocation = demo.invocation(&event)?;
    let idem = demo.idem.clone();
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
    let crashing = tokio::spawn(async move {
        idem.execute(&invocation, |_| async move {
            let _ = claimed_tx.send(());
            std::future::pending::<Result<Value, std::io::Error>>().await
        })
        .await
    });
    claimed_rx.await?;
    crashing.abort();
    demo.delivery += 1;
    println!(
        "delivery {:>2}  o-4   {:<34} -> (no answer)",
        demo.delivery, "worker claims, then crashes"
    );
    demo.deliver(event.clone(), "redelivered at once").await?;
    demo.clock.advance(LEASE + Duration::from_secs(1));
    demo.deliver(event.clone(), "redelivered after the lease")
        .await?;
    demo.deliver(event, "redelivered again").await?;

    let effects = demo.ledger.lock().map_err(|_| "ledger poisoned")?.clone();
    let mut distinct = effects.clone();
    distinct.sort();
    distinct.dedup();
    println!(
        "\n{} deliveries, {} effects {:?}, {} distinct operations",
        demo.delivery,
        effects.len(),
        effects,
        distinct.len()
    );
    if effects.len() != distinct.len() || distinct.len() != 4 {
        return Err("an operation took effect more than once, or not at all".into());
    }
    println!("one effect per operation: OK");
    Ok(())
}
