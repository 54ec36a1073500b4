//! The layer: configuration only (one [`Operation`]).

use std::fmt;
use std::sync::Arc;

use lambda_runtime::tower::Layer;

use super::operation::Operation;
use super::service::{ExecutionService, IdempotencyService};

/// Makes the wrapped Lambda handler idempotent: `ServiceBuilder::new().layer(layer)`, built
/// from an [`Operation`] ([`Operation::layer`]).
pub struct IdempotencyLayer<E> {
    pub(crate) operation: Arc<Operation<E>>,
}

impl<E> IdempotencyLayer<E> {
    /// A layer running `operation` for every event.
    pub fn new(operation: Operation<E>) -> Self {
        Self {
            operation: Arc::new(operation),
        }
    }

    /// Wraps `service` (the same as `.layer(service)`).
    pub fn wrap<Svc>(&self, service: Svc) -> IdempotencyService<Svc, E> {
        self.layer(service)
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
    pub fn executions(self) -> ExecutionLayer<E> {
        ExecutionLayer {
            operation: self.operation,
        }
    }
}

/// An [`IdempotencyLayer`] whose service answers the whole [`Execution`](crate::Execution)
/// ([`IdempotencyLayer::executions`]).
pub struct ExecutionLayer<E> {
    operation: Arc<Operation<E>>,
}

impl<E> Clone for ExecutionLayer<E> {
    fn clone(&self) -> Self {
        Self {
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<E> fmt::Debug for ExecutionLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutionLayer")
            .field("operation", &self.operation)
            .finish()
    }
}

impl<Svc, E> Layer<Svc> for ExecutionLayer<E> {
    type Service = ExecutionService<Svc, E>;

    fn layer(&self, inner: Svc) -> Self::Service {
        ExecutionService {
            inner,
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

impl<E> Clone for IdempotencyLayer<E> {
    fn clone(&self) -> Self {
        Self {
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<E> fmt::Debug for IdempotencyLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("operation", &self.operation)
            .finish()
    }
}

impl<Svc, E> Layer<Svc> for IdempotencyLayer<E> {
    type Service = IdempotencyService<Svc, E>;

    fn layer(&self, inner: Svc) -> Self::Service {
        IdempotencyService {
            execution: ExecutionService {
                inner,
                operation: Arc::clone(&self.operation),
            },
        }
    }
}
