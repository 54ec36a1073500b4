//! Errors as the Lambda Runtime API reports them.

use lambda_runtime::Diagnostic;

use super::error::IdempotencyError;
use crate::error::Error;

impl From<Error> for Diagnostic {
    fn from(error: Error) -> Self {
        Diagnostic {
            error_type: format!("Idempotency.{}", error.kind().name()),
            error_message: error.to_string(),
        }
    }
}

impl<E: Into<Diagnostic>> From<IdempotencyError<E>> for Diagnostic {
    fn from(error: IdempotencyError<E>) -> Self {
        match error {
            IdempotencyError::Handler(handler) => handler.into(),
            IdempotencyError::Idempotency(Error::Handler { source }) => Diagnostic {
                error_type: std::any::type_name::<E>().to_owned(),
                error_message: source.to_string(),
            },
            IdempotencyError::Idempotency(error) => error.into(),
        }
    }
}
