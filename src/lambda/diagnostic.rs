//! Errors as the Lambda Runtime API reports them: the kind for a Step Functions `Retry` or
//! `Catch`, and a message for the caller that never carries the store's internals (its table,
//! its SDK's text), which go to the function's log.

use lambda_runtime::Diagnostic;
use tracing::error;

use super::error::IdempotencyError;
use crate::effects::StepError;
use crate::error::{BoxError, Error};
use crate::failure::Terminal;
use crate::record::FailureKind;

impl From<Error> for Diagnostic {
    fn from(error: Error) -> Self {
        Diagnostic {
            error_type: format!("Idempotency.{}", error.kind().name()),
            error_message: caller_message(&error),
        }
    }
}

/// What the caller is told of `error`: the store's failures by their kind and what to do; a
/// failure the engine retained (a result or writes the store refused, a result that cannot be
/// replayed) by its kind, since its stored message is the store's or serde's text; writes the
/// store rejected without the store's reason; the rest as they read.
pub(crate) fn caller_message(error: &Error) -> String {
    match error {
        Error::Store(store) => {
            error!(error = %store, "the idempotency store failed: the caller is told its kind only");
            match store.is_transient() {
                true => "the idempotency store is unavailable or throttled: retry with the same event",
                false => "the service cannot record this request, and retrying will not help until its operator fixes it: see the function's logs",
            }
            .to_owned()
        }
        Error::Failed { key, failure }
            if !matches!(
                failure.kind,
                FailureKind::Terminal(_) | FailureKind::Released
            ) =>
        {
            // The stored message stays in the record (`idemctl show`): it may quote the result.
            error!(
                key = key.short(),
                kind = failure.kind.as_str(),
                "a failure the engine retained was answered: its message is in the record"
            );
            let what = match failure.kind.took_effect() {
                true => "it was applied, but its result could not be kept: do not send it again",
                false => {
                    "its writes cannot be sent as built: fix the handler or the table, then send a new operation"
                }
            };
            format!(
                "operation {} failed before and is not re-run ({}): {what}",
                key.short(),
                failure.kind.as_str()
            )
        }
        // Writes the store refused or rejected, which the engine made: its reason stays in the
        // log.
        Error::Handler { source } => match refusal(source) {
            Some(refused) => format!("handler failed: {}", refusal_message(refused)),
            None => error.to_string(),
        },
        other => other.to_string(),
    }
}

impl<E: Into<Diagnostic>> From<IdempotencyError<E>> for Diagnostic {
    fn from(error: IdempotencyError<E>) -> Self {
        match error {
            IdempotencyError::Handler(handler) => handler.into(),
            // Writes the store refused or rejected (a completion's, a step's) are the engine's
            // `StepError`, not the handler's type: named as what they are.
            IdempotencyError::Idempotency(Error::Handler { source }) => match refusal(&source) {
                Some(refused) => Diagnostic {
                    error_type: std::any::type_name::<StepError>().to_owned(),
                    error_message: refusal_message(refused),
                },
                None => Diagnostic {
                    error_type: std::any::type_name::<E>().to_owned(),
                    error_message: source.to_string(),
                },
            },
            IdempotencyError::Idempotency(error) => error.into(),
        }
    }
}

/// The refusal the engine made that `source` is (writes the store refused or rejected), as
/// it is or marked terminal; `None` for the handler's own error.
pub(crate) fn refusal(source: &BoxError) -> Option<&StepError> {
    let source: &(dyn std::error::Error + 'static) = &**source;
    refused(source).or_else(|| {
        source
            .downcast_ref::<Terminal>()
            .and_then(std::error::Error::source)
            .and_then(refused)
    })
}

/// `error` as writes the store refused or rejected.
fn refused<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a StepError> {
    match error.downcast_ref::<StepError>() {
        Some(step @ (StepError::Refused { .. } | StepError::Rejected { .. })) => Some(step),
        _ => None,
    }
}

/// A refusal's message for the caller: a rejection's reason is the store's text, which goes to
/// the function's log only.
fn refusal_message(refused: &StepError) -> String {
    match refused {
        StepError::Rejected { step, message } => {
            error!(step = %step, reason = %message, "the store rejected the writes");
            format!(
                "step `{step}`: the store rejected the writes; nothing was committed (see the function's logs)"
            )
        }
        other => other.to_string(),
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

    /// The handler's error carried by the engine is named by the handler's type; writes the
    /// store refused or rejected, which the engine made, by its own, also marked terminal, and
    /// without the store's text.
    #[test]
    fn an_engine_made_refusal_is_not_named_as_the_handlers_error() {
        let carried = |source: BoxError| {
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
        let rejected = carried(Box::new(Terminal::new(
            "completion_rejected",
            StepError::Rejected {
                step: "(completion)".into(),
                message: "Item size has exceeded the maximum allowed size in table prod-idem"
                    .into(),
            },
        )));
        assert!(rejected.error_type.ends_with("StepError"), "{rejected:?}");
        assert!(
            !rejected.error_message.contains("prod-idem"),
            "{rejected:?}"
        );
    }

    /// A failure the engine retained tells the caller its kind and what to do, never the
    /// store's text it keeps; a handler's terminal failure reads as the handler wrote it.
    #[test]
    fn a_retained_engine_failure_keeps_the_stores_text_from_the_caller() {
        let key = crate::key::OperationKey::derive(
            &crate::key::OperationScope::new("fn", "op").expect("scope"),
            None,
            &serde_json::json!("k"),
        )
        .expect("key");
        let failed = |kind: FailureKind, message: &str| {
            Diagnostic::from(Error::Failed {
                key: key.clone(),
                failure: crate::record::RetainedFailure {
                    kind,
                    message: message.into(),
                },
            })
        };
        let rejected = failed(
            FailureKind::CompletionRejected,
            "table `prod-idem` has multi-Region strong consistency",
        );
        assert!(
            !rejected.error_message.contains("prod-idem"),
            "{rejected:?}"
        );
        assert!(rejected.error_message.contains("completion_rejected"));
        let unstorable = failed(
            FailureKind::OutcomeUnstorable,
            "Item size has exceeded the maximum allowed size in table prod-idem",
        );
        assert!(
            !unstorable.error_message.contains("prod-idem"),
            "{unstorable:?}"
        );
        assert!(unstorable.error_message.contains("do not send it again"));
        let declined = failed(FailureKind::Terminal("declined".into()), "card declined");
        assert!(
            declined.error_message.contains("card declined"),
            "{declined:?}"
        );
        // The first caller's answer, before the failure is retained (the durable door's
        // message): the store's reason stays in the log.
        let rejected_now = caller_message(&Error::Handler {
            source: Box::new(Terminal::new(
                "completion_rejected",
                StepError::Rejected {
                    step: "(completion)".into(),
                    message: "table `prod-idem` has multi-Region strong consistency".into(),
                },
            )),
        });
        assert!(!rejected_now.contains("prod-idem"), "{rejected_now}");
    }

    /// A store's failure tells the caller its kind and what to do, never the table or the
    /// SDK's text.
    #[test]
    fn a_store_failure_keeps_its_internals_from_the_caller() {
        let missing = Diagnostic::from(Error::Store(crate::error::StoreError::TableNotFound {
            table: "prod-idem".into(),
        }));
        assert_eq!(missing.error_type, "Idempotency.Store");
        assert!(!missing.error_message.contains("prod-idem"), "{missing:?}");
        assert!(missing.error_message.contains("retrying will not help"));
    }
}
