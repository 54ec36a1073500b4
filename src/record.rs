//! The ledger row of one operation key.
//!
//! Times are [`SystemTime`] here; they become epoch seconds and milliseconds only where a store
//! encodes them. Comparisons go through [`epoch_secs`] and [`epoch_millis`], so the in-memory
//! store decides exactly as a DynamoDB condition expression does.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::key::{Fingerprint, OperationKey};

/// The longest result reference kept in a business identity's evidence, in bytes.
pub const MAX_RESULT_REF_BYTES: usize = 1024;
/// The longest request id kept in a record, in bytes (longer ones are cut).
pub const MAX_REQUEST_ID_BYTES: usize = 256;
/// The longest failure message kept in a record, in bytes (a longer handler error text is cut,
/// so that it cannot crowd the record past DynamoDB's item limit).
pub const MAX_FAILURE_MESSAGE_BYTES: usize = 1024;
/// The longest failure kind kept in a record, in bytes (a classifier's or an operator's longer
/// kind is cut).
pub const MAX_FAILURE_KIND_BYTES: usize = 128;
/// The most bytes an operation's steps may take together in its record (names and serialized
/// results, before compression, plus a few bytes each): they live in the record, inside
/// DynamoDB's 400 KB item limit beside an inline outcome of at most 64 KB. A step whose result
/// would pass it has run, so the operation is retained as FAILED (`outcome_too_large`); record
/// a reference (an id) instead of a large result.
pub const MAX_STEP_RESULTS_BYTES: usize = 256 * 1024;
/// The most steps one operation records.
pub const MAX_STEPS: usize = 100;

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Claimed; the lease holder is running the handler.
    InProgress,
    /// Done; the outcome is stored and replayed.
    Completed,
    /// Failed terminally; the failure is stored and replayed.
    Failed,
    /// The effect could not be established; waits for an operator.
    Indeterminate,
}

impl Status {
    /// The stored spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "IN_PROGRESS",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Indeterminate => "INDETERMINATE",
        }
    }

    /// COMPLETED or FAILED: the operation has its final, replayable outcome.
    pub const fn is_settled(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }

    /// Parses the stored spelling.
    pub fn parse(stored: &str) -> Option<Self> {
        [
            Self::InProgress,
            Self::Completed,
            Self::Failed,
            Self::Indeterminate,
        ]
        .into_iter()
        .find(|status| status.as_str() == stored)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The current claim on a record: who holds it, which attempt, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(Hash))]
pub struct Lease {
    /// Random token of the claim's owner: completion is fenced on it.
    pub token: String,
    /// 1 for the first execution, +1 for each takeover.
    pub attempt: u32,
    /// After this an IN_PROGRESS claim may be taken over.
    pub expires_at: SystemTime,
}

impl Lease {
    /// Whether the lease has run out at `now` (millisecond resolution, as stored).
    pub fn is_expired(&self, now: SystemTime) -> bool {
        epoch_millis(self.expires_at) < epoch_millis(now)
    }

    /// Time left at `now`, zero when expired.
    pub fn remaining(&self, now: SystemTime) -> Duration {
        self.expires_at.duration_since(now).unwrap_or_default()
    }
}

/// One operation's record in the idempotency table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(Hash))]
pub struct Record {
    /// The operation key.
    pub key: OperationKey,
    /// Where the operation stands.
    pub status: Status,
    /// The fingerprint of the intent that claimed the key.
    pub fingerprint: Fingerprint,
    /// The current or last claim.
    pub lease: Lease,
    /// Retention: after this the record counts as absent (DynamoDB TTL deletes it later).
    pub expires_at: SystemTime,
    /// The exact bytes of the serialized result (COMPLETED) or of the [`RetainedFailure`] (FAILED).
    pub outcome: Option<Vec<u8>>,
    /// When the key was first claimed.
    pub created_at: SystemTime,
    /// When the operation reached COMPLETED or FAILED.
    pub completed_at: Option<SystemTime>,
    /// The request id of the invocation that first claimed it, for correlation. A takeover
    /// keeps it: the record then names the attempt whose logs explain why it was taken over
    /// (a crash, a timeout); the taking-over invocation's own request id is on its span
    /// (`idempotency.execute`, with its attempt number).
    pub request_id: Option<String>,
    /// The business identity whose permanent [`Evidence`] this operation keeps, if declared:
    /// the evidence's key, recorded at the claim and kept for the operation's whole life.
    pub identity: Option<String>,
    /// The operator's trace, when an operator resolved the operation.
    pub audit: Option<Audit>,
    /// The recovery points the operation recorded, in the order it ran them
    /// ([`crate::effects`]): empty for a handler that runs no step.
    pub steps: Vec<StepRecord>,
    /// How many times the step list was written, as the store keeps it beside the list (0: never,
    /// or only by versions before 0.5, which kept no count). A takeover is conditioned on it,
    /// never on the list's encoded bytes, which another build may encode otherwise.
    pub steps_version: u64,
}

