//! What goes into an idempotent execution and what comes out of it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::error::{ConfigError, Error};
use crate::failure::Classifier;
use crate::key::{Fingerprint, IdentityScope, JsonPointer, OperationKey};
use crate::policy::OperationPolicy;
use crate::reconcile::{Reconciler, Recovery};
use crate::record::MAX_REQUEST_ID_BYTES;

/// The handler's view of its attempt lives with the attempt, in the engine; its 0.4 path stays.
pub use crate::engine::attempt::ExecutionContext;

mod from_policy;

/// The longest business identity accepted, in bytes.
pub const MAX_IDENTITY_BYTES: usize = 1024;

/// The longest lease an invocation holds (a year: far past Lambda's 15 minutes).
pub const MAX_LEASE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The shortest lease a claim holds. A lease of zero (a lease policy's `without_deadline` or
/// `max` set to zero, or [`Invocation::with_lease`]`(Duration::ZERO)`) would write a claim
/// that has already expired, which a concurrent duplicate takes over at once: two executions
/// in parallel. A claim's lease is raised to this instead.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// How far apart the clocks of two invocations may run, unless the lease policy says
/// otherwise: the margin a lease keeps past the deadline, and a step's effect past its
/// declared timeout.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(5);

/// One request for an idempotent execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub(crate) key: OperationKey,
    /// The key versions before 0.2 derived for this operation, when it was another.
    pub(crate) earlier_key: Option<OperationKey>,
    /// The key 0.4 derived for this operation, when the tenant Lambda's context gave (which
    /// 0.4 never read) changed it.
    pub(crate) key_by_0_4: Option<OperationKey>,
    /// The key versions before 0.2 derived for the material and tenant 0.4 read, when it is
    /// another than 0.4's and today's.
    pub(crate) key_by_0_1_as_0_4: Option<OperationKey>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) lease: Duration,
    pub(crate) deadline: Option<SystemTime>,
    /// How far apart two invocations' clocks may run (the lease policy's skew): a claim given
    /// back after a step keeps it until the step's effect can have landed on every clock.
    pub(crate) clock_skew: Duration,
    pub(crate) request_id: Option<String>,
    pub(crate) message_id: Option<String>,
    pub(crate) identity: Option<String>,
    pub(crate) identity_scope: IdentityScope,
    pub(crate) result_ref: Option<JsonPointer>,
    /// How long a duplicate waits for another environment's live claim to settle
    /// ([`Invocation::with_wait_for_result`]); `None`: it answers in progress at once.
    pub(crate) wait_for_result: Option<Duration>,
    /// Who the claim belongs to beyond this invocation ([`Invocation::with_owner`]): the
    /// lease token derived from it, which every later invocation of the same owner re-enters.
    pub(crate) owner: Option<LeaseOwner>,
    /// What the operation declares for itself; the engine's defaults fill the rest.
    pub(crate) policy: OperationPolicy,
    /// Whether its single-flight turn came after another caller's: with too little time left
    /// it answers from the record rather than run the handler.
    pub(crate) turn_came_late: bool,
}

/// The owner of a claim that outlives its invocation (a durable execution's ARN), as the
/// lease token every invocation of that owner writes: `owner-` and 32 hex digits of its
/// SHA-256, so that the owner's name itself is never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseOwner {
    token: String,
    /// For a durable execution's invocation, the branch of the execution it runs in (`""`
    /// the handler's own context): a run dropped unfinished there parks, for that branch to
    /// take back. `None` for any other owner.
    branch: Option<String>,
}

impl LeaseOwner {
    /// The lease token of `owner`.
    fn of(owner: &str) -> Self {
        let digest = Sha256::digest(owner.as_bytes());
        Self {
            token: format!("owner-{}", hex::encode(&digest[..16])),
            branch: None,
        }
    }

    /// The lease token every invocation of this owner claims under.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// The durable execution's branch ([`Invocation::with_durable_owner`]).
    pub(crate) fn branch(&self) -> Option<&str> {
        self.branch.as_deref()
    }
}

