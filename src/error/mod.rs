//! The errors callers see.
//!
//! Every variant is matched by value, never by message; every message tells an operator what
//! to do next. Keys appear only in their short hashed form.

mod kind;

use std::time::Duration;

pub use kind::ErrorKind;

use crate::key::OperationKey;
use crate::record::{Evidence, RetainedFailure};

/// A boxed error from a handler or an SDK: `lambda_runtime::Error` is the same type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong with an idempotent execution.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key was used before with a different payload: the request is not a retry of that
    /// operation.
    #[error(
        "operation {} was already requested with a different payload; send a new idempotency key for a new operation",
        key.short()
    )]
    PayloadConflict {
        /// The operation key.
        key: OperationKey,
    },

    /// Another invocation holds a live lease on this key; the handler was not run.
    #[error(
        "operation {} is in progress (attempt {attempt}); retry after {retry_after:?}",
        key.short()
    )]
    AlreadyInProgress {
        /// The operation key.
        key: OperationKey,
        /// The attempt that holds the lease.
        attempt: u32,
        /// Time left on the holder's lease.
        retry_after: Duration,
    },

    /// The operation's effect could not be established; an operator must resolve it.
    #[error(
        "operation {} is indeterminate: check downstream systems and resolve the record before retrying",
        key.short()
    )]
    Indeterminate {
        /// The operation key.
        key: OperationKey,
    },

    /// The operation's replayable record has expired (or is gone), but the permanent evidence
    /// of its business identity stands: it is not executed again.
    #[error("{}", key_expired_message(key, evidence))]
    KeyExpiredConflict {
        /// The operation key.
        key: OperationKey,
        /// The standing evidence. Its key may be another operation's that claimed the identity;
        /// when that operation is another tenant's (an identity shared across tenants), the
        /// evidence comes [redacted](Evidence::redacted).
        evidence: Box<Evidence>,
    },

    /// The reconciler could not inspect downstream evidence; the lease runs out and the next
    /// delivery asks again.
    #[error("reconciling operation {} failed: {source}; it will be retried after the lease expires", key.short())]
    ReconcileFailed {
        /// The operation key.
        key: OperationKey,
        /// The reconciler's error.
        source: BoxError,
    },

    /// This worker's lease was taken over, or ran out, before it completed (past its lease no
    /// step's effect starts: another attempt may take the claim over), or a step's declared
    /// effect timeout would outlast it (the step was not started and, nothing recorded, the
    /// claim released); its result was not recorded.
    #[error(
        "lease on operation {} was taken over, ran out, or is shorter than a step's declared effect timeout (this was attempt {attempt}); its result was not recorded, raise the lease if handlers outlive it",
        key.short()
    )]
    LeaseLost {
        /// The operation key.
        key: OperationKey,
        /// This worker's attempt.
        attempt: u32,
    },

    /// The event carries no key material for this operation.
    #[error(
        "the event has no idempotency key for operation `{operation}`; add the key field or change the key policy"
    )]
    MissingKey {
        /// The operation name.
        operation: String,
    },

    /// The request names no caller, and its keys are kept per caller
    /// ([`CallerScope::Principal`](crate::lambda::http::CallerScope::Principal)): two anonymous
    /// callers could otherwise read each other's responses. Nothing was written.
    #[error(
        "the request names no caller: idempotency keys are kept per caller, so authenticate the request (or key a public endpoint with CallerScope::PrincipalOrAnonymous)"
    )]
    CallerUnidentified,

    /// The key policy reads a tenant from each event ([`KeyPolicy::with_tenant`](crate::KeyPolicy::with_tenant)),
    /// Lambda's context gave none, and this event names none: keyed without one it would share
    /// the untenanted scope with every other such event. Nothing was written.
    #[error(
        "the event for operation `{operation}` names no tenant: send the tenant, or key tenant-less events with KeyPolicy::with_optional_tenant"
    )]
    TenantMissing {
        /// The operation name.
        operation: String,
    },

    /// The event could not be read.
    #[error("invalid event: {reason}")]
    InvalidEvent {
        /// Why.
        reason: String,
    },

    /// The handler's result is over [`Config::max_outcome_bytes`](crate::Config::max_outcome_bytes);
    /// the operation ran and is retained as failed (one the store refuses within the limit is
    /// [`Error::Failed`] with [`FailureKind::OutcomeUnstorable`](crate::record::FailureKind::OutcomeUnstorable)).
    #[error(
        "the result of operation {} is {size} bytes, over the {limit}-byte limit; return a reference instead of the full result",
        key.short()
    )]
    OutcomeTooLarge {
        /// The operation key.
        key: OperationKey,
        /// Serialized size of the result.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// The operation failed terminally before; this is the retained failure, replayed.
    #[error("operation {} failed before and is not re-run: {failure}", key.short())]
    Failed {
        /// The operation key.
        key: OperationKey,
        /// The retained failure.
        failure: RetainedFailure,
    },

    /// The stored outcome does not decode as the handler's output type.
    #[error(
        "the stored result of operation {} does not decode ({reason}); if a deploy changed the handler's output type, let the new type read the old results (serde defaults, aliases or an untagged enum): a new key version would run again the operations still being retried",
        key.short()
    )]
    StoredOutcomeUnreadable {
        /// The operation key.
        key: OperationKey,
        /// Where it failed to decode (never the stored values).
        reason: String,
    },

    /// A result given in the handler's place (an operator's `Completed` resolution) does not
    /// decode as the handler's output type; nothing was stored. (A reconciler's `Applied` value
    /// that does not holds the operation [`Error::Indeterminate`] for an operator.)
    #[error(
        "the result given for operation {} does not decode as the handler's output ({reason}); nothing was stored: give a value of the handler's output type",
        key.short()
    )]
    OutcomeMismatch {
        /// The operation key.
        key: OperationKey,
        /// The decoder's message.
        reason: String,
    },

    /// The handler's steps ([`crate::effects`]) are not the ones its operation recorded: a
    /// step name used twice, or steps in another order than an earlier attempt ran them (a
    /// deploy that changed the handler). The operation is held INDETERMINATE for an operator,
    /// never answered from another step's result.
    #[error(
        "operation {} ran step `{step}` where {}; the operation is held for an operator: check its recorded steps, then resolve it",
        key.short(),
        match expected { Some(expected) => format!("its record has step `{expected}`"), None => "that step already ran in this attempt".to_owned() }
    )]
    StepMismatch {
        /// The operation key.
        key: OperationKey,
        /// The step the handler ran.
        step: String,
        /// The step the record has at that position; `None`: the name was used twice.
        expected: Option<String>,
    },

    /// Records of an event from a source that reads no partial-batch response (SNS, S3) must
    /// be delivered again: the batch door fails the invocation so that Lambda retries the whole
    /// event (an asynchronous invocation: twice, then its on-failure destination or dead-letter
    /// queue), and the records that succeeded replay their stored outcomes instead of running
    /// again.
    #[error(
        "{failed} of the event's {records} records must be delivered again: the invocation fails so that Lambda retries the event (records that succeeded replay)"
    )]
    RecordsFailed {
        /// The records to deliver again (failed, skipped or not started).
        failed: usize,
        /// The records of the event.
        records: usize,
    },

    /// The idempotency store failed.
    #[error(transparent)]
    Store(#[from] StoreError),

    /// The handler failed: a retryable failure released the claim, a terminal one was retained.
    #[error("handler failed: {source}")]
    Handler {
        /// The handler's error.
        source: BoxError,
    },
}

