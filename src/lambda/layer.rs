//! The layer: configuration only (one [`Operation`]).

use std::fmt;
use std::sync::Arc;

use lambda_runtime::tower::Layer;

use super::operation::Operation;
use super::service::IdempotencyService;

/// Makes the wrapped Lambda handler idempotent: `ServiceBuilder::new().layer(layer)`, built
/// from an [`Operation`] ([`Operation::layer`]).
///
/// Its service answers the handler's value; [`IdempotencyLayer::executions`] gives the same
/// layer answering the whole [`Execution`](crate::Execution) (`EXECUTIONS = true`).
pub struct IdempotencyLayer<E, const EXECUTIONS: bool = false> {
    pub(crate) operation: Arc<Operation<E>>,
}

impl<E> IdempotencyLayer<E> {
    /// A layer running `operation` for every event.
    pub fn new(operation: Operation<E>) -> Self {
        Self {
            operation: Arc::new(operation),
        }
    }

    /// The same layer, answering the whole [`Execution`](crate::Execution) instead of the
    /// value: a service around it knows whether the value was executed or replayed
    /// ([`Execution::is_replay`](crate::Execution::is_replay)), as Powertools' response hook
    /// does, and marks its answer as it likes; the stored outcome stays byte for byte what the
    /// handler returned.
    ///
    /// ```no_run
    /// use lambda_idempotency::{Execution, Idempotency, KeyPolicy};
    /// use lambda_runtime::tower::ServiceBuilder;
    /// use lambda_runtime::{LambdaEvent, service_fn};
    /// use serde_json::{Value, json};
    ///
    /// async fn charge(event: LambdaEvent<Value>) -> Result<Value, lambda_runtime::Error> {
    ///     Ok(json!({"charged": event.payload["order_id"]}))
    /// }
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), lambda_runtime::Error> {
    ///     let idem = Idempotency::from_env().await?;
    ///     let charge_once = idem.operation("charge", KeyPolicy::pointer("/order_id")?)?.layer();
    ///     let service = ServiceBuilder::new()
    ///         .map_response(|done: Execution<Value>| {
    ///             let replayed = done.is_replay();
    ///             let mut answer = done.into_value();
    ///             answer["replayed"] = replayed.into(); // the caller's marker, not stored
    ///             answer
    ///         })
    ///         .layer(charge_once.executions())
    ///         .service(service_fn(charge));
    ///     lambda_runtime::run(service).await
    /// }
    /// ```
    pub fn executions(self) -> IdempotencyLayer<E, true> {
        IdempotencyLayer {
            operation: self.operation,
        }
    }
}

impl<E, const EXECUTIONS: bool> IdempotencyLayer<E, EXECUTIONS> {
    /// Wraps `service` (the same as `.layer(service)`).
    pub fn wrap<Svc>(&self, service: Svc) -> IdempotencyService<Svc, E, EXECUTIONS> {
        IdempotencyService {
            inner: service,
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<E> Operation<E> {
    /// The layer for a handler that gets one event per invocation (direct and async
    /// invocations, EventBridge). SNS and S3 events hold records: [`Operation::batch`].
    pub fn layer(self) -> IdempotencyLayer<E> {
        IdempotencyLayer::new(self)
    }
}

impl<E> From<Operation<E>> for IdempotencyLayer<E> {
    fn from(operation: Operation<E>) -> Self {
        Self::new(operation)
    }
}

impl<E, const EXECUTIONS: bool> Clone for IdempotencyLayer<E, EXECUTIONS> {
    fn clone(&self) -> Self {
        Self {
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<E, const EXECUTIONS: bool> fmt::Debug for IdempotencyLayer<E, EXECUTIONS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("operation", &self.operation)
            .field("executions", &EXECUTIONS)
            .finish()
    }
}

impl<Svc, E, const EXECUTIONS: bool> Layer<Svc> for IdempotencyLayer<E, EXECUTIONS> {
    type Service = IdempotencyService<Svc, E, EXECUTIONS>;

    fn layer(&self, inner: Svc) -> Self::Service {
        self.wrap(inner)
    }
}