/// One recovery point of an operation ([`crate::effects`]): its intent, recorded before its
/// effect, and its result, recorded after.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(Hash))]
pub struct StepRecord {
    /// The step's name, unique within the operation.
    pub name: String,
    /// The attempt that recorded its intent.
    pub attempt: u32,
    /// The exact bytes of the step's serialized result, once recorded. `None`: the intent
    /// stands without a result, so the step's effect is uncertain.
    pub result: Option<Vec<u8>>,
}

impl StepRecord {
    /// A step's intent, recorded by `attempt` before its effect.
    pub fn intent(name: impl Into<String>, attempt: u32) -> Self {
        Self {
            name: name.into(),
            attempt,
            result: None,
        }
    }

    /// Whether its result is recorded.
    pub fn is_done(&self) -> bool {
        self.result.is_some()
    }

    /// The step list's mark on a record that an adoption re-created (its crashed attempt's
    /// record, and whatever steps it held, deleted by TTL while its evidence stood): no step
    /// of that attempt is known, so no later takeover may read the list as "nothing happened".
    /// Its name is empty, which no step's name can be.
    pub fn steps_lost() -> Self {
        Self {
            name: String::new(),
            attempt: 1,
            result: None,
        }
    }

    /// Whether this is the mark of [`StepRecord::steps_lost`].
    pub fn marks_steps_lost(&self) -> bool {
        self.name.is_empty()
    }

    /// The step list's last entry when `attempt` gave its claim back knowingly (its handler
    /// returned a retryable failure, or the engine stopped it at a step): the steps before it
    /// are all that attempt did through steps, so the next delivery replays them and checks
    /// the uncertain ones, under every recovery policy. A crash writes no such mark: its
    /// takeover is decided by the recovery policy. Its name is one space, which no step's name
    /// can be (a step's name is not blank).
    pub fn given_back(attempt: u32) -> Self {
        Self {
            name: String::from(GIVEN_BACK),
            attempt,
            result: None,
        }
    }

    /// Whether this is a mark of [`StepRecord::given_back`].
    pub fn marks_given_back(&self) -> bool {
        self.name == GIVEN_BACK && self.result.is_none()
    }

    /// Whether this entry is a mark ([`StepRecord::steps_lost`], [`StepRecord::given_back`]),
    /// not a step.
    pub fn is_mark(&self) -> bool {
        self.marks_steps_lost() || self.marks_given_back()
    }
}

/// The name of the [`StepRecord::given_back`] mark.
const GIVEN_BACK: &str = " ";

impl Record {
    /// Whether retention has run out at `now` (second resolution, as stored). TTL deletes such a
    /// record eventually, whatever its status.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        epoch_secs(self.expires_at) < epoch_secs(now)
    }

    /// Whether a claim at `now` treats this record as absent: only a *settled* record
    /// (COMPLETED, FAILED) whose retention ran out. An IN_PROGRESS or INDETERMINATE record never
    /// expires into a fresh claim, however old: it is taken over (after reconciliation) or
    /// waits for an operator. This is the claim condition every store applies.
    pub fn counts_as_absent(&self, now: SystemTime) -> bool {
        if crate::defects::is_reintroduced(crate::defects::IN_PROGRESS_EXPIRES) {
            return self.is_expired(now);
        }
        self.status.is_settled() && self.is_expired(now)
    }

    /// Whether an IN_PROGRESS claim may be taken over at `now`.
    pub fn lease_is_takeable(&self, now: SystemTime) -> bool {
        self.status == Status::InProgress && self.lease.is_expired(now)
    }
}

