//! At-least-once delivery, simulated: duplicates, a changed payload, a concurrent race, crashes
//! before and after the effect, a redelivery after retention, and effects inside the protocol
//! (a crash between two steps, an uncertain e-mail checked, an order and its outbox event
//! committed together and consumed once), against a DynamoDB-compatible server (embedded, or
//! `DYNAMODB_ENDPOINT`).
//!
//! Each "charge" handler appends to a ledger standing in for the payment provider. However the
//! events arrive, the ledger must hold exactly one charge per distinct order.
//!
//! ```text
//! cargo run --example demo
//! ```

/// `println!`, and the line kept in the demo's transcript (which the README check reads).
macro_rules! say {
    ($($line:tt)*) => {{
        let line = format!($($line)*);
        println!("{line}");
        crate::transcript::keep(&line);
    }};
}

mod effects;
#[path = "../../src/testing/local.rs"]
mod local_dynamodb;
#[cfg(test)]
mod readme;
#[path = "../../tests/common/streams.rs"]
mod streams;
mod transcript;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::key::JsonPointer;
use lambda_idempotency::reconcile::{Checked, Takeover};
use lambda_idempotency::{
    BoxError, Config, Error, Execution, ExecutionContext, Idempotency, KeyPolicy, OperationScope,
};
use serde_json::{Value, json};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// The payment provider's ledger: (order, the idempotency key the charge was sent with).
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<(String, String)>>>);

impl Ledger {
    fn charge(&self, order: &Value, ctx: &ExecutionContext) -> Result<Value, std::io::Error> {
        let id = order["order_id"].as_str().unwrap_or("?").to_owned();
        let mut charges = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("ledger poisoned"))?;
        charges.push((id.clone(), ctx.downstream_key("charge")));
        Ok(json!({"charged": id, "amount": order["amount"], "attempt": ctx.attempt()}))
    }

    /// What the provider knows about a charge sent with `downstream_key`.
    fn lookup(&self, downstream_key: &str) -> Option<String> {
        let charges = self.0.lock().ok()?;
        charges
            .iter()
            .find(|(_, key)| key == downstream_key)
            .map(|(order, _)| order.clone())
    }

    fn orders(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|charges| charges.iter().map(|(order, _)| order.clone()).collect())
            .unwrap_or_default()
    }
}

/// Before a takeover re-runs a crashed charge, ask the provider whether it went through.
fn reconciler(
    ledger: Ledger,
) -> impl Fn(Takeover) -> std::future::Ready<Result<Checked, BoxError>> + Send + Sync {
    move |takeover: Takeover| {
        let answer = match ledger.lookup(&takeover.key.downstream("charge")) {
            Some(order) => Checked::Applied(json!({"charged": order, "found_by": "reconciler"})),
            None => Checked::NotApplied,
        };
        std::future::ready(Ok(answer))
    }
}

struct Demo {
    idem: Idempotency,
    clock: ManualClock,
    policy: KeyPolicy<Value>,
    scope: OperationScope,
    ledger: Ledger,
    delivery: usize,
}

impl Demo {
    /// The charge's invocation for `event`: its reconciler asks the provider about this
    /// operation's crashed attempts (and no other operation's).
    fn invocation(
        &self,
        event: &Value,
    ) -> Result<lambda_idempotency::Invocation, lambda_idempotency::BoxError> {
        Ok(self
            .policy
            .invocation(&self.scope, event, LEASE)?
            .with_reconciler(reconciler(self.ledger.clone())))
    }

    async fn deliver(
        &mut self,
        event: Value,
        note: &str,
    ) -> Result<(), lambda_idempotency::BoxError> {
        // The permanent evidence (for invoices) keeps the charged order as its result reference.
        let invocation = self
            .invocation(&event)?
            .with_result_ref(JsonPointer::new("/charged")?);
        let ledger = self.ledger.clone();
        let result = self
            .idem
            .execute(
                &invocation,
                |ctx| async move { ledger.charge(&event, &ctx) },
            )
            .await;
        self.report(note, &result);
        Ok(())
    }

    /// A worker that claims `event`, optionally charges, then dies before completing.
    async fn crash(
        &mut self,
        event: Value,
        charge_first: bool,
    ) -> Result<(), lambda_idempotency::BoxError> {
        let invocation = self.invocation(&event)?;
        let (idem, ledger) = (self.idem.clone(), self.ledger.clone());
        let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
        let worker = tokio::spawn(async move {
            idem.execute(&invocation, |ctx| async move {
                if charge_first {
                    let _ = ledger.charge(&event, &ctx);
                }
                let _ = claimed_tx.send(());
                std::future::pending::<Result<Value, std::io::Error>>().await
            })
            .await
        });
        claimed_rx.await?;
        drop(worker); // a crash: detached and never polled again, nothing of it runs
        self.delivery += 1;
        let what = if charge_first {
            "worker charges, then crashes"
        } else {
            "worker claims, then crashes"
        };
        say!("delivery {:>2}  {:<34} -> (no answer)", self.delivery, what);
        Ok(())
    }

