//! Errors as the Lambda Runtime API reports them.

use lambda_runtime::Diagnostic;

use super::error::IdempotencyError;
use crate::effects::StepError;
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
            // A completion the store refused (its writes' condition failed) is the engine's
            // `StepError`, not the handler's type: named as what it is.
            IdempotencyError::Idempotency(Error::Handler { source }) => Diagnostic {
                error_type: match source.is::<StepError>() {
                    true => std::any::type_name::<StepError>(),
                    false => std::any::type_name::<E>(),
                }
                .to_owned(),
                error_message: source.to_string(),
            },
            IdempotencyError::Idempotency(error) => error.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("declined")]
    struct Declined;

    impl From<Declined> for Diagnostic {
        fn from(_: Declined) -> Self {
            Diagnostic {
                error_type: "Declined".into(),
                error_message: "declined".into(),
            }
        }
    }

    /// The handler's error carried by the engine is named by the handler's type; a completion
    /// the store refused, which the engine made, by its own.
    #[test]
    fn an_engine_made_refusal_is_not_named_as_the_handlers_error() {
        let carried = |source: crate::error::BoxError| {
            Diagnostic::from(IdempotencyError::<Declined>::Idempotency(Error::Handler {
                source,
            }))
        };
        let handlers = carried(Box::new(Declined));
        assert!(handlers.error_type.ends_with("Declined"), "{handlers:?}");
        let refused = carried(Box::new(StepError::Refused {
            step: "(completion)".into(),
            write: 0,
        }));
        assert!(refused.error_type.ends_with("StepError"), "{refused:?}");
    }
}
