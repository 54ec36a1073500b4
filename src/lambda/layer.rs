//! The layer: configuration only (engine, scope, key policy, lease policy).

use std::fmt;
use std::sync::Arc;

use lambda_runtime::tower::Layer;

use super::operation::{LeasePolicy, Operation};
use super::service::Idempotent;
use crate::engine::Idempotency;
use crate::key::{KeyPolicy, OperationScope};
use crate::store::{AnyStore, Store};

/// Makes the wrapped Lambda handler idempotent: `ServiceBuilder::new().layer(layer)`.
pub struct IdempotencyLayer<E, S = AnyStore> {
    pub(crate) operation: Arc<Operation<E, S>>,
}

impl<E, S: Store> IdempotencyLayer<E, S> {
    /// A layer deriving each event's operation from `policy` in `scope`, executed by `idem`.
    pub fn new(idem: Idempotency<S>, scope: OperationScope, policy: KeyPolicy<E>) -> Self {
        Self::from_operation(Operation::new(idem, scope, policy))
    }

    /// A layer running `operation`.
    pub fn from_operation(operation: Operation<E, S>) -> Self {
        Self {
            operation: Arc::new(operation),
        }
    }

    /// Overrides the lease policy.
    pub fn with_lease_policy(self, lease: LeasePolicy) -> Self {
        let mut operation = Arc::unwrap_or_clone(self.operation);
        operation.lease = lease;
        Self {
            operation: Arc::new(operation),
        }
    }

    /// Wraps `service` (the thin front door: the same as `.layer(self)`).
    pub fn wrap<Svc>(&self, service: Svc) -> Idempotent<Svc, E, S> {
        self.layer(service)
    }
}

impl<E, S> Clone for IdempotencyLayer<E, S> {
    fn clone(&self) -> Self {
        Self {
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<E, S: fmt::Debug> fmt::Debug for IdempotencyLayer<E, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("scope", &self.operation.scope)
            .field("lease", &self.operation.lease)
            .finish_non_exhaustive()
    }
}

impl<Svc, E, S> Layer<Svc> for IdempotencyLayer<E, S> {
    type Service = Idempotent<Svc, E, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotent {
            inner,
            operation: Arc::clone(&self.operation),
        }
    }
}
