//! One taxonomy of errors: what the Lambda diagnostic names, which HTTP status answers, and
//! what a batch does with the record, all decided from [`ErrorKind`] in one place.

use super::Error;

/// What an [`Error`] means for the caller, one value per variant ([`Error::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::PayloadConflict`].
    PayloadConflict,
    /// [`Error::AlreadyInProgress`].
    AlreadyInProgress,
    /// [`Error::Indeterminate`].
    Indeterminate,
    /// [`Error::KeyExpiredConflict`].
    KeyExpiredConflict,
    /// [`Error::ReconcileFailed`].
    ReconcileFailed,
    /// [`Error::LeaseLost`].
    LeaseLost,
    /// [`Error::MissingKey`].
    MissingKey,
    /// [`Error::CallerUnidentified`].
    CallerUnidentified,
    /// [`Error::TenantMissing`].
    TenantMissing,
    /// [`Error::InvalidEvent`].
    InvalidEvent,
    /// [`Error::OutcomeTooLarge`].
    OutcomeTooLarge,
    /// [`Error::Failed`].
    Failed,
    /// [`Error::StoredOutcomeUnreadable`].
    StoredOutcomeUnreadable,
    /// [`Error::OutcomeMismatch`].
    OutcomeMismatch,
    /// [`Error::StepMismatch`].
    StepMismatch,
    /// [`Error::RecordsFailed`].
    RecordsFailed,
    /// [`Error::Store`].
    Store,
    /// [`Error::Handler`].
    Handler,
}

impl ErrorKind {
    /// The variant's name, e.g. `PayloadConflict` (the Lambda diagnostic's `errorType` is
    /// `Idempotency.<name>`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::PayloadConflict => "PayloadConflict",
            Self::AlreadyInProgress => "AlreadyInProgress",
            Self::Indeterminate => "Indeterminate",
            Self::KeyExpiredConflict => "KeyExpiredConflict",
            Self::ReconcileFailed => "ReconcileFailed",
            Self::LeaseLost => "LeaseLost",
            Self::MissingKey => "MissingKey",
            Self::CallerUnidentified => "CallerUnidentified",
            Self::TenantMissing => "TenantMissing",
            Self::InvalidEvent => "InvalidEvent",
            Self::OutcomeTooLarge => "OutcomeTooLarge",
            Self::Failed => "Failed",
            Self::StoredOutcomeUnreadable => "StoredOutcomeUnreadable",
            Self::OutcomeMismatch => "OutcomeMismatch",
            Self::StepMismatch => "StepMismatch",
            Self::RecordsFailed => "RecordsFailed",
            Self::Store => "Store",
            Self::Handler => "Handler",
        }
    }

    /// Whether delivering the same event again can never succeed: the request is malformed, its
    /// key is taken by another intent, or its outcome is settled as a failure. A batch applies
    /// its poison policy to such records instead of retrying them for ever.
    pub const fn is_permanent(self) -> bool {
        match self {
            Self::PayloadConflict
            | Self::MissingKey
            | Self::CallerUnidentified
            | Self::TenantMissing
            | Self::InvalidEvent
            | Self::OutcomeTooLarge
            | Self::Failed
            | Self::StoredOutcomeUnreadable => true,
            Self::AlreadyInProgress
            | Self::Indeterminate
            | Self::KeyExpiredConflict
            | Self::ReconcileFailed
            | Self::LeaseLost
            | Self::OutcomeMismatch
            | Self::StepMismatch
            | Self::RecordsFailed
            | Self::Store
            | Self::Handler => false,
        }
    }
}

impl Error {
    /// Whether delivering the same event again can never succeed: [`ErrorKind::is_permanent`],
    /// a [`Error::KeyExpiredConflict`] whose evidence is FAILED (evidence never expires), and a
    /// stored record that is corrupt ([`StoreError::CorruptRecord`](super::StoreError::CorruptRecord): it stays corrupt until an
    /// operator repairs it). A batch's [`PoisonPolicy`](crate::PoisonPolicy) applies to these,
    /// but never acknowledges a corrupt record's event.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::KeyExpiredConflict { evidence, .. } => {
                evidence.status == crate::record::Status::Failed
            }
            Self::Store(store) => store.is_corrupt_record(),
            other => other.kind().is_permanent(),
        }
    }

    /// The error's kind: the one taxonomy the Lambda diagnostic, the HTTP door and the batch
    /// processor answer from.
    pub const fn kind(&self) -> ErrorKind {
        match self {
            Self::PayloadConflict { .. } => ErrorKind::PayloadConflict,
            Self::AlreadyInProgress { .. } => ErrorKind::AlreadyInProgress,
            Self::Indeterminate { .. } => ErrorKind::Indeterminate,
            Self::KeyExpiredConflict { .. } => ErrorKind::KeyExpiredConflict,
            Self::ReconcileFailed { .. } => ErrorKind::ReconcileFailed,
            Self::LeaseLost { .. } => ErrorKind::LeaseLost,
            Self::MissingKey { .. } => ErrorKind::MissingKey,
            Self::CallerUnidentified => ErrorKind::CallerUnidentified,
            Self::TenantMissing { .. } => ErrorKind::TenantMissing,
            Self::InvalidEvent { .. } => ErrorKind::InvalidEvent,
            Self::OutcomeTooLarge { .. } => ErrorKind::OutcomeTooLarge,
            Self::Failed { .. } => ErrorKind::Failed,
            Self::StoredOutcomeUnreadable { .. } => ErrorKind::StoredOutcomeUnreadable,
            Self::OutcomeMismatch { .. } => ErrorKind::OutcomeMismatch,
            Self::RecordsFailed { .. } => ErrorKind::RecordsFailed,
            Self::StepMismatch { .. } => ErrorKind::StepMismatch,
            Self::Store(_) => ErrorKind::Store,
            Self::Handler { .. } => ErrorKind::Handler,
        }
    }
}
