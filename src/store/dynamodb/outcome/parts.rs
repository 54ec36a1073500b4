//! The part items' requests: writing a placement's parts before the settlement that names
//! them, and reading them back, checked against the manifest.

use std::time::SystemTime;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use futures_util::{StreamExt, TryStreamExt, stream};
use sha2::{Digest, Sha256};

use super::super::DynamoDbStore;
use super::super::error::map_sdk_error;
use super::super::item::{DYNAMODB_ITEM_LIMIT, b, corrupt, secs};
use super::{MAX_PARTS, PART_TTL_MARGIN, PARTS_IN_FLIGHT, PartsRef, Placement};
use crate::error::StoreError;
use crate::key::OperationKey;

impl DynamoDbStore {
    /// Writes the part items of `placement` (if it has any), kept until `record_expires_at`
    /// plus [`PART_TTL_MARGIN`]. A part's name is its content's digest, so a part already
    /// standing holds the same bytes: it is only written again to move its TTL later, never
    /// earlier (a late writer with a shorter retention cannot cut a standing record's parts).
    pub(crate) async fn put_parts(
        &self,
        key: &OperationKey,
        placement: &Placement,
        record_expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        let Some((parts, chunks)) = placement.parts() else {
            return Ok(());
        };
        let ttl = secs(record_expires_at + PART_TTL_MARGIN);
        let puts: Vec<_> = chunks
            .enumerate()
            .map(|(index, chunk)| {
                let mut item = self.names.part_key(key, &parts.sha256, parts.chunk, index);
                item.insert(self.names.outcome.clone(), b(chunk));
                item.insert(self.names.expires_at.clone(), ttl.clone());
                self.client
                    .put_item()
                    .table_name(&self.table)
                    .set_item(Some(item))
                    .condition_expression("attribute_not_exists(#pk) OR #expires_at < :ttl")
                    .expression_attribute_names("#pk", &self.names.partition_key)
                    .expression_attribute_names("#expires_at", &self.names.expires_at)
                    .expression_attribute_values(":ttl", ttl.clone())
            })
            .collect();
        stream::iter(puts)
            .map(|put| async move {
                match put.send().await {
                    Ok(_) => Ok(()),
                    // The same bytes stand, kept as long or longer.
                    Err(err)
                        if err
                            .as_service_error()
                            .is_some_and(PutItemError::is_conditional_check_failed_exception) =>
                    {
                        Ok(())
                    }
                    Err(err) => Err(map_sdk_error("settle", &self.table, err)),
                }
            })
            .buffer_unordered(PARTS_IN_FLIGHT)
            .try_for_each(|()| async { Ok(()) })
            .await
    }

    /// Reads an outcome's part items and checks them against the manifest: the stored bytes,
    /// whole; `None` when a part is missing (TTL deleted it, or something else did); or a
    /// corrupt-record error (bytes that do not match the manifest, or, before any read, a
    /// manifest naming more stored bytes than the store's outcome limit). Eventually consistent first, at half the read units: a
    /// part's name is its content's digest, so a read gives the right bytes or nothing (a part
    /// written moments ago may not have reached that replica yet); what is missing is read
    /// again strongly consistent (it was written before the manifest that names it).
    pub(crate) async fn read_parts(
        &self,
        key: &OperationKey,
        parts: &PartsRef,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let count = usize::try_from(parts.count)
            .ok()
            .filter(|count| (1..=MAX_PARTS).contains(count))
            .ok_or_else(|| corrupt(key.short(), "outcome part count out of range".into()))?;
        let chunk = usize::try_from(parts.chunk)
            .ok()
            .filter(|chunk| (1..=DYNAMODB_ITEM_LIMIT).contains(chunk))
            .ok_or_else(|| corrupt(key.short(), "outcome part size out of range".into()))?;
        let bytes = usize::try_from(parts.bytes)
            .ok()
            .filter(|bytes| bytes.div_ceil(chunk) == count)
            .ok_or_else(|| corrupt(key.short(), "outcome length out of range".into()))?;
        // Stored bytes are never more than the outcome (compressed only when shorter): more
        // than the limit is not read at all.
        let limit = self.outcomes.outcome_limit();
        if bytes > limit {
            return Err(corrupt(
                key.short(),
                format!("outcome parts of {bytes} bytes, past the limit of {limit}"),
            ));
        }
        let mut chunks = self.get_parts(key, parts, 0..count, false).await?;
        let missing: Vec<usize> = (0..count)
            .filter(|index| chunks[*index].is_none())
            .collect();
        if !missing.is_empty() {
            let again = self.get_parts(key, parts, missing.clone(), true).await?;
            for (index, chunk) in missing.into_iter().zip(again) {
                chunks[index] = chunk;
            }
        }
        let mut stored = Vec::with_capacity(bytes);
        for chunk in chunks {
            let Some(chunk) = chunk else {
                return Ok(None);
            };
            stored.extend_from_slice(&chunk);
        }
        if stored.len() as u64 != parts.bytes
            || hex::encode(Sha256::digest(&stored)) != parts.sha256
        {
            return Err(corrupt(
                key.short(),
                "outcome parts do not match their digest".into(),
            ));
        }
        Ok(Some(stored))
    }

    /// The stored bytes of the parts at `indexes`, in that order (`None`: no such item).
    async fn get_parts(
        &self,
        key: &OperationKey,
        parts: &PartsRef,
        indexes: impl IntoIterator<Item = usize>,
        consistent: bool,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let gets: Vec<_> = indexes
            .into_iter()
            .map(|index| {
                self.client
                    .get_item()
                    .table_name(&self.table)
                    .set_key(Some(self.names.part_key(
                        key,
                        &parts.sha256,
                        parts.chunk,
                        index,
                    )))
                    .consistent_read(consistent)
            })
            .collect();
        let outputs: Vec<_> = stream::iter(gets)
            .map(|get| get.send())
            .buffered(PARTS_IN_FLIGHT)
            .map_err(|err| map_sdk_error("get", &self.table, err))
            .try_collect()
            .await?;
        Ok(outputs
            .into_iter()
            .map(|output| {
                let mut item = output.item?;
                match item.remove(&self.names.outcome)? {
                    AttributeValue::B(blob) => Some(blob.into_inner()),
                    _ => None,
                }
            })
            .collect())
    }
}
