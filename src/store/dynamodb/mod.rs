//! The DynamoDB store: each primitive is one conditional request, or one transaction when the
//! operation keeps permanent evidence in the uniqueness table.
//!
//! | primitive | request | condition on the record |
//! |---|---|---|
//! | claim | `PutItem` (`TransactWriteItems` with the evidence `Put`, condition `attribute_not_exists(pk)`) | `attribute_not_exists(pk) OR (expires_at < :now_s AND status IN (COMPLETED, FAILED))` |
//! | adopt | `TransactWriteItems`: the record `Put` and an evidence `Update` conditioned on the orphan | same as claim |
//! | take_over | `UpdateItem`: new token, attempt, lease, retention | `status = IN_PROGRESS AND lease_token = :previous AND lease_expires_at_ms < :now_ms` |
//! | settle | `UpdateItem` (+ evidence `Update` in one transaction) | `status = IN_PROGRESS AND lease_token = :mine` |
//! | release | `DeleteItem` (+ evidence `Delete` in one transaction) | same |
//! | shorten | `UpdateItem`: lease expiry | same |
//! | get, evidence | `GetItem`, strongly consistent | — |
//!
//! Every conditional write asks for `ReturnValuesOnConditionCheckFailure=ALL_OLD`: a duplicate
//! costs one request, the failed claim returning the existing record, and a cancelled
//! transaction says which condition failed and what stood there.
//!
//! An outcome too large for a small record is kept compressed in part items beside it
//! ([`OutcomeStorage`]): a claim or takeover that finds such a record reads them (one more round
//! trip); a settlement, shortening or release whose fence is lost does not (the record it
//! returns has `outcome: None`, unless the record holds the very bytes that settlement wrote).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use lambda_idempotency::store::DynamoDbStore;
//!
//! // IDEMPOTENCY_TABLE names the table, UNIQUENESS_TABLE (optional) the permanent one;
//! // DYNAMODB_ENDPOINT, when set, points at a local server.
//! let store = DynamoDbStore::from_env().await?;
//!
//! // Or with a client of your own:
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency")
//!     .with_uniqueness_table("idempotency-uniqueness");
//! # Ok(()) }
//! ```

mod client;
mod error;
mod evidence;
mod item;
mod outcome;
mod replication;
mod scan;
mod table;
mod writes;

use std::future::Future;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::Client;

pub use client::{ATTEMPT_TIMEOUT, OPERATION_TIMEOUT};
#[cfg(feature = "testing")]
pub(crate) use item::value_size;
pub use item::{AttributeNames, SortKey};
pub use outcome::{OutcomeStorage, PART_BYTES, PART_TTL_MARGIN};
pub use replication::Replication;
pub use scan::ScanCursor;

use self::error::map_sdk_error;
use self::item::{Item, millis, n, s, secs};
use self::writes::{Check, Expr, Write};
use crate::error::{ConfigError, StoreError};
use crate::key::OperationKey;
use crate::record::{Evidence, Lease, Record, Settlement, Status};
use crate::store::{Claim, Fence, Guard, Store, Target};

/// The environment variable naming the idempotency table.
pub const TABLE_VAR: &str = "IDEMPOTENCY_TABLE";
/// The environment variable naming the uniqueness table (optional).
pub const UNIQUENESS_TABLE_VAR: &str = "UNIQUENESS_TABLE";
/// The environment variable that, when set, points the client at a DynamoDB-compatible endpoint.
pub const ENDPOINT_VAR: &str = "DYNAMODB_ENDPOINT";

/// Records in a DynamoDB table (`pk` string key, TTL on `expires_at` by default), and optional
/// permanent evidence in a uniqueness table (`pk` string key, no TTL).
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: String,
    uniqueness_table: Option<String>,
    names: AttributeNames,
    outcomes: OutcomeStorage,
    unscoped_evidence: bool,
    accept_eventual: bool,
    verdict: replication::Verdict,
}

