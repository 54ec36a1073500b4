//! Batch processing for SQS, Kinesis and DynamoDB Streams, and for the events of SNS and S3
//! (which hold records but read no partial-batch response: a record to deliver again fails the
//! invocation, [`Error::RecordsFailed`]): each record is its own operation.
//!
//! Records run concurrently (the whole batch in one wave by default, up to
//! [`BatchProcessor::MAX_DEFAULT_CONCURRENCY`]), except that records of one ordering group (an
//! SQS FIFO message group, a Kinesis partition key, a DynamoDB item named by its keys'
//! canonical JSON) run one at a time, in order;
//! after a failure the rest of its group is not run and is reported failed too, so that order
//! survives the retry. The answer is the partial-batch response: only failed or in-progress
//! records come back. A replayed record ([`RecordOutcome::Replayed`]), or one whose permanent
//! evidence shows it took effect ([`Error::already_took_effect`]), is acknowledged, not run again; evidence of an operation
//! still in progress, failed or indeterminate is reported failed. A batch close to its deadline
//! starts no new record ([`BatchProcessor::with_deadline_margin`]): those are reported failed
//! and come back, rather than being cut off mid-effect. A record that can never succeed (a
//! payload conflict, a retained failure, a handler's error its classifier calls terminal, from its
//! first delivery on, an unreadable event) follows the [`PoisonPolicy`]: SQS
//! retries it until its DLQ takes it; Kinesis and DynamoDB Streams acknowledge it with an error
//! log, so that one record does not stall the shard. A record that took effect but whose result
//! could not be kept ([`Error::applied_but_not_kept`]: an oversized or unstorable result) is
//! acknowledged on every source, logged at error level ([`RecordOutcome::AppliedNotKept`]): in
//! a DLQ, a redrive after its retained failure expired would run it again.
//!
//! **The trigger must report batch item failures**: Lambda reads the partial-batch response
//! only from an event source mapping with `FunctionResponseTypes: [ReportBatchItemFailures]`
//! (SAM: `FunctionResponseTypes` on the `SQS`, `Kinesis` or `DynamoDB` event); without it a
//! batch whose invocation succeeds counts as done whole, and SQS deletes, or a stream moves
//! past, every record reported failed, whose effect never happened.
//!
//! ```no_run
//! use aws_lambda_events::event::sqs::SqsMessage;
//! use lambda_idempotency::lambda::sources;
//! use lambda_idempotency::{ExecutionContext, Idempotency};
//!
//! async fn place_order(message: SqsMessage, ctx: ExecutionContext) -> Result<String, lambda_runtime::Error> {
//!     Ok(format!("placed (attempt {})", ctx.attempt()))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::from_env().await?;
//!     let orders = idem.operation("orders", sources::sqs(Some("/order_id"))?)?.batch();
//!     // A service over `SqsEvent` answering `SqsBatchResponse`; `orders.process(..)` gives
//!     // the report of each record instead.
//!     lambda_runtime::run(orders.service(place_order)).await
//! }
//! ```

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures_util::{FutureExt, StreamExt, TryFutureExt};
use lambda_runtime::Context;
use serde::Serialize;
use tracing::{error, warn};

pub use self::report::{BatchReport, PoisonPolicy, RecordOutcome};
pub use self::service::BatchService;
use super::operation::{Operation, deadline_of};
use crate::error::{BoxError, Error};
use crate::execution::{ExecutionContext, Invocation, Origin};
use crate::failure::Panicked;
use discarded::Discarded;
use groups::{IDENTITY, Prepared, group_in_order, joins};

mod discarded;
mod groups;
mod report;
mod service;

/// A record of a batch event, and the event and partial-batch response of its source.
pub trait BatchRecord: Send + Sized {
    /// The batch event Lambda delivers (`SqsEvent`, `KinesisEvent`, `Event` of DynamoDB
    /// Streams).
    type Event: Send;
    /// The partial-batch response Lambda reads (`SqsBatchResponse`, …; `()` for SNS and S3,
    /// which read none).
    type Response: Serialize + Send;
    /// The batch service's error: `Infallible` where every failure is in the partial-batch
    /// response; [`Error`] for SNS and S3.
    type Error: Send + 'static;
    /// The event's records, in order.
    fn records(event: Self::Event) -> Vec<Self>;
    /// The partial-batch response for `report`: the records Lambda must deliver again.
    fn response(report: &BatchReport) -> Self::Response;
    /// The identifier Lambda expects in `batchItemFailures`.
    fn item_identifier(&self) -> Option<String>;
    /// Records of one group run in order, one at a time; `None`: independent.
    fn ordering_group(&self) -> Option<String>;
    /// What to do with a record that can never succeed, unless the processor says otherwise
    /// ([`BatchProcessor::with_poison_policy`]): retry it by default.
    fn default_poison_policy() -> PoisonPolicy {
        PoisonPolicy::Retry
    }
    /// The invocation's answer for `report`: the partial-batch response where the source reads
    /// one (SQS, Kinesis, DynamoDB Streams: `Ok(Self::response(report))`, the error
    /// `Infallible`), else an error when a record must be delivered again (SNS, S3:
    /// [`BatchReport::records_failed`], and Lambda retries the whole event).
    fn answer(report: &BatchReport) -> Result<Self::Response, Self::Error>;
}

