//! A store decorator that injects faults into any [`Store`]: a primitive fails before it
//! applies, fails *after* it applies (the ambiguous case: the write committed, the answer was
//! lost), is held until the test lets it go, or cancels the calling task before or after it
//! applies.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lambda_idempotency::store::MemoryStore;
//! use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
//!
//! let store = FaultyStore::new(MemoryStore::new());
//! // The next completion commits, then its caller sees the store as unavailable.
//! store.inject(Primitive::Settle, Fault::FailAfter(FaultKind::Unavailable));
//! assert_eq!(store.pending(), 1);
//! // A queued fault that never fires fails the test when the store's last clone is dropped;
//! // a test that no longer expects it clears it.
//! store.clear();
//! # }
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use aws_sdk_dynamodb::types::TransactWriteItem;
use futures_util::future::BoxFuture;
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::store::{
    Answer, Claim, Committed, Fence, Request, Store, TransactionalStore, writes_refused,
};

/// A store primitive, as faults name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Primitive {
    /// [`StoreExt::claim`](crate::store::StoreExt::claim).
    Claim,
    /// [`StoreExt::adopt`](crate::store::StoreExt::adopt).
    Adopt,
    /// [`StoreExt::take_over`](crate::store::StoreExt::take_over).
    TakeOver,
    /// [`StoreExt::shorten`](crate::store::StoreExt::shorten).
    Shorten,
    /// [`StoreExt::settle`](crate::store::StoreExt::settle), and a settlement's
    /// [`TransactionalStore::commit`].
    Settle,
    /// [`StoreExt::release`](crate::store::StoreExt::release).
    Release,
    /// [`StoreExt::record_steps`](crate::store::StoreExt::record_steps).
    RecordSteps,
    /// A transactional step's [`TransactionalStore::commit`].
    CommitSteps,
    /// [`StoreExt::get`](crate::store::StoreExt::get).
    Get,
    /// [`StoreExt::evidence`](crate::store::StoreExt::evidence).
    Evidence,
    /// An operator's writes: [`StoreExt::release_by_operator`](crate::store::StoreExt::release_by_operator), [`StoreExt::settle_evidence`](crate::store::StoreExt::settle_evidence).
    Operator,
}

impl Primitive {
    /// The primitive a core request is.
    pub fn of(request: Request<'_>) -> Self {
        match request {
            Request::Claim { .. } => Self::Claim,
            Request::Adopt { .. } => Self::Adopt,
            Request::TakeOver { .. } => Self::TakeOver,
            Request::Shorten { .. } => Self::Shorten,
            Request::Settle { .. } => Self::Settle,
            Request::RecordSteps { .. } => Self::RecordSteps,
            Request::Release { .. } => Self::Release,
            Request::ReleaseByOperator { .. } | Request::SettleEvidence { .. } => Self::Operator,
            Request::Get { .. } => Self::Get,
            Request::Evidence { .. } => Self::Evidence,
        }
    }

    /// Every primitive.
    pub const ALL: [Self; 11] = [
        Self::Claim,
        Self::Adopt,
        Self::TakeOver,
        Self::Shorten,
        Self::Settle,
        Self::Release,
        Self::RecordSteps,
        Self::CommitSteps,
        Self::Get,
        Self::Evidence,
        Self::Operator,
    ];

    /// The primitive's name, as store errors report it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Adopt => "adopt",
            Self::TakeOver => "take_over",
            Self::Shorten => "shorten",
            Self::Settle => "settle",
            Self::Release => "release",
            Self::RecordSteps => "record_steps",
            Self::CommitSteps => "commit_steps",
            Self::Get => "get",
            Self::Evidence => "evidence",
            Self::Operator => "operator",
        }
    }
}

/// The error an injected failure returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FaultKind {
    /// [`StoreError::Throttled`]: throttling that outlasted the SDK's retries.
    Throttled,
    /// [`StoreError::Unavailable`]: a 5xx, a timeout, a dropped connection.
    Unavailable,
    /// [`StoreError::Contention`]: a transaction conflict.
    Contention,
    /// [`StoreError::CorruptRecord`]: a stored record that does not decode.
    Corrupt,
    /// [`StoreError::Rejected`]: a request the store refuses as invalid (DynamoDB's
    /// `ValidationException`: an item over 400 KB, an attribute it cannot take).
    Rejected,
}

