//! Transactional operations (on a store beside which the handler has tables of its own): a
//! transactional step reserves (an `ADD` on the handler's table, with an outbox event) and the
//! completion carries a second write; the downstream truth is read back from those tables,
//! and judged: each write at most once per life, the event with its write, the completion's
//! write only after the reservation.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, Update};
use serde_json::{Value, json};

use super::actors::{Behaviour, Run, SimulatedPanic, count_run, lock};
use super::world::World;
use crate::clock::Clock;
use crate::effects::{Destination, OUTBOX_RETENTION, Outbox, OutboxEvent, Transaction};
use crate::error::BoxError;
use crate::execution::ExecutionContext;
use crate::failure::Terminal;
use crate::store::Store;
use crate::testing::conformance::EffectTables;

/// What the handler's tables show for one life of an operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Truth {
    /// Reservations committed (by the transactional step).
    reserved: u32,
    /// Completions committed (writes carried by the settlement).
    completed: u32,
    /// Outbox events of this life.
    events: u32,
}

/// The item of `op`'s life `life` in the handler's table.
fn item_key(op: usize, life: u32) -> AttributeValue {
    AttributeValue::S(format!("op-{op}#life-{life}"))
}

/// `ADD attribute :one` on the item of `op`'s life.
fn add(tables: &EffectTables, op: usize, life: u32, attribute: &str) -> Result<Update, BoxError> {
    Ok(Update::builder()
        .table_name(&tables.local)
        .key("pk", item_key(op, life))
        .update_expression("ADD #n :one")
        .expression_attribute_names("#n", attribute)
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .build()?)
}

/// The transactional handler: the step `reserve` commits the reservation with its outbox
/// event; the completion carries the second write. Crashes, panics and suspensions fall
/// before the step, between it and the completion, or after the completion was queued.
pub(super) async fn transactional(
    run: Run,
    ctx: ExecutionContext,
    tables: Arc<EffectTables>,
) -> Result<Value, BoxError> {
    let Run {
        shared,
        op,
        life,
        profile,
        behaviour,
        after_effect,
        parked,
        resume,
        ..
    } = run;
    let attempt = ctx.attempt();
    count_run(&shared, op, attempt, profile);
    let park = || async {
        let _ = parked.send(());
        std::future::pending::<()>().await;
    };
    let suspend = |resume: tokio::sync::oneshot::Receiver<()>| {
        let parked = parked.clone();
        async move {
            let _ = parked.send(());
            if resume.await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let mut resume = Some(resume);
    match behaviour {
        Behaviour::RetryableFailure => {
            lock(&shared).ledger.failed_before_effect(op);
            return Err(std::io::Error::other("downstream timed out").into());
        }
        Behaviour::TerminalFailure => {
            return Err(Terminal::new(
                "declined",
                std::io::Error::other("the downstream declined"),
            )
            .into());
        }
        Behaviour::CrashBeforeEffect => park().await,
        Behaviour::SuspendBeforeEffect => {
            if let Some(resume) = resume.take() {
                suspend(resume).await;
            }
        }
        _ => {}
    }
    let outbox = Outbox::new(&tables.outbox);
    let reserved: Value = ctx
        .step("reserve")
        .transact(|_key| async {
            let event = OutboxEvent::new(
                "reserved",
                Destination::Sqs {
                    queue_url: "http://127.0.0.1/000000000000/reservations".into(),
                },
                &json!({"op": op, "life": life}),
            )?;
            Ok::<_, BoxError>(
                Transaction::new(json!({"op": op, "reserved": true}))
                    .update(add(&tables, op, life, "reserved")?)
                    .publish(&outbox, event),
            )
        })
        .await?;
    after_effect();
    match behaviour {
        Behaviour::CrashAfterEffect | Behaviour::CancelAfterEffect => park().await,
        Behaviour::PanicAfterEffect => std::panic::panic_any(SimulatedPanic),
        _ => {}
    }
    ctx.complete_with(Transaction::new(()).update(add(&tables, op, life, "completed")?))?;
    if behaviour == Behaviour::SuspendAfterEffect
        && let Some(resume) = resume.take()
    {
        suspend(resume).await;
    }
    Ok(json!({"op": op, "attempt": attempt, "reserved": reserved["reserved"]}))
}

impl<S: Store + Clone> World<S> {
    /// What the handler's tables show for every transactional operation's current life; the
    /// ledger is told its effects (the reservations). `None` without such tables.
    pub(super) async fn observe_transactions(&mut self) -> Option<Vec<Option<Truth>>> {
        let tables = self.tables.clone()?;
        let items = scan(&tables.client, &tables.local).await;
        let events = scan(&tables.client, &tables.outbox).await;
        let mut truths = Vec::with_capacity(self.specs.len());
        let mut downstream = lock(&self.shared);
        for op in 0..self.specs.len() {
            if !self.specs[op].transactional {
                truths.push(None);
                continue;
            }
            let life = downstream.ledger.life(op);
            let count = |attribute: &str| {
                items
                    .iter()
                    .find(|item| item.get("pk") == Some(&item_key(op, life)))
                    .and_then(|item| item.get(attribute))
                    .and_then(|n| n.as_n().ok())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            let payload = json!({"op": op, "life": life}).to_string();
            let truth = Truth {
                reserved: count("reserved"),
                completed: count("completed"),
                events: events
                    .iter()
                    .filter(|event| {
                        event.get("payload").and_then(|p| p.as_s().ok()) == Some(&payload)
                    })
                    .count()
                    .try_into()
                    .unwrap_or(u32::MAX),
            };
            downstream.ledger.observed_effects(op, truth.reserved);
            truths.push(Some(truth));
        }
        Some(truths)
    }

    /// Adds what the transactional operations' tables show to the run's figures.
    pub(super) async fn count_transactions(&mut self) {
        let Some(truths) = self.observe_transactions().await else {
            return;
        };
        for truth in truths.into_iter().flatten() {
            for (name, count) in [
                ("reservations", truth.reserved),
                ("events", truth.events),
                ("completions", truth.completed),
            ] {
                *self.stats.transactions.entry(name.to_owned()).or_default() += u64::from(count);
            }
        }
    }

    /// A transactional operation whose tables break the protocol's promise: a write committed
    /// twice in one life, an outbox event without its write (or, within the outbox's
    /// retention, a write without its event), a completion's write without the reservation
    /// the handler made first.
    pub(super) async fn transaction_disagrees(&mut self) -> Option<String> {
        let truths = self.observe_transactions().await?;
        let within_retention = self.clock.now() < self.started + OUTBOX_RETENTION;
        truths
            .into_iter()
            .enumerate()
            .find_map(|(op, truth)| {
                let truth = truth?;
                let event_lost = truth.reserved == 1 && truth.events == 0 && within_retention;
                if truth.reserved > 1 || truth.completed > 1 || truth.events > 1 {
                    Some(format!(
                        "operation {op}: a transactional write committed more than once in one life: {truth:?}"
                    ))
                } else if truth.events > truth.reserved || event_lost {
                    Some(format!(
                        "operation {op}: the outbox event and its write disagree: {truth:?}"
                    ))
                } else if truth.completed > truth.reserved {
                    Some(format!(
                        "operation {op}: the completion's write committed without the reservation: {truth:?}"
                    ))
                } else {
                    None
                }
            })
    }
}

/// Every item of `table` (small tables: one page).
async fn scan(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Vec<HashMap<String, AttributeValue>> {
    client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan a table of the handler's")
        .items
        .unwrap_or_default()
}
