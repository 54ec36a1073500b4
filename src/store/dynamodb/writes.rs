//! Conditional writes, sent alone or as one `TransactWriteItems`, with failed conditions decoded.

use std::collections::HashMap;
use std::pin::Pin;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::error::ConditionalCheckFailedException;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};

use super::DynamoDbStore;
use super::error::{map_cancellation, map_sdk_error};
use super::item::Item;
use crate::error::StoreError;

/// Expression attribute names (`#placeholder` → name).
type Names = HashMap<String, String>;
/// Expression attribute values (`:placeholder` → value).
type Values = HashMap<String, AttributeValue>;

/// Expression attribute names and values.
#[derive(Debug)]
pub(crate) struct Expr {
    names: Names,
    values: Values,
}

impl Default for Expr {
    /// Room for what a record's writes name (up to seven names and values each before either
    /// regrows).
    fn default() -> Self {
        Self {
            names: Names::with_capacity(7),
            values: Values::with_capacity(7),
        }
    }
}

impl Expr {
    /// Adds `#placeholder` → attribute name.
    pub(crate) fn name(mut self, placeholder: &str, attribute: &str) -> Self {
        self.names
            .insert(placeholder.to_owned(), attribute.to_owned());
        self
    }

    /// Adds `:placeholder` → value.
    pub(crate) fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.to_owned(), value);
        self
    }

    fn into_parts(self) -> (Option<Names>, Option<Values>) {
        let names = (!self.names.is_empty()).then_some(self.names);
        let values = (!self.values.is_empty()).then_some(self.values);
        (names, values)
    }
}

/// One conditional write; each returns the item as it stood when its condition fails.
#[derive(Debug)]
pub(crate) enum Write {
    Put(Put),
    Update(Update),
    Delete(Delete),
    /// A condition on an item that the transaction does not write (only inside one).
    Check(ConditionCheck),
    /// A handler's own write, as it built it (only inside a transaction).
    Item(Box<TransactWriteItem>),
}

/// What every conditioned write (put, update, delete, check) carries, written once: its
/// condition, the expression's names and values, and the old item when the condition fails.
/// (The SDK's four builders share these setters but no trait.)
macro_rules! conditioned {
    ($builder:expr, $condition:expr, $expr:expr) => {{
        let (names, values) = $expr.into_parts();
        $builder
            .condition_expression($condition)
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }};
}

impl Write {
    pub(crate) fn put(
        table: &str,
        item: Item,
        condition: &str,
        expr: Expr,
    ) -> Result<Self, StoreError> {
        conditioned!(
            Put::builder().table_name(table).set_item(Some(item)),
            condition,
            expr
        )
        .build()
        .map(Self::Put)
        .map_err(invalid)
    }

    pub(crate) fn update(
        table: &str,
        key: Item,
        update: &str,
        condition: &str,
        expr: Expr,
    ) -> Result<Self, StoreError> {
        conditioned!(
            Update::builder()
                .table_name(table)
                .set_key(Some(key))
                .update_expression(update),
            condition,
            expr
        )
        .build()
        .map(Self::Update)
        .map_err(invalid)
    }

    pub(crate) fn delete(
        table: &str,
        key: Item,
        condition: &str,
        expr: Expr,
    ) -> Result<Self, StoreError> {
        conditioned!(
            Delete::builder().table_name(table).set_key(Some(key)),
            condition,
            expr
        )
        .build()
        .map(Self::Delete)
        .map_err(invalid)
    }

    pub(crate) fn check(
        table: &str,
        key: Item,
        condition: &str,
        expr: Expr,
    ) -> Result<Self, StoreError> {
        conditioned!(
            ConditionCheck::builder()
                .table_name(table)
                .set_key(Some(key)),
            condition,
            expr
        )
        .build()
        .map(Self::Check)
        .map_err(invalid)
    }

    fn table(&self) -> &str {
        match self {
            Self::Put(put) => &put.table_name,
            Self::Update(update) => &update.table_name,
            Self::Delete(delete) => &delete.table_name,
            Self::Check(check) => &check.table_name,
            Self::Item(item) => item_table(item).unwrap_or_default(),
        }
    }

