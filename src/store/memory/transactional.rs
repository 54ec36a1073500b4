//! The memory store's transactional capability (feature `testing`): the handler's own
//! DynamoDB writes committed into an in-process DynamoDB (dynoxide), in one step with the
//! record's own write, under the store's lock.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use dynoxide::DynoxideError;
use dynoxide::actions::transact_write_items as dx;
use futures_util::future::BoxFuture;

use super::{MemoryStore, Tables};
use crate::defects;
use crate::error::StoreError;
use crate::record::{Settlement, StepRecord};
use crate::store::dynamodb::{map_cancellation, transaction_limits};
use crate::store::{
    Committed, Fence, Request, Target, TransactionalStore, shows_commit, too_many_actions,
    writes_refused,
};

/// The handler's own tables: an in-process DynamoDB its writes are committed to.
#[derive(Clone)]
pub(super) struct OwnTables(dynoxide::Database);

impl std::fmt::Debug for OwnTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnTables")
    }
}

impl MemoryStore {
    /// An empty store that also commits the handler's own DynamoDB writes (transactional
    /// steps, writes carried by the completion, outbox events) into `tables`, an in-process
    /// DynamoDB holding the handler's tables: the writes and the record's own write apply
    /// together or not at all, as on the DynamoDB store. Create the handler's tables in
    /// `tables` first; read them back through it (or through an SDK client of an endpoint
    /// serving it, [`crate::testing::local::serve`]).
    ///
    /// ```
    /// use lambda_idempotency::store::{MemoryStore, Store};
    /// let store = MemoryStore::with_tables(dynoxide::Database::memory()?);
    /// assert!(store.transactional().is_some());
    /// assert!(MemoryStore::new().transactional().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_tables(tables: dynoxide::Database) -> Self {
        Self {
            own_tables: Some(OwnTables(tables)),
            ..Self::default()
        }
    }

    /// Commits `writes` into the handler's tables, then `own` into the store's (`committing`:
    /// the request they commit with), while the store's lock is held and the target's fence
    /// (`None`) admits it. `own_actions`: how many actions the record's own write takes on
    /// DynamoDB (for its limits).
    fn commit_with(
        &self,
        committing: Request<'_>,
        own_actions: usize,
        writes: &[TransactWriteItem],
        token: &str,
        fence: impl FnOnce(&Tables) -> Result<Option<Committed>, StoreError>,
        own: impl FnOnce(&mut Tables),
    ) -> Result<Committed, StoreError> {
        let Some(OwnTables(database)) = &self.own_tables else {
            return Ok(writes_refused(committing));
        };
        let operation = match committing {
            Request::RecordSteps { .. } => "commit_steps",
            other => other.name(),
        };
        // Refused before anything is written, as the DynamoDB store refuses them before
        // sending (the record's own write is not a DynamoDB item here: counted, not sized).
        if let Some(message) = too_many_actions(own_actions, writes.len()) {
            return Ok(Committed::Invalid { message });
        }
        if let Err(message) = transaction_limits(&[], writes, "") {
            return Ok(Committed::Invalid { message });
        }
        let request = match request(writes, token) {
            Ok(request) => request,
            Err(message) => return Ok(Committed::Invalid { message }),
        };
        let mut tables = self.lock();
        if let Some(answer) = fence(&tables)? {
            if defects::is_reintroduced(defects::UNFENCED_TRANSACTION) && !writes.is_empty() {
                let _ = database.transact_write_items(request);
            }
            return Ok(answer);
        }
        if !writes.is_empty() {
            match database.transact_write_items(request) {
                Ok(_) => {}
                Err(DynoxideError::TransactionCanceledException(_, reasons)) => {
                    return canceled(operation, &reasons);
                }
                Err(err) => return Err(store_error(operation, database, writes, err)),
            }
        }
        own(&mut tables);
        Ok(Committed::Applied)
    }
}

impl TransactionalStore for MemoryStore {
    fn commit<'a>(
        &'a self,
        request: Request<'a>,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(async move {
            match request {
                Request::RecordSteps { target, steps } => {
                    self.commit_steps(target, steps, writes, token)
                }
                Request::Settle { target, settlement } => {
                    self.settle_with(target, settlement, writes, token)
                }
                other => Ok(writes_refused(other)),
            }
        })
    }

    /// Always `Ok` for a store with the handler's tables: they accept transactions.
    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            match self.own_tables {
                Some(_) => Ok(()),
                None => Err(StoreError::Rejected {
                    operation: "check_transactional_writes",
                    message: "this memory store has no tables for the handler's writes; build it with MemoryStore::with_tables".into(),
                }),
            }
        })
    }
}

