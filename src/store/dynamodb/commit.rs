//! A transactional step: the record's steps and the handler's own writes in one
//! `TransactWriteItems`, checked against DynamoDB's limits before it is sent.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::DynamoDbStore;
use super::decode::Parts;
use super::item::{Item, value_size};
use super::steps::steps_value;
use super::writes::{Check, Write, item_table};
use crate::error::StoreError;
use crate::store::{Commit, Committed, Target};

/// The most actions one `TransactWriteItems` holds.
pub(crate) const MAX_TRANSACTION_ACTIONS: usize = 100;
/// The most bytes one `TransactWriteItems` carries.
pub(crate) const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

impl DynamoDbStore {
    /// [`Store::commit_steps`](crate::store::Store::commit_steps) on DynamoDB.
    pub(crate) async fn commit(
        &self,
        target: Target<'_>,
        commit: Commit<'_>,
    ) -> Result<Committed, StoreError> {
        let record_key = self.names.key(target.key);
        let steps = steps_value(commit.steps);
        self.check_limits(&record_key, commit.writes, value_size(&steps))?;
        let (condition, expr) = self.guard(target.guard);
        let mut writes = vec![Write::update(
            &self.table,
            record_key,
            "SET #steps = :steps",
            condition,
            expr.name("#steps", &self.names.steps)
                .value(":steps", steps),
        )?];
        writes.extend(
            commit
                .writes
                .iter()
                .map(|write| Write::Item(Box::new(write.clone()))),
        );
        let Some(checks) = self
            .transact("commit_steps", writes, Some(commit.token))
            .await?
        else {
            return Ok(Committed::Applied);
        };
        if let Some(current) = checks.first().and_then(Check::failed_item) {
            return Ok(Committed::LeaseLost {
                current: self.decode(current, Parts::Skip).await?.map(Box::new),
            });
        }
        match checks
            .iter()
            .skip(1)
            .position(|check| check.failed_item().is_some())
        {
            Some(write) => Ok(Committed::Refused { write }),
            None => Err(StoreError::Contention {
                operation: "commit_steps",
            }),
        }
    }

    /// Refuses, before sending, a transaction DynamoDB would refuse: more than 100 actions,
    /// more than 4 MB (the step list's `steps_bytes` included), two actions on one item (among the keys the writes name, and the
    /// operation's own record), an action that names no table or several kinds.
    fn check_limits(
        &self,
        record_key: &Item,
        writes: &[TransactWriteItem],
        steps_bytes: usize,
    ) -> Result<(), StoreError> {
        let rejected = |message: String| StoreError::Rejected {
            operation: "commit_steps",
            message,
        };
        if writes.len() + 1 > MAX_TRANSACTION_ACTIONS {
            return Err(rejected(format!(
                "a transactional step holds {} writes and outbox events, and its record's; DynamoDB takes at most {MAX_TRANSACTION_ACTIONS} actions in one transaction",
                writes.len()
            )));
        }
        let mut items: Vec<(&str, &Item)> = vec![(self.table.as_str(), record_key)];
        let mut bytes = steps_bytes;
        for (index, write) in writes.iter().enumerate() {
            let kinds = [
                write.put.is_some(),
                write.update.is_some(),
                write.delete.is_some(),
                write.condition_check.is_some(),
            ];
            let table =
                item_table(write).filter(|_| kinds.iter().filter(|kind| **kind).count() == 1);
            let Some(table) = table else {
                return Err(rejected(format!(
                    "write {index} must be exactly one Put, Update, Delete or ConditionCheck"
                )));
            };
            bytes += write_size(write);
            let key = key_of(write, table, &self.table, record_key);
            if let Some(key) = key {
                if items
                    .iter()
                    .any(|(seen, item)| *seen == table && *item == key)
                {
                    return Err(rejected(format!(
                        "write {index} acts on an item another action of the transaction acts on (or the operation's own record); DynamoDB allows one action per item"
                    )));
                }
                items.push((table, key));
            }
        }
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(rejected(format!(
                "a transactional step's writes take about {bytes} bytes; DynamoDB takes at most {MAX_TRANSACTION_BYTES} in one transaction"
            )));
        }
        Ok(())
    }
}

/// The key a write names: an update's, delete's or check's key; a put's item when it targets
/// the idempotency table and carries the record's key (other tables' key schemas are not
/// known here: DynamoDB itself refuses two actions on one of their items).
fn key_of<'a>(
    write: &'a TransactWriteItem,
    table: &str,
    record_table: &str,
    record_key: &'a Item,
) -> Option<&'a Item> {
    if let Some(update) = &write.update {
        return Some(&update.key);
    }
    if let Some(delete) = &write.delete {
        return Some(&delete.key);
    }
    if let Some(check) = &write.condition_check {
        return Some(&check.key);
    }
    let put = write.put.as_ref()?;
    let is_record = table == record_table
        && record_key
            .iter()
            .all(|(name, value)| put.item.get(name) == Some(value));
    is_record.then_some(record_key)
}

/// About what a write carries: its item or key and its expression values.
fn write_size(write: &TransactWriteItem) -> usize {
    let attributes = |item: &Item| -> usize {
        item.iter()
            .map(|(name, value)| name.len() + value_size(value))
            .sum()
    };
    let values = |values: Option<&std::collections::HashMap<String, AttributeValue>>| {
        values.map_or(0, attributes)
    };
    let expressions = |parts: &[Option<&String>]| -> usize {
        parts.iter().flatten().map(|part| part.len()).sum()
    };
    if let Some(put) = &write.put {
        return attributes(&put.item)
            + values(put.expression_attribute_values.as_ref())
            + expressions(&[put.condition_expression.as_ref()]);
    }
    if let Some(update) = &write.update {
        return attributes(&update.key)
            + values(update.expression_attribute_values.as_ref())
            + update.update_expression.len()
            + expressions(&[update.condition_expression.as_ref()]);
    }
    if let Some(delete) = &write.delete {
        return attributes(&delete.key)
            + values(delete.expression_attribute_values.as_ref())
            + expressions(&[delete.condition_expression.as_ref()]);
    }
    write.condition_check.as_ref().map_or(0, |check| {
        attributes(&check.key)
            + values(check.expression_attribute_values.as_ref())
            + check.condition_expression.len()
    })
}