    pub(super) fn into_transact_item(self) -> TransactWriteItem {
        match self {
            Self::Put(put) => TransactWriteItem::builder().put(put).build(),
            Self::Update(update) => TransactWriteItem::builder().update(update).build(),
            Self::Delete(delete) => TransactWriteItem::builder().delete(delete).build(),
            Self::Check(check) => TransactWriteItem::builder().condition_check(check).build(),
            Self::Item(item) => *item,
        }
    }
}

/// The table a handler's transactional write names, if it names one action.
pub(crate) fn item_table(item: &TransactWriteItem) -> Option<&str> {
    match item {
        TransactWriteItem { put: Some(put), .. } => Some(&put.table_name),
        TransactWriteItem {
            update: Some(update),
            ..
        } => Some(&update.table_name),
        TransactWriteItem {
            delete: Some(delete),
            ..
        } => Some(&delete.table_name),
        TransactWriteItem {
            condition_check: Some(check),
            ..
        } => Some(&check.table_name),
        _ => None,
    }
}

/// How one write's condition fared when the writes were not applied.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Check {
    /// Its condition held (another write's failed).
    Passed,
    /// Its condition failed; the item as it stood, if there was one.
    Failed(Option<Item>),
}

impl Check {
    /// The item of a failed condition, empty items counted as absent.
    pub(crate) fn failed_item(&self) -> Option<Option<&Item>> {
        match self {
            Self::Passed => None,
            Self::Failed(item) => Some(item.as_ref().filter(|item| !item.is_empty())),
        }
    }

    /// [`Self::failed_item`], moved out.
    pub(crate) fn into_failed_item(self) -> Option<Option<Item>> {
        match self {
            Self::Passed => None,
            Self::Failed(item) => Some(item.filter(|item| !item.is_empty())),
        }
    }
}

impl DynamoDbStore {
    /// Applies `writes` atomically: one request for one write, a transaction for several.
    /// `Ok(None)`: applied. `Ok(Some(checks))`: not applied, one [`Check`] per write.
    pub(crate) async fn apply(
        &self,
        operation: &'static str,
        mut writes: Vec<Write>,
    ) -> Result<Option<Vec<Check>>, StoreError> {
        if writes.len() == 1
            && let Some(write) = writes.pop()
        {
            let table = write.table().to_owned();
            return match self.apply_one(operation, write).await {
                Ok(failed) => Ok(failed.map(|item| vec![Check::Failed(item)])),
                Err(StoreError::TableNotFound { .. }) => Err(self.not_found(&table)),
                Err(err) => Err(err),
            };
        }
        self.transact(operation, writes, None).await
    }