impl FaultKind {
    fn error(self, primitive: Primitive) -> StoreError {
        let operation = primitive.name();
        match self {
            Self::Throttled => StoreError::Throttled {
                operation,
                source: "injected throttling".into(),
            },
            Self::Unavailable => StoreError::Unavailable {
                operation,
                source: "injected unavailability".into(),
            },
            Self::Contention => StoreError::Contention { operation },
            Self::Corrupt => StoreError::CorruptRecord {
                key_short: "injected".into(),
                reason: format!("injected corruption read by `{operation}`"),
            },
            Self::Rejected => StoreError::Rejected {
                operation,
                message: String::from("injected rejection"),
            },
        }
    }
}

/// What happens to one call of a primitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Fault {
    /// Fails with the error before the primitive applies.
    FailBefore(FaultKind),
    /// Applies the primitive, then fails with the error: the write committed, its answer was lost.
    FailAfter(FaultKind),
    /// Cancels the calling task before the primitive applies: the call never returns and
    /// [`FaultyStore::cancellable`] answers `None`.
    CancelBefore,
    /// Applies the primitive, then cancels the calling task.
    CancelAfter,
    /// Holds the call before it applies until [`FaultyStore::let_go`]: a delay the test controls.
    Hold,
}

#[derive(Debug, Default)]
struct Plan {
    queued: HashMap<Primitive, VecDeque<Fault>>,
    outages: Vec<Outage>,
    fired: BTreeMap<(Primitive, Fault), u64>,
    /// The part of `fired` that outages made (each a [`Fault::FailBefore`] of its kind).
    outage_fired: BTreeMap<(Primitive, FaultKind), u64>,
    calls: BTreeMap<Primitive, u64>,
    /// The latest write that applied and changed whether a record exists, by key.
    existence: HashMap<OperationKey, Existence>,
}

/// A write that applied and changed whether a record exists ([`FaultyStore::existence_changes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Existence {
    /// A claim or an adoption wrote the record.
    Written,
    /// A fenced release deleted it (a retryable failure, a give-back before any intent).
    Released,
}

/// A queued fault that never fired is a case that did not check what it meant to: the last
/// clone of the store fails the case (unless it is failing already). A case that no longer
/// expects a fault it queued says so with [`FaultyStore::clear`].
impl Drop for Plan {
    fn drop(&mut self) {
        let unfired: Vec<_> = self.queued.iter().filter(|(_, q)| !q.is_empty()).collect();
        if !unfired.is_empty() {
            unfired_faults(&format!("{unfired:?}"));
        }
    }
}

/// Fails the test whose faults in `unfired` never fired. Inside a Tokio task (the last clone
/// dropped by a task, or by a runtime shutting down) a panic is caught by the runtime and may
/// never be seen: the process stops instead, saying why.
pub(crate) fn unfired_faults(unfired: &str) {
    if std::thread::panicking() {
        return;
    }
    let message = format!(
        "injected faults that never fired: {unfired}; show each fault fire, or clear() the \
         ones the case no longer expects"
    );
    if tokio::task::try_id().is_some() {
        eprintln!("{message}");
        std::process::abort();
    }
    panic!("{message}");
}

/// Every call of some primitives fails before it applies until a time on a clock.
#[derive(Debug)]
struct Outage {
    primitives: Vec<Primitive>,
    kind: FaultKind,
    until: SystemTime,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Signals {
    held: Notify,
    gate: Notify,
}

tokio::task_local! {
    /// The cancellation signal of the [`FaultyStore::cancellable`] call running on this task.
    static CANCELLED: Arc<Notify>;
}

/// Wraps a store and injects the faults queued with [`FaultyStore::inject`]; clones share the
/// store, the queue and the counts.
#[derive(Clone)]
pub struct FaultyStore<S> {
    inner: S,
    plan: Arc<Mutex<Plan>>,
    signals: Arc<Signals>,
}

impl<S: fmt::Debug> fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("pending", &self.pending())
            .finish()
    }
}

