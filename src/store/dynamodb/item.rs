//! Records as DynamoDB items: attribute names, encoding and decoding.

use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;

use super::outcome::{Manifest, PartsRef};
use super::steps::{read_steps, steps_value};
use crate::error::StoreError;
use crate::key::{Fingerprint, KeyRule, OperationKey};
use crate::record::{
    Audit, Lease, Record, Status, epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs,
};

/// An item as the SDK sees it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// DynamoDB's item size limit, in bytes: an outcome past it is kept in part items.
pub const DYNAMODB_ITEM_LIMIT: usize = 400 * 1024;

/// The attribute names of the idempotency table; every one can be renamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributeNames {
    /// Partition key (S): the operation key.
    pub partition_key: String,
    /// Optional sort key (S) for a table shared with other record kinds: every record of this
    /// store carries the same value in it.
    pub sort_key: Option<SortKey>,
    /// Status (S).
    pub status: String,
    /// Fingerprint (S).
    pub fingerprint: String,
    /// The [`KeyRule`] that derived the key and fingerprint (N), absent on records versions
    /// before 0.5 wrote.
    pub key_rule: String,
    /// Lease token (S).
    pub lease_token: String,
    /// Attempt (N).
    pub attempt: String,
    /// Lease expiry (N, epoch milliseconds).
    pub lease_expires_at: String,
    /// Retention expiry (N, epoch seconds): the table's TTL attribute.
    pub expires_at: String,
    /// Outcome (B): the outcome, or what of it the record holds.
    pub outcome: String,
    /// How the outcome is stored (M), when it is compressed or kept in part items beside the
    /// record (see [`OutcomeStorage`](super::OutcomeStorage)).
    pub outcome_format: String,
    /// First claim (N, epoch milliseconds).
    pub created_at: String,
    /// Settlement (N, epoch milliseconds).
    pub completed_at: String,
    /// Request id (S).
    pub request_id: String,
    /// Business identity (S), when the operation declared one.
    pub identity: String,
    /// An operator's trace (M: `by`, `at` in epoch milliseconds, `action`, `reason`), when an
    /// operator resolved the operation.
    pub audit: String,
    /// The operation's steps (L of M, see [`crate::effects`]), once it records one.
    pub steps: String,
    /// How many times the step list was written (N): what a takeover is conditioned on.
    pub steps_version: String,
}

/// A sort key for single-table designs. The operation key stays in the partition key, so
/// records spread over every partition (one shared partition value would put the whole
/// workload under one partition's 1,000 write units a second); the sort key names the record
/// kind, apart from the table's other items under the same partition key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    /// The sort key attribute.
    pub attribute: String,
    /// The value every record of this store has in it, e.g. `idempotency`.
    pub value: String,
}

impl Default for AttributeNames {
    fn default() -> Self {
        Self {
            partition_key: "pk".into(),
            sort_key: None,
            status: "status".into(),
            fingerprint: "fingerprint".into(),
            key_rule: "key_rule".into(),
            lease_token: "lease_token".into(),
            attempt: "attempt".into(),
            lease_expires_at: "lease_expires_at_ms".into(),
            expires_at: "expires_at".into(),
            outcome: "outcome".into(),
            outcome_format: "outcome_format".into(),
            created_at: "created_at".into(),
            completed_at: "completed_at".into(),
            request_id: "request_id".into(),
            identity: "identity".into(),
            audit: "audit".into(),
            steps: "steps".into(),
            steps_version: "steps_version".into(),
        }
    }
}

impl AttributeNames {
    /// The primary key attributes of `key`'s item.
    pub(crate) fn key(&self, key: &OperationKey) -> Item {
        let mut item = Item::with_capacity(2);
        self.insert_key(&mut item, key);
        item
    }

    fn insert_key(&self, item: &mut Item, key: &OperationKey) {
        item.insert(self.partition_key.clone(), s(key.as_str()));
        if let Some(sort) = &self.sort_key {
            item.insert(sort.attribute.clone(), s(&sort.value));
        }
    }

    /// The key of part `index` (each of at most `chunk` bytes) of the outcome whose stored
    /// bytes have the digest `sha256`: a partition of its own, beside the record's.
    pub(crate) fn part_key(
        &self,
        key: &OperationKey,
        sha256: &str,
        chunk: u64,
        index: usize,
    ) -> Item {
        let mut item = Item::new();
        item.insert(
            self.partition_key.clone(),
            AttributeValue::S(format!("{}#outcome#{sha256}#{chunk}#{index}", key.as_str())),
        );
        if let Some(sort) = &self.sort_key {
            item.insert(sort.attribute.clone(), s(&sort.value));
        }
        item
    }