/// The message of [`Error::KeyExpiredConflict`]: it names the caller's own operation only.
/// Where and how JSON failed to decode, without serde's text: that quotes the values it met,
/// which are the operation's stored data, never to reach a log or a caller.
pub(crate) fn decode_failure(err: &serde_json::Error) -> String {
    let what = match err.classify() {
        serde_json::error::Category::Data => "not the type's shape",
        serde_json::error::Category::Syntax => "not valid JSON",
        serde_json::error::Category::Eof => "cut short",
        serde_json::error::Category::Io => "unreadable",
    };
    format!("{what} at line {} column {}", err.line(), err.column())
}

fn key_expired_message(key: &OperationKey, evidence: &Evidence) -> String {
    let standing = match evidence.key == *key {
        true => "its replayable record has expired, but its permanent evidence stands",
        false => {
            "the permanent evidence of another operation with the same business identity stands"
        }
    };
    format!(
        "operation {} is not run: {standing} ({}); use the evidence's result reference, or a new business identity for a new operation",
        key.short(),
        evidence.status
    )
}

impl Error {
    /// Whether the error shows that the operation already took effect, so that a consumer may
    /// acknowledge the message: a [`Error::KeyExpiredConflict`] whose evidence is COMPLETED.
    /// Evidence of an operation that is in progress, failed or indeterminate is a reconcile or
    /// operator case, never a reason to acknowledge.
    pub fn already_took_effect(&self) -> bool {
        matches!(self, Self::KeyExpiredConflict { evidence, .. } if evidence.status == crate::record::Status::Completed)
    }

