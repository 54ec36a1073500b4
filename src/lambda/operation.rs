//! What every Lambda front door is built from: one configured [`Operation`] (engine, scope,
//! key policy, lease policy, result reference), and how an event with its invocation context
//! becomes an [`Invocation`]. The per-operation settings live here only; a door adds what is
//! its own (a batch's concurrency, the HTTP status rules).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use lambda_idempotency::key::JsonPointer;
//! use lambda_idempotency::lambda::sources;
//! use lambda_idempotency::Idempotency;
//!
//! let idem = Idempotency::from_env().await?;
//! let orders = idem
//!     .operation("orders", sources::sqs(Some("/order_id"))?)?
//!     .with_result_ref(JsonPointer::new("/order_number")?);
//! let processor = orders.batch(); // or .layer() for one event per invocation
//! # let _ = processor;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Once;
use std::time::{Duration, SystemTime};

use lambda_runtime::Context;
use tracing::warn;

use crate::engine::Idempotency;
use crate::error::ConfigError;
use crate::error::Error;
use crate::execution::Invocation;
use crate::failure::Classifier;
use crate::key::{JsonPointer, KeyPolicy, OperationScope};
use crate::policy::OperationPolicy;
use crate::reconcile::{Reconciler, Recovery};

/// One configured operation: what every front door is built from
/// ([`Idempotency::operation`], or [`Operation::new`] for a scope of your own).
pub struct Operation<E> {
    pub(crate) idem: Idempotency,
    pub(crate) scope: OperationScope,
    pub(crate) policy: KeyPolicy<E>,
    pub(crate) lease: LeasePolicy,
    pub(crate) result_ref: Option<JsonPointer>,
    pub(crate) transactional_writes: bool,
    pub(crate) wait_for_result: Option<Duration>,
    /// Recovery, reconciler, classifier, retention and outcome limit, where the operation
    /// declares its own.
    pub(crate) own: OperationPolicy,
}

impl<E> Clone for Operation<E> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            scope: self.scope.clone(),
            policy: self.policy.clone(),
            lease: self.lease,
            result_ref: self.result_ref.clone(),
            transactional_writes: self.transactional_writes,
            wait_for_result: self.wait_for_result,
            own: self.own.clone(),
        }
    }
}

impl<E> fmt::Debug for Operation<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation")
            .field("scope", &self.scope)
            .field("policy", &self.policy)
            .field("lease", &self.lease)
            .field("result_ref", &self.result_ref)
            .field("transactional_writes", &self.transactional_writes)
            .field("wait_for_result", &self.wait_for_result)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

impl<E> Operation<E> {
    /// `policy` in `scope`, executed by `idem`, with the default lease policy.
    pub fn new(idem: Idempotency, scope: OperationScope, policy: KeyPolicy<E>) -> Self {
        Self {
            idem,
            scope,
            policy,
            lease: LeasePolicy::default(),
            result_ref: None,
            transactional_writes: false,
            wait_for_result: None,
            own: OperationPolicy::default(),
        }
    }

    /// Overrides the lease policy.
    pub fn with_lease_policy(mut self, lease: LeasePolicy) -> Self {
        self.lease = lease;
        self
    }

    /// Keeps the part of each result at `pointer` (e.g. `/invoice_id`) as the result reference
    /// of the business identity's permanent evidence ([`Invocation::with_result_ref`]).
    pub fn with_result_ref(mut self, pointer: JsonPointer) -> Self {
        self.result_ref = Some(pointer);
        self
    }

    /// A duplicate that arrives while another environment runs the operation waits up to
    /// `max` for its outcome (and never past its invocation's deadline less a second)
    /// instead of answering "in progress" ([`Invocation::with_wait_for_result`]): for
    /// synchronous callers, an HTTP client or a direct invocation, that would rather get the
    /// result than retry. Each wait costs a strongly consistent read every 50 ms to 1 s
    /// (backed off): 9 reads for a 5-second wait.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use lambda_idempotency::{Idempotency, KeyPolicy};
    ///
    /// let idem = Idempotency::from_env().await?;
    /// let charge = idem
    ///     .operation("charge", KeyPolicy::<serde_json::Value>::pointer("/order_id")?)?
    ///     .with_wait_for_result(Duration::from_secs(10))
    ///     .layer();
    /// # let _ = charge;
    /// # Ok(()) }
    /// ```
    pub fn with_wait_for_result(mut self, max: Duration) -> Self {
        self.wait_for_result = Some(max);
        self
    }

