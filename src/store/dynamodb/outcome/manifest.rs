//! The manifest a record keeps in its `outcome_format` attribute (its fields: the table in the
//! parent module's docs): how the stored outcome bytes are read, compressed or not, in the
//! record or in part items.

use aws_sdk_dynamodb::types::AttributeValue;

use super::super::item::{Item, corrupt, n, s};
use super::codec::decompress_within;
use crate::error::StoreError;
use crate::key::OperationKey;

/// The manifest field names.
const CODEC: &str = "codec";
const LENGTH: &str = "length";
const PARTS: &str = "parts";
const BYTES: &str = "bytes";
const SHA256: &str = "sha256";
const CHUNK: &str = "chunk";
const ZSTD: &str = "zstd";

/// How a record's stored outcome bytes are to be read: the `outcome_format` attribute.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// The decompressed length, when the stored bytes are zstd-compressed.
    pub(super) length: Option<u64>,
    /// The part items, when the stored bytes are not in the record.
    pub(super) parts: Option<PartsRef>,
}

/// The part items holding an outcome's stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartsRef {
    pub(super) count: u64,
    pub(super) bytes: u64,
    /// The most bytes one part holds: in the parts' name too, so that parts cut to another
    /// size (another version) never stand in for these.
    pub(super) chunk: u64,
    pub(super) sha256: String,
}

impl Manifest {
    /// The attribute value (a map).
    pub(crate) fn to_attribute(&self) -> AttributeValue {
        let mut fields = Item::new();
        if let Some(length) = self.length {
            fields.insert(CODEC.into(), s(ZSTD));
            fields.insert(LENGTH.into(), n(length));
        }
        if let Some(parts) = &self.parts {
            fields.insert(PARTS.into(), n(parts.count));
            fields.insert(BYTES.into(), n(parts.bytes));
            fields.insert(CHUNK.into(), n(parts.chunk));
            fields.insert(SHA256.into(), s(&parts.sha256));
        }
        AttributeValue::M(fields)
    }

    /// The manifest in a stored attribute.
    pub(crate) fn read(value: &AttributeValue, key: &OperationKey) -> Result<Self, StoreError> {
        let bad = |reason: &str| corrupt(key.short(), format!("outcome format: {reason}"));
        let fields = value.as_m().map_err(|_| bad("not a map"))?;
        let number = |name: &str| -> Result<Option<u64>, StoreError> {
            fields
                .get(name)
                .map(|value| {
                    value
                        .as_n()
                        .ok()
                        .and_then(|n| n.parse().ok())
                        .ok_or_else(|| bad(&format!("`{name}` is not a whole number")))
                })
                .transpose()
        };
        let length = match fields.get(CODEC).map(AttributeValue::as_s) {
            None => None,
            Some(Ok(codec)) if codec == ZSTD => {
                Some(number(LENGTH)?.ok_or_else(|| bad("`length` is missing"))?)
            }
            Some(_) => return Err(bad("unknown codec (written by a newer version?)")),
        };
        let parts = match number(PARTS)? {
            None => None,
            Some(count) => Some(PartsRef {
                count,
                bytes: number(BYTES)?.ok_or_else(|| bad("`bytes` is missing"))?,
                chunk: number(CHUNK)?.ok_or_else(|| bad("`chunk` is missing"))?,
                sha256: fields
                    .get(SHA256)
                    .and_then(|value| value.as_s().ok())
                    .cloned()
                    .ok_or_else(|| bad("`sha256` is missing"))?,
            }),
        };
        Ok(Self { length, parts })
    }

    /// The part items to read, if the stored bytes are not in the record.
    pub(crate) fn parts(&self) -> Option<&PartsRef> {
        self.parts.as_ref()
    }

    /// The outcome from its stored bytes (decompressed if they are compressed), at most
    /// `limit` bytes: a manifest that names a longer outcome, stored bytes longer than the
    /// limit, or compressed bytes that expand past it (a compression bomb) are a corrupt
    /// record, refused before (or as soon as) the limit is passed.
    pub(crate) fn restore(
        &self,
        stored: Vec<u8>,
        key: &OperationKey,
        limit: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let Some(length) = self.length else {
            if stored.len() > limit {
                return Err(corrupt(
                    key.short(),
                    format!(
                        "outcome of {} bytes, past the limit of {limit}",
                        stored.len()
                    ),
                ));
            }
            return Ok(stored);
        };
        let length = usize::try_from(length)
            .ok()
            .filter(|length| *length <= limit)
            .ok_or_else(|| {
                corrupt(
                    key.short(),
                    format!("outcome length {length} out of range (limit {limit})"),
                )
            })?;
        let outcome = decompress_within(&stored, length)
            .map_err(|err| corrupt(key.short(), format!("outcome {err}")))?;
        if outcome.len() != length {
            return Err(corrupt(
                key.short(),
                format!(
                    "outcome decompresses to {} bytes, not {length}",
                    outcome.len()
                ),
            ));
        }
        Ok(outcome)
    }
}