/// How a record leaves IN_PROGRESS (or, resolved by an operator, INDETERMINATE).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(Hash))]
pub struct Settlement {
    /// COMPLETED, FAILED or INDETERMINATE.
    pub status: Status,
    /// The serialized result or failure (none for INDETERMINATE).
    pub outcome: Option<Vec<u8>>,
    /// A short reference to the result (a created resource's id) kept in the permanent evidence.
    pub result_ref: Option<String>,
    /// New retention.
    pub expires_at: SystemTime,
    /// When it settled.
    pub completed_at: SystemTime,
    /// The operator's trace, when an operator settles it (kept on the record and its evidence).
    pub audit: Option<Audit>,
    /// The operation's steps as the settlement leaves them, when they changed since they were
    /// last written (a step's result merged into the settlement); `None` keeps them as stored.
    pub steps: Option<Vec<StepRecord>>,
    /// Whether the business identity's evidence is deleted instead of settled: a refusal (the
    /// application refused the request and nothing took effect) replays under its key but
    /// holds no identity, so that another operation may still claim it
    /// ([`ExecutionContext::refuse`](crate::ExecutionContext::refuse)).
    pub releases_identity: bool,
}

impl Settlement {
    /// COMPLETED with the result's exact bytes (and a reference for the evidence), kept for
    /// `retention` from `now`.
    pub fn completed(
        outcome: Vec<u8>,
        result_ref: Option<String>,
        now: SystemTime,
        retention: Duration,
    ) -> Self {
        Self::settled(
            Status::Completed,
            Some(outcome),
            result_ref,
            now,
            now + retention,
        )
    }

    /// FAILED with `failure`, replayed for `retention` from `now`.
    pub fn failed(failure: &RetainedFailure, now: SystemTime, retention: Duration) -> Self {
        let outcome = failure.to_json().into_bytes();
        Self::settled(Status::Failed, Some(outcome), None, now, now + retention)
    }

    /// INDETERMINATE, kept for `retention` from `now` while it waits for an operator.
    pub fn indeterminate(now: SystemTime, retention: Duration) -> Self {
        Self::settled(Status::Indeterminate, None, None, now, now + retention)
    }

    /// The same settlement, carrying an operator's trace.
    pub fn with_audit(mut self, audit: Audit) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The same settlement, writing the operation's steps as `steps` (`None`: as stored).
    pub fn with_steps(mut self, steps: Option<Vec<StepRecord>>) -> Self {
        self.steps = steps;
        self
    }

    /// The same settlement, deleting the business identity's evidence instead of settling it
    /// when `releases` ([`Settlement::releases_identity`]).
    pub fn releasing_identity(mut self, releases: bool) -> Self {
        self.releases_identity = releases;
        self
    }

    fn settled(
        status: Status,
        outcome: Option<Vec<u8>>,
        result_ref: Option<String>,
        completed_at: SystemTime,
        expires_at: SystemTime,
    ) -> Self {
        Self {
            status,
            outcome,
            result_ref,
            expires_at,
            completed_at,
            audit: None,
            steps: None,
            releases_identity: false,
        }
    }
}

/// An operator's intervention, kept on the record and the evidence it changed: who, when,
/// what.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(Hash))]
pub struct Audit {
    /// Who: `idemctl` records the caller's ARN as STS `GetCallerIdentity` names it, or
    /// `unverified:NAME` (`--operator NAME`) when STS does not answer.
    pub by: String,
    /// When.
    pub at: SystemTime,
    /// What: the resolution and the state it was made from, e.g. `completed from INDETERMINATE`.
    pub action: String,
    /// Why, when said.
    pub reason: Option<String>,
}

/// Permanent, compact evidence that a business identity was executed: the uniqueness record.
///
/// It outlives the idempotency record (no TTL) and holds no response body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(Hash))]
pub struct Evidence {
    /// The business identity under its scope, which is the evidence's key in the uniqueness
    /// table, e.g. `billing#t=acme#id=invoice:order-418:rev-2`
    /// ([`IdentityScope`](crate::key::IdentityScope)).
    pub identity: String,
    /// The operation key that executed it.
    pub key: OperationKey,
    /// That operation's fingerprint.
    pub fingerprint: Fingerprint,
    /// IN_PROGRESS until settled, then COMPLETED, FAILED or INDETERMINATE.
    pub status: Status,
    /// The reference the operation chose to keep (e.g. the created invoice's id).
    pub result_ref: Option<String>,
    /// When the identity was claimed.
    pub created_at: SystemTime,
    /// When the operation settled.
    pub completed_at: Option<SystemTime>,
    /// The operator's trace, when an operator resolved it.
    pub audit: Option<Audit>,
}

impl Evidence {
    /// The key an evidence of another tenant's operation carries once redacted.
    pub const REDACTED: &'static str = "redacted";