impl<S> FaultyStore<S> {
    /// `inner`, with no fault queued.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            plan: Arc::default(),
            signals: Arc::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Queues `fault` for the next call of `primitive` that has none queued before it.
    pub fn inject(&self, primitive: Primitive, fault: Fault) {
        self.lock()
            .queued
            .entry(primitive)
            .or_default()
            .push_back(fault);
    }

    /// An outage: every call of `primitives` fails with `kind` before it applies while
    /// `clock` reads earlier than `until` (a throttling burst, a partition's brief
    /// unavailability). Queued faults fire first.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use lambda_idempotency::clock::{Clock, ManualClock};
    /// use lambda_idempotency::store::MemoryStore;
    /// use lambda_idempotency::testing::conformance::start_time;
    /// use lambda_idempotency::testing::faults::{FaultKind, FaultyStore, Primitive};
    ///
    /// let clock = ManualClock::new(start_time());
    /// let store = FaultyStore::new(MemoryStore::new());
    /// // Settlements are throttled for the next 5 seconds.
    /// store.outage(&[Primitive::Settle], FaultKind::Throttled, clock.now() + Duration::from_secs(5), clock);
    /// # }
    /// ```
    pub fn outage(
        &self,
        primitives: &[Primitive],
        kind: FaultKind,
        until: SystemTime,
        clock: impl Clock + 'static,
    ) {
        self.lock().outages.push(Outage {
            primitives: primitives.to_vec(),
            kind,
            until,
            clock: Arc::new(clock),
        });
    }

    /// Drops every queued fault that has not fired, and every outage.
    pub fn clear(&self) {
        let mut plan = self.lock();
        plan.queued.clear();
        plan.outages.clear();
    }

    /// How many queued faults have not fired yet.
    pub fn pending(&self) -> usize {
        self.lock().queued.values().map(VecDeque::len).sum()
    }

    /// How often each fault fired, by primitive (outages' failures included).
    pub fn fired(&self) -> BTreeMap<(Primitive, Fault), u64> {
        self.lock().fired.clone()
    }

    /// How often an outage failed a call, by primitive and kind: the part of
    /// [`FaultyStore::fired`] that outages made, apart from the faults queued with
    /// [`FaultyStore::inject`].
    pub fn fired_in_outages(&self) -> BTreeMap<(Primitive, FaultKind), u64> {
        self.lock().outage_fired.clone()
    }

    /// How often each primitive was called.
    pub fn calls(&self) -> BTreeMap<Primitive, u64> {
        self.lock().calls.clone()
    }

    /// The latest write per key that applied and created ([`Existence::Written`]: a claim, an
    /// adoption) or deleted ([`Existence::Released`]: a release) a record, since the last call.
    /// Noted between the faults and the wrapped store, so a write that applied and whose
    /// answer an injected fault then lost counts: what a check of missing records judges by.
    pub fn existence_changes(&self) -> HashMap<OperationKey, Existence> {
        std::mem::take(&mut self.lock().existence)
    }

