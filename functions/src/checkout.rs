//! A checkout that uses every kind of effect (binary `checkout`): a transactional step that
//! writes the order into the ledger table together with its `order-placed` outbox event, then
//! an e-mail step whose send can be uncertain and is checked before it is ever sent again.
//!
//! The engine declares `Recovery::Steps`: every effect of this handler is a step, so a
//! takeover after a crash replays the order (never placed twice) and asks the e-mail's check.

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::effects::{
    Checked, Destination, Destinations, Outbox, OutboxEvent, Transaction,
};
use lambda_idempotency::lambda::{IdempotencyLayer, current};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::{BoxError, Idempotency, KeyPolicy, Operation, OperationScope};
use lambda_runtime::LambdaEvent;
use serde_json::{Value, json};

use crate::ledger::Ledger;

/// The environment variable naming the outbox table.
pub const OUTBOX_TABLE_VAR: &str = "OUTBOX_TABLE";
/// The environment variable naming the queue the `order-placed` events go to.
pub const ORDER_EVENTS_QUEUE_VAR: &str = "ORDER_EVENTS_QUEUE_URL";
/// The environment variable naming who publishes the outbox's events: `relay` (the default)
/// or `pipe` (template.yaml's `OutboxPublisher`), whose envelope each event is checked
/// against at commit ([`Outbox::through_pipe`]).
pub const OUTBOX_PUBLISHER_VAR: &str = "OUTBOX_PUBLISHER";

/// Where the checkout writes: the ledger (orders and e-mails), the outbox, the events' queue.
#[derive(Debug, Clone)]
pub struct Checkout {
    /// The ledger table: `order#<id>` items and `email#<id>` counters.
    pub ledger: Ledger,
    /// The outbox table.
    pub outbox: Outbox,
    /// The queue URL the `order-placed` events are published to.
    pub events_queue: String,
}

impl Checkout {
    /// From `OUTBOX_TABLE`, `ORDER_EVENTS_QUEUE_URL`, the allowed destinations
    /// (`OUTBOX_DESTINATIONS`) and who publishes (`OUTBOX_PUBLISHER`, `relay` when unset).
    ///
    /// # Errors
    /// When one is not set, or the publisher is neither `relay` nor `pipe`.
    pub fn from_env(ledger: Ledger) -> Result<Self, String> {
        use crate::settings::required;
        let outbox = Outbox::new(required(OUTBOX_TABLE_VAR, "the outbox table's name")?)
            .with_destinations(Destinations::from_env().map_err(|err| err.to_string())?);
        let outbox = match std::env::var(OUTBOX_PUBLISHER_VAR)
            .as_deref()
            .map(str::trim)
        {
            Err(_) | Ok("relay") => outbox,
            Ok("pipe") => outbox.through_pipe(),
            Ok(_) => return Err(format!("{OUTBOX_PUBLISHER_VAR} is `relay` or `pipe`")),
        };
        Ok(Self {
            ledger,
            outbox,
            events_queue: required(ORDER_EVENTS_QUEUE_VAR, "the order events queue's URL")?,
        })
    }

    /// The business operation: place the order (with its event), then e-mail the customer.
    ///
    /// # Errors
    /// When the event has no `order_id`, or a step fails (a `StepError::Stopped` lets the
    /// engine answer).
    pub async fn checkout(self, event: LambdaEvent<Value>) -> Result<Value, BoxError> {
        let order = event.payload["order_id"]
            .as_str()
            .ok_or("the event has no order_id")?
            .to_owned();
        let total = event.payload["total"].clone();
        if !total.is_number() {
            return Err("the event has no numeric total".into());
        }
        let ctx = current().ok_or("not inside an idempotent handler")?;
        let placed: String = ctx
            .step("place-order")
            .transact(|_key| {
                let (checkout, order) = (self.clone(), order.clone());
                async move { checkout.place(&order, total) }
            })
            .await?;
        let (check, send) = (self.ledger.clone(), self.ledger.clone());
        let (checked, sent) = (format!("email#{order}"), format!("email#{order}"));
        let mail: String = ctx
            .step("email")
            // The mail provider keeps what it sent: if a crash left the send uncertain, look.
            .checked_by(move |key: String| async move {
                Ok(match check.count(&checked).await? {
                    0 => Checked::NotApplied,
                    _ => Checked::Applied(format!("mail-{}", &key[..12])),
                })
            })
            .run(move |key| async move {
                send.apply(&sent, &key).await?;
                Ok(format!("mail-{}", &key[..12]))
            })
            .await?;
        Ok(json!({"order": placed, "mail": mail, "attempt": ctx.attempt()}))
    }

    /// The order's item (written only if absent) and its `order-placed` event, in one
    /// transaction with the step's record.
    fn place(&self, order: &str, total: Value) -> Result<Transaction<String>, BoxError> {
        let put = Put::builder()
            .table_name(self.ledger.table())
            .item("pk", AttributeValue::S(format!("order#{order}")))
            .item("total", AttributeValue::N(total.to_string()))
            .condition_expression("attribute_not_exists(pk)")
            .build()?;
        let placed = OutboxEvent::new(
            "order-placed",
            Destination::Sqs {
                queue_url: self.events_queue.clone(),
            },
            &json!({"order_id": order, "total": total}),
        )?;
        Ok(Transaction::new(format!("order#{order}"))
            .put(put)
            .publish(&self.outbox, placed))
    }
}

/// The idempotency layer of the checkout, primed: keyed by `order_id`, every effect a step
/// (`Recovery::Steps`), declared to write in transactions (its transactional step, its outbox
/// event), so a table that accepts no transactions fails the init
/// ([`Operation::prime`]) instead of the first order.
///
/// # Errors
/// When the store's tables refuse transactional writes, or cannot be checked for a lasting
/// reason; a transient error is left to the first event's retries.
pub async fn layer(
    idem: Idempotency,
    scope: OperationScope,
) -> Result<IdempotencyLayer<Value>, lambda_runtime::Error> {
    let operation = Operation::new(idem, scope, KeyPolicy::pointer("/order_id")?)
        .with_recovery(Recovery::Steps)
        .with_transactional_writes();
    if let Err(err) = operation.prime().await {
        if !err.is_transient() {
            tracing::error!(error = %err, "the operation cannot run on this store: the init fails");
            return Err(err.to_string().into());
        }
        tracing::warn!(error = %err, "checking the store failed; the first event will retry");
    }
    Ok(operation.layer())
}
