//! The audit trail of resolutions: one item per resolution attempt and one per its result,
//! appended to the uniqueness table under keys that start with `#audit#`.
//!
//! - **Neither a claim nor TTL erases it.** The uniqueness table has no TTL, and no claim,
//!   settlement or release writes a key outside its operation's evidence: evidence keys start
//!   with a namespace, a bare global identity has no `#`, and one with `#` starts with `#g#`.
//! - **The functions' roles cannot rewrite it.** Each function may write only keys that start
//!   with its own name (`dynamodb:LeadingKeys`, template.yaml), and a function name cannot
//!   start with `#`.
//! - **Append only.** Each item is a `PutItem` conditioned on the key being new; idemctl never
//!   updates or deletes one. Audit items carry no `status`, so the stuck check's evidence scan
//!   passes them by.
//!
//! Read them with a `Scan` of the uniqueness table filtered on `begins_with(pk, "#audit#")`.

use std::time::SystemTime;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::BoxError;
use lambda_idempotency::record::epoch_millis;
use sha2::{Digest, Sha256};

/// What every audit item's key starts with.
pub(crate) const PREFIX: &str = "#audit#";

/// One resolution, as the trail keeps it.
pub(crate) struct Entry<'a> {
    /// `record` or `evidence`.
    pub(crate) target_kind: &'static str,
    /// The operation key or the evidence key.
    pub(crate) target: &'a str,
    /// Who, as AWS identified the caller (or `unverified:NAME`).
    pub(crate) by: &'a str,
    /// Why, if given.
    pub(crate) reason: Option<&'a str>,
    /// What the resolution writes, one line each, as the confirmation showed them.
    pub(crate) writes: &'a [String],
}

/// The trail on `table`, written with `client`.
pub(crate) struct Trail<'a> {
    pub(crate) client: &'a Client,
    pub(crate) table: &'a str,
}

impl Trail<'_> {
    /// Appends the attempt `entry` at `at`; the key of its item, which its result names.
    pub(crate) async fn attempt(
        &self,
        entry: &Entry<'_>,
        at: SystemTime,
    ) -> Result<String, BoxError> {
        let millis = epoch_millis(at);
        let nonce = hex::encode(
            &Sha256::digest(format!("{}{millis}{}", entry.target, std::process::id()))[..6],
        );
        let key = format!(
            "{PREFIX}{}#{millis:013}#{nonce}",
            target_digest(entry.target)
        );
        let mut put = self
            .client
            .put_item()
            .table_name(self.table)
            .item("pk", AttributeValue::S(key.clone()))
            .item("event", AttributeValue::S("resolution".into()))
            .item("target_kind", AttributeValue::S(entry.target_kind.into()))
            .item("target", AttributeValue::S(entry.target.into()))
            .item("by", AttributeValue::S(entry.by.into()))
            .item("at", AttributeValue::N(millis.to_string()))
            .item(
                "writes",
                AttributeValue::L(
                    entry
                        .writes
                        .iter()
                        .map(|line| AttributeValue::S(line.clone()))
                        .collect(),
                ),
            );
        if let Some(reason) = entry.reason {
            put = put.item("reason", AttributeValue::S(reason.into()));
        }
        put.condition_expression("attribute_not_exists(pk)")
            .send()
            .await
            .map_err(|err| {
                format!(
                    "cannot append to the audit trail in {} ({}): nothing changed",
                    self.table,
                    aws_sdk_dynamodb::error::DisplayErrorContext(&err)
                )
            })?;
        Ok(key)
    }

    /// Appends the result of the attempt at `attempt`: whether the resolution was written, or
    /// the kind of the error that stopped it (`resolved` false, with `error`).
    pub(crate) async fn result(
        &self,
        attempt: &str,
        result: Result<bool, &str>,
        at: SystemTime,
    ) -> Result<(), BoxError> {
        let mut put = self
            .client
            .put_item()
            .table_name(self.table)
            .item("pk", AttributeValue::S(format!("{attempt}#result")))
            .item("event", AttributeValue::S("resolution_result".into()))
            .item("attempt", AttributeValue::S(attempt.into()))
            .item("resolved", AttributeValue::Bool(result == Ok(true)))
            .item("at", AttributeValue::N(epoch_millis(at).to_string()));
        if let Err(kind) = result {
            put = put.item("error", AttributeValue::S(kind.into()));
        }
        put.condition_expression("attribute_not_exists(pk)")
            .send()
            .await
            .map_err(|err| {
                format!(
                    "the resolution's result could not be appended to the audit trail in {} ({}); its attempt is there",
                    self.table,
                    aws_sdk_dynamodb::error::DisplayErrorContext(&err)
                )
            })?;
        Ok(())
    }
}

/// A short digest of the target: the items of one operation share their key's start, whatever
/// characters its key holds.
fn target_digest(target: &str) -> String {
    hex::encode(&Sha256::digest(target)[..16])
}
