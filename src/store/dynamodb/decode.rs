//! A record read back from an item: its outcome, when stored compressed or in part items, is
//! read and decompressed only as far as the caller needs ([`Parts`]).

use tracing::warn;

use super::DynamoDbStore;
use super::item::{Deferred, Item, corrupt};
use super::outcome;
use crate::error::StoreError;
use crate::record::{Record, Settlement};

impl DynamoDbStore {
    /// The record in `item`; an outcome stored compressed or in part items is restored (read,
    /// decompressed) as `parts` says.
    pub(super) async fn decode(
        &self,
        item: Option<Item>,
        parts: Parts<'_>,
    ) -> Result<Option<Record>, StoreError> {
        let Some(item) = item else {
            return Ok(None);
        };
        let (mut record, deferred) = self.names.decode(item)?;
        let Some(deferred) = deferred else {
            return Ok(Some(record));
        };
        match parts {
            // The very bytes this settlement wrote: a compressed outcome in the record is
            // compared too, since its manifest names only its length.
            Parts::Known(placement, settlement)
                if placement.describes(deferred.manifest())
                    && match &deferred {
                        Deferred::Inline { stored, .. } => placement.stores(stored),
                        Deferred::Parts { .. } => true,
                    } =>
            {
                record.outcome.clone_from(&settlement.outcome);
            }
            parts if parts.reads(&record) => {
                let (manifest, stored) = match deferred {
                    Deferred::Inline { manifest, stored } => (manifest, stored),
                    Deferred::Parts { manifest, refs } => {
                        match self.read_parts(&record.key, &refs).await? {
                            Some(stored) => (manifest, stored),
                            // Read as stored, expired or not: TTL deletes a record's parts an
                            // hour past its retention, in its own time, which can come before
                            // the record's. The outcome is left out; the record's times say
                            // whether it still counts.
                            None if matches!(parts, Parts::Kept) => {
                                warn!(
                                    key = record.key.short(),
                                    "an outcome part is missing (deleted by TTL past the record's retention?): the record is read without its outcome"
                                );
                                return Ok(Some(record));
                            }
                            None => {
                                return Err(corrupt(
                                    record.key.short(),
                                    "an outcome part is missing".into(),
                                ));
                            }
                        }
                    }
                };
                record.outcome =
                    Some(manifest.restore(stored, &record.key, self.outcomes.outcome_limit())?);
            }
            _ => {}
        }
        Ok(Some(record))
    }
}

/// How much of an outcome kept in part items a decoded record needs.
#[derive(Clone, Copy)]
pub(super) enum Parts<'a> {
    /// Read the parts: the record may be answered from (replayed).
    Read,
    /// Read the parts TTL has left: a plain read of the record as stored, expired or not
    /// ([`StoreExt::get`](crate::store::StoreExt::get)), mostly for its state. A missing part
    /// leaves the outcome out (`None`) instead of failing the read, since TTL deletes a
    /// record's parts an hour past its retention and may do so before it deletes the record;
    /// an answer from the record then finds no outcome to replay.
    Kept,
    /// Read the parts only if the record may be replayed to a caller with this fingerprint;
    /// otherwise leave the outcome out (`None`): the caller's answer is a payload conflict,
    /// which costs no part read.
    ReplayableTo(&'a crate::key::Fingerprint),
    /// Leave a stored-as-is outcome in, any other out (`None`): only the record's state
    /// matters.
    Skip,
    /// The record is compared with this settlement: when its manifest names this placement's
    /// bytes, its outcome is the settlement's (the digest says so), without a read; otherwise
    /// it is left out.
    Known(&'a outcome::Placement, &'a Settlement),
}

impl Parts<'_> {
    /// Whether `record`'s outcome parts are read.
    fn reads(self, record: &Record) -> bool {
        match self {
            Self::Read | Self::Kept => true,
            Self::ReplayableTo(fingerprint) => {
                fingerprint.names(&record.fingerprint, record.created_at)
            }
            Self::Skip | Self::Known(..) => false,
        }
    }
}
