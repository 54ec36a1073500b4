//! Where the DynamoDB store keeps an outcome, so that duplicates stay cheap and outcomes past
//! DynamoDB's 400 KB item limit can be replayed at all.
//!
//! DynamoDB charges a failed conditional write (a duplicate's claim) by the size of the item
//! that stands: a record holding a 100 KB outcome makes every duplicate cost 100 write units.
//! So an outcome stays *inline* in the record only while the settled record fits in
//! [`OutcomeStorage::inline_up_to`] bytes (1 KB by default: one write unit per duplicate). A
//! larger one is first compressed (zstd); if it still does not fit, its bytes go to *part items*
//! beside the record, each at most [`PART_BYTES`], and the record keeps a small manifest in its
//! `outcome_format` attribute:
//!
//! | manifest field | meaning |
//! |---|---|
//! | `codec` (S) | `zstd` when the stored bytes are compressed |
//! | `length` (N) | the outcome's length after decompression |
//! | `parts` (N) | how many part items hold the stored bytes |
//! | `bytes` (N) | the stored bytes' length, across the parts |
//! | `chunk` (N) | the most stored bytes one part holds ([`PART_BYTES`] when written) |
//! | `sha256` (S) | hex SHA-256 of the stored bytes: the parts' name and their check |
//!
//! The protocol stays the record's:
//! - **No partial replay.** Parts are written before the fenced settlement that names them; a
//!   settlement that fails or never happens leaves the record without a manifest (the parts are
//!   orphans that TTL deletes). A replay reads every part (eventually consistent, then strongly
//!   for any not found) and checks the length and digest before it decompresses: a missing or
//!   altered part is a corrupt record, never a truncated answer.
//! - **Fencing.** Parts are named by the digest of what they hold: a writer that lost its lease
//!   writes parts no manifest names (other bytes) or the very same bytes (same content), so it
//!   can never change what a replay returns.
//! - **Retention.** Every part carries the record's TTL plus [`PART_TTL_MARGIN`], so TTL never
//!   deletes a part while its record still counts.
//!
//! A record without the attribute holds its outcome inline and uncompressed, as records
//! written before the attribute existed do.

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use futures_util::{StreamExt, TryStreamExt, stream};
use sha2::{Digest, Sha256};

use super::DynamoDbStore;
use super::error::map_sdk_error;
use super::item::{AttributeNames, Item, b, corrupt, n, s, secs, value_size};
use crate::config::{DYNAMODB_ITEM_LIMIT, MAX_OUTCOME_BYTES};
use crate::error::StoreError;
use crate::key::{Fingerprint, OperationKey};
use crate::record::{Lease, Record, Settlement};
use crate::store::{Guard, Target};

/// The most stored bytes one part item holds: with its key and TTL it stays well inside
/// DynamoDB's 400 KB item limit.
pub const PART_BYTES: usize = 384 * 1024;
/// How much longer than its record a part is kept, so that TTL never deletes a part while its
/// record counts (a writer's clock and its retries shift a settlement by minutes at most).
pub const PART_TTL_MARGIN: Duration = Duration::from_secs(3600);
/// The most part items one outcome may take (stored bytes up to 24 MiB: room for the largest
/// outcome the engine accepts, [`MAX_OUTCOME_BYTES`], even when it does not compress).
const MAX_PARTS: usize = 64;
/// zstd's default level: most of the ratio for JSON at a few hundred MB/s.
const ZSTD_LEVEL: i32 = 3;
/// Part reads and writes in flight at once for one outcome.
const PARTS_IN_FLIGHT: usize = 8;
/// The length of a Lambda request id (a UUID), assumed for the record the store sizes.
const TYPICAL_REQUEST_ID_BYTES: usize = 36;
/// The manifest field names.
const CODEC: &str = "codec";
const LENGTH: &str = "length";
const PARTS: &str = "parts";
const BYTES: &str = "bytes";
const SHA256: &str = "sha256";
const CHUNK: &str = "chunk";
const ZSTD: &str = "zstd";

/// How the DynamoDB store keeps outcomes: inline while the settled record stays small,
/// compressed, then in part items beside the record (see the module's table in the crate's
/// guide).
///
/// ```
/// use lambda_idempotency::store::OutcomeStorage;
///
/// // Keep records up to 4 KB inline: a duplicate costs up to 4 write units, but never a read.
/// let storage = OutcomeStorage::default().inline_up_to(4096);
/// assert_eq!(storage.inline_item_bytes(), 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeStorage {
    inline_item_bytes: usize,
    compression: bool,
}