    /// The full item of `record` (its outcome inline and uncompressed).
    pub(crate) fn encode(&self, record: &Record) -> Item {
        // Room for a claim's attributes and a few more: built without regrowing.
        let mut item = Item::with_capacity(14);
        self.insert_key(&mut item, &record.key);
        item.insert(self.status.clone(), s(record.status.as_str()));
        item.insert(self.fingerprint.clone(), s(record.fingerprint.as_str()));
        if let Some(rule) = record.fingerprint.rule().stored() {
            item.insert(self.key_rule.clone(), n(u64::from(rule)));
        }
        item.insert(self.lease_token.clone(), s(&record.lease.token));
        item.insert(self.attempt.clone(), n(u64::from(record.lease.attempt)));
        item.insert(
            self.lease_expires_at.clone(),
            millis(record.lease.expires_at),
        );
        item.insert(self.expires_at.clone(), secs(record.expires_at));
        item.insert(self.created_at.clone(), millis(record.created_at));
        if let Some(outcome) = &record.outcome {
            item.insert(
                self.outcome.clone(),
                AttributeValue::B(Blob::new(outcome.clone())),
            );
        }
        if let Some(completed_at) = record.completed_at {
            item.insert(self.completed_at.clone(), millis(completed_at));
        }
        if let Some(request_id) = &record.request_id {
            item.insert(self.request_id.clone(), s(request_id));
        }
        if let Some(identity) = &record.identity {
            item.insert(self.identity.clone(), s(identity));
        }
        if let Some(audit) = &record.audit {
            item.insert(self.audit.clone(), audit_value(audit));
        }
        if !record.steps.is_empty() {
            item.insert(self.steps.clone(), steps_value(&record.steps));
        }
        if record.steps_version > 0 {
            item.insert(self.steps_version.clone(), n(record.steps_version));
        }
        item
    }

    /// The size of `record`'s item by DynamoDB's rules: each attribute's name plus its value
    /// (strings and binaries by length, numbers one byte per two digits plus one).
    /// Counted from the record's fields, without building the item: the engine asks before
    /// every completion.
    pub fn item_size(&self, record: &Record) -> usize {
        let text = |name: &str, value: &str| name.len() + value.len();
        let number = |name: &str, value: u64| name.len() + number_size(value);
        let key = text(&self.partition_key, record.key.as_str())
            + self
                .sort_key
                .as_ref()
                .map_or(0, |sort| text(&sort.attribute, &sort.value));
        key + text(&self.status, record.status.as_str())
            + text(&self.fingerprint, record.fingerprint.as_str())
            + record
                .fingerprint
                .rule()
                .stored()
                .map_or(0, |rule| number(&self.key_rule, u64::from(rule)))
            + text(&self.lease_token, &record.lease.token)
            + number(&self.attempt, u64::from(record.lease.attempt))
            + number(
                &self.lease_expires_at,
                epoch_millis(record.lease.expires_at),
            )
            + number(&self.expires_at, epoch_secs(record.expires_at))
            + number(&self.created_at, epoch_millis(record.created_at))
            + record
                .outcome
                .as_ref()
                .map_or(0, |outcome| self.outcome.len() + outcome.len())
            + record
                .completed_at
                .map_or(0, |at| number(&self.completed_at, epoch_millis(at)))
            + record
                .request_id
                .as_ref()
                .map_or(0, |id| text(&self.request_id, id))
            + record
                .identity
                .as_ref()
                .map_or(0, |identity| text(&self.identity, identity))
            + record.audit.as_ref().map_or(0, |audit| {
                self.audit.len() + value_size(&audit_value(audit))
            })
            + match record.steps.is_empty() {
                true => 0,
                false => self.steps.len() + value_size(&steps_value(&record.steps)),
            }
            + match record.steps_version {
                0 => 0,
                version => number(&self.steps_version, version),
            }
    }

