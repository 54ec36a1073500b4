//! Transactional operations (on a store beside which the handler has tables of its own): a
//! transactional step reserves (an `ADD` on the handler's table, with an outbox event) and the
//! completion carries a second write and event (refused by its condition on a first
//! takeover); the downstream truth is read back from those tables, every life of every
//! operation, and judged: each write at most once per life, each event with its write, the
//! completion's write only after the reservation, and always with the handler's COMPLETED.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, Update};
use serde_json::{Value, json};

use super::actors::{Behaviour, Run, SimulatedPanic, count_run, lock};
use super::world::World;
use crate::effects::{Destination, Outbox, OutboxEvent, Transaction};
use crate::error::BoxError;
use crate::execution::ExecutionContext;
use crate::failure::Terminal;
use crate::record::Status;
use crate::store::{Store, StoreExt};
use crate::testing::conformance::EffectTables;

/// What the handler's tables show for one life of an operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Truth {
    /// Reservations committed (by the transactional step).
    reserved: u32,
    /// Completions committed (writes carried by the settlement).
    completed: u32,
    /// The reservation's outbox events.
    events: u32,
    /// The completion's outbox events.
    completion_events: u32,
}

/// The key of the item of `op`'s life `life` in the handler's table.
fn item_key(op: usize, life: u32) -> String {
    format!("op-{op}#life-{life}")
}

/// `ADD attribute :one` on the item of `op`'s life, on `condition` if any (none, so that a
/// second commit counts rather than being refused).
fn add(
    tables: &EffectTables,
    op: usize,
    life: u32,
    attribute: &str,
    condition: Option<&str>,
) -> Result<Update, BoxError> {
    Ok(Update::builder()
        .table_name(&tables.local)
        .key("pk", AttributeValue::S(item_key(op, life)))
        .update_expression("ADD #n :one")
        .set_condition_expression(condition.map(str::to_owned))
        .expression_attribute_names("#n", attribute)
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .build()?)
}

/// A completion write its condition always refuses (the item of `op`'s life never holds the
/// attribute it names), for a handler without steps whose completion is refused.
pub(super) fn refused_write(
    tables: &EffectTables,
    op: usize,
    life: u32,
) -> Result<Update, BoxError> {
    add(
        tables,
        op,
        life,
        "refused",
        Some("attribute_exists(never_written)"),
    )
}

/// An outbox event of `op`'s life; `completion` for the completion's.
fn event(op: usize, life: u32, completion: bool) -> Result<OutboxEvent, BoxError> {
    let name = if completion { "completed" } else { "reserved" };
    let payload = match completion {
        true => json!({"op": op, "life": life, "completed": true}),
        false => json!({"op": op, "life": life}),
    };
    Ok(OutboxEvent::new(
        name,
        Destination::Sqs {
            queue_url: "http://127.0.0.1/000000000000/reservations".into(),
        },
        &payload,
    )?)
}

/// The transactional handler: the step `reserve` commits the reservation with its outbox
/// event; the completion carries the second write and its event. Crashes, panics and
/// suspensions fall before the step, between it and the completion, or (a suspension, a
/// cancellation on a takeover) after the completion was queued.
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
            Ok::<_, BoxError>(
                Transaction::new(json!({"op": op, "reserved": true}))
                    .update(add(&tables, op, life, "reserved", None)?)
                    .publish(&outbox, event(op, life, false)?),
            )
        })
        .await?;
    after_effect();
    match behaviour {
        // The handler's own retryable failure after a done step: given back, the step kept.
        Behaviour::FailAfterStep => {
            lock(&shared).failed_after_step = Some((op, attempt));
            return Err(std::io::Error::other("the downstream timed out after the step").into());
        }
        Behaviour::CrashAfterEffect => park().await,
        Behaviour::CancelAfterEffect if attempt == 1 => park().await,
        Behaviour::PanicAfterEffect => std::panic::panic_any(SimulatedPanic),
        _ => {}
    }
    // The first takeover's completion is refused by its condition (nothing commits; the claim
    // is given back, the reservation kept).
    let condition = (attempt == 2).then_some("attribute_not_exists(reserved)");
    if condition.is_some() {
        lock(&shared).refusals += 1;
    }
    ctx.complete_with(
        Transaction::new(())
            .update(add(&tables, op, life, "completed", condition)?)
            .publish(&outbox, event(op, life, true)?),
    )?;
    match behaviour {
        Behaviour::SuspendAfterEffect => {
            if let Some(resume) = resume.take() {
                suspend(resume).await;
            }
        }
        // After the completion was queued, before it committed.
        Behaviour::CancelAfterEffect if attempt > 1 => park().await,
        _ => {}
    }
    Ok(json!({"op": op, "attempt": attempt, "life": life, "reserved": reserved["reserved"]}))
}