impl OutcomeStorage {
    /// The default inline limit: a settled record of 1 KB, so a duplicate's failed claim costs
    /// one write unit.
    pub const DEFAULT_INLINE_ITEM_BYTES: usize = 1024;
    /// The largest inline limit: past it, a duplicate would cost more than 64 write units.
    pub const MAX_INLINE_ITEM_BYTES: usize = 64 * 1024;

    /// Keeps an outcome in the record while the settled record (key, status, times, the
    /// outcome) is at most `item_bytes` (clamped to 1 KB ..= [`Self::MAX_INLINE_ITEM_BYTES`]:
    /// within a record's first KB, an inline outcome costs no more than parts would).
    /// Larger keeps more replays at one request, each duplicate costing a write unit per KB;
    /// smaller keeps every duplicate at one write unit, a larger outcome then costing one
    /// more round trip (its reads) per replay. The request id is counted at Lambda's 36
    /// characters.
    pub fn inline_up_to(mut self, item_bytes: usize) -> Self {
        self.inline_item_bytes = item_bytes.clamp(1024, Self::MAX_INLINE_ITEM_BYTES);
        self
    }

    /// Whether outcomes that do not fit inline are compressed (zstd) first (default: yes).
    pub fn compression(mut self, on: bool) -> Self {
        self.compression = on;
        self
    }

    /// The inline limit, in item bytes.
    pub fn inline_item_bytes(&self) -> usize {
        self.inline_item_bytes
    }

    /// Whether outcomes are compressed.
    pub fn compresses(&self) -> bool {
        self.compression
    }

    /// Where `settlement`'s outcome goes, for a record of `target` named by `names`.
    pub(crate) fn place(
        &self,
        names: &AttributeNames,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Placement, StoreError> {
        let Some(raw) = &settlement.outcome else {
            return Ok(Placement::none());
        };
        let record = names.item_size(&sized_record(target, settlement));
        let manifest_size =
            |m: &Manifest| names.outcome_format.len() + value_size(&m.to_attribute());
        // The record that names part items: what a duplicate would be billed on instead.
        let with_parts = record
            + manifest_size(&Manifest {
                length: Some(raw.len() as u64),
                parts: Some(PartsRef {
                    count: 1,
                    bytes: raw.len() as u64,
                    chunk: PART_BYTES as u64,
                    sha256: "0".repeat(64),
                }),
            });
        // Inline within the limit, or whenever it costs no more write units than parts would
        // (a long key, identity or request id makes every record larger than 1 KB).
        let fits = |stored: usize, manifest: Option<&Manifest>| {
            let size = record + names.outcome.len() + stored + manifest.map_or(0, manifest_size);
            size <= self.inline_item_bytes || size.div_ceil(1024) <= with_parts.div_ceil(1024)
        };
        if fits(raw.len(), None) {
            return Ok(Placement::inline(raw.clone(), None));
        }
        let mut manifest = Manifest::default();
        let mut stored = raw.clone();
        if self.compression {
            let compressed =
                zstd::bulk::compress(raw, ZSTD_LEVEL).map_err(|err| StoreError::Rejected {
                    operation: "settle",
                    message: format!("the outcome could not be compressed: {err}"),
                })?;
            if compressed.len() < raw.len() {
                manifest.length = Some(raw.len() as u64);
                stored = compressed;
            }
        }
        if fits(stored.len(), Some(&manifest)) {
            return Ok(Placement::inline(stored, Some(manifest)));
        }
        let parts = stored.len().div_ceil(PART_BYTES);
        if parts > MAX_PARTS {
            return Err(StoreError::Rejected {
                operation: "settle",
                message: format!(
                    "the outcome takes {} stored bytes, more than {MAX_PARTS} parts of \
                     {PART_BYTES}: lower max_outcome_bytes",
                    stored.len()
                ),
            });
        }
        manifest.parts = Some(PartsRef {
            count: parts as u64,
            bytes: stored.len() as u64,
            chunk: PART_BYTES as u64,
            sha256: hex::encode(Sha256::digest(&stored)),
        });
        Ok(Placement {
            stored,
            manifest: Some(manifest),
        })
    }
}

impl Default for OutcomeStorage {
    fn default() -> Self {
        Self {
            inline_item_bytes: Self::DEFAULT_INLINE_ITEM_BYTES,
            compression: true,
        }
    }
}

/// The settled record as the store sizes it before writing: the target's key and identity, the
/// settlement's times, and the attributes the store does not see at their usual width.
fn sized_record(target: Target<'_>, settlement: &Settlement) -> Record {
    let token = match target.guard {
        Guard::Lease(token) | Guard::Expired { token, .. } => token.to_owned(),
        Guard::Indeterminate => uuid::Uuid::nil().to_string(),
    };
    Record {
        key: target.key.clone(),
        status: settlement.status,
        fingerprint: Fingerprint::from_stored("0".repeat(64)),
        lease: Lease {
            token,
            attempt: u32::MAX,
            expires_at: settlement.completed_at,
        },
        expires_at: settlement.expires_at,
        outcome: None,
        created_at: settlement.completed_at,
        completed_at: Some(settlement.completed_at),
        request_id: Some("r".repeat(TYPICAL_REQUEST_ID_BYTES)),
        identity: target.identity.map(str::to_owned),
        audit: settlement.audit.clone(),
    }
}

/// How a record's stored outcome bytes are to be read: the `outcome_format` attribute.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// The decompressed length, when the stored bytes are zstd-compressed.
    length: Option<u64>,
    /// The part items, when the stored bytes are not in the record.
    parts: Option<PartsRef>,
}

