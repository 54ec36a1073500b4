//! The service: derive the operation, claim, call the inner handler once, answer.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use lambda_runtime::LambdaEvent;
use lambda_runtime::tower::Service;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::context;
use super::operation::Operation;
use crate::error::{BoxError, Error};
use crate::reconcile::BoxFuture;
use crate::store::{AnyStore, Store};

/// A Lambda handler made idempotent by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// `Clone + Send`, its state shared and thread-safe: it runs under `lambda_runtime::run` and
/// `run_concurrent` alike.
pub struct Idempotent<Svc, E, S = AnyStore> {
    pub(crate) inner: Svc,
    pub(crate) operation: Arc<Operation<E, S>>,
}

impl<Svc: Clone, E, S> Clone for Idempotent<Svc, E, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<Svc, E, S> fmt::Debug for Idempotent<Svc, E, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent")
            .field("scope", &self.operation.scope)
            .finish_non_exhaustive()
    }
}

impl<Svc, E, S, R> Service<LambdaEvent<E>> for Idempotent<Svc, E, S>
where
    Svc: Service<LambdaEvent<E>, Response = R> + Clone + Send + 'static,
    Svc::Error: Into<BoxError> + Send,
    Svc::Future: Send,
    S: Store,
    E: Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    type Response = R;
    type Error = Error;
    type Future = BoxFuture<'static, Result<R, Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|err| Error::Handler { source: err.into() })
    }

    fn call(&mut self, event: LambdaEvent<E>) -> Self::Future {
        // The ready service answers this call; a fresh clone waits for the next one.
        let inner = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, inner);
        let operation = Arc::clone(&self.operation);
        Box::pin(async move {
            let invocation = operation.invocation(&event.payload, &event.context)?;
            let execution = operation
                .idem
                .execute(&invocation, |ctx| context::scope(ctx, inner.call(event)))
                .await?;
            Ok(execution.into_value())
        })
    }
}