impl<S: Store + Clone> World<S> {
    /// What the handler's tables show, by operation and life; the ledger is told each
    /// transactional operation's effects (the reservations) in its current life. `None`
    /// without such tables.
    pub(super) async fn observe_transactions(&mut self) -> Option<BTreeMap<(usize, u32), Truth>> {
        let tables = self.tables.clone()?;
        let mut truths: BTreeMap<(usize, u32), Truth> = BTreeMap::new();
        for item in scan(&tables.client, &tables.local).await {
            let Some((op, life)) = item
                .get("pk")
                .and_then(|pk| pk.as_s().ok())
                .and_then(|pk| parse_item_key(pk))
            else {
                continue;
            };
            let count = |attribute: &str| {
                item.get(attribute)
                    .and_then(|n| n.as_n().ok())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            let truth = truths.entry((op, life)).or_default();
            truth.reserved = count("reserved");
            truth.completed = count("completed");
        }
        for item in scan(&tables.client, &tables.outbox).await {
            let payload: Option<Value> = item
                .get("payload")
                .and_then(|payload| payload.as_s().ok())
                .and_then(|payload| serde_json::from_str(payload).ok());
            let Some(payload) = payload else { continue };
            let (Some(op), Some(life)) = (payload["op"].as_u64(), payload["life"].as_u64()) else {
                continue;
            };
            let (Ok(op), Ok(life)) = (usize::try_from(op), u32::try_from(life)) else {
                continue;
            };
            let truth = truths.entry((op, life)).or_default();
            match payload.get("completed") {
                Some(_) => truth.completion_events += 1,
                None => truth.events += 1,
            }
        }
        let mut downstream = lock(&self.shared);
        for op in 0..self.specs.len() {
            if self.specs[op].transactional {
                let life = downstream.ledger.life(op);
                let reserved = truths.get(&(op, life)).map_or(0, |truth| truth.reserved);
                downstream.ledger.observed_effects(op, reserved);
            }
        }
        Some(truths)
    }

    /// Adds what the transactional operations' tables show (every life) to the run's figures.
    pub(super) async fn count_transactions(&mut self) {
        let Some(truths) = self.observe_transactions().await else {
            return;
        };
        for truth in truths.values() {
            for (name, count) in [
                ("reservations", truth.reserved),
                ("events", truth.events + truth.completion_events),
                ("completions", truth.completed),
            ] {
                *self.stats.transactions.entry(name.to_owned()).or_default() += u64::from(count);
            }
        }
    }

    /// A transactional operation whose tables break the protocol's promise, in any of its
    /// lives: a write committed twice, an outbox event without its write (or, within the
    /// outbox's retention, a write without its event), a completion's write without the
    /// reservation the handler made first; or a record COMPLETED with the handler's own result
    /// whose completion's write did not commit. An outbox event is pending until published
    /// (nothing publishes here), so it never expires: a write without its event is lost
    /// whenever the clock stands.
    pub(super) async fn transaction_disagrees(&mut self) -> Option<String> {
        let truths = self.observe_transactions().await?;
        for ((op, life), truth) in &truths {
            let lost = truth.events < truth.reserved || truth.completion_events < truth.completed;
            let broken = if truth.reserved > 1 || truth.completed > 1 {
                "a transactional write committed more than once in one life"
            } else if truth.events > truth.reserved
                || truth.completion_events > truth.completed
                || lost
            {
                "an outbox event and its write disagree"
            } else if truth.completed > truth.reserved {
                "the completion's write committed without the reservation"
            } else {
                continue;
            };
            return Some(format!("operation {op}, life {life}: {broken}: {truth:?}"));
        }
        for op in (0..self.specs.len()).filter(|op| self.specs[*op].transactional) {
            let record = self
                .store
                .inner()
                .get(&self.specs[op].key)
                .await
                .ok()
                .flatten();
            let Some(outcome) = record
                .filter(|record| record.status == Status::Completed)
                .and_then(|record| record.outcome)
                .and_then(|outcome| serde_json::from_slice::<Value>(&outcome).ok())
            else {
                continue;
            };
            // The handler's own result names its life; a reconciler's or an operator's none.
            let Some(life) = outcome.get("life").and_then(Value::as_u64) else {
                continue;
            };
            let life = u32::try_from(life).unwrap_or(u32::MAX);
            let completed = truths.get(&(op, life)).map_or(0, |truth| truth.completed);
            if completed != 1 {
                return Some(format!(
                    "operation {op}, life {life}: COMPLETED with the handler's result, but its completion's write committed {completed} times"
                ));
            }
        }
        None
    }
}

/// The operation and life an item key names.
fn parse_item_key(pk: &str) -> Option<(usize, u32)> {
    let (op, life) = pk.strip_prefix("op-")?.split_once("#life-")?;
    Some((op.parse().ok()?, life.parse().ok()?))
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