    /// The wrapped store's answer to `request`, noting the existence change it makes to the
    /// request's record: a claim that wrote it, a release that deleted it (as the caller may
    /// never learn, when a fault then loses the answer).
    async fn noting(&self, request: Request<'_>) -> Result<Answer, StoreError>
    where
        S: Store,
    {
        let answer = self.inner.call(request).await;
        let change = match (request, &answer) {
            (
                Request::Claim { record, .. } | Request::Adopt { record, .. },
                Ok(Answer::Claim(Claim::Acquired)),
            ) => Some((&record.key, Existence::Written)),
            (Request::Release { target }, Ok(Answer::Fence(Fence::Held))) => {
                Some((target.key, Existence::Released))
            }
            _ => None,
        };
        if let Some((key, existence)) = change {
            self.lock().existence.insert(key.clone(), existence);
        }
        answer
    }

    /// Runs `future` until it ends (`Some`) or a [`Fault::CancelBefore`] /
    /// [`Fault::CancelAfter`] cancels it (`None`; the future is dropped there).
    pub async fn cancellable<T>(&self, future: impl Future<Output = T>) -> Option<T> {
        let cancelled = Arc::new(Notify::new());
        let signal = Arc::clone(&cancelled);
        tokio::select! {
            biased;
            output = CANCELLED.scope(signal, future) => Some(output),
            () = cancelled.notified() => None,
        }
    }

    /// Waits until a call is held by [`Fault::Hold`].
    pub async fn held(&self) {
        self.signals.held.notified().await;
    }

    /// Lets the held call go on.
    pub fn let_go(&self) {
        self.signals.gate.notify_one();
    }

    fn lock(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_fault(&self, primitive: Primitive) -> Option<Fault> {
        let mut plan = self.lock();
        *plan.calls.entry(primitive).or_default() += 1;
        let queued = plan
            .queued
            .get_mut(&primitive)
            .and_then(VecDeque::pop_front);
        let fault = match queued {
            Some(fault) => fault,
            None => {
                let kind = plan
                    .outages
                    .iter()
                    .find(|outage| {
                        outage.primitives.contains(&primitive) && outage.clock.now() < outage.until
                    })
                    .map(|outage| outage.kind)?;
                *plan.outage_fired.entry((primitive, kind)).or_default() += 1;
                Fault::FailBefore(kind)
            }
        };
        *plan.fired.entry((primitive, fault)).or_default() += 1;
        Some(fault)
    }

    /// Runs one call of `primitive`, with its fault if one is queued.
    async fn around<T>(
        &self,
        primitive: Primitive,
        apply: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.next_fault(primitive) {
            None => apply.await,
            Some(Fault::FailBefore(kind)) => Err(kind.error(primitive)),
            Some(Fault::FailAfter(kind)) => apply.await.and(Err(kind.error(primitive))),
            Some(Fault::CancelBefore) => self.cancel().await,
            Some(Fault::CancelAfter) => {
                let _ = apply.await;
                self.cancel().await
            }
            Some(Fault::Hold) => {
                self.signals.held.notify_one();
                self.signals.gate.notified().await;
                apply.await
            }
        }
    }

    /// Cancels the calling task: signals its [`FaultyStore::cancellable`] (outside one, the
    /// call just never returns).
    async fn cancel<T>(&self) -> T {
        let _ = CANCELLED.try_with(|cancelled| cancelled.notify_one());
        std::future::pending().await
    }
}

impl<S: Store + Clone> Store for FaultyStore<S> {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(self.around(Primitive::of(request), self.noting(request)))
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner
            .transactional()
            .map(|_| self as &dyn TransactionalStore)
    }
}

/// The wrapped store's transactional capability, with the same faults.
impl<S: Store + Clone> TransactionalStore for FaultyStore<S> {
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
            let primitive = match request {
                Request::RecordSteps { .. } => Primitive::CommitSteps,
                Request::Settle { .. } => Primitive::Settle,
                // Commits no writes: refused as the wrapped store refuses it, with no fault.
                other => return inner.commit(other, writes, token).await,
            };
            let commit = async move { inner.commit(request, writes, token).await };
            self.around(primitive, commit).await
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
mod tests {
    use super::{Fault, FaultyStore, Primitive};
    use crate::store::MemoryStore;

    #[test]
    #[should_panic(expected = "injected faults that never fired")]
    fn a_fault_that_never_fires_fails_the_case() {
        let store = FaultyStore::new(MemoryStore::new());
        let clone = store.clone();
        store.inject(Primitive::Settle, Fault::Hold);
        drop(store);
        drop(clone); // the last clone checks
    }

    #[test]
    fn a_fault_the_case_no_longer_expects_is_cleared() {
        let store = FaultyStore::new(MemoryStore::new());
        store.inject(Primitive::Settle, Fault::Hold);
        store.clear();
    }
}