/// Runs each record of a batch as its own idempotent operation; built from an [`Operation`]
/// ([`Operation::batch`]).
pub struct BatchProcessor<R> {
    operation: Operation<R>,
    concurrency: Option<usize>,
    deadline_margin: Duration,
    poison: Option<PoisonPolicy>,
}

impl<R> fmt::Debug for BatchProcessor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchProcessor")
            .field("operation", &self.operation)
            .field("concurrency", &self.concurrency)
            .field("deadline_margin", &self.deadline_margin)
            .field("poison", &self.poison)
            .finish()
    }
}

impl<R: BatchRecord> Operation<R> {
    /// The processor for a batch source (SQS, Kinesis, DynamoDB Streams, and the events of SNS
    /// and S3): each record is its own run of this operation.
    pub fn batch(self) -> BatchProcessor<R> {
        BatchProcessor::new(self)
    }
}

impl<R: BatchRecord> BatchProcessor<R> {
    /// The most records (or ordering groups) run at once by default: a whole batch runs in one
    /// wave up to this size.
    pub const MAX_DEFAULT_CONCURRENCY: usize = 64;
    /// Default time left before the deadline under which no record is started.
    pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_secs(2);

    /// A processor running each record as `operation`.
    pub fn new(operation: Operation<R>) -> Self {
        Self {
            operation,
            concurrency: None,
            deadline_margin: Self::DEFAULT_DEADLINE_MARGIN,
            poison: None,
        }
    }

    /// What to do with records that can never succeed (default: the source's,
    /// [`BatchRecord::default_poison_policy`]).
    pub fn with_poison_policy(mut self, policy: PoisonPolicy) -> Self {
        self.poison = Some(policy);
        self
    }

    /// Starts no record once less than `margin` is left before the invocation's deadline
    /// (default 2 s): those are reported failed and delivered again, instead of being cut off
    /// by the timeout mid-effect with their claims held. Size it to one record's run time. A
    /// batch that starts with no more than `margin` left (a function timeout of 2 s or less
    /// under the default) keeps half the time left instead, logged at error level.
    pub fn with_deadline_margin(mut self, margin: Duration) -> Self {
        self.deadline_margin = margin;
        self
    }

