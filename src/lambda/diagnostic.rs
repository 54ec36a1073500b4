//! Errors as the Lambda Runtime API reports them.

use lambda_runtime::Diagnostic;

use crate::error::Error;

impl From<Error> for Diagnostic {
    fn from(error: Error) -> Self {
        let variant = match &error {
            Error::PayloadConflict { .. } => "PayloadConflict",
            Error::AlreadyInProgress { .. } => "AlreadyInProgress",
            Error::Indeterminate { .. } => "Indeterminate",
            Error::KeyExpiredConflict { .. } => "KeyExpiredConflict",
            Error::ReconcileFailed { .. } => "ReconcileFailed",
            Error::LeaseLost { .. } => "LeaseLost",
            Error::MissingKey { .. } => "MissingKey",
            Error::InvalidEvent { .. } => "InvalidEvent",
            Error::OutcomeTooLarge { .. } => "OutcomeTooLarge",
            Error::Failed { .. } => "Failed",
            Error::StoredOutcomeUnreadable { .. } => "StoredOutcomeUnreadable",
            Error::OutcomeMismatch { .. } => "OutcomeMismatch",
            Error::Store(_) => "Store",
            Error::Handler { .. } => "Handler",
        };
        Diagnostic {
            error_type: format!("Idempotency.{variant}"),
            error_message: error.to_string(),
        }
    }
}