/// The part items holding an outcome's stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartsRef {
    count: u64,
    bytes: u64,
    /// The most bytes one part holds: in the parts' name too, so that parts cut to another
    /// size (another version) never stand in for these.
    chunk: u64,
    sha256: String,
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

    /// The outcome from its stored bytes (decompressed if they are compressed).
    pub(crate) fn restore(
        &self,
        stored: Vec<u8>,
        key: &OperationKey,
    ) -> Result<Vec<u8>, StoreError> {
        let Some(length) = self.length else {
            return Ok(stored);
        };
        let length = usize::try_from(length)
            .ok()
            .filter(|length| *length <= MAX_OUTCOME_BYTES)
            .ok_or_else(|| corrupt(key.short(), "outcome length out of range".into()))?;
        let outcome = zstd::bulk::decompress(&stored, length)
            .map_err(|err| corrupt(key.short(), format!("outcome does not decompress: {err}")))?;
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

/// Where a settlement's outcome goes: its stored bytes, and the manifest that says how to read
/// them (none: inline and uncompressed).
#[derive(Debug)]
pub(crate) struct Placement {
    stored: Vec<u8>,
    manifest: Option<Manifest>,
}

impl Placement {
    fn none() -> Self {
        Self {
            stored: Vec::new(),
            manifest: None,
        }
    }

    fn inline(stored: Vec<u8>, manifest: Option<Manifest>) -> Self {
        let manifest = manifest.filter(|manifest| *manifest != Manifest::default());
        Self { stored, manifest }
    }

    /// The bytes the record itself holds, if any.
    pub(crate) fn inline_bytes(&self, settlement: &Settlement) -> Option<AttributeValue> {
        let external = self.manifest.as_ref().is_some_and(|m| m.parts.is_some());
        (settlement.outcome.is_some() && !external).then(|| b(&self.stored))
    }

    /// The manifest attribute, if the outcome is compressed or in parts.
    pub(crate) fn manifest(&self) -> Option<AttributeValue> {
        self.manifest.as_ref().map(Manifest::to_attribute)
    }

    /// Whether `manifest` names exactly the stored bytes of this placement.
    pub(crate) fn describes(&self, manifest: &Manifest) -> bool {
        self.manifest.as_ref() == Some(manifest)
    }

    /// The part items to write before the settlement, if any.
    fn parts(&self) -> Option<(&PartsRef, std::slice::Chunks<'_, u8>)> {
        let parts = self.manifest.as_ref()?.parts.as_ref()?;
        Some((parts, self.stored.chunks(PART_BYTES)))
    }
}

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
    /// whole, or a corrupt-record error. Eventually consistent first, at half the read units: a
    /// part's name is its content's digest, so a read gives the right bytes or nothing (a part
    /// written moments ago may not have reached that replica yet); what is missing is read
    /// again strongly consistent (it was written before the manifest that names it).
    pub(crate) async fn read_parts(
        &self,
        key: &OperationKey,
        parts: &PartsRef,
    ) -> Result<Vec<u8>, StoreError> {
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
        for (index, chunk) in chunks.into_iter().enumerate() {
            let chunk = chunk.ok_or_else(|| {
                corrupt(
                    key.short(),
                    format!("outcome part {} of {count} is missing", index + 1),
                )
            })?;
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
        Ok(stored)
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
