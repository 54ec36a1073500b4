//! Whether the tables replicate across Regions, checked at start-up: a conditional claim only
//! guards the Region that evaluates it unless the table has multi-Region strong consistency.
//!
//! | table | claims | business identities |
//! |---|---|---|
//! | single Region | safe | safe |
//! | global, multi-Region strong consistency (MRSC) | safe: every conditional write is decided against the latest write in any Region | refused: they need `TransactWriteItems`, which MRSC tables do not accept |
//! | global, multi-Region eventual consistency (MREC) | refused unless opted in: the last writer wins across Regions, so two Regions can both claim and both run | the same |

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{MultiRegionConsistency, TableDescription};
use futures_util::{FutureExt, future};
use tracing::warn;

use super::DynamoDbStore;
use super::error::map_sdk_error;
use crate::error::StoreError;

/// How a table replicates across Regions, as `DescribeTable` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replication {
    /// One Region.
    SingleRegion,
    /// A global table with multi-Region strong consistency (MRSC).
    Strong {
        /// The Regions of its replicas and witness.
        regions: Vec<String>,
    },
    /// A global table with multi-Region eventual consistency (MREC).
    Eventual {
        /// The Regions of its replicas.
        regions: Vec<String>,
    },
}

impl Replication {
    /// The replication `table` describes.
    fn of(table: &TableDescription) -> Self {
        let mut regions: Vec<String> = table
            .replicas()
            .iter()
            .filter_map(|replica| replica.region_name().map(str::to_owned))
            .collect();
        if regions.is_empty() {
            return Self::SingleRegion;
        }
        match table.multi_region_consistency() {
            Some(MultiRegionConsistency::Strong) => {
                regions.extend(
                    table
                        .global_table_witnesses()
                        .iter()
                        .filter_map(|witness| witness.region_name().map(str::to_owned)),
                );
                Self::Strong { regions }
            }
            // Unset on a global table means EVENTUAL, DynamoDB's default.
            _ => Self::Eventual { regions },
        }
    }
}

/// Why the store refuses claims, once the check has found it: kept for every clone of the
/// store, so that claims are refused even when the caller carried on past `prime`'s error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    Eventual { table: String, regions: Vec<String> },
    NoTransactions { table: String },
}

impl Refusal {
    fn to_error(&self) -> StoreError {
        match self {
            Self::Eventual { table, regions } => StoreError::EventuallyConsistentReplicas {
                table: table.clone(),
                regions: regions.clone(),
            },
            Self::NoTransactions { table } => StoreError::TransactionsUnsupported {
                table: table.clone(),
            },
        }
    }
}

/// A refusal found by a check, shared by a store and its clones (a builder that changes what
/// the check depends on starts a fresh one): unset until a check refuses.
pub(crate) type Verdict = Arc<OnceLock<Refusal>>;

/// Once a check has described the idempotency table: `Some(table)` when it has multi-Region
/// strong consistency (its transactional writes are then refused before they are sent), `None`
/// when it has not. Shared by a store and its clones.
pub(crate) type Strong = Arc<OnceLock<Option<String>>>;

/// A replication check owed and not completed (every store owes one from its creation;
/// [`DynamoDbStore::prime`] runs it at init, and one that failed for now, or ran out of time,
/// stays owed): the claims try it, one at a time (the others wait for
/// it), at most once per [`RETRY_OWED_CHECK_AFTER`], until it completes or fails for good.
/// Shared by a store and its clones.
#[derive(Debug, Default)]
pub(crate) struct OwedCheck {
    owed: AtomicBool,
    /// When a claim may try it next; held by the claim trying it.
    next_try: tokio::sync::Mutex<Option<Instant>>,
}

/// The shared [`OwedCheck`].
pub(crate) type Owed = Arc<OwedCheck>;

/// How long claims wait between two tries of a check that failed for now: `DescribeTable` is
/// throttled by the burst of cold starts that failed `prime`'s, and one try per claim would
/// keep it so.
const RETRY_OWED_CHECK_AFTER: Duration = Duration::from_secs(5);

impl DynamoDbStore {
    /// Accepts global tables with multi-Region eventual consistency (MREC), which
    /// [`Self::check_replication`] refuses otherwise. Opt in only when a single Region ever
    /// writes to the tables at a time (the others stand by for a fail-over, and a fail-over
    /// waits until replication has caught up): with writers in two Regions, both can claim the
    /// same key and both run the handler, since the last writer wins across Regions.
    pub fn accept_eventually_consistent_replicas(mut self) -> Self {
        self.accept_eventual = true;
        self.reset_replication_check();
        self
    }

    /// Whether a check has described the idempotency table's replication.
    pub(crate) fn described(&self) -> bool {
        self.strong.get().is_some()
    }

    /// `Some(table)` when a check found the idempotency table strongly consistent across
    /// Regions: transactional writes are refused there, before they are sent.
    pub(crate) fn strongly_consistent_table(&self) -> Option<&str> {
        self.strong.get().and_then(Option::as_deref)
    }

