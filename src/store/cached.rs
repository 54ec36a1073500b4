//! An in-process cache of settled records in front of any store, so that a duplicate of a
//! settled operation costs no round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use aws_sdk_dynamodb::types::TransactWriteItem;
use futures_util::future::BoxFuture;
use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, OptionsBuilder, Weighter};

use super::{
    Answer, Claim, Committed, Fence, Guard, Request, Store, StoreExt, Target, TransactionalStore,
    writes_refused,
};
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{Lease, Record, Settlement, Status, StepRecord};

/// Room a cached record takes besides the strings and bytes [`ByBytes`] counts, in bytes: its
/// own fields and its fingerprint's digests (64 hex digits each, up to three).
const RECORD_OVERHEAD: u64 = 512;
/// Room a step takes besides its name and result: its own fields and the allocations behind
/// them (a pending claim's steps; a settled record is kept without its steps).
const STEP_OVERHEAD: usize = std::mem::size_of::<StepRecord>() + 64;
/// How many claims waiting for their settlement the cache expects to hold (a sizing hint).
const PENDING_CLAIMS: usize = 4096;
/// What the claims waiting for their settlement hold, at most, in bytes (a crashed claim's
/// entry is evicted): a takeover's claim carries the steps it took over, up to 256 KiB. An
/// evicted claim costs only the replay from memory of its settled record.
const PENDING_BYTES: u64 = 16 * 1024 * 1024;
/// The shards of the pending claims: each holds a quarter of [`PENDING_BYTES`], so that a
/// claim with the most steps fits whatever the machine's CPUs.
const PENDING_SHARDS: usize = 4;
/// The smallest share of the cache one shard holds: a shard keeps no record heavier than
/// about its share, so large outcomes need large shards.
const MIN_SHARD_BYTES: u64 = 8 * 1024 * 1024;
/// The most shards (concurrent invocations in one environment are few).
const MAX_SHARDS: usize = 16;

/// Caches settled records (COMPLETED, FAILED) of the wrapped store in the execution environment,
/// bounded by bytes, shared by every clone and so by concurrent invocations. A claim whose key
/// has a cached settled record still within its retention answers from the cache: no request.
/// The engine checks the fingerprint as usual, so a changed payload is still a conflict.
///
/// Only settled records are cached: they change only once their retention has run out, which
/// the cache checks on every read with the engine's clock. IN_PROGRESS and INDETERMINATE records
/// always go to the store.
///
/// ```
/// use lambda_idempotency::store::{CachedStore, MemoryStore};
/// use lambda_idempotency::Idempotency;
///
/// // 16 MiB of settled records; DynamoDbStore in Lambda.
/// let store = CachedStore::new(MemoryStore::new(), 16 * 1024 * 1024);
/// let idem = Idempotency::new(store);
/// # let _ = idem;
/// ```
#[derive(Clone)]
pub struct CachedStore<S> {
    inner: S,
    settled: Arc<Cache<OperationKey, Arc<Record>, ByBytes>>,
    /// Claim records by key and lease token, until they settle: what a settlement is applied
    /// to. By both: an owner's claims share its token across keys
    /// ([`Invocation::with_owner`](crate::Invocation::with_owner)).
    pending: Arc<Cache<PendingKey, Arc<Record>, ByBytes>>,
    hits: Arc<AtomicU64>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for CachedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedStore")
            .field("inner", &self.inner)
            .field("cached", &self.settled.len())
            .field("bytes", &self.settled.weight())
            .field("hits", &self.hits())
            .finish()
    }
}

/// Weighs a record by what it holds on the heap (its outcome, its steps, its key, its lease
/// token, its request id, its identity, its operator's audit) and a fixed overhead (the
/// fingerprint's digests, the record's own fields).
#[derive(Debug, Clone, Copy)]
struct ByBytes;

impl Weighter<OperationKey, Arc<Record>> for ByBytes {
    fn weight(&self, key: &OperationKey, record: &Arc<Record>) -> u64 {
        let text = |text: Option<&String>| text.map_or(0, String::len);
        let outcome = record.outcome.as_ref().map_or(0, Vec::len);
        let steps: usize = record
            .steps
            .iter()
            .map(|step| STEP_OVERHEAD + step.name.len() + step.result.as_ref().map_or(0, Vec::len))
            .sum();
        let audit = record.audit.as_ref().map_or(0, |audit| {
            audit.by.len() + audit.action.len() + text(audit.reason.as_ref())
        });
        let held = outcome
            + steps
            + key.as_str().len()
            + record.key.as_str().len()
            + record.lease.token.len()
            + text(record.request_id.as_ref())
            + text(record.identity.as_ref())
            + audit;
        u64::try_from(held)
            .unwrap_or(u64::MAX)
            .saturating_add(RECORD_OVERHEAD)
    }
}

impl Weighter<PendingKey, Arc<Record>> for ByBytes {
    fn weight(&self, (key, token): &PendingKey, record: &Arc<Record>) -> u64 {
        let token = u64::try_from(token.len()).unwrap_or(u64::MAX);
        Weighter::<OperationKey, Arc<Record>>::weight(self, key, record).saturating_add(token)
    }
}

