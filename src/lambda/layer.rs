//! The layer: configuration only (engine, scope, key policy, lease policy).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lambda_runtime::tower::Layer;

use super::operation::Operation;
use super::service::Idempotent;
use crate::engine::Idempotency;
use crate::key::{KeyPolicy, OperationScope};
use crate::store::Store;

/// How long a claim's lease lasts: the invocation's remaining time plus a margin, capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Added to the remaining time, so that a lease outlives the invocation it guards.
    pub skew: Duration,
    /// The longest lease (Lambda's 15-minute limit plus the skew, by default).
    pub max: Duration,
    /// The lease when the invocation has no deadline (local runs).
    pub without_deadline: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            skew: Duration::from_secs(5),
            max: Duration::from_secs(15 * 60 + 5),
            without_deadline: Duration::from_secs(60),
        }
    }
}

impl LeasePolicy {
    /// The lease for an invocation with `deadline` (`None`: no deadline), at `now`.
    pub fn lease(&self, deadline: Option<SystemTime>, now: SystemTime) -> Duration {
        match deadline {
            Some(deadline) => {
                (deadline.duration_since(now).unwrap_or_default() + self.skew).min(self.max)
            }
            None => self.without_deadline,
        }
    }
}

/// Makes the wrapped Lambda handler idempotent: `ServiceBuilder::new().layer(layer)`.
pub struct IdempotencyLayer<S, E> {
    pub(crate) operation: Arc<Operation<S, E>>,
}

impl<S: Store, E> IdempotencyLayer<S, E> {
    /// A layer deriving each event's operation from `policy` in `scope`, executed by `idem`.
    pub fn new(idem: Idempotency<S>, scope: OperationScope, policy: KeyPolicy<E>) -> Self {
        Self {
            operation: Arc::new(Operation::new(idem, scope, policy)),
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
    pub fn wrap<Svc>(&self, service: Svc) -> Idempotent<Svc, S, E> {
        self.layer(service)
    }
}

impl<S, E> Clone for IdempotencyLayer<S, E> {
    fn clone(&self) -> Self {
        Self {
            operation: Arc::clone(&self.operation),
        }
    }
}

impl<S: fmt::Debug, E> fmt::Debug for IdempotencyLayer<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("scope", &self.operation.scope)
            .field("lease", &self.operation.lease)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, E> Layer<Svc> for IdempotencyLayer<S, E> {
    type Service = Idempotent<Svc, S, E>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotent {
            inner,
            operation: Arc::clone(&self.operation),
        }
    }
}
