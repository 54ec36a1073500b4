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
use lambda_idempotency::record::{Record, Status};
use lambda_idempotency::store::{
    Answer, Claim, Committed, Fence, MemoryStore, Request, Store, StoreExt, TransactionalStore,
};
use shuttle::rand::{Rng, thread_rng};

use super::{Faults, deliveries, shown};
use lambda_idempotency::testing::transitions;

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
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        let operation = request.name();
        let key = match request {
            Request::Claim { record, now } if self.defect == Some(Defect::StealsLiveLeases) => {
                let stealing = self.stealing(record, now);
                return Box::pin(self.specified(operation, &record.key, request, stealing));
            }
            Request::Claim { record, .. } | Request::Adopt { record, .. } => &record.key,
            Request::TakeOver { previous, .. } => &previous.key,
            Request::Shorten { target, .. }
            | Request::Settle { target, .. }
            | Request::RecordSteps { target, .. }
            | Request::Release { target } => target.key,
            Request::Get { .. } | Request::Evidence { .. } => {
                return Box::pin(self.request(operation, self.read(request)));
            }
            // An operator's writes: no scheduling point.
            Request::ReleaseByOperator { .. } | Request::SettleEvidence { .. } => {
                return self.inner.call(request);
            }
        };
        let sent = async move { self.inner.call(request).await };
        Box::pin(self.specified(operation, key, request, sent))
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner
            .transactional()
            .map(|_| self as &dyn TransactionalStore)
    }
}

impl Scheduled {
    /// A read, noted as what the store showed the delivery sending it.
    async fn read(&self, request: Request<'_>) -> Result<Answer, StoreError> {
        let answer = self.inner.call(request).await?;
        match &answer {
            Answer::Record(found) => shown::record("get", None, found.clone()),
            Answer::Evidence(found) => shown::evidence(found.as_ref()),
            _ => {}
        }
        Ok(answer)
    }

    /// The claim of [`Defect::StealsLiveLeases`]: a live claim met is taken over anyway.
    async fn stealing(&self, record: &Record, now: SystemTime) -> Result<Answer, StoreError> {
        let claim = match self.inner.claim(record, now).await? {
            Claim::Existing(live) => {
                let past_its_end = live.lease.expires_at + Duration::from_secs(1);
                let stolen =
                    self.inner
                        .take_over(&live, &record.lease, record.expires_at, past_its_end);
                match stolen.await? {
                    Fence::Held => Claim::Acquired,
                    Fence::Lost { .. } => Claim::Existing(live),
                }
            }
            claim => claim,
        };
        Ok(Answer::Claim(claim))
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
    fn commit<'a>(
        &'a self,
        request: Request<'a>,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        let (operation, key) = match request {
            Request::RecordSteps { target, .. } => ("commit_steps", target.key),
            Request::Settle { target, .. } => ("settle_with", target.key),
            _ => return self.committing().commit(request, writes, token),
        };
        let sent = async move { self.committing().commit(request, writes, token).await };
        let (Request::RecordSteps { target, steps }, Some(Defect::ForgetsCommittedSteps)) =
            (request, self.defect)
        else {
            return Box::pin(self.specified(operation, key, request, sent));
        };
        let before = &steps[..steps.len().saturating_sub(1)];
        Box::pin(self.specified(operation, key, request, async move {
            let committed = sent.await?;
            self.inner.record_steps(target, before).await?;
            Ok(committed)
        }))
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