impl Invocation {
    /// `key` with intent `fingerprint`, holding a lease of `lease` while the handler runs (set it
    /// to the time the invocation may still run, plus a small margin).
    /// The lease is capped at [`MAX_LEASE`]; a claim holds at least [`MIN_LEASE`].
    pub fn new(key: OperationKey, fingerprint: Fingerprint, lease: Duration) -> Self {
        Self {
            key,
            earlier_key: None,
            key_by_0_4: None,
            key_by_0_1_as_0_4: None,
            fingerprint,
            lease: lease.min(MAX_LEASE),
            deadline: None,
            clock_skew: CLOCK_SKEW,
            request_id: None,
            message_id: None,
            identity: None,
            identity_scope: IdentityScope::default(),
            result_ref: None,
            wait_for_result: None,
            owner: None,
            policy: OperationPolicy::default(),
            turn_came_late: false,
        }
    }

    /// The time by which the invocation must have answered (a Lambda invocation's deadline):
    /// a settlement that fails for a transient reason after the handler ran is retried until
    /// shortly before it. Without one, until shortly before the lease runs out. The doors set
    /// it from the invocation's context.
    pub fn with_deadline(mut self, deadline: SystemTime) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The key versions before 0.2 derived for the same material (see
    /// [`OperationKey`]'s exact integers): an operation still recorded under it is continued
    /// there.
    pub(crate) fn with_earlier_key(mut self, earlier: Option<OperationKey>) -> Self {
        self.earlier_key = earlier;
        self
    }

    /// The key 0.4 derived for the same event, when Lambda's tenant changed it, and the one
    /// versions before 0.2 derived for what 0.4 read: an operation 0.4 (or 0.1) recorded
    /// there before the cut-over is answered without running again
    /// ([`ConfigBuilder::keyed_by_0_4_before`](crate::config::ConfigBuilder::keyed_by_0_4_before)).
    pub(crate) fn with_keys_by_0_4(
        mut self,
        key: Option<OperationKey>,
        by_0_1: Option<OperationKey>,
    ) -> Self {
        self.key_by_0_4 = key;
        self.key_by_0_1_as_0_4 = by_0_1;
        self
    }

    /// The same invocation where two invocations' clocks may run `skew` apart (the lease
    /// policy's).
    pub(crate) fn with_clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// The same invocation with a lease of `lease` from its claim (capped at [`MAX_LEASE`]; a
    /// claim holds at least [`MIN_LEASE`]): a batch record's lease counts from when the record
    /// starts, not from when its batch did; a durable execution's covers its longest suspension
    /// ([`Invocation::with_owner`]).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.min(MAX_LEASE);
        self
    }

