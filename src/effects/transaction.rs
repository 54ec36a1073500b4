//! A transactional step's result and the handler's own DynamoDB writes, committed with it.

use aws_sdk_dynamodb::types::{ConditionCheck, Delete, Put, TransactWriteItem, Update};

use super::outbox::{Outbox, OutboxEvent};

/// What a transactional step ([`Step::transact`](super::Step::transact)) produces: its result,
/// and the writes committed in one `TransactWriteItems` with the step's record, fenced on the
/// lease, all or nothing. Conditions (an optimistic version check, `attribute_not_exists`) are
/// the handler's own; one that fails refuses the whole transaction
/// ([`StepError::Refused`](super::StepError::Refused)).
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Put, Update};
/// use lambda_idempotency::effects::Transaction;
///
/// # fn build() -> Result<(), aws_sdk_dynamodb::error::BuildError> {
/// let order = Put::builder()
///     .table_name("orders")
///     .item("pk", AttributeValue::S("order-418".into()))
///     .condition_expression("attribute_not_exists(pk)")
///     .build()?;
/// let stock = Update::builder()
///     .table_name("stock")
///     .key("pk", AttributeValue::S("sku-7".into()))
///     .update_expression("SET version = :next ADD reserved :one")
///     .condition_expression("version = :seen")
///     .expression_attribute_values(":seen", AttributeValue::N("41".into()))
///     .expression_attribute_values(":next", AttributeValue::N("42".into()))
///     .expression_attribute_values(":one", AttributeValue::N("1".into()))
///     .build()?;
/// let placed = Transaction::new("order-418").put(order).update(stock);
/// assert_eq!(placed.writes().len(), 2);
/// # Ok(()) }
/// # build().unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct Transaction<T> {
    pub(crate) value: T,
    pub(crate) writes: Vec<TransactWriteItem>,
    pub(crate) events: Vec<(Outbox, OutboxEvent)>,
}

impl<T> Transaction<T> {
    /// The step's result `value`, with no write yet.
    pub fn new(value: T) -> Self {
        Self {
            value,
            writes: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Adds a `Put`.
    pub fn put(self, put: Put) -> Self {
        self.write(TransactWriteItem::builder().put(put).build())
    }

    /// Adds an `Update`.
    pub fn update(self, update: Update) -> Self {
        self.write(TransactWriteItem::builder().update(update).build())
    }

    /// Adds a `Delete`.
    pub fn delete(self, delete: Delete) -> Self {
        self.write(TransactWriteItem::builder().delete(delete).build())
    }

    /// Adds a `ConditionCheck` on an item the transaction does not write.
    pub fn check(self, check: ConditionCheck) -> Self {
        self.write(TransactWriteItem::builder().condition_check(check).build())
    }

    /// Adds a write as the SDK builds it.
    pub fn write(mut self, write: TransactWriteItem) -> Self {
        self.writes.push(write);
        self
    }

    /// Publishes `event` through `outbox`: its item is written in the same transaction (after
    /// the writes), under an id derived from the operation key, its execution, the step and
    /// the event's name ([`event_id`](super::event_id)), and a relay publishes it at least once.
    pub fn publish(mut self, outbox: &Outbox, event: OutboxEvent) -> Self {
        self.events.push((outbox.clone(), event));
        self
    }

    /// The writes, in the order given (a refusal names its index here).
    pub fn writes(&self) -> &[TransactWriteItem] {
        &self.writes
    }
}

/// Writes with no step result: what [`ExecutionContext::complete_with`] commits with the
/// completion (the handler's own DynamoDB writes and outbox events). Start from
/// `Writes::default()`.
///
/// [`ExecutionContext::complete_with`]: crate::ExecutionContext::complete_with
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Put};
/// use lambda_idempotency::effects::Writes;
///
/// # fn build() -> Result<(), aws_sdk_dynamodb::error::BuildError> {
/// let order = Put::builder()
///     .table_name("orders")
///     .item("pk", AttributeValue::S("order-418".into()))
///     .build()?;
/// let writes = Writes::default().put(order);
/// assert_eq!(writes.writes().len(), 1);
/// # Ok(()) }
/// # build().unwrap();
/// ```
pub type Writes = Transaction<()>;