    /// This evidence as another tenant may see it: its identity, status and times, but not the
    /// operation that holds it (key and fingerprint [`Evidence::REDACTED`]) nor its result.
    pub fn redacted(self) -> Self {
        Self {
            key: OperationKey::from_stored(Self::REDACTED),
            fingerprint: Fingerprint::from_stored(Self::REDACTED),
            result_ref: None,
            audit: None,
            ..self
        }
    }

    /// The evidence a new claim writes.
    pub fn of_claim(record: &Record, identity: &str) -> Self {
        Self {
            identity: identity.to_owned(),
            key: record.key.clone(),
            fingerprint: record.fingerprint.clone(),
            status: Status::InProgress,
            result_ref: None,
            created_at: record.created_at,
            completed_at: None,
            audit: None,
        }
    }
}

/// A terminal failure as stored and replayed: a stable machine-readable kind and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedFailure {
    /// Stable machine-readable kind: the engine's own (an outcome it could not keep, an
    /// operator's release) or a handler's terminal kind, e.g. `card_declined`.
    pub kind: FailureKind,
    /// Human-readable message, with no payload data.
    pub message: String,
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn cut_to(mut text: String, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

impl RetainedFailure {
    /// The failure as a record keeps it: its kind cut to
    /// [`MAX_FAILURE_KIND_BYTES`](MAX_FAILURE_KIND_BYTES) and its message to
    /// [`MAX_FAILURE_MESSAGE_BYTES`](MAX_FAILURE_MESSAGE_BYTES), at character
    /// boundaries: a handler's or an operator's text of any length cannot grow the record.
    pub(crate) fn bounded(self) -> Self {
        let kind = match self.kind {
            FailureKind::Terminal(kind) => {
                FailureKind::Terminal(cut_to(kind, MAX_FAILURE_KIND_BYTES))
            }
            engine => engine,
        };
        Self {
            kind,
            message: cut_to(self.message, MAX_FAILURE_MESSAGE_BYTES),
        }
    }

    /// The stored JSON form (`{"kind":…,"message":…}`).
    pub fn to_json(&self) -> String {
        let mut fields = serde_json::Map::new();
        fields.insert("kind".into(), self.kind.as_str().into());
        fields.insert("message".into(), self.message.clone().into());
        serde_json::Value::Object(fields).to_string()
    }
}

impl fmt::Display for RetainedFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// The kind of a retained failure, stored as its name (`outcome_too_large`, `card_declined`):
/// the engine's own kinds are variants, so that they are matched by variant, never by string.
///
/// ```
/// use lambda_idempotency::record::FailureKind;
///
/// assert_eq!(FailureKind::from("outcome_too_large"), FailureKind::OutcomeTooLarge);
/// assert_eq!(FailureKind::from("card_declined"), FailureKind::Terminal("card_declined".into()));
/// assert!(FailureKind::OutcomeTooLarge.took_effect());
/// assert_eq!(FailureKind::Terminal("card_declined".into()), "card_declined");
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
#[non_exhaustive]
pub enum FailureKind {
    /// The operation ran, but its result is over the outcome limit (`outcome_too_large`).
    OutcomeTooLarge,
    /// The operation ran, but the store refused its result (`outcome_unstorable`).
    OutcomeUnstorable,
    /// The operation ran, but its result (or a step's) could never be replayed: it does not
    /// serialize to JSON, nests too deep, or does not read back as its own type
    /// (`outcome_unserializable`).
    OutcomeUnserializable,
    /// An operator released the operation for the next delivery to run (`released`).
    Released,
    /// The completion's writes cannot be sent on this store (a table that refuses
    /// transactions): retained, since the same handler would send them again
    /// (`completion_rejected`).
    CompletionRejected,
    /// A transactional step's writes cannot be sent as built (over DynamoDB's limits, two
    /// actions on one item, an invalid expression), and the handler returned that error:
    /// retained, since the same handler would build them again (`step_rejected`).
    StepRejected,
    /// A handler's terminal failure, of the kind its classifier named. The engine's names
    /// above are taken: a classifier's kind of the same name reads as the engine's.
    Terminal(String),
}

impl FailureKind {
    /// The stored name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::OutcomeTooLarge => "outcome_too_large",
            Self::OutcomeUnstorable => "outcome_unstorable",
            Self::OutcomeUnserializable => "outcome_unserializable",
            Self::Released => "released",
            Self::CompletionRejected => "completion_rejected",
            Self::StepRejected => "step_rejected",
            Self::Terminal(kind) => kind,
        }
    }

    /// Whether the operation took effect though its response was not kept (too large,
    /// refused by the store, or never replayable): a retry is told it was applied, not that it
    /// failed.
    pub fn took_effect(&self) -> bool {
        matches!(
            self,
            Self::OutcomeTooLarge | Self::OutcomeUnstorable | Self::OutcomeUnserializable
        )
    }
}

