//! What a Lambda door's service fails with: the handler's own error, or the engine's.

use crate::error::Error;

/// The error of an idempotent handler's service ([`IdempotencyService`](super::IdempotencyService),
/// [`BatchService`](super::batch::BatchService)).
///
/// A handler error comes back as the handler returned it (`Handler`), so that its Lambda
/// diagnostic is the handler's own: an `errorType` a Step Functions `Retry` or `Catch` matches
/// survives the layer. The engine's own answers (a duplicate in progress, a payload conflict, a
/// store outage) are `Idempotency`, reported as `Idempotency.<kind>` ([`crate::ErrorKind`]).
///
/// A handler's error is given back as itself when its type is `lambda_runtime::Error` (any
/// `Box<dyn Error + Send + Sync>`), the type the engine keeps it as; an error of another type
/// comes back inside [`Error::Handler`], reported with that type's name as its `errorType`, as
/// `lambda_runtime` reports an error of a type without a diagnostic of its own.
///
/// ```
/// use lambda_idempotency::{Error, IdempotencyError};
/// use lambda_runtime::Diagnostic;
///
/// let failed: IdempotencyError<lambda_runtime::Error> = IdempotencyError::Handler("declined".into());
/// let diagnostic = Diagnostic::from(failed);
/// assert_eq!(diagnostic.error_message, "declined");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyError<E> {
    /// The handler ran and failed with this error (its claim was released or its failure
    /// retained, as classified).
    #[error("{0}")]
    Handler(E),
    /// The engine answered instead of the handler.
    #[error(transparent)]
    Idempotency(#[from] Error),
}

impl<E> IdempotencyError<E> {
    /// The engine's error, if it is one.
    pub fn idempotency(&self) -> Option<&Error> {
        match self {
            Self::Idempotency(err) => Some(err),
            Self::Handler(_) => None,
        }
    }

    /// The handler's error, if it is one.
    pub fn handler(&self) -> Option<&E> {
        match self {
            Self::Handler(err) => Some(err),
            Self::Idempotency(_) => None,
        }
    }
}