    /// The attributes of a record's summary: its key, status, fingerprint, lease and times,
    /// enough to decode it (with no outcome, steps or audit). The stuck check reads only these,
    /// and template.yaml limits its role to them (`dynamodb:Attributes`).
    pub(crate) fn summary(&self) -> Vec<&str> {
        let mut names = vec![
            self.partition_key.as_str(),
            &self.status,
            &self.fingerprint,
            &self.key_rule,
            &self.lease_token,
            &self.attempt,
            &self.lease_expires_at,
            &self.expires_at,
            &self.created_at,
            &self.completed_at,
        ];
        if let Some(sort) = &self.sort_key {
            names.push(&sort.attribute);
        }
        names
    }

    /// The projection of a record's [`Self::summary`]: the expression and its names
    /// (`#s0`, `#s1`, …).
    pub(crate) fn summary_projection(&self) -> (String, HashMap<String, String>) {
        let summary = self.summary();
        let expression = (0..summary.len())
            .map(|index| format!("#s{index}"))
            .collect::<Vec<_>>()
            .join(", ");
        let names = summary
            .into_iter()
            .enumerate()
            .map(|(index, name)| (format!("#s{index}"), name.to_owned()))
            .collect();
        (expression, names)
    }

    /// The record in `item`, and its outcome when it is not stored as it is (compressed inline,
    /// or kept in part items): the record's `outcome` is then `None` until the caller that
    /// answers from it restores it ([`Deferred`]), so that a record only looked at (a failed
    /// claim of another intent, an operator's count) costs no decompression.
    ///
    /// Every attribute is checked where it lies first; the strings and the outcome are then
    /// moved out of the item, not copied.
    pub(crate) fn decode(&self, mut item: Item) -> Result<(Record, Option<Deferred>), StoreError> {
        read_s(&item, &self.partition_key).map_err(|reason| corrupt("?", reason))?;
        let key = OperationKey::from_stored(take_s(&mut item, &self.partition_key));
        let decoder = Decoder {
            item: &item,
            key: &key,
        };
        let status = decoder.s(&self.status)?;
        let status = Status::parse(status)
            .ok_or_else(|| corrupt(key.short(), format!("unknown status `{status}`")))?;
        let attempt = u32::try_from(decoder.n(&self.attempt)?)
            .map_err(|_| corrupt(key.short(), "attempt out of range".into()))?;
        let manifest = item
            .get(&self.outcome_format)
            .map(|value| Manifest::read(value, &key))
            .transpose()?;
        // Checked for their kinds here, moved out below.
        decoder.optional(&self.outcome, |value| value.as_b().ok().map(drop))?;
        let compressed_inline = manifest
            .as_ref()
            .is_some_and(|manifest| manifest.parts().is_none());
        if compressed_inline && !item.contains_key(&self.outcome) {
            return Err(corrupt(
                key.short(),
                "a compressed outcome is missing".into(),
            ));
        }
        decoder.s(&self.fingerprint)?;
        let key_rule = decoder.key_rule(&self.key_rule)?;
        decoder.s(&self.lease_token)?;
        let lease_expires_at = decoder.millis(&self.lease_expires_at)?;
        let expires_at = decoder.secs(&self.expires_at)?;
        let created_at = decoder.millis(&self.created_at)?;
        let completed_at = decoder.optional_millis(&self.completed_at)?;
        decoder.optional(&self.request_id, |value| value.as_s().ok().map(drop))?;
        decoder.optional(&self.identity, |value| value.as_s().ok().map(drop))?;
        let audit = decoder.optional(&self.audit, read_audit)?;
        let steps = item
            .get(&self.steps)
            .map(|steps| read_steps(steps, &key))
            .transpose()?
            .unwrap_or_default();
        let steps_version = match item.contains_key(&self.steps_version) {
            true => decoder.n(&self.steps_version)?,
            false => 0,
        };
        let mut outcome = match item.remove(&self.outcome) {
            Some(AttributeValue::B(outcome)) => Some(outcome.into_inner()),
            _ => None,
        };
        let mut pending = None;
        if let Some(manifest) = manifest {
            pending = Some(match manifest.parts().cloned() {
                Some(refs) => Deferred::Parts { manifest, refs },
                None => Deferred::Inline {
                    stored: outcome.take().ok_or_else(|| {
                        corrupt(key.short(), "a compressed outcome is missing".into())
                    })?,
                    manifest,
                },
            });
        }
        let record = Record {
            status,
            fingerprint: Fingerprint::from_stored_under(
                take_s(&mut item, &self.fingerprint),
                key_rule,
            ),
            lease: Lease {
                token: take_s(&mut item, &self.lease_token),
                attempt,
                expires_at: lease_expires_at,
            },
            expires_at,
            outcome,
            created_at,
            completed_at,
            request_id: item
                .contains_key(&self.request_id)
                .then(|| take_s(&mut item, &self.request_id)),
            identity: item
                .contains_key(&self.identity)
                .then(|| take_s(&mut item, &self.identity)),
            audit,
            steps,
            steps_version,
            key,
        };
        Ok((record, pending))
    }
}

