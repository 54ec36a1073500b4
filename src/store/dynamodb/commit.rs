//! A transactional step or settlement: the record's steps (or its settlement) and the
//! handler's own writes in one `TransactWriteItems`, checked against DynamoDB's limits before
//! it is sent.

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::DynamoDbStore;
use super::decode::Parts;
use super::item::{Item, n, s, value_size};
use super::steps::{STEPS_VERSION_BUMP, bump_steps_version, steps_value};
use super::writes::{Check, Write, item_table};
use crate::error::StoreError;
use crate::record::{Settlement, StepRecord};
use crate::store::{Committed, Target, shows_commit, too_many_actions};

/// The most bytes one `TransactWriteItems` carries.
pub(crate) const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

impl DynamoDbStore {
    /// A transactional step's commit ([`TransactionalStore::commit`](crate::store::TransactionalStore::commit)
    /// of [`Request::RecordSteps`](crate::store::Request::RecordSteps)) on DynamoDB.
    pub(crate) async fn commit_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, StoreError> {
        if let Some(refused) = self.refuse_transactions() {
            return Ok(refused);
        }
        let record_key = self.names.key(target.key);
        let (guard, expr) = self.guard(target.guard);
        // The step this commit adds is not in the list yet: a re-send after the first one
        // applied (an endpoint without token replay, or past DynamoDB's ten minutes) fails here
        // instead of applying the handler's writes twice, and is recognised below.
        let (condition, expr) = match steps.split_last() {
            Some((adding, before)) => (
                format!(
                    "{guard} AND NOT (#steps[{at}].#step_name = :adding_name AND #steps[{at}].#step_attempt = :adding_attempt)",
                    at = before.len()
                ),
                expr.name("#step_name", "name")
                    .name("#step_attempt", "attempt")
                    .value(":adding_name", s(&adding.name))
                    .value(":adding_attempt", n(u64::from(adding.attempt))),
            ),
            None => (guard.into_owned(), expr),
        };
        let own = Write::update(
            &self.table,
            record_key,
            &format!("SET #steps = :steps, {STEPS_VERSION_BUMP}"),
            &condition,
            bump_steps_version(expr.name("#steps", &self.names.steps), &self.names)
                .value(":steps", steps_value(steps)),
        )?;
        let own = vec![own.into_transact_item()];
        if let Err(message) = transaction_limits(&own, writes, &self.table) {
            return Ok(Committed::Invalid { message });
        }
        let answer = self
            .transact_with("commit_steps", target, own, writes, token)
            .await?;
        match answer {
            Answer::Lost(current) => {
                let current = self.decode(current, Parts::Skip).await?;
                match current {
                    // This very commit applied before its answer was lost: the record holds
                    // the lease and the step as committed.
                    Some(current) if shows_commit(&current, target, steps) => {
                        Ok(Committed::Applied)
                    }
                    current => Ok(Committed::LeaseLost {
                        current: current.map(Box::new),
                    }),
                }
            }
            Answer::Committed(committed) => Ok(committed),
        }
    }