    /// Records the invocation's request id with the claim, for correlation (cut to
    /// [`MAX_REQUEST_ID_BYTES`], so that it cannot crowd
    /// the outcome out of the item).
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(crate::record::cut_to(
            request_id.into(),
            MAX_REQUEST_ID_BYTES,
        ));
        self
    }

    /// Names the source's message or event (an SQS message id, a Kinesis sequence number) in the
    /// execution's `tracing` span, for correlation; it is not stored.
    pub fn with_message_id(mut self, message_id: impl Into<String>) -> Self {
        self.message_id = Some(message_id.into());
        self
    }

    /// Declares the operation's business identity (e.g. `invoice:order-418:rev-2`): its
    /// evidence is kept permanently, so the operation is never executed again once its
    /// replayable record has expired ([`crate::Error::KeyExpiredConflict`]). The evidence is
    /// kept under the operation key's namespace and tenant ([`IdentityScope::Tenant`]): another
    /// tenant's or another function's operation with the same identity string is its own.
    ///
    /// The identity a claim records is the operation's for its whole life: a later attempt
    /// (after a deploy that adds, changes or removes the identity) settles the recorded one.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] for an identity that is blank, holds a control character or is over
    /// [`MAX_IDENTITY_BYTES`] bytes: it is checked here, where the invocation is built, so that
    /// every way of building one (a key policy, your own code) refuses the same identities.
    pub fn with_identity(mut self, identity: impl Into<String>) -> Result<Self, Error> {
        let identity = identity.into();
        if identity.trim().is_empty()
            || identity.len() > MAX_IDENTITY_BYTES
            || identity.chars().any(char::is_control)
        {
            return Err(Error::InvalidEvent {
                reason: format!(
                    "the business identity must be 1 to {MAX_IDENTITY_BYTES} bytes, not blank, with no control character"
                ),
            });
        }
        self.identity = Some(identity);
        Ok(self)
    }

    /// Shares the business identity's evidence more widely than the operation's tenant (see
    /// [`IdentityScope`]): across a namespace's tenants, or across every function and tenant
    /// on the uniqueness table.
    pub fn with_identity_scope(mut self, scope: IdentityScope) -> Self {
        self.identity_scope = scope;
        self
    }

    /// Keeps the part of the result at `pointer` (e.g. `/invoice_id`) as the permanent
    /// evidence's result reference.
    pub fn with_result_ref(mut self, pointer: JsonPointer) -> Self {
        self.result_ref = Some(pointer);
        self
    }

    /// Waits up to `max` for the outcome when another environment holds a live claim on the
    /// key, instead of answering [`Error::AlreadyInProgress`] at once: the record is read again
    /// (strongly consistent, backed off from 50 ms to 1 s), never past the invocation's
    /// deadline less a second. When the holder settles, the caller gets its outcome (a
    /// replay, or its retained failure); when the holder's lease runs out, the caller claims
    /// it as any takeover does (unless less than 2 s are left before its deadline: then it
    /// answers in progress rather than start an effect Lambda would cut off); when `max` or the
    /// deadline comes first, it answers `AlreadyInProgress` as without waiting. For synchronous callers (HTTP, direct
    /// invocations) that would rather get the result than retry.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lambda_idempotency::{Fingerprint, Invocation, OperationKey, OperationScope};
    /// # let scope = OperationScope::new("shop", "charge")?;
    /// # let key = OperationKey::derive(&scope, None, "order-418")?;
    /// let invocation = Invocation::new(key, Fingerprint::of(&42)?, Duration::from_secs(30))
    ///     .with_wait_for_result(Duration::from_secs(10));
    /// # let _ = invocation;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_wait_for_result(mut self, max: Duration) -> Self {
        self.wait_for_result = Some(max);
        self
    }

    /// Claims for `owner` (a Lambda durable execution's ARN), not for this invocation alone:
    /// a later invocation with the same owner, a replay of the same durable execution after it
    /// suspended, re-enters the claim while the record is IN_PROGRESS (its recorded steps
    /// replay, under a renewed lease), where any other caller is answered as a duplicate
    /// ([`Error::AlreadyInProgress`], then the stored outcome). A cancelled invocation of an
    /// owned claim (the durable SDK drops the handler at every suspension) keeps its claim
    /// for the owner's return instead of giving it back.
    ///
    /// An owner's invocations must run one at a time, as the durable service invokes one
    /// execution's (a stale one is fenced by its checkpoint token). In one process a second
    /// run of the same owner's operation at the same time (a durable `map` or `parallel`
    /// branch) is answered as a duplicate; in two processes at once both would run. What may
    /// run twice at once in two places is not an owner: leave it a plain invocation.
    ///
    /// Completion is still fenced: once the lease has run out, another caller may take the
    /// claim over (after the usual checks of what the owner's steps did), and the owner then
    /// finds it taken. Give the invocation a lease that covers the owner's longest pause
    /// ([`Invocation::with_lease`]; it counts from the claim, waiting or not), or
    /// claim inside one durable step (see the guide's durable functions section). The record,
    /// settled too, is retained for at least that lease (when it is longer than the
    /// operation's retention), so that the owner's replay after a pause that follows the
    /// operation is answered from its outcome; an owner that goes on for longer after the
    /// operation settled needs a retention that covers it
    /// ([`Operation::with_retention`](crate::Operation::with_retention)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lambda_idempotency::{Fingerprint, Invocation, OperationKey, OperationScope};
    /// # let scope = OperationScope::new("shop", "charge")?;
    /// # let key = OperationKey::derive(&scope, None, "order-418")?;
    /// let arn = "arn:aws:lambda:eu-west-1:123456789012:function:orders:$LATEST/durable-execution/order-418/1f2e";
    /// let invocation = Invocation::new(key, Fingerprint::of(&42)?, Duration::from_secs(30))
    ///     .with_owner(arn);
    /// # let _ = invocation;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_owner(mut self, owner: &str) -> Self {
        self.owner = Some(LeaseOwner::of(owner));
        self
    }

    /// Owned by the durable execution `owner`, as [`Invocation::with_owner`], in its `branch`
    /// (`""`: the handler's own context), which tells a sibling branch started beside a parked
    /// run of the same execution from that run's own return.
    #[cfg(feature = "durable")]
    pub(crate) fn with_durable_owner(mut self, owner: &str, branch: String) -> Self {
        let mut owner = LeaseOwner::of(owner);
        owner.branch = Some(branch);
        self.owner = Some(owner);
        self
    }

    /// The operation key.
    pub fn key(&self) -> &OperationKey {
        &self.key
    }

    /// The fingerprint of the operation's intent.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The business identity, if declared.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// The key of the business identity's evidence in the uniqueness table (the identity under
    /// its [`IdentityScope`]), if an identity is declared.
    pub fn evidence_key(&self) -> Option<String> {
        let identity = self.identity.as_deref()?;
        Some(self.identity_scope.evidence_key(identity, &self.key))
    }
}