impl DynamoDbStore {
    /// A store on `table` through `client`, with the default attribute names. A client
    /// without an operation timeout or an attempt timeout gets the store's
    /// ([`OPERATION_TIMEOUT`], [`ATTEMPT_TIMEOUT`]): each of the engine's tries
    /// is bounded, so that one hung request cannot use up the time a settlement has left.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let client = client::with_timeouts(client.config()).map_or(client, Client::from_conf);
        Self {
            client,
            table: table.into(),
            uniqueness_table: None,
            names: AttributeNames::default(),
            outcomes: OutcomeStorage::default(),
            unscoped_evidence: true,
            accept_eventual: false,
            verdict: replication::Verdict::default(),
        }
    }

    /// A store on the tables named by `IDEMPOTENCY_TABLE` and (if set) `UNIQUENESS_TABLE`, with
    /// the default AWS configuration (aws-config: the credential chain, profiles, every
    /// `AWS_*` setting); `DYNAMODB_ENDPOINT`, when set, overrides the endpoint.
    /// [`Self::for_lambda`] is leaner inside a Lambda function.
    pub async fn from_env() -> Result<Self, ConfigError> {
        let table = table_from_env()?;
        Ok(Self::new(Client::new(&client::from_env().await), table).with_uniqueness_from_env())
    }

    /// A store for a Lambda function: the tables as [`Self::from_env`] names them, the region
    /// and the execution role's credentials from the variables Lambda sets (`AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`),
    /// `DYNAMODB_ENDPOINT`, and an HTTPS client that trusts Mozilla's roots compiled into the
    /// binary (the system's when `SSL_CERT_FILE` or `SSL_CERT_DIR` is set).
    ///
    /// It reads no file and calls no credential provider, so a cold start is shorter, and a
    /// binary that uses it instead of [`Self::from_env`] links none of aws-config's credential
    /// chain (BENCHMARKS.md has the figures). Other `AWS_*` settings (`AWS_MAX_ATTEMPTS`,
    /// `AWS_ENDPOINT_URL_DYNAMODB`, profiles) are not read: use [`Self::from_env`] for them.
    ///
    /// ```no_run
    /// # async fn build() -> Result<(), lambda_idempotency::ConfigError> {
    /// use lambda_idempotency::{DynamoDbStore, Idempotency};
    ///
    /// let idem = Idempotency::new(DynamoDbStore::for_lambda()?);
    /// # let _ = idem; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::MissingEnv`] when a table's, the region's or the credentials' variable
    /// is not set (outside Lambda).
    pub fn for_lambda() -> Result<Self, ConfigError> {
        let table = table_from_env()?;
        Ok(Self::new(Client::from_conf(client::for_lambda()?), table).with_uniqueness_from_env())
    }

    /// Keeps permanent evidence in the table `UNIQUENESS_TABLE` names, if set.
    fn with_uniqueness_from_env(self) -> Self {
        match std::env::var(UNIQUENESS_TABLE_VAR) {
            Ok(uniqueness) => self.with_uniqueness_table(uniqueness),
            Err(_) => self,
        }
    }

    /// Warms the client and checks the tables during a function's init: one eventually
    /// consistent `GetItem` of a key no operation uses, so the connection (TCP and TLS), the
    /// credentials, the endpoint and the SDK's first-use paths are ready before the first event
    /// instead of delaying it, and, at the same time, [`Self::check_replication`]
    /// (`DescribeTable` of each table), which refuses a global table that would let two
    /// Regions claim one key. In Lambda, init runs with a full CPU and, with provisioned
    /// concurrency, before any request. It finds a missing or forbidden table before an event
    /// does. It gives up after 2 s, well inside Lambda's 10 s init.
    ///
    /// ```no_run
    /// # async fn init() -> Result<(), Box<dyn std::error::Error>> {
    /// use lambda_idempotency::DynamoDbStore;
    ///
    /// let store = DynamoDbStore::for_lambda()?;
    /// if let Err(err) = store.prime().await {
    ///     if !err.is_transient() {
    ///         return Err(err.into()); // a missing table or permission: fail the init
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::TableNotFound`], [`StoreError::UniquenessTableNotFound`],
    /// [`StoreError::AccessDenied`] (the role needs `dynamodb:DescribeTable` too),
    /// [`StoreError::Rejected`] (the table's key schema is not the store's),
    /// [`StoreError::EventuallyConsistentReplicas`], [`StoreError::TransactionsUnsupported`],
    /// or a transient error ([`StoreError::is_transient`]: throttled, unavailable, or no answer
    /// within 2 s) that the first event's own requests will retry (a replication check left
    /// undone by one is done by the next cold start's).
    pub async fn prime(&self) -> Result<(), StoreError> {
        let key = OperationKey::from_stored(PRIME_KEY);
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.names.key(&key)))
            .projection_expression("#pk")
            .expression_attribute_names("#pk", &self.names.partition_key)
            .send();
        let read = async {
            read.await
                .map(drop)
                .map_err(|err| map_sdk_error("prime", &self.table, err))
        };
        let (read, checked) = futures_util::future::join(
            within(PRIME_TIMEOUT, read),
            within(PRIME_TIMEOUT, async {
                self.check_replication().await.map(drop)
            }),
        )
        .await;
        // A lasting error first: it fails the init; a transient one leaves it to the events.
        match (read, checked) {
            (Err(err), _) | (_, Err(err)) if !err.is_transient() => Err(err),
            (read, checked) => read.and(checked),
        }
    }

    /// Keeps permanent evidence of business identities in `table`.
    pub fn with_uniqueness_table(mut self, table: impl Into<String>) -> Self {
        self.uniqueness_table = Some(table.into());
        self.verdict = replication::Verdict::default();
        self
    }

    /// Whether a claim that declares a business identity also looks for the evidence versions
    /// before 0.2 kept under the bare identity (default `true`). Those versions did not scope
    /// evidence by namespace and tenant ([`IdentityScope`](crate::key::IdentityScope)); with
    /// the check, such evidence of an operation in the claim's scope still refuses it (one
    /// more `ConditionCheck` item in the claim's transaction, which needs
    /// `dynamodb:ConditionCheckItem` on the uniqueness table). Turn it off only on a uniqueness
    /// table that no version before 0.2 wrote to.
    pub fn with_unscoped_evidence_check(mut self, check: bool) -> Self {
        self.unscoped_evidence = check;
        self
    }

    /// Renames the attributes (the key and TTL attributes must match the table).
    pub fn with_attribute_names(mut self, names: AttributeNames) -> Self {
        self.names = names;
        self
    }

    /// Chooses where outcomes are kept: inline in a record up to 1 KB, compressed, then in
    /// part items beside it by default (see [`OutcomeStorage`]).
    pub fn with_outcome_storage(mut self, outcomes: OutcomeStorage) -> Self {
        self.outcomes = outcomes;
        self
    }

    /// The SDK client (to reuse its configuration for the handler's own tables).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The idempotency table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The uniqueness table's name, if configured.
    pub fn uniqueness_table(&self) -> Option<&str> {
        self.uniqueness_table.as_deref()
    }

    fn uniqueness(&self) -> Result<&str, StoreError> {
        self.uniqueness_table
            .as_deref()
            .ok_or(StoreError::NoUniquenessTable)
    }

    /// The not-found error for `table`, named by its role.
    fn not_found(&self, table: &str) -> StoreError {
        let table = table.to_owned();
        if self.uniqueness_table.as_deref() == Some(table.as_str()) {
            StoreError::UniquenessTableNotFound { table }
        } else {
            StoreError::TableNotFound { table }
        }
    }

    /// The record in `item`; an outcome kept in part items is read as `parts` says.
    async fn decode(
        &self,
        item: Option<&Item>,
        parts: Parts<'_>,
    ) -> Result<Option<Record>, StoreError> {
        let Some(item) = item else {
            return Ok(None);
        };
        let (mut record, manifest) = self.names.decode(item)?;
        if let Some(manifest) = manifest
            && let Some(refs) = manifest.parts()
        {
            match parts {
                Parts::Known(placement, settlement) if placement.describes(&manifest) => {
                    record.outcome.clone_from(&settlement.outcome);
                }
                parts if parts.reads(&record) => {
                    let stored = self.read_parts(&record.key, refs).await?;
                    record.outcome = Some(manifest.restore(stored, &record.key)?);
                }
                _ => {}
            }
        }
        Ok(Some(record))
    }

    /// The record's condition and names/values for a guard.
    fn guard(&self, guard: Guard<'_>) -> (&'static str, Expr) {
        let expr = Expr::default().name("#status", &self.names.status);
        match guard {
            Guard::Lease(token) => (
                "#status = :in_progress AND #lease_token = :mine",
                expr.name("#lease_token", &self.names.lease_token)
                    .value(":in_progress", s(Status::InProgress.as_str()))
                    .value(":mine", s(token)),
            ),
            Guard::Indeterminate => (
                "#status = :indeterminate",
                expr.value(":indeterminate", s(Status::Indeterminate.as_str())),
            ),
            Guard::Expired { token, now } => (
                "#status = :in_progress AND #lease_token = :mine AND #lease_expires_at < :now_ms",
                expr.name("#lease_token", &self.names.lease_token)
                    .name("#lease_expires_at", &self.names.lease_expires_at)
                    .value(":in_progress", s(Status::InProgress.as_str()))
                    .value(":mine", s(token))
                    .value(":now_ms", millis(now)),
            ),
        }
    }

    /// The condition that the record is still as an operator saw it (the same status and lease
    /// token), or, when it saw none, that it is absent or settled and expired.
    fn as_seen(&self, seen: Option<&Record>, now: SystemTime) -> (&'static str, Expr) {
        let names = &self.names;
        let expr = Expr::default().name("#status", &names.status);
        match seen {
            Some(seen) if seen.status == Status::InProgress => (
                "#status = :seen_status AND #lease_token = :seen_token AND #lease_expires_at < :now_ms",
                expr.name("#lease_token", &names.lease_token)
                    .name("#lease_expires_at", &names.lease_expires_at)
                    .value(":seen_status", s(seen.status.as_str()))
                    .value(":seen_token", s(&seen.lease.token))
                    .value(":now_ms", millis(now)),
            ),
            Some(seen) => (
                "#status = :seen_status AND #lease_token = :seen_token",
                expr.name("#lease_token", &names.lease_token)
                    .value(":seen_status", s(seen.status.as_str()))
                    .value(":seen_token", s(&seen.lease.token)),
            ),
            None => (
                "attribute_not_exists(#pk) OR (#expires_at < :now_s AND #status IN (:completed, :failed))",
                expr.name("#pk", &names.partition_key)
                    .name("#expires_at", &names.expires_at)
                    .value(":now_s", secs(now))
                    .value(":completed", s(Status::Completed.as_str()))
                    .value(":failed", s(Status::Failed.as_str())),
            ),
        }
    }

    /// The claim's `Put` of the record: only where no record stands that counts.
    fn claim_write(&self, record: &Record, now: SystemTime) -> Result<Write, StoreError> {
        let names = &self.names;
        Write::put(
            &self.table,
            names.encode(record),
            "attribute_not_exists(#pk) OR (#expires_at < :now_s AND #status IN (:completed, :failed))",
            Expr::default()
                .name("#pk", &names.partition_key)
                .name("#expires_at", &names.expires_at)
                .name("#status", &names.status)
                .value(":now_s", secs(now))
                .value(":completed", s(Status::Completed.as_str()))
                .value(":failed", s(Status::Failed.as_str())),
        )
    }

    /// Applies a claim's writes (the record first, then the evidence) and reads the answer.
    async fn claimed(
        &self,
        operation: &'static str,
        record: &Record,
        writes: Vec<Write>,
    ) -> Result<Claim, StoreError> {
        let Some(checks) = self.apply(operation, writes).await? else {
            return Ok(Claim::Acquired);
        };
        if let Some(existing) = checks.first().and_then(Check::failed_item) {
            // A record of another intent is a payload conflict: its parts are not read.
            let parts = Parts::ReplayableTo(&record.fingerprint);
            let existing =
                self.decode(existing, parts)
                    .await?
                    .ok_or_else(|| StoreError::CorruptRecord {
                        key_short: record.key.short().to_owned(),
                        reason: "the claim's condition failed but no existing item was returned"
                            .into(),
                    })?;
            return Ok(Claim::Existing(existing));
        }
        // The evidence (scoped, then unscoped) that refused the claim.
        match checks.iter().skip(1).find_map(Check::failed_item) {
            Some(Some(item)) => Ok(Claim::IdentityTaken(evidence::decode(item)?)),
            // The evidence an adoption expected is gone (an operator released it meanwhile):
            // a concurrent change, which the next delivery's fresh claim settles.
            Some(None) => Err(StoreError::Contention { operation }),
            None => Err(StoreError::CorruptRecord {
                key_short: record.key.short().to_owned(),
                reason: "the claim was cancelled but no condition reported the item that stood"
                    .into(),
            }),
        }
    }

    /// Applies a fenced write on the record (index 0) and, with an identity, on its evidence.
    /// A lost fence's record has its outcome read from part items as `parts` says.
    async fn fenced(
        &self,
        operation: &'static str,
        target: Target<'_>,
        writes: Vec<Write>,
        parts: Parts<'_>,
    ) -> Result<Fence, StoreError> {
        let Some(checks) = self.apply(operation, writes).await? else {
            return Ok(Fence::Held);
        };
        if let Some(current) = checks.first().and_then(Check::failed_item) {
            return Ok(Fence::Lost {
                current: self.decode(current, parts).await?.map(Box::new),
            });
        }
        Err(crate::store::memory::evidence_not_owned(target))
    }
}

/// How much of an outcome kept in part items a decoded record needs.
#[derive(Clone, Copy)]
enum Parts<'a> {
    /// Read the parts: the record may be answered from (replayed).
    Read,
    /// Read the parts only if the record may be replayed to a caller with this fingerprint;
    /// otherwise leave the outcome out (`None`): the caller's answer is a payload conflict,
    /// which costs no part read.
    ReplayableTo(&'a crate::key::Fingerprint),
    /// Leave the outcome out (`None`): only the record's state matters.
    Skip,
    /// The record is compared with this settlement: when its manifest names this placement's
    /// bytes, its outcome is the settlement's (the digest says so), without a read; otherwise
    /// it is left out.
    Known(&'a outcome::Placement, &'a Settlement),
}

impl Parts<'_> {
    /// Whether `record`'s outcome parts are read.
    fn reads(self, record: &Record) -> bool {
        match self {
            Self::Read => true,
            Self::ReplayableTo(fingerprint) => fingerprint.matches(&record.fingerprint),
            Self::Skip | Self::Known(..) => false,
        }
    }
}

/// The key [`DynamoDbStore::prime`] reads: not an operation key (those carry a version and a
/// hash), so it is never stored.
const PRIME_KEY: &str = "lambda-idempotency#prime";
/// How long [`DynamoDbStore::prime`] waits for its read.
const PRIME_TIMEOUT: Duration = Duration::from_secs(2);

/// `request`'s answer, or [`StoreError::Unavailable`] when it has none within `limit`.
async fn within(
    limit: Duration,
    request: impl Future<Output = Result<(), StoreError>>,
) -> Result<(), StoreError> {
    tokio::time::timeout(limit, request)
        .await
        .unwrap_or_else(|elapsed| {
            Err(StoreError::Unavailable {
                operation: "prime",
                source: Box::new(elapsed),
            })
        })
}

/// The idempotency table's name, from `IDEMPOTENCY_TABLE`.
fn table_from_env() -> Result<String, ConfigError> {
    std::env::var(TABLE_VAR).map_err(|_| ConfigError::MissingEnv {
        name: TABLE_VAR,
        hint: "set it to the idempotency table's name (template.yaml outputs it)",
    })
}

impl Store for DynamoDbStore {
    async fn claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        self.refused()?;
        let mut writes = vec![self.claim_write(record, now)?];
        if let Some(identity) = &record.identity {
            let uniqueness = self.uniqueness()?;
            writes.push(evidence::claim_write(uniqueness, record, identity)?);
            if self.unscoped_evidence {
                writes.extend(evidence::unscoped_check(uniqueness, identity)?);
            }
        }
        self.claimed("claim", record, writes).await
    }

    async fn adopt(
        &self,
        record: &Record,
        orphan: &Evidence,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        self.refused()?;
        let writes = vec![
            self.claim_write(record, now)?,
            evidence::adopt_write(self.uniqueness()?, orphan)?,
        ];
        self.claimed("adopt", record, writes).await
    }

    async fn take_over(
        &self,
        previous: &Record,
        lease: &Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> Result<Fence, StoreError> {
        let names = &self.names;
        let write = Write::update(
            &self.table,
            names.key(&previous.key),
            "SET #lease_token = :token, #attempt = :attempt, #lease_expires_at = :lease_expires_at, #expires_at = :expires_at",
            "#status = :in_progress AND #lease_token = :previous AND #lease_expires_at < :now_ms",
            Expr::default()
                .name("#status", &names.status)
                .name("#lease_token", &names.lease_token)
                .name("#attempt", &names.attempt)
                .name("#lease_expires_at", &names.lease_expires_at)
                .name("#expires_at", &names.expires_at)
                .value(":in_progress", s(Status::InProgress.as_str()))
                .value(":previous", s(&previous.lease.token))
                .value(":expires_at", secs(expires_at))
                .value(":now_ms", millis(now))
                .value(":token", s(&lease.token))
                .value(":attempt", n(u64::from(lease.attempt)))
                .value(":lease_expires_at", millis(lease.expires_at)),
        )?;
        let target = Target {
            key: &previous.key,
            identity: None,
            guard: Guard::Lease(&previous.lease.token),
        };
        // The record that stands may be answered from (replayed): read it whole.
        self.fenced("take_over", target, vec![write], Parts::Read)
            .await
    }

    async fn settle(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        let names = &self.names;
        let (condition, expr) = self.guard(target.guard);
        let mut update =
            "SET #status = :status, #expires_at = :expires_at, #completed_at = :completed_at"
                .to_owned();
        let mut expr = expr
            .name("#expires_at", &names.expires_at)
            .name("#completed_at", &names.completed_at)
            .value(":status", s(settlement.status.as_str()))
            .value(":expires_at", secs(settlement.expires_at))
            .value(":completed_at", millis(settlement.completed_at));
        let placement = self.outcomes.place(names, target, settlement)?;
        self.put_parts(target.key, &placement, settlement.expires_at)
            .await?;
        let mut removed = Vec::new();
        expr = expr
            .name("#outcome", &names.outcome)
            .name("#outcome_format", &names.outcome_format);
        match placement.inline_bytes(settlement) {
            Some(inline) => {
                update.push_str(", #outcome = :outcome");
                expr = expr.value(":outcome", inline);
            }
            None => removed.push("#outcome"),
        }
        match placement.manifest() {
            Some(manifest) => {
                update.push_str(", #outcome_format = :outcome_format");
                expr = expr.value(":outcome_format", manifest);
            }
            None => removed.push("#outcome_format"),
        }
        if let Some(audit) = &settlement.audit {
            update.push_str(", #audit = :audit");
            expr = expr
                .name("#audit", &names.audit)
                .value(":audit", item::audit_value(audit));
        }
        if !removed.is_empty() {
            update.push_str(" REMOVE ");
            update.push_str(&removed.join(", "));
        }
        let mut writes = vec![Write::update(
            &self.table,
            names.key(target.key),
            &update,
            condition,
            expr,
        )?];
        if let Some(identity) = target.identity {
            writes.push(evidence::settle_write(
                self.uniqueness()?,
                target,
                identity,
                settlement,
            )?);
        }
        // Lost: the caller only needs to know whether the record is its own settlement.
        self.fenced(
            "settle",
            target,
            writes,
            Parts::Known(&placement, settlement),
        )
        .await
    }

    async fn shorten(&self, target: Target<'_>, until: SystemTime) -> Result<Fence, StoreError> {
        let (condition, expr) = self.guard(target.guard);
        let write = Write::update(
            &self.table,
            self.names.key(target.key),
            "SET #lease_expires_at = :until",
            condition,
            expr.name("#lease_expires_at", &self.names.lease_expires_at)
                .value(":until", millis(until)),
        )?;
        let target = Target {
            identity: None,
            ..target
        };
        self.fenced("shorten", target, vec![write], Parts::Skip)
            .await
    }

    async fn release(&self, target: Target<'_>) -> Result<Fence, StoreError> {
        let (condition, expr) = self.guard(target.guard);
        let mut writes = vec![Write::delete(
            &self.table,
            self.names.key(target.key),
            condition,
            expr,
        )?];
        if let Some(identity) = target.identity {
            writes.push(evidence::release_write(
                self.uniqueness()?,
                target,
                identity,
            )?);
        }
        self.fenced("release", target, writes, Parts::Skip).await
    }

    async fn release_by_operator(
        &self,
        seen: Option<&Record>,
        evidence: Option<&Evidence>,
        released: &Record,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        let (condition, expr) = self.as_seen(seen, now);
        let mut writes = vec![Write::put(
            &self.table,
            self.names.encode(released),
            condition,
            expr,
        )?];
        if let Some(evidence) = evidence {
            writes.push(evidence::operator_delete_write(
                self.uniqueness()?,
                evidence,
            )?);
        }
        Ok(self.apply("release_by_operator", writes).await?.is_none())
    }

    async fn settle_evidence(
        &self,
        seen: &Evidence,
        settlement: &Settlement,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        // The record must still be gone: a redelivery that adopted the evidence holds a claim.
        let (condition, expr) = self.as_seen(None, now);
        let writes = vec![
            Write::check(&self.table, self.names.key(&seen.key), condition, expr)?,
            evidence::operator_settle_write(self.uniqueness()?, seen, settlement)?,
        ];
        Ok(self.apply("settle_evidence", writes).await?.is_none())
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<Record>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.names.key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|err| map_sdk_error("get", &self.table, err))?;
        self.decode(output.item(), Parts::Read).await
    }

    async fn evidence(&self, identity: &str) -> Result<Option<Evidence>, StoreError> {
        let table = self.uniqueness()?;
        let output = self
            .client
            .get_item()
            .table_name(table)
            .set_key(Some(evidence::key(identity)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|err| match map_sdk_error("evidence", table, err) {
                StoreError::TableNotFound { .. } => self.not_found(table),
                other => other,
            })?;
        output.item().map(evidence::decode).transpose()
    }
}