/// A decoded record's outcome as stored, and the manifest that says how to restore it.
#[derive(Debug)]
pub(crate) enum Deferred {
    /// Compressed, in the record.
    Inline { manifest: Manifest, stored: Vec<u8> },
    /// In the part items the manifest names (`refs`).
    Parts { manifest: Manifest, refs: PartsRef },
}

impl Deferred {
    /// How the outcome was stored.
    pub(crate) fn manifest(&self) -> &Manifest {
        match self {
            Self::Inline { manifest, .. } | Self::Parts { manifest, .. } => manifest,
        }
    }
}

/// Reads typed attributes of one item, reporting a corrupt record under `key`.
pub(crate) struct Decoder<'a> {
    pub(crate) item: &'a Item,
    pub(crate) key: &'a OperationKey,
}

impl Decoder<'_> {
    pub(crate) fn s(&self, attribute: &str) -> Result<&str, StoreError> {
        read_s(self.item, attribute).map_err(|reason| corrupt(self.key.short(), reason))
    }

    pub(crate) fn n(&self, attribute: &str) -> Result<u64, StoreError> {
        self.item
            .get(attribute)
            .and_then(|value| value.as_n().ok())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                corrupt(
                    self.key.short(),
                    format!("`{attribute}` is missing or not a whole number"),
                )
            })
    }

    /// The [`KeyRule`] a record names (absent: [`KeyRule::Unstated`]).
    pub(crate) fn key_rule(&self, attribute: &str) -> Result<KeyRule, StoreError> {
        if !self.item.contains_key(attribute) {
            return Ok(KeyRule::Unstated);
        }
        let rule = u32::try_from(self.n(attribute)?)
            .map_err(|_| corrupt(self.key.short(), format!("`{attribute}` out of range")))?;
        Ok(KeyRule::from_stored(Some(rule)))
    }

    /// A time stored as epoch milliseconds.
    pub(crate) fn millis(&self, attribute: &str) -> Result<SystemTime, StoreError> {
        from_epoch_millis(self.n(attribute)?).ok_or_else(|| self.out_of_range(attribute))
    }

    /// A time stored as epoch seconds.
    pub(crate) fn secs(&self, attribute: &str) -> Result<SystemTime, StoreError> {
        from_epoch_secs(self.n(attribute)?).ok_or_else(|| self.out_of_range(attribute))
    }

    /// An optional time stored as epoch milliseconds.
    pub(crate) fn optional_millis(
        &self,
        attribute: &str,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.optional(attribute, |value| {
            value.as_n().ok().and_then(|n| n.parse::<u64>().ok())
        })?
        .map(|millis| from_epoch_millis(millis).ok_or_else(|| self.out_of_range(attribute)))
        .transpose()
    }

    fn out_of_range(&self, attribute: &str) -> StoreError {
        corrupt(
            self.key.short(),
            format!("`{attribute}` is a time out of range"),
        )
    }

    pub(crate) fn optional<T>(
        &self,
        attribute: &str,
        read: impl FnOnce(&AttributeValue) -> Option<T>,
    ) -> Result<Option<T>, StoreError> {
        self.item
            .get(attribute)
            .map(|value| {
                read(value).ok_or_else(|| {
                    corrupt(
                        self.key.short(),
                        format!("`{attribute}` has the wrong type"),
                    )
                })
            })
            .transpose()
    }
}