impl MemoryStore {
    /// A transactional step's commit, under the lock.
    fn commit_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, StoreError> {
        // The record alone, as on DynamoDB: the evidence is not touched, so not checked.
        let target = Target {
            identity: None,
            ..target
        };
        self.commit_with(
            Request::RecordSteps { target, steps },
            1,
            writes,
            token,
            |tables| {
                // As DynamoDB's condition: the step this commit adds must not be in the
                // list yet, so that a re-send after it applied never applies the writes
                // twice, and is recognised as this commit.
                let current = tables.records.get(target.key);
                let resent = steps.split_last().is_some_and(|(adding, before)| {
                    current
                        .and_then(|record| record.steps.get(before.len()))
                        .is_some_and(|at| at.name == adding.name && at.attempt == adding.attempt)
                });
                if !resent && tables.fence(target)?.is_none() {
                    return Ok(None);
                }
                Ok(Some(match current {
                    Some(current) if shows_commit(current, target, steps) => Committed::Applied,
                    current => Committed::LeaseLost {
                        current: current.cloned().map(Box::new),
                    },
                }))
            },
            |tables| tables.record_steps(target, steps),
        )
    }

    /// A settlement's commit with the completion's writes, under the lock.
    fn settle_with(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
        writes: &[TransactWriteItem],
        token: &str,
    ) -> Result<Committed, StoreError> {
        let own_actions = 1 + usize::from(target.identity.is_some());
        self.commit_with(
            Request::Settle { target, settlement },
            own_actions,
            writes,
            token,
            |tables| {
                Ok(tables.fence(target)?.map(|lost| match lost {
                    Fence::Lost { current } => Committed::LeaseLost { current },
                    Fence::Held => Committed::Applied,
                }))
            },
            |tables| tables.settle(target, settlement),
        )
    }
}

/// The answer to a transaction of the handler's writes that DynamoDB cancelled, read as the
/// DynamoDB store reads it: a reason other than a failed condition is the error it names;
/// else the first write whose condition failed is refused.
fn canceled(
    operation: &'static str,
    reasons: &[dynoxide::errors::CancellationReason],
) -> Result<Committed, StoreError> {
    let mut refused = None;
    for (write, reason) in reasons.iter().enumerate() {
        match reason.code.as_str() {
            "None" | "" => {}
            "ConditionalCheckFailed" => {
                refused.get_or_insert(write);
            }
            code => return Err(map_cancellation(operation, code, reason.message.as_deref())),
        }
    }
    match refused {
        Some(write) => Ok(Committed::Refused { write }),
        None => Err(StoreError::Contention { operation }),
    }
}

/// A failed transaction of the handler's writes as the DynamoDB store maps its SDK's errors:
/// a missing table named, throttling and conflicts retried, an invalid request rejected, and
/// anything else (a token reused with other writes included) an outcome unknown.
fn store_error(
    operation: &'static str,
    database: &dynoxide::Database,
    writes: &[TransactWriteItem],
    err: DynoxideError,
) -> StoreError {
    match err {
        DynoxideError::ResourceNotFoundException(_) => {
            let missing = writes.iter().filter_map(table_of).find(|table| {
                let request = dynoxide::actions::describe_table::DescribeTableRequest {
                    table_name: (*table).to_owned(),
                };
                database.describe_table(request).is_err()
            });
            StoreError::TableNotFound {
                table: missing.unwrap_or_default().to_owned(),
            }
        }
        DynoxideError::ValidationException(message)
        | DynoxideError::SerializationException(message) => {
            StoreError::Rejected { operation, message }
        }
        DynoxideError::ProvisionedThroughputExceededException(_)
        | DynoxideError::LimitExceededException(_) => StoreError::Throttled {
            operation,
            source: Box::new(err),
        },
        DynoxideError::AccessDeniedException(_) => StoreError::AccessDenied {
            operation,
            code: "AccessDeniedException".into(),
        },
        other => StoreError::Unavailable {
            operation,
            source: Box::new(other),
        },
    }
}

