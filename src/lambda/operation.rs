//! What every Lambda front door shares: the engine, the scope, the key policy and the lease
//! policy, and how an event with its invocation context becomes an [`Invocation`].

use lambda_runtime::Context;

use super::layer::LeasePolicy;
use crate::engine::Idempotency;
use crate::error::Error;
use crate::execution::Invocation;
use crate::key::{KeyPolicy, OperationScope};
use crate::store::Store;

/// One configured operation.
pub(crate) struct Operation<S, E> {
    pub(crate) idem: Idempotency<S>,
    pub(crate) scope: OperationScope,
    pub(crate) policy: KeyPolicy<E>,
    pub(crate) lease: LeasePolicy,
}

impl<S, E> Clone for Operation<S, E> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            scope: self.scope.clone(),
            policy: self.policy.clone(),
            lease: self.lease,
        }
    }
}

impl<S: Store, E> Operation<S, E> {
    /// `policy` in `scope`, executed by `idem`, with the default lease policy.
    pub(crate) fn new(idem: Idempotency<S>, scope: OperationScope, policy: KeyPolicy<E>) -> Self {
        Self {
            idem,
            scope,
            policy,
            lease: LeasePolicy::default(),
        }
    }

    /// The invocation for `payload`: its operation, a lease from the context's deadline, and
    /// the request id for correlation.
    pub(crate) fn invocation(&self, payload: &E, context: &Context) -> Result<Invocation, Error> {
        let deadline = (context.deadline > 0).then(|| context.deadline());
        let lease = self.lease.lease(deadline, self.idem.now());
        Ok(self
            .policy
            .invocation(&self.scope, payload, lease)?
            .with_request_id(context.request_id.clone()))
    }
}
