//! The store and the clock the schedules run on: the real memory store with every request a
//! scheduling point where the checker may choose a fault, and time that moves only when a
//! sleeping task's end comes or the case moves it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::TransactWriteItem;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::error::StoreError;
use lambda_idempotency::key::OperationKey;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};
use lambda_idempotency::store::{
    Claim, Committed, Fence, MemoryStore, Store, Target, TransactionalStore,
};
use shuttle::rand::{Rng, thread_rng};

use super::{Faults, deliveries, shown};
use lambda_idempotency::testing::transitions::{self, Request};

/// A defect the harness must catch, put into the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Defect {
    /// A claim that meets a live claim takes its lease anyway.
    StealsLiveLeases,
    /// A transactional step's writes commit, but the record keeps the steps it had.
    ForgetsCommittedSteps,
}

/// The memory store with every request a scheduling point, and the checker's faults.
#[derive(Debug, Clone)]
pub(super) struct Scheduled {
    pub(super) inner: MemoryStore,
    pub(super) faults: Faults,
    /// A defect put in for the harness's own check.
    pub(super) defect: Option<Defect>,
    /// Faults chosen, counted.
    pub(super) fired: Arc<AtomicUsize>,
    /// The operations whose records are checked after every request.
    pub(super) watched: Arc<Vec<OperationKey>>,
    /// The schedule's clock, which a stall moves past every lease.
    pub(super) clock: ScheduledClock,
    /// Whether a delivery of this schedule stalled already (one stall a schedule, so that
    /// the redelivery still comes within the retention).
    pub(super) stalled: Arc<AtomicBool>,
    /// Stalls chosen, counted.
    pub(super) stalls: Arc<AtomicUsize>,
    /// Crashes by an unwinding panic, counted.
    pub(super) unwound: Arc<AtomicUsize>,
    /// The first check this schedule failed, kept: a check's panic inside the handler meets
    /// the engine's catch, whose next requests must not crash the delivery over it, and the
    /// case reports it even if it never surfaces ([`Scheduled::reported`]).
    pub(super) broken: Arc<Mutex<Option<String>>>,
    /// Whether each request is checked against the transitions the model allows.
    pub(super) checks_transitions: bool,
}

/// How long a stalled delivery is frozen before its request: past any lease the cases take
/// (60 s without a deadline) and a give-back's grace, well within the retention.
const STALL: Duration = Duration::from_secs(120);

impl Scheduled {
    async fn request<T>(
        &self,
        operation: &'static str,
        apply: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        shuttle::future::yield_now().await;
        // Each fault the case allows meets one request in ten, chosen by the checker (none
        // once a check failed).
        let faults = match self.faults {
            _ if self.broken().is_some() => 0,
            Faults::None => 0,
            Faults::Lossy => 2,
            // A crash only where a delivery can crash (not in a give-back's own task).
            Faults::Crashing if deliveries::current().is_some() => 4,
            Faults::Crashing => 2,
        };
        let unavailable = || StoreError::Unavailable {
            operation,
            source: "the checker's fault".into(),
        };
        let fault = match faults {
            0 => 0,
            _ => Some(thread_rng().gen_range(0..10))
                .filter(|drawn| *drawn <= faults)
                .unwrap_or(0),
        };
        if fault > 0 {
            self.fired.fetch_add(1, Ordering::SeqCst);
        }
        // A crash where the delivery could also stall instead (frozen past its lease, as a
        // Lambda sandbox can be, then going on as if nothing happened), once a schedule.
        let stall =
            fault == 3 && thread_rng().gen_bool(0.5) && !self.stalled.swap(true, Ordering::SeqCst);
        if stall {
            self.stalls.fetch_add(1, Ordering::SeqCst);
            self.clock.advance(STALL);
            shuttle::future::yield_now().await;
        }
        match fault {
            3 if stall => {
                let answer = apply.await;
                self.check_after(operation).await;
                shuttle::future::yield_now().await;
                answer
            }
            1 => Err(unavailable()),
            2 => {
                let _ = apply.await;
                self.check_after(operation).await;
                shuttle::future::yield_now().await;
                Err(unavailable())
            }
            3 => self.crash().await,
            4 => {
                let _ = apply.await;
                self.check_after(operation).await;
                self.crash().await
            }
            _ => {
                let answer = apply.await;
                self.check_after(operation).await;
                shuttle::future::yield_now().await;
                answer
            }
        }
    }