/// The table a write names.
fn table_of(write: &TransactWriteItem) -> Option<&str> {
    let put = write.put.as_ref().map(|put| put.table_name.as_str());
    let update = write
        .update
        .as_ref()
        .map(|update| update.table_name.as_str());
    let delete = write
        .delete
        .as_ref()
        .map(|delete| delete.table_name.as_str());
    let check = write
        .condition_check
        .as_ref()
        .map(|check| check.table_name.as_str());
    put.or(update).or(delete).or(check)
}

/// The handler's writes as dynoxide's request, sent under `token`.
fn request(
    writes: &[TransactWriteItem],
    token: &str,
) -> Result<dx::TransactWriteItemsRequest, String> {
    Ok(dx::TransactWriteItemsRequest {
        transact_items: writes.iter().map(action).collect::<Result<_, _>>()?,
        client_request_token: Some(token.to_owned()),
        ..dx::TransactWriteItemsRequest::default()
    })
}

/// One write as dynoxide's action.
fn action(write: &TransactWriteItem) -> Result<dx::TransactWriteItem, String> {
    let mut action = dx::TransactWriteItem::default();
    if let Some(put) = &write.put {
        action.put = Some(dx::TransactPut {
            table_name: put.table_name.clone(),
            item: item(&put.item)?,
            condition_expression: put.condition_expression.clone(),
            expression_attribute_names: put.expression_attribute_names.clone(),
            expression_attribute_values: values(put.expression_attribute_values.as_ref())?,
            return_values_on_condition_check_failure: None,
        });
    }
    if let Some(update) = &write.update {
        action.update = Some(dx::TransactUpdate {
            table_name: update.table_name.clone(),
            key: item(&update.key)?,
            update_expression: update.update_expression.clone(),
            condition_expression: update.condition_expression.clone(),
            expression_attribute_names: update.expression_attribute_names.clone(),
            expression_attribute_values: values(update.expression_attribute_values.as_ref())?,
            return_values_on_condition_check_failure: None,
        });
    }
    if let Some(delete) = &write.delete {
        action.delete = Some(dx::TransactDelete {
            table_name: delete.table_name.clone(),
            key: item(&delete.key)?,
            condition_expression: delete.condition_expression.clone(),
            expression_attribute_names: delete.expression_attribute_names.clone(),
            expression_attribute_values: values(delete.expression_attribute_values.as_ref())?,
            return_values_on_condition_check_failure: None,
        });
    }
    if let Some(check) = &write.condition_check {
        action.condition_check = Some(dx::TransactConditionCheck {
            table_name: check.table_name.clone(),
            key: item(&check.key)?,
            condition_expression: check.condition_expression.clone(),
            expression_attribute_names: check.expression_attribute_names.clone(),
            expression_attribute_values: values(check.expression_attribute_values.as_ref())?,
            return_values_on_condition_check_failure: None,
        });
    }
    Ok(action)
}

fn values(
    values: Option<&HashMap<String, AttributeValue>>,
) -> Result<Option<HashMap<String, dynoxide::AttributeValue>>, String> {
    values.map(item).transpose()
}

fn item(
    item: &HashMap<String, AttributeValue>,
) -> Result<HashMap<String, dynoxide::AttributeValue>, String> {
    item.iter()
        .map(|(name, attribute)| Ok((name.clone(), value(attribute)?)))
        .collect()
}

/// One attribute value as dynoxide's.
fn value(attribute: &AttributeValue) -> Result<dynoxide::AttributeValue, String> {
    use dynoxide::AttributeValue as Dx;
    let bytes = |blob: &aws_sdk_dynamodb::primitives::Blob| blob.as_ref().to_vec();
    Ok(match attribute {
        AttributeValue::S(s) => Dx::S(s.clone()),
        AttributeValue::N(n) => Dx::N(n.clone()),
        AttributeValue::B(b) => Dx::B(bytes(b)),
        AttributeValue::Bool(b) => Dx::BOOL(*b),
        AttributeValue::Null(b) => Dx::NULL(*b),
        AttributeValue::Ss(set) => Dx::SS(set.clone()),
        AttributeValue::Ns(set) => Dx::NS(set.clone()),
        AttributeValue::Bs(set) => Dx::BS(set.iter().map(bytes).collect()),
        AttributeValue::L(list) => Dx::L(list.iter().map(value).collect::<Result<_, _>>()?),
        AttributeValue::M(map) => Dx::M(item(map)?),
        _ => {
            return Err(
                "a write carries an attribute value of a type DynamoDB does not have".into(),
            );
        }
    })
}