    /// Reads the tables' replication (`DescribeTable`, IAM `dynamodb:DescribeTable`) and
    /// refuses what would let two Regions claim one key: a global table with multi-Region
    /// eventual consistency (unless [`Self::accept_eventually_consistent_replicas`]), and a
    /// uniqueness table beside a table with multi-Region strong consistency, which accepts no
    /// transactions. (An operation that writes in transactions is refused on a table with
    /// multi-Region strong consistency by [`Operation::prime`](crate::lambda::Operation::prime),
    /// which asks [`TransactionalStore::check_transactional_writes`](crate::store::TransactionalStore::check_transactional_writes);
    /// other operations run there.) After a refusal, every claim of this store (and
    /// its clones) fails with the same error. [`Self::prime`] runs it; when its check does not
    /// complete (throttled, no answer in time), the claims run it again, one at a time, until
    /// it does. Returns the idempotency table's replication.
    ///
    /// Global tables of the legacy version 2017.11.29 are not described by `DescribeTable` and
    /// pass as single-Region tables.
    ///
    /// ```no_run
    /// # async fn init(store: lambda_idempotency::DynamoDbStore) -> Result<(), lambda_idempotency::StoreError> {
    /// use lambda_idempotency::store::Replication;
    ///
    /// match store.check_replication().await? {
    ///     Replication::SingleRegion => {}
    ///     Replication::Strong { regions } => println!("MRSC across {regions:?}"),
    ///     other => println!("accepted: {other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::EventuallyConsistentReplicas`], [`StoreError::TransactionsUnsupported`],
    /// or the `DescribeTable` request's own error (a missing table, access denied, throttled).
    pub async fn check_replication(&self) -> Result<Replication, StoreError> {
        let describe_uniqueness = async {
            match &self.uniqueness_table {
                Some(table) => self.replication_of(table).await.map(Some),
                None => Ok(None),
            }
        };
        let (replication, uniqueness) =
            future::join(self.replication_of(&self.table), describe_uniqueness).await;
        let (replication, uniqueness) = (replication?, uniqueness?);
        // A table's consistency mode cannot change.
        let strong = matches!(replication, Replication::Strong { .. });
        let _ = self.strong.set(strong.then(|| self.table.clone()));
        match self.refusal(&replication, uniqueness.as_ref()) {
            Some(refusal) => {
                // Kept for every later claim: a global table's consistency mode cannot change.
                let kept = self.verdict.get_or_init(|| refusal);
                Err(kept.to_error())
            }
            None => Ok(replication),
        }
    }

    /// Marks a replication check owed until one completes ([`OwedCheck`]).
    pub(crate) fn owe_replication_check(&self) {
        self.owed.owed.store(true, Ordering::Release);
    }

    /// Whether the replication check is owed and not done.
    fn check_owed(&self) -> bool {
        !self.described() && self.owed.owed.load(Ordering::Acquire)
    }

    /// `Err` when a check has refused this store's tables; first, when [`Self::prime`]'s check
    /// did not complete, runs it again (within [`PRIME_TIMEOUT`](super::init::PRIME_TIMEOUT);
    /// a claim that finds another running it waits for it): one that fails for now stays owed
    /// for a try [`RETRY_OWED_CHECK_AFTER`] later, and this claim goes on unchecked, as it
    /// would have; one that fails for good (access denied) is no longer tried.
    pub(crate) async fn checked_replication(&self) -> Result<(), StoreError> {
        if self.check_owed() {
            let mut next_try = self.owed.next_try.lock().await;
            let now = Instant::now();
            if self.check_owed() && next_try.is_none_or(|at| now >= at) {
                *next_try = Some(now + RETRY_OWED_CHECK_AFTER);
                let checked = super::init::within(
                    super::init::PRIME_TIMEOUT,
                    self.check_replication().map(|checked| checked.map(drop)),
                )
                .await;
                match checked {
                    Err(err) if !self.described() => {
                        warn!(error = %err, transient = err.is_transient(), "the tables' replication could not be checked: claims go on unchecked");
                        if !err.is_transient() {
                            self.owed.owed.store(false, Ordering::Release);
                        }
                    }
                    _ => self.owed.owed.store(false, Ordering::Release),
                }
            }
        }
        self.refused()
    }

    /// What a builder that changes what the check depends on (the tables it describes, what it
    /// accepts) leaves: a fresh verdict and description, and the check owed when the store's
    /// was asked for (owed, or done for the settings before).
    pub(crate) fn reset_replication_check(&mut self) {
        let asked = self.described() || self.owed.owed.load(Ordering::Acquire);
        self.verdict = Verdict::default();
        self.strong = Strong::default();
        self.owed = Owed::default();
        if asked {
            self.owe_replication_check();
        }
    }

    /// `Err` when a check has refused this store's tables.
    pub(crate) fn refused(&self) -> Result<(), StoreError> {
        self.verdict
            .get()
            .map_or(Ok(()), |refusal| Err(refusal.to_error()))
    }

    /// What the check refuses, if anything.
    fn refusal(
        &self,
        replication: &Replication,
        uniqueness: Option<&Replication>,
    ) -> Option<Refusal> {
        let tables = std::iter::once((&self.table, replication))
            .chain(self.uniqueness_table.as_ref().zip(uniqueness));
        let mut strong = None;
        for (table, replication) in tables {
            match replication {
                Replication::Eventual { regions } if !self.accept_eventual => {
                    return Some(Refusal::Eventual {
                        table: table.clone(),
                        regions: regions.clone(),
                    });
                }
                Replication::Strong { .. } => strong = strong.or(Some(table)),
                _ => {}
            }
        }
        let table = strong.filter(|_| self.uniqueness_table.is_some())?;
        Some(Refusal::NoTransactions {
            table: table.clone(),
        })
    }

    /// The replication of `table`.
    async fn replication_of(&self, table: &str) -> Result<Replication, StoreError> {
        let output = self
            .client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|err| match map_sdk_error("describe_table", table, err) {
                StoreError::TableNotFound { .. } => self.not_found(table),
                other => other,
            })?;
        Ok(output
            .table()
            .map_or(Replication::SingleRegion, Replication::of))
    }
}