    /// A settlement's commit with the completion's writes
    /// ([`TransactionalStore::commit`](crate::store::TransactionalStore::commit) of
    /// [`Request::Settle`](crate::store::Request::Settle)) on DynamoDB: the settlement's writes
    /// (the record's, the evidence's), then the handler's.
    pub(crate) async fn settle_committing(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, StoreError> {
        if let Some(refused) = self.refuse_transactions() {
            return Ok(refused);
        }
        let (own, placement) = self.settlement_writes(target, settlement)?;
        let own: Vec<TransactWriteItem> = own.into_iter().map(Write::into_transact_item).collect();
        // Refused before anything is written: no part item is left behind for nothing.
        if let Err(message) = transaction_limits(&own, writes, &self.table) {
            return Ok(Committed::Invalid { message });
        }
        self.put_parts(target.key, &placement, settlement.expires_at)
            .await?;
        let answer = self
            .transact_with("settle", target, own, writes, token)
            .await?;
        match answer {
            Answer::Lost(current) => Ok(Committed::LeaseLost {
                current: self
                    .decode(current, Parts::Known(&placement, settlement))
                    .await?
                    .map(Box::new),
            }),
            Answer::Committed(committed) => Ok(committed),
        }
    }

    /// One transaction of the crate's `own` writes (the record's first) and the handler's
    /// `writes` (checked against DynamoDB's limits already), sent under `token`.
    /// The answer to a transaction on a table a check found strongly consistent across
    /// Regions, which refuses transactions: refused before anything is sent or written.
    fn refuse_transactions(&self) -> Option<Committed> {
        self.strongly_consistent_table().map(|table| {
            let refusal = StoreError::TransactionalWritesUnsupported {
                table: table.to_owned(),
            };
            Committed::Invalid {
                message: refusal.to_string(),
            }
        })
    }

    async fn transact_with(
        &self,
        operation: &'static str,
        target: Target<'_>,
        own: Vec<TransactWriteItem>,
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Answer, StoreError> {
        let owned = own.len();
        let all = own
            .into_iter()
            .chain(writes.iter().cloned())
            .map(|write| Write::Item(Box::new(write)))
            .collect();
        let Some(checks) = self.transact(operation, all, Some(token)).await? else {
            return Ok(Answer::Committed(Committed::Applied));
        };
        if checks.first().and_then(Check::failed_item).is_some() {
            let current = checks.into_iter().next().and_then(Check::into_failed_item);
            return Ok(Answer::Lost(current.flatten()));
        }
        if checks[..owned.min(checks.len())]
            .iter()
            .any(|check| check.failed_item().is_some())
        {
            return Err(StoreError::evidence_not_owned(target.key));
        }
        match checks
            .iter()
            .skip(owned)
            .position(|check| check.failed_item().is_some())
        {
            Some(write) => Ok(Answer::Committed(Committed::Refused { write })),
            None => Err(StoreError::Contention { operation }),
        }
    }
}

/// Refuses, before sending, a transaction DynamoDB would refuse: more than 100 actions, more
/// than 4 MB, two actions on one item (among the keys the writes name, and the crate's `own`
/// writes', the record's first, in `record_table`), a handler's write that names no table or
/// several kinds. `Err` says what, for the operator.
pub(crate) fn transaction_limits(
    own: &[TransactWriteItem],
    writes: &[TransactWriteItem],
    record_table: &str,
) -> Result<(), String> {
    if let Some(message) = too_many_actions(own.len(), writes.len()) {
        return Err(message);
    }
    let record_key = own
        .first()
        .and_then(|write| write.update.as_ref())
        .map(|update| &update.key);
    let mut items: Vec<(&str, &Item)> = Vec::new();
    let mut bytes = 0;
    for write in own {
        bytes += write_size(write);
        if let (Some(table), Some(key)) = (item_table(write), own_key(write)) {
            items.push((table, key));
        }
    }
    for (index, write) in writes.iter().enumerate() {
        let kinds = [
            write.put.is_some(),
            write.update.is_some(),
            write.delete.is_some(),
            write.condition_check.is_some(),
        ];
        let table = item_table(write).filter(|_| kinds.iter().filter(|kind| **kind).count() == 1);
        let Some(table) = table else {
            return Err(format!(
                "write {index} must be exactly one Put, Update, Delete or ConditionCheck"
            ));
        };
        bytes += write_size(write);
        if let Some(key) = key_of(write, table, record_table, record_key) {
            if items
                .iter()
                .any(|(seen, item)| *seen == table && *item == key)
            {
                return Err(format!(
                    "write {index} acts on an item another action of the transaction acts on (or the operation's own record); DynamoDB allows one action per item"
                ));
            }
            items.push((table, key));
        }
    }
    if bytes > MAX_TRANSACTION_BYTES {
        return Err(format!(
            "the transaction takes about {bytes} bytes; DynamoDB takes at most {MAX_TRANSACTION_BYTES} in one transaction"
        ));
    }
    Ok(())
}

/// What a transaction of the crate's own writes and the handler's came to.
enum Answer {
    /// Committed, or refused by a handler's write.
    Committed(Committed),
    /// The record's fence failed: the record as it stands (if any).
    Lost(Option<Item>),
}

/// The key of one of the crate's own writes (an update's, a delete's or a check's; a put's
/// key is not known here).
fn own_key(write: &TransactWriteItem) -> Option<&Item> {
    write
        .update
        .as_ref()
        .map(|update| &update.key)
        .or_else(|| write.delete.as_ref().map(|delete| &delete.key))
        .or_else(|| write.condition_check.as_ref().map(|check| &check.key))
}

/// The key a write names: an update's, delete's or check's key; a put's item when it targets
/// the idempotency table and carries the record's key (other tables' key schemas are not
/// known here: DynamoDB itself refuses two actions on one of their items).
fn key_of<'a>(
    write: &'a TransactWriteItem,
    table: &str,
    record_table: &str,
    record_key: Option<&'a Item>,
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
    let record_key = record_key?;
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