    /// `apply`, a request concerning `key`'s record, checked as it applies against the
    /// transitions the model allows ([`transitions::allowed`]), unless the case checks none;
    /// what it left is noted as what the store showed the delivery sending it.
    async fn specified<T>(
        &self,
        operation: &'static str,
        key: &OperationKey,
        request: Request<'_>,
        apply: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.request(operation, async move {
            let before = self.inner.get(key).await?;
            let answer = apply.await;
            let after = self.inner.get(key).await?;
            if self.checks_transitions
                && let Err(forbidden) =
                    transitions::allowed(request, before.as_ref(), after.as_ref())
            {
                self.fail(format!(
                    "{operation} of {}: {forbidden} (a transition the model forbids)",
                    key.short()
                ));
            }
            shown::record(operation, Some(request), after);
            answer
        })
        .await
    }

    /// What holds after every request that applied: a record under a lease is retained at
    /// least as long, so that TTL never deletes a record whose lease is live.
    async fn check_after(&self, operation: &'static str) {
        for key in self.watched.iter() {
            let Ok(Some(record)) = self.inner.get(key).await else {
                continue;
            };
            if record.status == Status::InProgress && record.expires_at < record.lease.expires_at {
                self.fail(format!(
                    "after {operation}, {}'s record (attempt {}) is retained until {:?}, before its lease ends at {:?}: TTL could delete it under a live lease",
                    key.short(),
                    record.lease.attempt,
                    record.expires_at,
                    record.lease.expires_at
                ));
            }
        }
    }

    /// Fails the schedule with `message`, kept as its first failed check.
    fn fail(&self, message: String) -> ! {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| message.clone());
        panic!("{message}");
    }

    fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Panics with the first check this schedule failed, if one did (a panic the engine
    /// caught and turned into an answer, a give-back or a stored failure).
    pub(super) fn reported(&self) {
        if let Some(message) = self.broken() {
            panic!("{message}");
        }
    }
}

/// The payload of a delivery's crash by an unwinding panic (a handler's bug, or the engine's,
/// in a build that unwinds): the delivery tells it from a check's panic.
#[derive(Debug)]
pub(super) struct Crashed;

impl Scheduled {
    /// Crashes the calling delivery, as the checker chooses: its future dropped where it
    /// stands (signalled, and never returning), or a panic unwinding through the engine's
    /// futures from here (the handler's catch and the engine's guards run on the way up).
    async fn crash<T>(&self) -> T {
        if thread_rng().gen_bool(0.5) {
            self.unwound.fetch_add(1, Ordering::SeqCst);
            std::panic::resume_unwind(Box::new(Crashed));
        }
        if let Some(delivery) = deliveries::current() {
            delivery.crash.notify_one();
        }
        std::future::pending().await
    }
}

