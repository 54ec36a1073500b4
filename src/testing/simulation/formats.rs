//! Step lists as another build writes them: the step list of a standing IN_PROGRESS record
//! rewritten, raw through the SDK, with the same steps in other bytes (another zstd level, or
//! uncompressed, and a field today's build does not write), as a build with another zstd, a
//! rollback or a later version would have left it. DESIGN §9: no condition compares bytes a
//! build re-encodes, so such a list is taken over as any other (judged in steps.rs). A store
//! that keeps records decoded (the memory store) has nothing to rewrite.

use std::any::Any;
use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::world::World;
use crate::error::BoxError;
use crate::record::{Record, Status};
use crate::store::{DynamoDbStore, Store};

/// How another build encodes a step's result in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// zstd at level 19, whatever the result's size (today's build compresses results over
    /// 1 KB only, at level 3).
    Zstd19,
    /// Uncompressed, whatever the size (a build without compression).
    Uncompressed,
}

/// The field a later build added to every step: today's build reads past it.
const LATER_FIELD: &str = "later_field";

impl<S: Store + Clone> World<S> {
    /// Rewrites the step list of one IN_PROGRESS record with steps (as the last check saw it)
    /// in `encoding`, when the store keeps DynamoDB items; its attempt is then watched until
    /// a delivery takes it over.
    pub(super) async fn re_encode(&mut self, encoding: Encoding) {
        let Some(store) = (self.store.inner() as &dyn Any).downcast_ref::<DynamoDbStore>() else {
            self.note("the store keeps no encoded step lists".into());
            return;
        };
        let (client, table) = (store.client().clone(), store.table().to_owned());
        let candidates: Vec<usize> = (0..self.specs.len())
            .filter(|op| {
                self.last_seen[*op].as_ref().is_some_and(|record| {
                    record.status == Status::InProgress && !record.steps.is_empty()
                })
            })
            .collect();
        if candidates.is_empty() {
            self.note("no step list in progress to rewrite".into());
            return;
        }
        let op = candidates[self.rng.usize(..candidates.len())];
        let Some(record) = self.last_seen[op].clone() else {
            return;
        };
        match rewrite(&client, &table, &record, encoding).await {
            Ok(true) => {
                self.stats.re_encoded += 1;
                self.re_encoded[op] = Some(record.lease.token.clone());
                self.note(format!(
                    "op {op}: the step list of attempt {} rewritten ({} entries)",
                    record.lease.attempt,
                    record.steps.len()
                ));
            }
            Ok(false) => self.note(format!("op {op}: its record changed; not rewritten")),
            Err(err) => self.note(format!("op {op}: not rewritten: {err}")),
        }
    }
}

/// Rewrites the `steps` of `record`'s item in `encoding`, on the condition that the item is
/// still the attempt read with the list as read (its lease token and list version); `false`
/// when it is not.
async fn rewrite(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    record: &Record,
    encoding: Encoding,
) -> Result<bool, BoxError> {
    let key = AttributeValue::S(record.key.to_string());
    let item = client
        .get_item()
        .table_name(table)
        .key("pk", key.clone())
        .consistent_read(true)
        .send()
        .await?
        .item;
    let Some(item) = item else {
        return Ok(false);
    };
    let token = AttributeValue::S(record.lease.token.clone());
    if item.get("lease_token") != Some(&token) {
        return Ok(false);
    }
    let Some(AttributeValue::L(steps)) = item.get("steps") else {
        return Ok(false);
    };
    let rewritten = steps
        .iter()
        .map(|step| re_encoded(step, encoding))
        .collect::<Result<Vec<_>, _>>()?;
    let update = client
        .update_item()
        .table_name(table)
        .key("pk", key)
        .update_expression("SET #steps = :steps")
        .expression_attribute_names("#steps", "steps")
        .expression_attribute_names("#token", "lease_token")
        .expression_attribute_names("#version", "steps_version")
        .expression_attribute_values(":steps", AttributeValue::L(rewritten))
        .expression_attribute_values(":token", token);
    let update = match item.get("steps_version") {
        Some(version) => update
            .condition_expression("#token = :token AND #version = :version")
            .expression_attribute_values(":version", version.clone()),
        None => update.condition_expression("#token = :token AND attribute_not_exists(#version)"),
    };
    match update.send().await {
        Ok(_) => Ok(true),
        Err(err)
            if err
                .as_service_error()
                .is_some_and(|err| err.is_conditional_check_failed_exception()) =>
        {
            Ok(false)
        }
        Err(err) => Err(err.into()),
    }
}

/// One step of a list as today's build wrote it, in `encoding`, with a later build's field.
fn re_encoded(step: &AttributeValue, encoding: Encoding) -> Result<AttributeValue, BoxError> {
    let AttributeValue::M(fields) = step else {
        return Err("a step that is not a map".into());
    };
    let mut fields: HashMap<String, AttributeValue> = fields.clone();
    let stored = fields.remove("result");
    let codec = fields.remove("codec");
    let length = fields.remove("length");
    if let Some(stored) = stored {
        let stored = stored
            .as_b()
            .map_err(|_| "a result that is not binary")?
            .as_ref()
            .to_vec();
        let result = match (codec, length) {
            (Some(_), Some(length)) => {
                let length: usize = length
                    .as_n()
                    .map_err(|_| "a length that is not a number")?
                    .parse()?;
                zstd::bulk::decompress(&stored, length)?
            }
            _ => stored,
        };
        match encoding {
            Encoding::Zstd19 => {
                let compressed = zstd::bulk::compress(&result, 19)?;
                fields.insert("codec".into(), AttributeValue::S("zstd".into()));
                fields.insert("length".into(), AttributeValue::N(result.len().to_string()));
                fields.insert("result".into(), AttributeValue::B(Blob::new(compressed)));
            }
            Encoding::Uncompressed => {
                fields.insert("result".into(), AttributeValue::B(Blob::new(result)));
            }
        }
    }
    fields.insert(
        LATER_FIELD.into(),
        AttributeValue::S("written by another build".into()),
    );
    Ok(AttributeValue::M(fields))
}