impl<S> CachedStore<S> {
    /// `inner`, with up to `max_bytes` of settled records cached. The cache is split into
    /// shards of at least 8 MiB (fewer, larger shards for a small cache), since a shard keeps
    /// no record heavier than its share: every outcome up to the default limit (6 MiB) fits
    /// in a cache of 8 MiB or more. Besides them, the claims in flight in this environment
    /// are kept until they settle (what their settlement is applied to), in up to 16 MiB more.
    pub fn new(inner: S, max_bytes: u64) -> Self {
        let estimated = usize::try_from(max_bytes / 1024)
            .unwrap_or(usize::MAX)
            .max(16);
        // quick_cache rounds a shard count up to a power of two: round down first, so that
        // no shard holds less than MIN_SHARD_BYTES.
        let fitting = (max_bytes / MIN_SHARD_BYTES).max(1);
        let shards = usize::try_from(1_u64 << fitting.ilog2())
            .unwrap_or(MAX_SHARDS)
            .min(MAX_SHARDS);
        let settled = by_bytes(shards, estimated, max_bytes);
        Self {
            inner,
            settled: Arc::new(settled),
            pending: Arc::new(by_bytes(PENDING_SHARDS, PENDING_CLAIMS, PENDING_BYTES)),
            hits: Arc::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many claims the cache answered without a request.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The bytes the cached records weigh.
    pub fn cached_bytes(&self) -> u64 {
        self.settled.weight()
    }

    /// Keeps a settled record for its replays, without what no replay reads (its steps, an
    /// operator's audit: up to a hundred steps' worth of memory each).
    fn remember(&self, record: &Record) {
        if record.status.is_settled() {
            let replayable = Record {
                steps: Vec::new(),
                audit: None,
                ..record.clone()
            };
            self.settled
                .insert(record.key.clone(), Arc::new(replayable));
        }
    }

    /// Remembers the claim held under the target's lease as `settlement` left it.
    fn remember_settled(&self, target: Target<'_>, settlement: &Settlement) {
        let Guard::Lease(token) = target.guard else {
            return;
        };
        if let Some((_, claim)) = self.pending.remove(&pending_key(target.key, token)) {
            let mut settled = (*claim).clone();
            settled.status = settlement.status;
            settled.outcome.clone_from(&settlement.outcome);
            settled.expires_at = settlement.expires_at;
            settled.completed_at = Some(settlement.completed_at);
            if let Some(steps) = &settlement.steps {
                settled.steps.clone_from(steps);
                settled.steps_version += 1;
            }
            self.remember(&settled);
        }
    }
}

/// A pending claim's place: its key and its lease token.
type PendingKey = (OperationKey, String);

/// A cache of up to `bytes` as [`ByBytes`] weighs its entries, in `shards`, sized for about
/// `items` entries.
fn by_bytes<K, V>(shards: usize, items: usize, bytes: u64) -> Cache<K, V, ByBytes>
where
    K: Eq + std::hash::Hash + Clone,
    V: Clone,
    ByBytes: Weighter<K, V>,
{
    OptionsBuilder::new()
        .shards(shards)
        .estimated_items_capacity(items)
        .weight_capacity(bytes)
        .build()
        .map_or_else(
            |_| Cache::with_weighter(items, bytes, ByBytes),
            |options| {
                Cache::with_options(
                    options,
                    ByBytes,
                    DefaultHashBuilder::default(),
                    DefaultLifecycle::default(),
                )
            },
        )
}

fn pending_key(key: &OperationKey, token: &str) -> PendingKey {
    (key.clone(), token.to_owned())
}

/// What the cache does around each request it keeps up to date; the reads and the rest hand
/// on the wrapped store's own future.
impl<S: Store> Store for CachedStore<S> {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        match request {
            Request::Claim { record, now } => Box::pin(self.claim_cached(record, now)),
            Request::Adopt { record, .. } => Box::pin(async move {
                // An adoption writes its own pending claim.
                self.pending.insert(
                    pending_key(&record.key, &record.lease.token),
                    Arc::new(record.clone()),
                );
                self.inner.call(request).await
            }),
            Request::TakeOver {
                previous, lease, ..
            } => Box::pin(self.take_over_cached(request, previous, lease)),
            Request::Settle { target, settlement } => {
                Box::pin(self.settle_cached(target, settlement))
            }
            Request::RecordSteps { target, steps } => {
                Box::pin(self.record_steps_cached(target, steps))
            }
            Request::Release { target } => Box::pin(async move {
                self.settled.remove(target.key);
                if let Guard::Lease(token) = target.guard {
                    self.pending.remove(&pending_key(target.key, token));
                }
                self.inner.call(request).await
            }),
            Request::ReleaseByOperator { released, .. } => Box::pin(async move {
                self.settled.remove(&released.key);
                self.inner.call(request).await
            }),
            // The rest change no record the cache keeps.
            Request::Shorten { .. }
            | Request::SettleEvidence { .. }
            | Request::Get { .. }
            | Request::Evidence { .. } => self.inner.call(request),
        }
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner
            .transactional()
            .map(|_| self as &dyn TransactionalStore)
    }
}

impl<S: Store> CachedStore<S> {
    /// A claim answered from the cache when it holds the key's settled record, else sent with
    /// its record kept as pending.
    async fn claim_cached(&self, record: &Record, now: SystemTime) -> Result<Answer, StoreError> {
        if let Some(cached) = self.settled.get(&record.key) {
            if !cached.counts_as_absent(now) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Answer::Claim(Claim::Existing((*cached).clone())));
            }
            self.settled.remove(&record.key);
        }
        self.pending.insert(
            pending_key(&record.key, &record.lease.token),
            Arc::new(record.clone()),
        );
        let claim = self.inner.claim(record, now).await?;
        match &claim {
            Claim::Acquired => {}
            // A claim whose lease ran out is taken over under this token, and an owner's own
            // claim re-entered: keep it. Another live claim is answered (or waited for under
            // a claim of its own): nothing settles under this token.
            Claim::Existing(existing)
                if existing.status == Status::InProgress
                    && (existing.lease_is_takeable(now)
                        || existing.lease.token == record.lease.token) => {}
            // A record of another intent may come without its outcome (a store need not read
            // outcome parts for a payload conflict): only one this claim could replay is kept,
            // by the test the store read it by (a record 0.4 wrote is of this intent by 0.4's
            // digest only).
            Claim::Existing(existing) => {
                if record
                    .fingerprint
                    .names(&existing.fingerprint, existing.created_at)
                {
                    self.remember(existing);
                }
                self.pending
                    .remove(&pending_key(&record.key, &record.lease.token));
            }
            // An adoption writes its own pending claim (`Request::Adopt`).
            Claim::IdentityTaken(_) => {
                self.pending
                    .remove(&pending_key(&record.key, &record.lease.token));
            }
        }
        Ok(Answer::Claim(claim))
    }

    /// `request`, the takeover of `previous` under `lease`, then its pending claim moved to the
    /// record taken over.
    async fn take_over_cached(
        &self,
        request: Request<'_>,
        previous: &Record,
        lease: &Lease,
    ) -> Result<Answer, StoreError> {
        let answer = self.inner.call(request).await?;
        let pending = pending_key(&previous.key, &lease.token);
        if let Some(mut claim) = self.pending.get(&pending).map(|claim| (*claim).clone()) {
            // The record taken over: the previous one's creation and fingerprint (a takeover
            // rewrites neither: a record an earlier rule wrote keeps its digest), the new lease.
            claim.fingerprint.clone_from(&previous.fingerprint);
            claim.lease = lease.clone();
            claim.steps.clone_from(&previous.steps);
            claim.steps_version = previous.steps_version;
            claim.created_at = previous.created_at;
            claim.request_id.clone_from(&previous.request_id);
            claim.identity.clone_from(&previous.identity);
            self.pending.insert(pending, Arc::new(claim));
        }
        Ok(answer)
    }

    async fn settle_cached(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Answer, StoreError> {
        self.settled.remove(target.key);
        let fence = self.inner.settle(target, settlement).await?;
        if let Fence::Held = fence {
            self.remember_settled(target, settlement);
        }
        Ok(Answer::Fence(fence))
    }

    async fn record_steps_cached(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
    ) -> Result<Answer, StoreError> {
        let fence = self.inner.record_steps(target, steps).await?;
        if let Fence::Held = fence {
            self.steps_recorded(target, steps);
        }
        Ok(Answer::Fence(fence))
    }

    /// The pending claim of `target`'s lease, with `steps` recorded.
    fn steps_recorded(&self, target: Target<'_>, steps: &[StepRecord]) {
        let Guard::Lease(token) = target.guard else {
            return;
        };
        let pending = pending_key(target.key, token);
        if let Some(claim) = self.pending.get(&pending) {
            let mut claim = (*claim).clone();
            claim.steps = steps.to_vec();
            claim.steps_version += 1;
            self.pending.insert(pending, Arc::new(claim));
        }
    }
}

/// The wrapped store's transactional capability, keeping the cache as the core writes do.
impl<S: Store> TransactionalStore for CachedStore<S> {
    fn commit<'a>(
        &'a self,
        request: Request<'a>,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(async move {
            let Some(inner) = self.inner.transactional() else {
                return Ok(writes_refused(request));
            };
            if let Request::Settle { target, .. } = request {
                self.settled.remove(target.key);
            }
            let committed = inner.commit(request, writes, token).await?;
            match (&committed, request) {
                (Committed::Applied, Request::RecordSteps { target, steps }) => {
                    self.steps_recorded(target, steps);
                }
                (Committed::Applied, Request::Settle { target, settlement }) => {
                    self.remember_settled(target, settlement);
                }
                _ => {}
            }
            Ok(committed)
        })
    }

    /// The wrapped store's check; `Ok` when it has no transactional capability, as the
    /// engine answers (each write is refused instead).
    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        match self.inner.transactional() {
            Some(inner) => inner.check_transactional_writes(),
            None => Box::pin(async { Ok(()) }),
        }
    }
}

#[cfg(test)]
mod weight;
