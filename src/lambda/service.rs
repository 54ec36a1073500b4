//! The service: derive the operation, claim, call the inner handler once, answer.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use lambda_runtime::LambdaEvent;
use lambda_runtime::tower::Service;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::context;
use super::diagnostic::refusal;
use super::error::IdempotencyError;
use super::operation::Operation;
use crate::error::{BoxError, Error};
use crate::execution::Execution;
use crate::reconcile::BoxFuture;

/// A Lambda handler made idempotent by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// `Clone + Send`, its state shared and thread-safe: it runs under `lambda_runtime::run` and
/// `run_concurrent` alike. Its error is [`IdempotencyError`]: the handler's own error as it
/// returned it when its type is `lambda_runtime::Error`, else the engine's. It answers the
/// handler's value, or with `EXECUTIONS = true`
/// ([`IdempotencyLayer::executions`](super::IdempotencyLayer::executions)) the whole
/// [`Execution`], so that the service around it knows whether the value was executed or
/// replayed ([`Execution::origin`]) without the stored bytes changing.
pub struct IdempotencyService<Svc, E, const EXECUTIONS: bool = false> {
    pub(crate) inner: Svc,
    pub(crate) operation: Arc<Operation<E>>,
}

impl<Svc: Clone, E, const EXECUTIONS: bool> Clone for IdempotencyService<Svc, E, EXECUTIONS> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<Svc, E, const EXECUTIONS: bool> fmt::Debug for IdempotencyService<Svc, E, EXECUTIONS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("operation", &self.operation)
            .field("executions", &EXECUTIONS)
            .finish_non_exhaustive()
    }
}

/// The service of one `EXECUTIONS` value: what it answers (`$response`) and how it makes that
/// answer of the engine's [`Execution`] (`$answer`).
macro_rules! answering {
    ($executions:literal, $response:ty, $answer:expr) => {
        impl<Svc, E, R> Service<LambdaEvent<E>> for IdempotencyService<Svc, E, $executions>
        where
            Svc: Service<LambdaEvent<E>, Response = R> + Clone + Send + 'static,
            Svc::Error: Into<BoxError> + Send + 'static,
            Svc::Future: Send,
            E: Send + 'static,
            R: Serialize + DeserializeOwned + Send + 'static,
        {
            type Response = $response;
            type Error = IdempotencyError<Svc::Error>;
            type Future = BoxFuture<'static, Result<$response, Self::Error>>;

            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx).map_err(IdempotencyError::Handler)
            }

            fn call(&mut self, event: LambdaEvent<E>) -> Self::Future {
                // The ready service answers this call; a fresh clone waits for the next one.
                let fresh = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, fresh);
                let operation = Arc::clone(&self.operation);
                Box::pin(async move {
                    let invocation = operation.invocation(&event.payload, &event.context)?;
                    let done = operation
                        .idem
                        .execute(&invocation, |ctx| context::scope(ctx, inner.call(event)))
                        .await
                        .map_err(handler_error)?;
                    Ok($answer(done))
                })
            }
        }
    };
}

answering!(false, R, Execution::into_value);
answering!(true, Execution<R>, std::convert::identity);

/// The engine's answer as the service's error: a handler's own error given back as it was
/// returned when its type is the box the engine keeps it as (`lambda_runtime::Error`, any
/// `Box<dyn Error + Send + Sync>`), else the engine's [`Error::Handler`] carrying it. Writes
/// the store refused or rejected stay the engine's, whatever the handler's error type.
fn handler_error<H: 'static>(err: Error) -> IdempotencyError<H> {
    match err {
        Error::Handler { source }
            if TypeId::of::<H>() == TypeId::of::<BoxError>() && refusal(&source).is_none() =>
        {
            let boxed: Box<dyn Any> = Box::new(source);
            match boxed.downcast::<H>() {
                Ok(handler) => IdempotencyError::Handler(*handler),
                // The types were compared above: this arm is never taken.
                Err(_) => IdempotencyError::Idempotency(Error::InvalidEvent {
                    reason: "the handler's error could not be given back".into(),
                }),
            }
        }
        other => IdempotencyError::Idempotency(other),
    }
}