    fn report(&mut self, note: &str, result: &Result<Execution<Value>, Error>) {
        self.delivery += 1;
        let answer = match result {
            Ok(done) => match done.origin() {
                lambda_idempotency::Origin::Replayed => {
                    format!("replayed {} (handler not run)", done.raw_json())
                }
                lambda_idempotency::Origin::Reconciled { attempt } => {
                    format!(
                        "RECONCILED at attempt {attempt}: {} (handler not run)",
                        done.raw_json()
                    )
                }
                lambda_idempotency::Origin::Executed { .. } => {
                    format!("EXECUTED {}", done.raw_json())
                }
            },
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
            Err(Error::KeyExpiredConflict { evidence, .. }) => format!(
                "refused: record expired, permanent evidence says {} (result ref {})",
                evidence.status,
                evidence.result_ref.as_deref().unwrap_or("-")
            ),
            Err(other) => format!("error: {other}"),
        };
        say!("delivery {:>2}  {note:<34} -> {answer}", self.delivery);
    }
}

#[tokio::main]
async fn main() -> Result<(), lambda_idempotency::BoxError> {
    run().await
}

/// The whole demo: every delivery's answer said, then the ledger's check.
async fn run() -> Result<(), lambda_idempotency::BoxError> {
    let endpoint = local_dynamodb::endpoint().await?;
    let client =
        aws_sdk_dynamodb::Client::from_conf(local_dynamodb::config_for(endpoint.clone()).build());
    let store = lambda_idempotency::DynamoDbStore::new(
        client.clone(),
        local_dynamodb::unique_table_name("demo-idempotency"),
    )
    .with_uniqueness_table(local_dynamodb::unique_table_name("demo-uniqueness"));
    store.create_table().await?;
    say!(
        "tables `{}` and `{}` ready\n",
        store.table(),
        store.uniqueness_table().unwrap_or("-")
    );

    let clock = ManualClock::new(SystemTime::now());
    let ledger = Ledger::default();
    let idem = Idempotency::new(store)
        .with_config(Config::builder().retention(RETENTION).build()?)
        .with_clock(clock.clone());
    let mut demo = Demo {
        idem,
        clock,
        // The key is the order id; orders with an invoice revision also keep permanent evidence.
        policy: KeyPolicy::pointer("/order_id")?.with_identity(|event: &Value| {
            event["invoice_rev"].as_u64().map(|rev| {
                format!(
                    "invoice:{}:rev-{rev}",
                    event["order_id"].as_str().unwrap_or("?")
                )
            })
        }),
        scope: OperationScope::new("demo", "charge")?,
        ledger: ledger.clone(),
        delivery: 0,
    };
    let order = |id: &str, amount: u32| json!({"order_id": id, "amount": amount});

    say!("-- duplicates, as SQS, SNS and EventBridge deliver them");
    demo.deliver(order("o-1", 100), "o-1 first delivery")
        .await?;
    demo.deliver(order("o-2", 250), "o-2 first delivery")
        .await?;
    demo.deliver(order("o-1", 100), "o-1 redelivered").await?;
    demo.deliver(order("o-2", 250), "o-2 redelivered").await?;
    demo.deliver(order("o-1", 999), "o-1 same key, changed amount")
        .await?;

    say!("-- a race: four copies of o-3 arrive at once on four workers");
    let invocation = demo.invocation(&order("o-3", 40))?;
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let (idem, invocation, ledger) =
                (demo.idem.clone(), invocation.clone(), ledger.clone());
            tokio::spawn(async move {
                idem.execute(&invocation, |ctx| async move {
                    ledger.charge(&json!({"order_id": "o-3", "amount": 40}), &ctx)
                })
                .await
            })
        })
        .collect();
    for racer in racers {
        let result = racer.await?;
        demo.report("o-3 concurrent copy", &result);
    }

    say!("-- o-4: a crash before the charge; the takeover asks the provider, then re-runs");
    demo.crash(order("o-4", 75), false).await?;
    demo.deliver(order("o-4", 75), "o-4 redelivered at once")
        .await?;
    demo.clock.advance(LEASE + Duration::from_secs(1));
    demo.deliver(order("o-4", 75), "o-4 redelivered after the lease")
        .await?;

    say!("-- o-5: a crash after the charge; the takeover finds it and records it");
    demo.crash(order("o-5", 60), true).await?;
    demo.clock.advance(LEASE + Duration::from_secs(1));
    demo.deliver(order("o-5", 60), "o-5 redelivered after the lease")
        .await?;
    demo.deliver(order("o-5", 60), "o-5 redelivered again")
        .await?;

    say!("-- o-6: an invoice with permanent evidence, redelivered after retention");
    let invoice = json!({"order_id": "o-6", "amount": 500, "invoice_rev": 1});
    demo.deliver(invoice.clone(), "o-6 first delivery").await?;
    demo.clock.advance(RETENTION + Duration::from_secs(60));
    demo.deliver(invoice, "o-6 redelivered after retention")
        .await?;

    demo.delivery = effects::run(
        &demo.idem,
        &demo.clock,
        &ledger,
        &client,
        &endpoint,
        demo.delivery,
    )
    .await?;

    let effects = ledger.orders();
    let mut distinct = effects.clone();
    distinct.sort();
    distinct.dedup();
    say!(
        "\n{} deliveries, {} charges {:?}, {} distinct orders",
        demo.delivery,
        effects.len(),
        effects,
        distinct.len()
    );
    if effects.len() != distinct.len() || distinct.len() != 7 {
        return Err("an order was charged more than once, or not at all".into());
    }
    say!("one charge per order: OK");
    Ok(())
}
