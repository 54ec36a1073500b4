//! What a Lambda door's service fails with: the handler's own error, or the engine's.

use crate::error::Error;

/// The error of an idempotent handler's service ([`IdempotencyService`](super::IdempotencyService)).
///
/// The engine's own answers (a duplicate in progress, a payload conflict, a store outage) are
/// `Idempotency`, reported to Lambda as `Idempotency.<kind>` ([`crate::ErrorKind`]), so that a
/// Step Functions `Retry` or `Catch` can tell them from the handler's.
///
/// A handler's error comes back as `Handler`, as the handler returned it, when its type is
/// `lambda_runtime::Error` (any `Box<dyn Error + Send + Sync>`): the type the engine keeps a
/// handler's error as, to classify it. Writes the store refused or rejected (a completion's, or
/// a transactional step's that the handler returned) stay `Idempotency` ([`Error::Handler`]
/// carrying the [`StepError`](crate::effects::StepError)), reported as `StepError`. An error of another type comes back inside
/// [`Error::Handler`] (reach it with [`IdempotencyError::downcast_handler`]); its diagnostic's
/// `errorType` is the type's name, as `lambda_runtime` reports a type without a diagnostic of
/// its own. A `From<MyError> for Diagnostic` of your own is not applied to it: stable Rust
/// cannot give a boxed error back as its type without a bound `lambda_runtime::Error` lacks.
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
    /// retained, as classified), or the wrapped service was not ready.
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

    /// The handler's error as `T`, when the engine carries one of that type
    /// ([`Error::Handler`]); `Err(self)` otherwise.
    pub fn downcast_handler<T: std::error::Error + 'static>(self) -> Result<T, Self> {
        match self {
            Self::Idempotency(Error::Handler { source }) => match source.downcast::<T>() {
                Ok(typed) => Ok(*typed),
                Err(source) => Err(Self::Idempotency(Error::Handler { source })),
            },
            other => Err(other),
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