impl Store for Scheduled {
    fn claim<'a>(
        &'a self,
        record: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        let request = Request::Claim { record, now };
        Box::pin(self.specified("claim", &record.key, request, async move {
            match self.inner.claim(record, now).await? {
                Claim::Existing(live) if self.defect == Some(Defect::StealsLiveLeases) => {
                    let past_its_end = live.lease.expires_at + Duration::from_secs(1);
                    let stolen =
                        self.inner
                            .take_over(&live, &record.lease, record.expires_at, past_its_end);
                    match stolen.await? {
                        Fence::Held => Ok(Claim::Acquired),
                        Fence::Lost { .. } => Ok(Claim::Existing(live)),
                    }
                }
                claim => Ok(claim),
            }
        }))
    }

    fn adopt<'a>(
        &'a self,
        record: &'a Record,
        orphan: &'a Evidence,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        let request = Request::Claim { record, now };
        let adopt = self.inner.adopt(record, orphan, now);
        Box::pin(self.specified("adopt", &record.key, request, adopt))
    }

    fn take_over<'a>(
        &'a self,
        previous: &'a Record,
        lease: &'a Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        let request = Request::TakeOver {
            previous,
            lease,
            expires_at,
            now,
        };
        let take_over = self.inner.take_over(previous, lease, expires_at, now);
        Box::pin(self.specified("take_over", &previous.key, request, take_over))
    }

    fn shorten<'a>(
        &'a self,
        target: Target<'a>,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        let request = Request::Shorten {
            guard: target.guard,
            until,
        };
        let shorten = self.inner.shorten(target, until);
        Box::pin(self.specified("shorten", target.key, request, shorten))
    }

    fn settle<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        let request = Request::Settle {
            guard: target.guard,
            settlement,
        };
        let settle = self.inner.settle(target, settlement);
        Box::pin(self.specified("settle", target.key, request, settle))
    }

    fn record_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
    ) -> BoxFuture<'a, Result<Fence, StoreError>> {
        let request = Request::Steps {
            guard: target.guard,
            steps,
        };
        let record_steps = self.inner.record_steps(target, steps);
        Box::pin(self.specified("record_steps", target.key, request, record_steps))
    }

    fn release<'a>(&'a self, target: Target<'a>) -> BoxFuture<'a, Result<Fence, StoreError>> {
        let request = Request::Release {
            guard: target.guard,
        };
        let release = self.inner.release(target);
        Box::pin(self.specified("release", target.key, request, release))
    }

    fn release_by_operator<'a>(
        &'a self,
        seen: Option<&'a Record>,
        evidence: Option<&'a Evidence>,
        released: &'a Record,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner
            .release_by_operator(seen, evidence, released, now)
    }

    fn settle_evidence<'a>(
        &'a self,
        seen: &'a Evidence,
        settlement: &'a Settlement,
        now: SystemTime,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.settle_evidence(seen, settlement, now)
    }

    fn get<'a>(
        &'a self,
        key: &'a OperationKey,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(self.request("get", async move {
            let found = self.inner.get(key).await?;
            shown::record("get", None, found.clone());
            Ok(found)
        }))
    }

    fn evidence<'a>(
        &'a self,
        identity: &'a str,
    ) -> BoxFuture<'a, Result<Option<Evidence>, StoreError>> {
        Box::pin(self.request("evidence", async move {
            let found = self.inner.evidence(identity).await?;
            shown::evidence(found.as_ref());
            Ok(found)
        }))
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner
            .transactional()
            .map(|_| self as &dyn TransactionalStore)
    }
}

impl Scheduled {
    /// The memory store's transactional capability (the cases build it with the handler's
    /// tables).
    fn committing(&self) -> &dyn TransactionalStore {
        self.inner
            .transactional()
            .expect("the schedules' memory store has the handler's tables")
    }
}

impl TransactionalStore for Scheduled {
    fn commit_steps<'a>(
        &'a self,
        target: Target<'a>,
        steps: &'a [StepRecord],
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        let commit = self.committing().commit_steps(target, steps, writes, token);
        let request = Request::Steps {
            guard: target.guard,
            steps,
        };
        if self.defect != Some(Defect::ForgetsCommittedSteps) {
            return Box::pin(self.specified("commit_steps", target.key, request, commit));
        }
        let before = &steps[..steps.len().saturating_sub(1)];
        Box::pin(
            self.specified("commit_steps", target.key, request, async move {
                let committed = commit.await?;
                self.inner.record_steps(target, before).await?;
                Ok(committed)
            }),
        )
    }

    fn settle_with<'a>(
        &'a self,
        target: Target<'a>,
        settlement: &'a Settlement,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        let settle = self
            .committing()
            .settle_with(target, settlement, writes, token);
        let request = Request::Settle {
            guard: target.guard,
            settlement,
        };
        Box::pin(self.specified("settle_with", target.key, request, settle))
    }

    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.committing().check_transactional_writes()
    }
}

/// The engine's manual clock (each sleeping task waits for its own end, the first due moving
/// time there once the scheduler runs it again, each sleep a scheduling point of shuttle's
/// own) or the case moving it; a deadline never ends before what it bounds (the cases set
/// none).
#[derive(Debug, Clone)]
pub(super) struct ScheduledClock(pub(super) ManualClock);

impl ScheduledClock {
    pub(super) fn advance(&self, by: Duration) {
        self.0.advance(by);
    }
}

impl Clock for ScheduledClock {
    fn now(&self) -> SystemTime {
        self.0.now()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        // Shuttle's own yield first, so that every scheduler (PCT's priorities included) may
        // run another task before the sleeper moves the clock.
        let sleep = self.0.sleep(duration);
        Box::pin(async move {
            shuttle::future::yield_now().await;
            sleep.await;
        })
    }

    fn deadline(&self, _: Duration) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        ceiling
    }
}
