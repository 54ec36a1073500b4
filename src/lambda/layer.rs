//! The layer: configuration only (one [`Operation`]).

use std::fmt;
use std::sync::Arc;

use lambda_runtime::tower::Layer;

use super::operation::Operation;
use super::service::IdempotencyService;

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
}

impl<E> Operation<E> {
    /// The layer for a handler that gets one event per invocation (direct and async
    /// invocations, EventBridge, SNS).
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
            inner,
            operation: Arc::clone(&self.operation),
        }
    }
}
