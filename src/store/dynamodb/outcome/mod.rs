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
//!
//! **Bounded reads.** Whatever a record says, restoring its outcome never takes more memory
//! than the store's outcome limit ([`OutcomeStorage::max_outcome_bytes`], set it to the engine's
//! [`Config::max_outcome_bytes`](crate::Config::max_outcome_bytes)): a manifest that names a
//! longer outcome or more stored bytes, or compressed bytes that would expand past it (a
//! compression bomb), is a corrupt record ([`StoreError::CorruptRecord`]), read no further.

mod codec;
mod manifest;
mod parts;

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sha2::{Digest, Sha256};

pub(crate) use self::codec::{Inflate, decompress_within};
pub(crate) use self::manifest::{Manifest, PartsRef};
use super::item::{AttributeNames, b, value_size};
use crate::config::MAX_OUTCOME_BYTES;
use crate::error::StoreError;
use crate::key::Fingerprint;
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
    max_outcome_bytes: usize,
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

    /// The largest outcome this store writes or restores (clamped to 1 ..=
    /// [`MAX_OUTCOME_BYTES`]; default [`MAX_OUTCOME_BYTES`], which reads what any
    /// configuration wrote). Set it to the engine's
    /// [`Config::max_outcome_bytes`](crate::Config::max_outcome_bytes), or the largest an
    /// operation declares ([`Operation::with_max_outcome_bytes`](crate::Operation::with_max_outcome_bytes)) if larger: a stored outcome that
    /// says it is longer, or whose compressed bytes expand past it, is then refused as a
    /// corrupt record without the memory it would take, and a longer settlement is rejected
    /// before it is written.
    ///
    /// ```
    /// use lambda_idempotency::store::OutcomeStorage;
    /// use lambda_idempotency::Config;
    ///
    /// let config = Config::builder().max_outcome_bytes(1024 * 1024).build()?;
    /// let storage = OutcomeStorage::default().max_outcome_bytes(config.max_outcome_bytes());
    /// assert_eq!(storage.outcome_limit(), 1024 * 1024);
    /// # Ok::<(), lambda_idempotency::ConfigError>(())
    /// ```
    pub fn max_outcome_bytes(mut self, bytes: usize) -> Self {
        self.max_outcome_bytes = bytes.clamp(1, MAX_OUTCOME_BYTES);
        self
    }

    /// The largest outcome this store writes or restores, in bytes.
    pub fn outcome_limit(&self) -> usize {
        self.max_outcome_bytes
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
        if raw.len() > self.max_outcome_bytes {
            return Err(StoreError::Rejected {
                operation: "settle",
                message: format!(
                    "the outcome takes {} bytes, more than this store restores ({}): raise \
                     OutcomeStorage::max_outcome_bytes to the engine's max_outcome_bytes",
                    raw.len(),
                    self.max_outcome_bytes
                ),
            });
        }
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
            max_outcome_bytes: MAX_OUTCOME_BYTES,
        }
    }
}

/// The settled record as the store sizes it before writing: the target's key and identity, the
/// settlement's times, and the attributes the store does not see at their usual width.
fn sized_record(target: Target<'_>, settlement: &Settlement) -> Record {
    let token = match target.guard {
        Guard::Lease(token) | Guard::Expired { token, .. } | Guard::Indeterminate { token, .. } => {
            token.to_owned()
        }
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
        steps: Vec::new(),
        steps_version: 0,
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

    /// Whether `stored` are this placement's stored bytes.
    pub(crate) fn stores(&self, stored: &[u8]) -> bool {
        self.stored == stored
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
