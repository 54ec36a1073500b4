//! What a batch answers: each record's outcome, the poison policy that decides the outcome
//! of a record that can never succeed, and the partial-batch failures.

use crate::error::Error;

/// What a batch does with a record that can never succeed ([`Error::is_permanent`]): a
/// payload conflict, a retained terminal failure, an unreadable event. A stored record the
/// build cannot read is reported failed under either policy: the event is not at fault, and
/// the record may be a newer build's claim (a rolling deploy, a rollback). (A record that took
/// effect but whose result was not kept is always acknowledged: [`RecordOutcome::AppliedNotKept`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoisonPolicy {
    /// Report it failed: the source delivers it again until its redrive policy moves it to a
    /// dead-letter queue. The default for SQS, where a DLQ ends the retries (configure one: a
    /// FIFO group waits behind a failing message until it moves). On a FIFO queue the messages
    /// of its group behind it in the same batch are reported failed with it (skipped, to keep
    /// the order), so their receive counts rise with its own, but only in the batches they
    /// shared with it: the DLQ may take it alone, and the group's later messages then run
    /// before it is redriven. Where the group's order matters, deal with the poison message
    /// before the messages behind it (its redrive runs it after them).
    Retry,
    /// Acknowledge it, logged at error level with its key hash and error kind, and reported as
    /// [`RecordOutcome::Poison`]: the stream moves on instead of retrying the shard or the
    /// stream from that record until it expires. The default for Kinesis and DynamoDB Streams.
    Acknowledge,
}

/// What became of one record.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecordOutcome {
    /// The handler ran and its result was stored.
    Executed,
    /// An earlier delivery's stored outcome was replayed; the handler did not run (what the
    /// HTTP door answers with `Idempotent-Replayed: true`).
    Replayed,
    /// The effect was found without running the handler or replaying: a takeover's
    /// reconciler found it, or the business identity's permanent evidence shows it took
    /// effect ([`Error::already_took_effect`]).
    AlreadyDone,
    /// The record failed (handler error, in progress elsewhere, conflict, store error).
    Failed(Error),
    /// Not run: an earlier record of its ordering group failed.
    Skipped,
    /// Not started: too close to the invocation's deadline
    /// ([`BatchProcessor::with_deadline_margin`](super::BatchProcessor::with_deadline_margin)).
    NotStarted,
    /// It can never succeed, and the poison policy acknowledged it ([`PoisonPolicy::Acknowledge`]).
    Poison(Error),
    /// It took effect but its result could not be kept ([`Error::applied_but_not_kept`]):
    /// acknowledged whatever the poison policy, and logged at error level (alarm on it), so
    /// that no redrive runs it again once its retained failure expires.
    AppliedNotKept(Error),
}

impl RecordOutcome {
    /// Whether Lambda must deliver the record again.
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_) | Self::Skipped | Self::NotStarted)
    }

    /// Whether the record was answered by replaying an earlier delivery's stored outcome.
    pub fn is_replay(&self) -> bool {
        matches!(self, Self::Replayed)
    }
}

/// Every record's identifier and outcome, in the batch's order.
#[derive(Debug)]
pub struct BatchReport {
    /// `(item identifier, outcome)` per record.
    pub records: Vec<(Option<String>, RecordOutcome)>,
}

impl BatchReport {
    /// The identifiers of the records Lambda must deliver again (an unknown identifier is
    /// reported empty, which makes Lambda retry the whole batch).
    pub fn failed_identifiers(&self) -> Vec<String> {
        self.records
            .iter()
            .filter(|(_, outcome)| outcome.is_failure())
            .map(|(id, _)| id.clone().unwrap_or_default())
            .collect()
    }

    /// `Err` when a record must be delivered again: the answer of a source that reads no
    /// partial-batch response (SNS, S3), whose invocation then fails so that Lambda retries
    /// the event.
    pub fn records_failed(&self) -> Result<(), Error> {
        match self.failed_identifiers().len() {
            0 => Ok(()),
            failed => Err(Error::RecordsFailed {
                failed,
                records: self.records.len(),
            }),
        }
    }

    /// One partial-batch failure entry per record Lambda must deliver again.
    #[cfg(any(feature = "sqs", feature = "kinesis", feature = "dynamodb"))]
    pub(crate) fn failures<T>(&self, failure: impl Fn(String) -> T) -> Vec<T> {
        self.failed_identifiers().into_iter().map(failure).collect()
    }
}