/// The operation's own policy, for an invocation built by hand; the doors take it from the
/// [`Operation`](crate::Operation), whose setters of the same names say what each does.
impl Invocation {
    /// Recovers a crashed attempt of this operation under `recovery`
    /// ([`Operation::with_recovery`](crate::Operation::with_recovery)).
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.policy.recovery = Some(recovery);
        self
    }

    /// Asks `reconciler` before a takeover of this operation
    /// ([`Operation::with_reconciler`](crate::Operation::with_reconciler)).
    pub fn with_reconciler(mut self, reconciler: impl Reconciler + 'static) -> Self {
        self.policy.reconciler = Some(Arc::new(reconciler));
        self
    }

    /// Classifies this operation's handler errors with `classifier`
    /// ([`Operation::with_classifier`](crate::Operation::with_classifier)).
    pub fn with_classifier(mut self, classifier: impl Classifier + 'static) -> Self {
        self.policy.classifier = Some(Arc::new(classifier));
        self
    }

    /// Keeps this operation's settled records for `retention`
    /// ([`Operation::with_retention`](crate::Operation::with_retention)).
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] outside 1 s ..= 366 days.
    pub fn with_retention(mut self, retention: Duration) -> Result<Self, ConfigError> {
        self.policy = self.policy.with_retention(retention)?;
        Ok(self)
    }

    /// Stores this operation's outcomes up to `bytes`
    /// ([`Operation::with_max_outcome_bytes`](crate::Operation::with_max_outcome_bytes)).
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] outside 1 ..= [`MAX_OUTCOME_BYTES`](crate::config::MAX_OUTCOME_BYTES).
    pub fn with_max_outcome_bytes(mut self, bytes: usize) -> Result<Self, ConfigError> {
        self.policy = self.policy.with_max_outcome_bytes(bytes)?;
        Ok(self)
    }
}

/// Where an execution's outcome came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The handler ran, as this attempt.
    Executed {
        /// The attempt number.
        attempt: u32,
    },
    /// A takeover's reconciler found the effect already applied; the handler did not run.
    Reconciled {
        /// The attempt that recorded it.
        attempt: u32,
    },
    /// The stored outcome was returned; the handler did not run.
    Replayed,
}

/// The outcome of an idempotent execution.
#[derive(Debug)]
pub struct Execution<T> {
    pub(crate) value: T,
    pub(crate) raw: Box<RawValue>,
    pub(crate) origin: Origin,
    /// An owner's run ([`Invocation::with_owner`]) that re-entered its own claim: its
    /// completion is the operation's execution, not a takeover's.
    pub(crate) reentered: bool,
}

impl<T> Execution<T> {
    /// The handler's result.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The handler's result, owned.
    pub fn into_value(self) -> T {
        self.value
    }

    /// The result's JSON exactly as first serialized: a replay is byte-identical to the original.
    pub fn raw_json(&self) -> &RawValue {
        &self.raw
    }

    /// Where the outcome came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether this is a replay of a stored outcome.
    pub fn is_replay(&self) -> bool {
        self.origin == Origin::Replayed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::OperationScope;

    fn invocation() -> Result<Invocation, Error> {
        let scope = OperationScope::new("shop", "invoice").map_err(|err| Error::InvalidEvent {
            reason: err.to_string(),
        })?;
        let key = OperationKey::derive(&scope, None, "o-1")?;
        Ok(Invocation::new(
            key,
            Fingerprint::of(&1)?,
            Duration::from_secs(30),
        ))
    }

    /// Every way of building an invocation refuses the same identities: here, not only in a
    /// key policy.
    #[test]
    fn an_identity_is_checked_where_the_invocation_is_built() -> Result<(), Error> {
        for refused in [
            String::new(),
            "   ".into(),
            "i".repeat(MAX_IDENTITY_BYTES + 1),
        ] {
            assert!(matches!(
                invocation()?.with_identity(refused),
                Err(Error::InvalidEvent { .. })
            ));
        }
        let longest = invocation()?.with_identity("i".repeat(MAX_IDENTITY_BYTES))?;
        assert_eq!(longest.identity().map(str::len), Some(MAX_IDENTITY_BYTES));
        Ok(())
    }
}