    /// What a takeover of this operation's crashed attempt does when it recorded no step and
    /// no reconciler is set ([`Recovery`]): hold the operation INDETERMINATE for an operator
    /// (the default), re-run a handler whose every effect is a step ([`Recovery::Steps`]), or
    /// re-run a handler declared safe to repeat ([`Recovery::Rerun`]). It is this operation's
    /// declaration alone: other operations on the same engine keep theirs (or the engine's
    /// default, [`Idempotency::with_recovery`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use lambda_idempotency::lambda::sources;
    /// use lambda_idempotency::reconcile::Recovery;
    /// use lambda_idempotency::Idempotency;
    ///
    /// let idem = Idempotency::from_env().await?;
    /// // Every effect of this handler is a recorded step: a crashed attempt's steps decide.
    /// let orders = idem
    ///     .operation("orders", sources::sqs(Some("/order_id"))?)?
    ///     .with_recovery(Recovery::Steps);
    /// # let _ = orders;
    /// # Ok(()) }
    /// ```
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.own.recovery = Some(recovery);
        self
    }

    /// Asks `reconciler` before a takeover re-runs a crashed attempt of this operation
    /// ([`crate::reconcile`]); other operations on the same engine are not asked about.
    pub fn with_reconciler(mut self, reconciler: impl Reconciler + 'static) -> Self {
        self.own.reconciler = Some(std::sync::Arc::new(reconciler));
        self
    }

    /// Classifies this operation's handler errors with `classifier` ([`crate::failure`]):
    /// which are released for a retry and which are retained as terminal, on every door (the
    /// HTTP door's status included).
    pub fn with_classifier(mut self, classifier: impl Classifier + 'static) -> Self {
        self.own.classifier = Some(std::sync::Arc::new(classifier));
        self
    }

    /// Keeps this operation's settled records (and their replayable outcomes) for `retention`
    /// instead of the engine's [`Config::retention`](crate::Config::retention). Size it
    /// against how late a duplicate of this operation can arrive. Operator commands
    /// ([`Idempotency::resolve`](crate::Idempotency::resolve)) keep what they settle for the
    /// engine's retention.
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] outside 1 s ..= 366 days.
    pub fn with_retention(mut self, retention: Duration) -> Result<Self, ConfigError> {
        self.own = self.own.with_retention(retention)?;
        Ok(self)
    }

    /// Stores this operation's serialized outcomes (and recorded step results) up to `bytes`
    /// instead of the engine's [`Config::max_outcome_bytes`](crate::Config::max_outcome_bytes);
    /// a larger one is retained as FAILED (`outcome_too_large`). The DynamoDB store keeps
    /// outcomes up to its own [`OutcomeStorage::max_outcome_bytes`](crate::store::OutcomeStorage::max_outcome_bytes)
    /// (16 MiB unless set): where you lower it, keep it at least the largest limit any
    /// operation declares.
    /// Operator commands ([`Idempotency::resolve`](crate::Idempotency::resolve)) check a value
    /// against the engine's limit.
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] outside 1 ..= [`MAX_OUTCOME_BYTES`](crate::config::MAX_OUTCOME_BYTES).
    pub fn with_max_outcome_bytes(mut self, bytes: usize) -> Result<Self, ConfigError> {
        self.own = self.own.with_max_outcome_bytes(bytes)?;
        Ok(self)
    }

    /// Declares that this operation's handler writes in transactions (transactional steps,
    /// [`ExecutionContext::complete_with`](crate::ExecutionContext::complete_with), an
    /// outbox): [`Self::prime`] then refuses, at init, a store whose tables refuse them (a
    /// DynamoDB idempotency table with multi-Region strong consistency accepts no
    /// `TransactWriteItems`). Undeclared, the operation starts there, and each transactional
    /// write is refused before it is sent, before any of its effects, once a check has found
    /// the table so: a transactional step answers
    /// [`StepError::Rejected`](crate::effects::StepError::Rejected), a completion is retained
    /// as `completion_rejected`. Transactional writes must stay in the idempotency table's
    /// account and Region: one transaction cannot span two.
    pub fn with_transactional_writes(mut self) -> Self {
        self.transactional_writes = true;
        self
    }

    /// Whether the operation declares transactional writes ([`Self::with_transactional_writes`]).
    pub fn transactional_writes(&self) -> bool {
        self.transactional_writes
    }

    /// Checks at init that this operation can run on its engine's store: with
    /// [`Self::with_transactional_writes`], that the store's tables accept transactional
    /// writes ([`TransactionalStore::check_transactional_writes`](crate::store::TransactionalStore::check_transactional_writes));
    /// otherwise it asks nothing. Call it beside the store's own start-up check
    /// ([`DynamoDbStore::prime`](crate::DynamoDbStore::prime)) and fail the init on a lasting error.
    ///
    /// ```no_run
    /// # async fn init() -> Result<(), Box<dyn std::error::Error>> {
    /// use lambda_idempotency::lambda::sources;
    /// use lambda_idempotency::{DynamoDbStore, Idempotency};
    ///
    /// let store = DynamoDbStore::for_lambda()?;
    /// store.prime().await?;
    /// let checkout = Idempotency::new(store)
    ///     .operation("checkout", sources::sqs(Some("/order_id"))?)?
    ///     .with_transactional_writes();
    /// checkout.prime().await?; // refused on a table that accepts no transactions
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::TransactionalWritesUnsupported`](crate::StoreError::TransactionalWritesUnsupported);
    /// when the store was not primed, what its replication check refuses
    /// ([`StoreError::EventuallyConsistentReplicas`](crate::StoreError::EventuallyConsistentReplicas),
    /// [`StoreError::TransactionsUnsupported`](crate::StoreError::TransactionsUnsupported)); or the
    /// check's own error (the DynamoDB store's `DescribeTable`, bounded by the client's
    /// operation timeout: a missing table, access denied, throttled, unavailable).
    pub async fn prime(&self) -> Result<(), crate::StoreError> {
        if !self.transactional_writes {
            return Ok(());
        }
        match crate::store::Store::transactional(self.idem.store()) {
            Some(store) => store.check_transactional_writes().await,
            // Refused at each write instead, before anything is sent.
            None => Ok(()),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Idempotency {
        &self.idem
    }

    /// The key policy.
    pub fn policy(&self) -> &KeyPolicy<E> {
        &self.policy
    }

    /// The scope.
    pub fn scope(&self) -> &OperationScope {
        &self.scope
    }

    /// The lease policy.
    pub fn lease_policy(&self) -> LeasePolicy {
        self.lease
    }

    /// The invocation for `payload`: its operation, a lease from the context's deadline (a
    /// deadline already past, an emulator's, is none), the deadline itself, the request id for
    /// correlation and the result reference.
    pub fn invocation(&self, payload: &E, context: &Context) -> Result<Invocation, Error> {
        self.invocation_in(payload, Some(context))
    }

    /// [`Self::invocation`] for a payload that may come without its invocation context (an
    /// HTTP request built by hand): no deadline, no request id.
    pub(crate) fn invocation_in(
        &self,
        payload: &E,
        context: Option<&Context>,
    ) -> Result<Invocation, Error> {
        let now = self.idem.now();
        let deadline = context.and_then(|context| deadline_of(context, now));
        let lease = self.lease.lease(deadline, now);
        // Lambda's tenant isolation mode names the invocation's tenant in its context: it
        // scopes the operation on every door, whatever the event says.
        let tenant = context.and_then(|context| context.tenant_id.as_deref());
        let invocation =
            match self
                .policy
                .invocation_for_tenant(&self.scope, payload, lease, tenant)
            {
                Ok(invocation) => invocation.with_clock_skew(self.lease.skew),
                Err(err) => {
                    // Never reaches the engine: counted here, so that a producer that stopped
                    // sending the key field shows on a dashboard, not only in a log.
                    self.idem.observe_refusal(self.scope.operation(), &err);
                    return Err(err);
                }
            };
        let invocation = match context {
            Some(context) => invocation.with_request_id(context.request_id.clone()),
            None => invocation,
        };
        let invocation = match deadline {
            Some(deadline) => invocation.with_deadline(deadline),
            None => invocation,
        };
        let invocation = match self.wait_for_result {
            Some(max) => invocation.with_wait_for_result(max),
            None => invocation,
        };
        let mut invocation = match &self.result_ref {
            Some(pointer) => invocation.with_result_ref(pointer.clone()),
            None => invocation,
        };
        invocation.policy = self.own.clone();
        Ok(invocation)
    }

    /// Whether `error` from this operation's handler is retained as a terminal failure, by
    /// its classifier (the HTTP door's status, the batch doors' poison).
    pub(crate) fn is_terminal(&self, error: &(dyn std::error::Error + 'static)) -> bool {
        self.idem.is_terminal(error, self.own.classifier.as_deref())
    }
}

impl Idempotency {
    /// The operation `name` of this function, keyed by `policy`: its scope is
    /// [`OperationScope::for_function`]`(name)` (the function's namespace, the operation's
    /// name). Every door is built from it (`.layer()`, `.batch()`, `.http_layer()`).
    ///
    /// # Errors
    /// [`ConfigError`] for a name that is empty, too long, or starts with `t=`.
    pub fn operation<E>(
        &self,
        name: &str,
        policy: KeyPolicy<E>,
    ) -> Result<Operation<E>, ConfigError> {
        Ok(Operation::new(
            self.clone(),
            OperationScope::for_function(name)?,
            policy,
        ))
    }
}

/// The invocation's deadline, if it is one. Lambda's is always ahead when a handler starts (the
/// sandbox is stopped at the deadline), so a deadline that is unset (`0`) or already past at
/// `now` is no deadline: an emulator that sets none gives one in 1970 (`cargo lambda watch`),
/// and honouring it would give every claim the shortest lease and start no batch record.
pub(crate) fn deadline_of(context: &Context, now: SystemTime) -> Option<SystemTime> {
    let deadline = (context.deadline > 0).then(|| context.deadline())?;
    (deadline > now).then_some(deadline)
}

/// How long a claim's lease lasts: the invocation's remaining time plus a margin, capped. A
/// claim holds at least [`MIN_LEASE`](crate::execution::MIN_LEASE) whatever the policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Added to the remaining time, so that a lease outlives the invocation it guards. Raise
    /// [`Self::max`] with it: the cap applies to the sum.
    pub skew: Duration,
    /// The longest lease (Lambda's 15-minute limit plus the default skew, by default). Keep it
    /// at least the function's timeout plus the skew: a lease it cuts shorter can run out
    /// while the handler still runs, and another invocation take the operation over beside
    /// it (the engine logs a warning once when it cuts one).
    pub max: Duration,
    /// The lease when the invocation has no deadline (local runs).
    pub without_deadline: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            skew: crate::execution::CLOCK_SKEW,
            max: Duration::from_secs(15 * 60 + 5),
            without_deadline: Duration::from_secs(60),
        }
    }
}

impl LeasePolicy {
    /// The lease for an invocation with `deadline` at `now`: the time left plus the skew,
    /// capped; [`Self::without_deadline`] when there is none (`None`) or it has already passed
    /// (an emulator's: Lambda's deadline is always ahead when a handler starts).
    pub fn lease(&self, deadline: Option<SystemTime>, now: SystemTime) -> Duration {
        match deadline.and_then(|deadline| deadline.duration_since(now).ok()) {
            Some(left) if !left.is_zero() => {
                let covered = left.saturating_add(self.skew);
                if covered > self.max {
                    static CUT: Once = Once::new();
                    CUT.call_once(|| {
                        warn!(
                            max_secs = self.max.as_secs(),
                            skew_secs = self.skew.as_secs(),
                            left_secs = left.as_secs(),
                            "the lease policy's max cuts a lease below the invocation's remaining time plus the skew: a takeover could start while the handler still runs; set LeasePolicy::max to at least the function's timeout plus the skew"
                        );
                    });
                }
                covered.min(self.max)
            }
            _ => self.without_deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::key::KeyPolicy;
    use crate::store::MemoryStore;
    use crate::{Idempotency, OperationScope};

    use super::Operation;

    #[test]
    fn a_skew_past_any_lease_gives_the_longest_lease_not_a_panic() {
        let policy = super::LeasePolicy {
            skew: Duration::MAX,
            ..super::LeasePolicy::default()
        };
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let lease = policy.lease(Some(now + Duration::from_secs(10)), now);
        assert_eq!(lease, policy.max);
    }

    #[test]
    fn the_operations_wait_reaches_every_invocation_it_builds() {
        let scope = OperationScope::new("shop", "charge").expect("scope");
        let policy = KeyPolicy::pointer("/order_id").expect("policy");
        let operation = Operation::new(Idempotency::new(MemoryStore::new()), scope, policy);
        let event = serde_json::json!({"order_id": "o-1"});
        let context = lambda_runtime::Context::default();
        let plain = operation.invocation(&event, &context).expect("invocation");
        assert_eq!(plain.wait_for_result, None);
        let waiting = operation
            .with_wait_for_result(Duration::from_secs(10))
            .invocation(&event, &context)
            .expect("invocation");
        assert_eq!(waiting.wait_for_result, Some(Duration::from_secs(10)));
    }
}