    /// Whether the operation took effect but its result could not be kept (over the outcome
    /// limit, refused by the store, not JSON): it is retained FAILED and never runs again while
    /// that record lives. A consumer acknowledges the message (and alarms on it) rather than
    /// letting it reach a dead-letter queue, whose late redrive, once the record expired, would
    /// run it again.
    pub fn applied_but_not_kept(&self) -> bool {
        match self {
            Self::OutcomeTooLarge { .. } => true,
            Self::Failed { failure, .. } => failure.kind.took_effect(),
            _ => false,
        }
    }
}

/// A failure of the idempotency store, mapped from the backend's own errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The table does not exist or is not visible to these credentials.
    #[error(
        "idempotency table `{table}` not found; deploy it (template.yaml) or set IDEMPOTENCY_TABLE"
    )]
    TableNotFound {
        /// The table name.
        table: String,
    },

    /// The uniqueness table does not exist or is not visible to these credentials.
    #[error(
        "uniqueness table `{table}` not found; deploy it (template.yaml) or set UNIQUENESS_TABLE"
    )]
    UniquenessTableNotFound {
        /// The table name.
        table: String,
    },

    /// The credentials may not make the request (IAM), or are missing, invalid or expired.
    #[error(
        "the idempotency store refused `{operation}` to these credentials ({code}); grant the function's role access to the tables (template.yaml) or fix the credentials"
    )]
    AccessDenied {
        /// The store operation.
        operation: &'static str,
        /// The backend's error code, e.g. `AccessDeniedException`.
        code: String,
    },

    /// The store throttled the request; the caller should retry with backoff.
    #[error(
        "the idempotency store throttled `{operation}`; retry later or raise the table's capacity"
    )]
    Throttled {
        /// The store operation.
        operation: &'static str,
        /// The backend's error.
        source: BoxError,
    },

    /// The store could not be reached or did not answer.
    #[error(
        "the idempotency store is unavailable for `{operation}`: {source}; check the endpoint and network"
    )]
    Unavailable {
        /// The store operation.
        operation: &'static str,
        /// The backend's error.
        source: BoxError,
    },

    /// Another request was writing the same items at the same moment (a transaction conflict).
    #[error("the idempotency store saw a concurrent write during `{operation}`; retry the request")]
    Contention {
        /// The store operation.
        operation: &'static str,
    },

    /// An operation declares a business identity, but the store has no uniqueness table.
    #[error(
        "the operation declares a business identity but the store has no uniqueness table; configure one (DynamoDbStore::with_uniqueness_table, UNIQUENESS_TABLE)"
    )]
    NoUniquenessTable,

    /// The store rejected the request as invalid.
    #[error(
        "the idempotency store rejected `{operation}`: {message}; check the table's key schema and attribute names"
    )]
    Rejected {
        /// The store operation.
        operation: &'static str,
        /// The backend's message.
        message: String,
    },

    /// A table is a global table with multi-Region eventual consistency (MREC): the last writer
    /// wins across Regions, so a claim in one Region does not see a claim in another and both
    /// could run. Found by [`DynamoDbStore::check_replication`](crate::store::DynamoDbStore::check_replication).
    #[error(
        "table `{table}` is a global table with multi-Region eventual consistency (Regions {regions:?}): claims in two Regions do not see each other and both could run; use a single-Region table or one with multi-Region strong consistency (MRSC), or, if only one Region ever writes, opt in with DynamoDbStore::accept_eventually_consistent_replicas"
    )]
    EventuallyConsistentReplicas {
        /// The table.
        table: String,
        /// The Regions of its replicas.
        regions: Vec<String>,
    },

    /// A table has multi-Region strong consistency (MRSC), which accepts no transactions, and
    /// the store has a uniqueness table: business identities are written in transactions.
    #[error(
        "table `{table}` has multi-Region strong consistency, which accepts no transactions, but business identities are written in transactions; remove the uniqueness table from this store (UNIQUENESS_TABLE), or keep identities on single-Region tables"
    )]
    TransactionsUnsupported {
        /// The table.
        table: String,
    },

    /// The idempotency table has multi-Region strong consistency, which refuses
    /// `TransactWriteItems`, and the operation declares that it writes in transactions
    /// ([`Operation::with_transactional_writes`](crate::lambda::Operation::with_transactional_writes)),
    /// or a transactional write was refused there before it was sent.
    #[error(
        "table `{table}` has multi-Region strong consistency, which accepts no transactions, but this operation uses transactional steps, complete_with or an outbox; run it on a single-Region table in the same account and Region, or use plain steps"
    )]
    TransactionalWritesUnsupported {
        /// The table.
        table: String,
    },

    /// A write on an operation with a business identity found its evidence missing or held by
    /// another operation (released or rewritten by an operator, or damaged): nothing was
    /// written. Not a corrupt record of its own: the record stands, to be reconciled with its
    /// evidence by an operator (`idemctl`).
    #[error(
        "the evidence of operation {key_short}'s business identity is missing or another operation's; reconcile the record and its evidence (idemctl get, resolve)"
    )]
    EvidenceNotOwned {
        /// The short form of the operation key.
        key_short: String,
    },

    /// A store answered a request with an answer of another kind (a claim with a fence, a
    /// read with a write's answer): a defect of that store or of a decorator around it.
    #[error(
        "the idempotency store answered `{operation}` with an answer of another kind; fix the store (or the decorator around it) so that it answers each request in kind"
    )]
    WrongAnswer {
        /// The store operation.
        operation: &'static str,
    },

    /// A stored record could not be decoded.
    #[error(
        "the stored record for operation {key_short} is corrupt ({reason}); inspect or delete it"
    )]
    CorruptRecord {
        /// The short form of the operation key.
        key_short: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// The error for a fenced write whose identity's evidence is missing or another operation's.
    pub(crate) fn evidence_not_owned(key: &OperationKey) -> Self {
        Self::EvidenceNotOwned {
            key_short: key.short().to_owned(),
        }
    }

    /// Whether the same request may pass if sent again: throttling past the SDK's own
    /// retries, a 5xx or timeout, a transaction conflict. The engine retries these; the
    /// others are configuration or data problems that a retry does not fix.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Throttled { .. } | Self::Unavailable { .. } | Self::Contention { .. }
        )
    }

    /// Whether a stored record (or evidence) could not be decoded: an operator's case, which no
    /// redelivery fixes.
    pub fn is_corrupt_record(&self) -> bool {
        matches!(self, Self::CorruptRecord { .. })
    }
}

/// A configuration mistake, reported when the configuration is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No namespace was given and `AWS_LAMBDA_FUNCTION_NAME` is not set.
    #[error(
        "no namespace: pass one to OperationScope::new, or run inside Lambda where AWS_LAMBDA_FUNCTION_NAME is set"
    )]
    MissingNamespace,

    /// A scope component is malformed.
    #[error("invalid {field}: {reason}")]
    InvalidScope {
        /// The component.
        field: &'static str,
        /// The rule it breaks.
        reason: &'static str,
    },

    /// A JSON Pointer does not start with `/`.
    #[error("invalid JSON Pointer `{pointer}`: it must be empty or start with '/' (RFC 6901)")]
    InvalidPointer {
        /// The pointer as given.
        pointer: String,
    },

    /// A setting is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting.
        setting: &'static str,
        /// The accepted range.
        reason: String,
    },

    /// A required environment variable is not set.
    #[error("environment variable {name} is not set; {hint}")]
    MissingEnv {
        /// The variable.
        name: &'static str,
        /// What to set it to.
        hint: &'static str,
    },
}