impl From<&str> for FailureKind {
    fn from(name: &str) -> Self {
        match name {
            "outcome_too_large" => Self::OutcomeTooLarge,
            "outcome_unstorable" => Self::OutcomeUnstorable,
            "outcome_unserializable" => Self::OutcomeUnserializable,
            "released" => Self::Released,
            "completion_rejected" => Self::CompletionRejected,
            "step_rejected" => Self::StepRejected,
            other => Self::Terminal(other.to_owned()),
        }
    }
}

impl From<String> for FailureKind {
    fn from(name: String) -> Self {
        match Self::from(name.as_str()) {
            Self::Terminal(_) => Self::Terminal(name),
            engine => engine,
        }
    }
}

impl From<FailureKind> for String {
    fn from(kind: FailureKind) -> Self {
        match kind {
            FailureKind::Terminal(kind) => kind,
            engine => engine.as_str().to_owned(),
        }
    }
}

/// Kinds are equal when their stored names are: a `Terminal` built with one of the engine's
/// names (`Terminal("released".into())`) is that kind, as it reads back once stored.
impl PartialEq for FailureKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for FailureKind {}

impl std::hash::Hash for FailureKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq<&str> for FailureKind {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whole seconds since the Unix epoch (0 before it).
pub fn epoch_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whole milliseconds since the Unix epoch (0 before it).
pub fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time `millis` milliseconds after the Unix epoch; `None` past what the platform's clock
/// can represent.
pub fn from_epoch_millis(millis: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// The time `secs` seconds after the Unix epoch; `None` past what the platform's clock can
/// represent.
pub fn from_epoch_secs(secs: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// The retention expiry of a record holding a lease until `lease_expires_at`: `retention`
/// after the lease runs out (rounded up to the next whole second, as stored). TTL can then
/// never delete a record under a live lease, and a crashed attempt's record stays, to be taken
/// over after reconciliation, for as long as a settled one would.
pub fn retention_expiry(lease_expires_at: SystemTime, retention: Duration) -> SystemTime {
    let rounded_up =
        from_epoch_secs(epoch_secs(lease_expires_at).saturating_add(1)).unwrap_or(lease_expires_at);
    rounded_up + retention
}

#[cfg(test)]
mod failure_kind_tests {
    use super::*;

    /// A classifier's or an operator's kind and message of any length are kept cut, at
    /// character boundaries; the engine's kinds are kept whole.
    #[test]
    fn a_retained_failure_is_bounded_in_kind_and_message() {
        let huge = RetainedFailure {
            kind: FailureKind::Terminal("é".repeat(300_000)),
            message: "ü".repeat(1_000_000),
        }
        .bounded();
        let kind = String::from(huge.kind.clone());
        assert!(kind.len() <= MAX_FAILURE_KIND_BYTES && !kind.is_empty());
        assert!(huge.message.len() <= MAX_FAILURE_MESSAGE_BYTES);
        assert!(huge.message.len() > MAX_FAILURE_MESSAGE_BYTES - 2);
        let engine = RetainedFailure {
            kind: FailureKind::OutcomeTooLarge,
            message: "m".into(),
        };
        assert_eq!(engine.clone().bounded(), engine);
    }

    /// The stored form is the one 0.2 wrote: a failure reads back as its variant and writes
    /// the same bytes.
    #[test]
    fn a_retained_failure_keeps_its_stored_bytes() -> Result<(), serde_json::Error> {
        for (stored, kind) in [
            (
                r#"{"kind":"outcome_too_large","message":"m"}"#,
                FailureKind::OutcomeTooLarge,
            ),
            (
                r#"{"kind":"released","message":"m"}"#,
                FailureKind::Released,
            ),
            (
                r#"{"kind":"card_declined","message":"m"}"#,
                FailureKind::Terminal("card_declined".into()),
            ),
        ] {
            let failure: RetainedFailure = serde_json::from_str(stored)?;
            assert_eq!(failure.kind, kind);
            assert_eq!(failure.to_json(), stored);
            assert_eq!(serde_json::to_string(&failure)?, stored);
        }
        Ok(())
    }
}