/// The size DynamoDB counts for an attribute value of the kinds the store writes (S, B, N, M,
/// L): strings and binaries by length, numbers by digits, a map 3 bytes plus, per entry, its
/// name, its value and one byte; a list 3 bytes plus, per element, its value and one byte.
pub(crate) fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::N(number) => number.trim_start_matches('0').len().max(1).div_ceil(2) + 1,
        AttributeValue::M(fields) => {
            3 + fields
                .iter()
                .map(|(name, value)| name.len() + value_size(value) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(values) => {
            3 + values
                .iter()
                .map(|value| value_size(value) + 1)
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// The size DynamoDB counts for a whole number: one byte per two significant digits, plus one.
fn number_size(value: u64) -> usize {
    let digits = value.checked_ilog10().map_or(1, |log| log as usize + 1);
    digits.div_ceil(2) + 1
}

/// An operator's trace as a map attribute.
pub(crate) fn audit_value(audit: &Audit) -> AttributeValue {
    let mut fields = HashMap::from([
        ("by".to_owned(), s(&audit.by)),
        ("at".to_owned(), millis(audit.at)),
        ("action".to_owned(), s(&audit.action)),
    ]);
    if let Some(reason) = &audit.reason {
        fields.insert("reason".to_owned(), s(reason));
    }
    AttributeValue::M(fields)
}

/// An operator's trace from its map attribute; `None` when it is not one.
pub(crate) fn read_audit(value: &AttributeValue) -> Option<Audit> {
    let fields = value.as_m().ok()?;
    let text = |name: &str| fields.get(name)?.as_s().ok().cloned();
    let at = fields.get("at")?.as_n().ok()?.parse().ok()?;
    Some(Audit {
        by: text("by")?,
        at: from_epoch_millis(at)?,
        action: text("action")?,
        reason: text("reason"),
    })
}

/// Moves a string attribute out of `item`, once [`read_s`] (or a [`Decoder`]) has found it one
/// (empty otherwise).
fn take_s(item: &mut Item, attribute: &str) -> String {
    match item.remove(attribute) {
        Some(AttributeValue::S(text)) => text,
        _ => String::new(),
    }
}

pub(crate) fn read_s<'a>(item: &'a Item, attribute: &str) -> Result<&'a str, String> {
    item.get(attribute)
        .and_then(|value| value.as_s().ok())
        .map(String::as_str)
        .ok_or_else(|| format!("`{attribute}` is missing or not a string"))
}

pub(crate) fn corrupt(key_short: &str, reason: String) -> StoreError {
    StoreError::CorruptRecord {
        key_short: key_short.to_owned(),
        reason,
    }
}

pub(crate) fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

pub(crate) fn b(value: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(value))
}

pub(crate) fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn secs(time: SystemTime) -> AttributeValue {
    n(epoch_secs(time))
}

pub(crate) fn millis(time: SystemTime) -> AttributeValue {
    n(epoch_millis(time))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::{AttributeNames, SortKey, value_size};
    use crate::key::{Fingerprint, OperationKey};
    use crate::record::{Lease, Record, Status};

    /// The size DynamoDB counts for the item `names` encodes.
    fn encoded_size(names: &AttributeNames, record: &Record) -> usize {
        names
            .encode(record)
            .iter()
            .map(|(name, value)| name.len() + value_size(value))
            .sum()
    }

    #[test]
    fn item_size_counts_what_encode_writes() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_946_400_123);
        let claim = Record {
            key: OperationKey::from_stored("ns#op#v1#0123456789abcdef"),
            status: Status::InProgress,
            fingerprint: Fingerprint::from_stored("ab".repeat(32)),
            lease: Lease {
                token: "token-1".into(),
                attempt: 12,
                expires_at: at + Duration::from_secs(35),
            },
            expires_at: at + Duration::from_secs(86_400),
            outcome: None,
            created_at: at,
            completed_at: None,
            request_id: None,
            identity: None,
            audit: None,
            steps: Vec::new(),
            steps_version: 0,
        };
        let settled = Record {
            status: Status::Completed,
            outcome: Some(vec![b'x'; 1000]),
            completed_at: Some(at + Duration::from_millis(7)),
            request_id: Some("r".repeat(256)),
            identity: Some("invoice:o-1".into()),
            audit: Some(crate::record::Audit {
                by: "ops".into(),
                at,
                action: "completed from INDETERMINATE".into(),
                reason: Some("checked the ledger".into()),
            }),
            steps: vec![
                crate::record::StepRecord {
                    name: "charge".into(),
                    attempt: 1,
                    result: Some(vec![b'y'; 2000]),
                },
                crate::record::StepRecord::intent("email", 2),
            ],
            ..claim.clone()
        };
        let single_table = AttributeNames {
            sort_key: Some(SortKey {
                attribute: "sk".into(),
                value: "idempotency".into(),
            }),
            ..AttributeNames::default()
        };
        for names in [AttributeNames::default(), single_table] {
            for record in [&claim, &settled] {
                assert_eq!(names.item_size(record), encoded_size(&names, record));
            }
        }
    }
}
