//! SDK errors mapped into [`StoreError`] at the store edge.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use crate::error::StoreError;

/// Maps an SDK failure of `operation` on `table` (other than a failed condition, which callers
/// handle first) into a [`StoreError`].
pub(crate) fn map_sdk_error<E, R>(
    operation: &'static str,
    table: &str,
    err: SdkError<E, R>,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let code = match &err {
        SdkError::ServiceError(service) => service.err().code(),
        SdkError::ConstructionFailure(_) => {
            return StoreError::Rejected {
                operation,
                message: aws_sdk_dynamodb::error::DisplayErrorContext(&err).to_string(),
            };
        }
        _ => None,
    };
    match code {
        Some("ResourceNotFoundException") => StoreError::TableNotFound {
            table: table.to_owned(),
        },
        Some(
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded",
        ) => StoreError::Throttled {
            operation,
            source: Box::new(err),
        },
        Some(
            code @ ("AccessDeniedException"
            | "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "MissingAuthenticationTokenException"
            | "ExpiredTokenException"
            | "IncompleteSignatureException"),
        ) => StoreError::AccessDenied {
            operation,
            code: code.to_owned(),
        },
        Some("TransactionConflictException" | "ReplicatedWriteConflictException") => {
            StoreError::Contention { operation }
        }
        // IdempotentParameterMismatchException falls through to Unavailable: a request under
        // the token was accepted, so the outcome is unknown, never "not applied".
        Some("ValidationException" | "SerializationException") => StoreError::Rejected {
            operation,
            message: err.message().unwrap_or("no message").to_owned(),
        },
        _ => StoreError::Unavailable {
            operation,
            source: Box::new(err),
        },
    }
}

/// Maps the code of a cancelled transaction's failed item (other than a failed condition,
/// which callers read first) into a [`StoreError`].
pub(crate) fn map_cancellation(
    operation: &'static str,
    code: &str,
    message: Option<&str>,
) -> StoreError {
    let message = message.unwrap_or("no message");
    match code {
        "TransactionConflict" => StoreError::Contention { operation },
        "ThrottlingError" | "ProvisionedThroughputExceeded" | "RequestLimitExceeded" => {
            StoreError::Throttled {
                operation,
                source: format!("transaction cancelled: {code}: {message}").into(),
            }
        }
        "ValidationError" | "ItemCollectionSizeLimitExceeded" => StoreError::Rejected {
            operation,
            message: format!("transaction cancelled: {code}: {message}"),
        },
        _ => StoreError::Unavailable {
            operation,
            source: format!("transaction cancelled: {code}: {message}").into(),
        },
    }
}
