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

use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
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
        let mut item = HashMap::from([
            ("pk".to_owned(), AttributeValue::S(key.clone())),
            ("event".to_owned(), AttributeValue::S("resolution".into())),
            (
                "target_kind".to_owned(),
                AttributeValue::S(entry.target_kind.into()),
            ),
            ("target".to_owned(), AttributeValue::S(entry.target.into())),
            ("by".to_owned(), AttributeValue::S(entry.by.into())),
            ("at".to_owned(), AttributeValue::N(millis.to_string())),
            (
                "writes".to_owned(),
                AttributeValue::L(
                    entry
                        .writes
                        .iter()
                        .map(|line| AttributeValue::S(line.clone()))
                        .collect(),
                ),
            ),
        ]);
        if let Some(reason) = entry.reason {
            item.insert("reason".to_owned(), AttributeValue::S(reason.into()));
        }
        self.append(item).await.map_err(|err| {
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
        let mut item = HashMap::from([
            (
                "pk".to_owned(),
                AttributeValue::S(format!("{attempt}#result")),
            ),
            (
                "event".to_owned(),
                AttributeValue::S("resolution_result".into()),
            ),
            ("attempt".to_owned(), AttributeValue::S(attempt.into())),
            (
                "resolved".to_owned(),
                AttributeValue::Bool(result == Ok(true)),
            ),
            (
                "at".to_owned(),
                AttributeValue::N(epoch_millis(at).to_string()),
            ),
        ]);
        if let Err(kind) = result {
            item.insert("error".to_owned(), AttributeValue::S(kind.into()));
        }
        self.append(item).await.map_err(|err| {
            format!(
                "the resolution's result could not be appended to the audit trail in {} ({}); its attempt is there, without it",
                self.table,
                aws_sdk_dynamodb::error::DisplayErrorContext(&err)
            )
        })?;
        Ok(())
    }

    /// Puts `item` under a new key. A key already holding this very item is this append's own
    /// write: the SDK sent the request again after its answer was lost, and the retry's
    /// condition met what the first try wrote.
    async fn append(
        &self,
        item: HashMap<String, AttributeValue>,
    ) -> Result<(), SdkError<PutItemError, HttpResponse>> {
        let put = self
            .client
            .put_item()
            .table_name(self.table)
            .set_item(Some(item.clone()))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed))
                    if failed.item() == Some(&item) =>
                {
                    Ok(())
                }
                _ => Err(err),
            },
        }
    }
}

/// A short digest of the target: the items of one operation share their key's start, whatever
/// characters its key holds.
fn target_digest(target: &str) -> String {
    hex::encode(&Sha256::digest(target)[..16])
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use lambda_idempotency::testing::local::{create_key_table, sdk_config};

    use super::*;

    /// A client of the local endpoint, and a `pk` table on it.
    async fn table() -> Result<(Client, &'static str), BoxError> {
        let client = Client::from_conf(sdk_config().await?.build());
        let table = "uniqueness";
        create_key_table(&client, table, false).await?;
        Ok((client, table))
    }

    /// The SDK sends a request again when its answer was lost: the append that meets its own
    /// write goes on (its attempt then gets its result), one that meets another's does not.
    #[tokio::test]
    async fn an_append_sent_again_after_its_answer_was_lost_is_its_own() -> Result<(), BoxError> {
        let (client, table) = table().await?;
        let trail = Trail {
            client: &client,
            table,
        };
        let writes = ["COMPLETED with an outcome of 14 bytes".to_owned()];
        let entry = Entry {
            target_kind: "record",
            target: "orders#place#v1#ab12",
            by: "arn:aws:iam::111122223333:user/ops",
            reason: Some("checked the ledger"),
            writes: &writes,
        };
        let at = UNIX_EPOCH + Duration::from_secs(1_765_000_000);

        let first = trail.attempt(&entry, at).await?;
        let again = trail.attempt(&entry, at).await?;
        assert_eq!(first, again, "the same item, appended once");
        trail.result(&first, Ok(true), at).await?;
        trail.result(&first, Ok(true), at).await?;

        assert!(
            trail.result(&first, Ok(false), at).await.is_err(),
            "another result for the attempt is refused"
        );
        let other = Entry {
            by: "unverified:mallory",
            ..entry
        };
        assert!(
            trail.attempt(&other, at).await.is_err(),
            "another operator's attempt under the same key is never taken for this one"
        );
        Ok(())
    }
}