    /// Runs at most `concurrency` records (or ordering groups) at once (at least 1). By default
    /// the whole batch runs at once, up to [`Self::MAX_DEFAULT_CONCURRENCY`].
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = Some(concurrency.max(1));
        self
    }

    /// Runs `handler` once per record's operation and reports what became of each record.
    ///
    /// Records of one operation key in the same batch run one after the other, so that a
    /// duplicate inside the batch is acknowledged as a replay rather than reported in progress.
    pub async fn process<F, Fut, T, E>(
        &self,
        records: Vec<R>,
        context: &Context,
        handler: F,
    ) -> BatchReport
    where
        F: Fn(R, ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize,
        E: Into<BoxError>,
    {
        let prepared = records.into_iter().enumerate().map(|(index, record)| {
            // A key, tenant or identity function that panics on one record (an `unwrap` on a
            // malformed message) fails that record as a panicking handler does, for
            // redelivery whatever the poison policy (a bug a deploy fixes): never the batch.
            let derived = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.operation.invocation(&record, context)
            }));
            let invocation = derived
                .unwrap_or_else(|_| {
                    error!("the operation's key policy panicked on a record: reported failed for redelivery");
                    let err = Error::Handler {
                        source: Box::new(Panicked),
                    };
                    // Never reaches the engine: counted here, as a handler that panicked is.
                    self.operation
                        .idem
                        .observe_refusal(self.operation.scope.operation(), &err);
                    Err(err)
                })
                .map(|invocation| match record.item_identifier() {
                    Some(id) => invocation.with_message_id(id),
                    None => invocation,
                });
            Prepared {
                index,
                joins: joins(&record, &invocation),
                record,
                invocation,
            }
        });
        let handler = &handler;
        let deadline = self.usable_deadline(context);
        let margin = self.margin_before(deadline);
        let groups = group_in_order(prepared);
        let concurrency = self
            .concurrency
            .unwrap_or_else(|| groups.len().clamp(1, Self::MAX_DEFAULT_CONCURRENCY));
        let mut outcomes: Vec<(usize, Option<String>, RecordOutcome)> =
            futures_util::stream::iter(groups)
                .map(|group| self.run_group(group, (deadline, margin), handler))
                .buffer_unordered(concurrency)
                .flat_map(futures_util::stream::iter)
                .collect()
                .await;
        outcomes.sort_by_key(|(index, _, _)| *index);
        BatchReport {
            records: outcomes
                .into_iter()
                .map(|(_, id, outcome)| (id, outcome))
                .collect(),
        }
    }

    /// Runs one group's records in order; after a failure, the rest of its ordering group (or
    /// of its operation key, without one) are skipped.
    async fn run_group<F, Fut, T, E>(
        &self,
        group: Vec<Prepared<R>>,
        (deadline, margin): (Option<SystemTime>, Duration),
        handler: &F,
    ) -> Vec<(usize, Option<String>, RecordOutcome)>
    where
        F: Fn(R, ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize,
        E: Into<BoxError>,
    {
        let mut outcomes = Vec::with_capacity(group.len());
        let mut stopped: HashSet<String> = HashSet::new();
        for Prepared {
            index,
            joins,
            record,
            invocation,
        } in group
        {
            let id = record.item_identifier();
            let failed = joins.iter().any(|name| stopped.contains(name));
            let outcome = match invocation {
                _ if failed => RecordOutcome::Skipped,
                _ if self.too_late(deadline, margin) => {
                    warn!(
                        message_id = id.as_deref(),
                        left_ms = self.time_left(deadline).as_millis() as u64,
                        margin_ms = margin.as_millis() as u64,
                        "record not started: too close to the invocation's deadline; it is reported failed for redelivery"
                    );
                    RecordOutcome::NotStarted
                }
                Err(err) => self.failed(id.as_deref(), None, err, Retained::No),
                Ok(invocation) => {
                    // The lease (and single-flight patience) counts from the record's start: a
                    // record started late must not hold its claim past the deadline.
                    let lease = self
                        .operation
                        .lease
                        .lease(deadline, self.operation.idem.now());
                    let invocation = invocation.with_lease(lease);
                    self.run_record(record, &invocation, handler).await
                }
            };
            // A failure stops what must follow it: its ordering group and its key. Another key
            // of its identity only ran after it to find its evidence settled, and may run.
            if outcome.is_failure() {
                stopped.extend(joins.into_iter().filter(|name| !name.starts_with(IDENTITY)));
            }
            outcomes.push((index, id, outcome));
        }
        outcomes
    }

    /// The invocation's deadline, if it is one ([`deadline_of`]): one already past when the
    /// batch starts comes from an emulator, and records then run without a deadline margin.
    fn usable_deadline(&self, context: &Context) -> Option<SystemTime> {
        let deadline = deadline_of(context, self.operation.idem.now());
        if deadline.is_none() && context.deadline > 0 {
            warn!(
                "the invocation's deadline had passed before the batch started (a local emulator?); records run without a deadline margin"
            );
        }
        deadline
    }

    /// The margin this batch keeps before `deadline`: the processor's, or half the time left
    /// when the batch starts with no more than that (a function whose timeout is the margin or
    /// shorter), so that such a function still runs its records instead of reporting every
    /// one not started on every delivery, until they reach a dead-letter queue unrun.
    fn margin_before(&self, deadline: Option<SystemTime>) -> Duration {
        let left = self.time_left(deadline);
        if deadline.is_none() || left > self.deadline_margin {
            return self.deadline_margin;
        }
        error!(
            left_ms = left.as_millis() as u64,
            margin_ms = self.deadline_margin.as_millis() as u64,
            "the batch starts with no more than its deadline margin left: records start until half of it is left; raise the function's timeout or lower with_deadline_margin"
        );
        left / 2
    }

    /// Whether less than `margin` is left before `deadline`.
    fn too_late(&self, deadline: Option<SystemTime>, margin: Duration) -> bool {
        deadline.is_some() && self.time_left(deadline) < margin
    }

    /// The time left before `deadline` (`None`: no deadline, all the time in the world).
    fn time_left(&self, deadline: Option<SystemTime>) -> Duration {
        deadline.map_or(Duration::MAX, |deadline| {
            deadline
                .duration_since(self.operation.idem.now())
                .unwrap_or_default()
        })
    }

    async fn run_record<F, Fut, T, E>(
        &self,
        record: R,
        invocation: &Invocation,
        handler: &F,
    ) -> RecordOutcome
    where
        F: Fn(R, ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize,
        E: Into<BoxError>,
    {
        let run = self
            .operation
            .idem
            .execute::<Discarded<T>, E, _, _>(invocation, |ctx| {
                crate::lambda::context::scope(ctx.clone(), handler(record, ctx))
                    .map_ok(Discarded::Fresh)
            });
        // A panic is this record's failure: the engine gave its claim back; the other records
        // are answered as usual instead of the whole batch coming back.
        let Ok(answer) = AssertUnwindSafe(run).catch_unwind().await else {
            error!(
                key = invocation.key().short(),
                "the record's handler panicked: reported failed for redelivery"
            );
            return self.failed(
                invocation.message_id.as_deref(),
                Some(invocation),
                Error::Handler {
                    source: Box::new(Panicked),
                },
                Retained::No,
            );
        };
        match answer {
            Ok(done) => match done.origin() {
                Origin::Executed { .. } => RecordOutcome::Executed,
                Origin::Replayed => RecordOutcome::Replayed,
                Origin::Reconciled { .. } => RecordOutcome::AlreadyDone,
            },
            Err(err) if err.already_took_effect() => {
                warn!(
                    key = invocation.key().short(),
                    "record already took effect (permanent evidence); acknowledged"
                );
                RecordOutcome::AlreadyDone
            }
            Err(err) if err.applied_but_not_kept() => {
                error!(
                    key = invocation.key().short(),
                    kind = err.kind().name(),
                    "record took effect but its result could not be kept: acknowledged, never run again"
                );
                RecordOutcome::AppliedNotKept(err)
            }
            Err(err) => {
                // The engine's answer: a handler's error it classified terminal, it retained.
                let retained = match &err {
                    Error::Handler { source } if self.operation.is_terminal(&**source) => {
                        Retained::AsFailed
                    }
                    _ => Retained::No,
                };
                self.failed(
                    invocation.message_id.as_deref(),
                    Some(invocation),
                    err,
                    retained,
                )
            }
        }
    }

    /// A failed record's outcome: reported failed, or acknowledged as poison when it can never
    /// succeed and the poison policy says so. A stored record this build cannot read is never
    /// acknowledged: the event is not at fault, and the record may be a claim a newer build
    /// holds (a rolling deploy, a rollback) whose event would be lost, or a step's result of
    /// another type, which holds the operation for an operator whose release needs a delivery
    /// left to run it (the batch doors never decode a stored result of their own). A handler's
    /// error that the engine retained as FAILED (`retained`: its classifier called it
    /// terminal), which every redelivery is answered with, is poison from its first delivery
    /// (on a stream, reporting it would hold its shard for a redelivery that can only
    /// acknowledge it); a panic, the handler's or the key policy's, never is: nothing retained
    /// it, and only a redelivery takes its claim over. Each is logged with the record's
    /// identifier (`message_id`), so that an operator can find the event.
    fn failed(
        &self,
        id: Option<&str>,
        invocation: Option<&Invocation>,
        err: Error,
        retained: Retained,
    ) -> RecordOutcome {
        let policy = self.poison.unwrap_or_else(R::default_poison_policy);
        let unreadable_record = matches!(&err, Error::Store(store) if store.is_corrupt_record())
            || matches!(err, Error::StoredOutcomeUnreadable { .. });
        let key = invocation.map(|inv| inv.key().short());
        let kind = err.kind().name();
        if policy == PoisonPolicy::Acknowledge
            && (err.is_permanent() || retained == Retained::AsFailed)
            && !unreadable_record
        {
            error!(
                message_id = id,
                key,
                kind,
                "record can never succeed: acknowledged as poison (PoisonPolicy::Acknowledge)"
            );
            return RecordOutcome::Poison(err);
        }
        warn!(
            message_id = id,
            key, kind, "record failed: reported in the batch's failures for redelivery"
        );
        RecordOutcome::Failed(err)
    }
}

/// Whether the engine retained a failed record's error as FAILED (a handler's error its
/// classifier called terminal), which only the engine's own answer can say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retained {
    /// Retained: every redelivery is answered with it.
    AsFailed,
    /// Not retained (a panic, a key policy's failure, any other error).
    No,
}