    /// Applies `writes` as one `TransactWriteItems`, idempotent under `token` when given (a
    /// re-sent commit within DynamoDB's ten minutes answers as the first did).
    pub(crate) async fn transact(
        &self,
        operation: &'static str,
        writes: Vec<Write>,
        token: Option<&str>,
    ) -> Result<Option<Vec<Check>>, StoreError> {
        let tables: Vec<String> = writes
            .iter()
            .map(|write| write.table().to_owned())
            .collect();
        let result = sent(
            self.client
                .transact_write_items()
                .set_transact_items(Some(
                    writes.into_iter().map(Write::into_transact_item).collect(),
                ))
                .set_client_request_token(token.map(str::to_owned))
                .send(),
        )
        .await;
        let err = match result {
            Ok(_) => return Ok(None),
            Err(err) => err,
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(canceled)) =
            err.as_service_error()
        else {
            return Err(match map_sdk_error(operation, &self.table, err) {
                StoreError::TableNotFound { .. } => self.missing_table(&tables).await,
                other => other,
            });
        };
        canceled
            .cancellation_reasons()
            .iter()
            .map(|reason| match reason.code() {
                None | Some("None") => Ok(Check::Passed),
                Some("ConditionalCheckFailed") => Ok(Check::Failed(reason.item().cloned())),
                Some(code) => Err(map_cancellation(operation, code, reason.message())),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Which of `tables` is missing (a transaction does not say): the first one DescribeTable
    /// does not find, named by its role.
    async fn missing_table(&self, tables: &[String]) -> StoreError {
        for table in tables {
            let described = sent(self.client.describe_table().table_name(table).send()).await;
            let missing = described.as_ref().err().and_then(|err| err.as_service_error()).is_some_and(
                aws_sdk_dynamodb::operation::describe_table::DescribeTableError::is_resource_not_found_exception,
            );
            if missing {
                return self.not_found(table);
            }
        }
        self.not_found(&self.table)
    }

    /// One write alone. `Ok(Some(item))`: its condition failed.
    async fn apply_one(
        &self,
        operation: &'static str,
        write: Write,
    ) -> Result<Option<Option<Item>>, StoreError> {
        let client = &self.client;
        match write {
            // A lone check writes nothing, and a handler's write goes with its step: never
            // sent alone.
            Write::Check(_) | Write::Item(_) => Err(StoreError::Rejected {
                operation,
                message: "a condition check is only sent inside a transaction".into(),
            }),
            Write::Put(put) => condition_outcome(
                operation,
                &self.table,
                sent(
                    client
                        .put_item()
                        .table_name(put.table_name)
                        .set_item(Some(put.item))
                        .set_condition_expression(put.condition_expression)
                        .set_expression_attribute_names(put.expression_attribute_names)
                        .set_expression_attribute_values(put.expression_attribute_values)
                        .return_values_on_condition_check_failure(
                            ReturnValuesOnConditionCheckFailure::AllOld,
                        )
                        .send(),
                )
                .await,
            ),
            Write::Update(update) => condition_outcome(
                operation,
                &self.table,
                sent(
                    client
                        .update_item()
                        .table_name(update.table_name)
                        .set_key(Some(update.key))
                        .update_expression(update.update_expression)
                        .set_condition_expression(update.condition_expression)
                        .set_expression_attribute_names(update.expression_attribute_names)
                        .set_expression_attribute_values(update.expression_attribute_values)
                        .return_values_on_condition_check_failure(
                            ReturnValuesOnConditionCheckFailure::AllOld,
                        )
                        .send(),
                )
                .await,
            ),
            Write::Delete(delete) => condition_outcome(
                operation,
                &self.table,
                sent(
                    client
                        .delete_item()
                        .table_name(delete.table_name)
                        .set_key(Some(delete.key))
                        .set_condition_expression(delete.condition_expression)
                        .set_expression_attribute_names(delete.expression_attribute_names)
                        .set_expression_attribute_values(delete.expression_attribute_values)
                        .return_values_on_condition_check_failure(
                            ReturnValuesOnConditionCheckFailure::AllOld,
                        )
                        .send(),
                )
                .await,
            ),
        }
    }
}

/// An SDK request's future, boxed where it is made: its few kilobytes are then not carried,
/// and copied as each is made, by every future around it (the store's, the erased store's
/// box, the engine's), which stay a few hundred bytes.
pub(super) fn sent<F: Future>(request: F) -> Pin<Box<F>> {
    Box::pin(request)
}

/// Splits a single write's result into applied, condition failed (with the item), or error.
fn condition_outcome<O, E, R>(
    operation: &'static str,
    table: &str,
    result: Result<O, SdkError<E, R>>,
) -> Result<Option<Option<Item>>, StoreError>
where
    E: AsConditionFailure
        + aws_sdk_dynamodb::error::ProvideErrorMetadata
        + std::error::Error
        + Send
        + Sync
        + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match result {
        Ok(_) => Ok(None),
        // The item is taken out of the error, not copied: a duplicate's whole record.
        Err(SdkError::ServiceError(failure)) if failure.err().condition_failure().is_some() => {
            Ok(Some(
                failure
                    .into_err()
                    .into_condition_failure()
                    .and_then(|failed| failed.item),
            ))
        }
        Err(err) => Err(map_sdk_error(operation, table, err)),
    }
}

fn invalid(err: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Rejected {
        operation: "build request",
        message: err.to_string(),
    }
}

/// The single-item operation errors whose condition can fail.
trait AsConditionFailure: Sized {
    fn condition_failure(&self) -> Option<&ConditionalCheckFailedException>;
    fn into_condition_failure(self) -> Option<ConditionalCheckFailedException>;
}

macro_rules! condition_failure {
    ($($error:ty),*) => {$(
        impl AsConditionFailure for $error {
            fn condition_failure(&self) -> Option<&ConditionalCheckFailedException> {
                match self {
                    Self::ConditionalCheckFailedException(failed) => Some(failed),
                    _ => None,
                }
            }

            fn into_condition_failure(self) -> Option<ConditionalCheckFailedException> {
                match self {
                    Self::ConditionalCheckFailedException(failed) => Some(failed),
                    _ => None,
                }
            }
        }
    )*};
}
condition_failure!(PutItemError, UpdateItemError, DeleteItemError);
