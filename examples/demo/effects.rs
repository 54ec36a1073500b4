//! The demo's effects: a checkout in two steps whose worker crashes while e-mailing (the
//! charge replays, the uncertain e-mail is checked, nothing is sent twice), and an order
//! written with its outbox event in one transaction, whose stream delivers the event twice to
//! a consumer that runs once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
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
            async move { Ok(charges.charge(&order, &ctx)?) }
        })
        .await?;
    let checker = mailer.clone();
    let mail: String = ctx
        .step("email")
        .checked_by(move |key: String| {
            let found = checker.sent(&key);
            async move {
                Ok(match found {
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
    // Every effect of the checkout is a step: its steps decide a takeover (a declaration of
    // the checkout's own invocations).
    let mailer = Mailer::default();
    let scope = OperationScope::new("demo", "checkout")?;
    let order = json!({"order_id": "o-7", "amount": 120});
    let key = OperationKey::derive(&scope, None, "o-7")?;
    let invocation =
        Invocation::new(key, Fingerprint::of(&order)?, super::LEASE).with_recovery(Recovery::Steps);

    say!("-- o-7: a checkout in two steps; the worker crashes while e-mailing");
    let (crashed_tx, crashed_rx) = tokio::sync::oneshot::channel();
    let worker = tokio::spawn({
        let (idem, invocation, charges, mailer, order) = (
            idem.clone(),
            invocation.clone(),
            charges.clone(),
            mailer.clone(),
            order.clone(),
        );
        async move {
            idem.execute(&invocation, |ctx| {
                checkout(ctx, charges, mailer, order, Some(crashed_tx))
            })
            .await
        }
    });
    crashed_rx.await?;
    drop(worker);
    delivery += 1;
    say!(
        "delivery {delivery:>2}  {:<34} -> (no answer)",
        "worker charges, crashes mid-e-mail"
    );
    clock.advance(super::LEASE + Duration::from_secs(1));
    let done = idem
        .execute(&invocation, |ctx| {
            checkout(ctx, charges.clone(), mailer.clone(), order.clone(), None)
        })
        .await?;
    delivery += 1;
    say!(
        "delivery {delivery:>2}  {:<34} -> EXECUTED {} (charge replayed, e-mail checked)",
        "o-7 redelivered after the lease",
        done.raw_json()
    );
    if mailer.count() != 1 {
        return Err("the e-mail was sent more than once".into());
    }

    say!(
        "-- o-8: an order and its order-placed event, in one transaction; the stream delivers the event twice"
    );
    let (orders, outbox) = (
        super::local_dynamodb::unique_table_name("demo-orders"),
        super::local_dynamodb::unique_table_name("demo-outbox"),
    );
    super::local_dynamodb::create_key_table(client, &orders, false).await?;
    super::local_dynamodb::create_outbox_table(client, &outbox).await?;
    let outbox = Outbox::new(outbox);
    let key = OperationKey::derive(&OperationScope::new("demo", "place-order")?, None, "o-8")?;
    let invocation =
        Invocation::new(key, Fingerprint::of(&"o-8")?, super::LEASE).with_recovery(Recovery::Steps);
    let placed = idem
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
                        Ok(Transaction::new(String::from("o-8"))
                            .put(put)
                            .publish(&outbox, event))
                    })
                    .await
            }
        })
        .await?;
    delivery += 1;
    say!(
        "delivery {delivery:>2}  {:<34} -> EXECUTED {}",
        "o-8 placed with its event",
        placed.raw_json()
    );
    // The outbox's stream, read as an event source mapping reads it, delivered twice.
    let events: Vec<String> = super::streams::stream_records(endpoint, outbox.table())
        .await?
        .iter()
        .filter_map(|record| {
            record["dynamodb"]["NewImage"]["pk"]["S"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
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
        say!(
            "delivery {delivery:>2}  {:<34} -> {how}",
            format!("order-placed event, copy {}", copy + 1)
        );
    }
    if events.len() != 1 || consumed.load(Ordering::SeqCst) != 1 {
        return Err("the order-placed event was not consumed exactly once".into());
    }
    Ok(delivery)
}
