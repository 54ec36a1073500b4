//! Errors as the Lambda Runtime API reports them.

use lambda_runtime::Diagnostic;

use crate::error::Error;

impl From<Error> for Diagnostic {
    fn from(error: Error) -> Self {
        Diagnostic {
            error_type: format!("Idempotency.{}", error.kind().name()),
            error_message: error.to_string(),
        }
    }
}
