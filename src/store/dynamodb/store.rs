//! The [`Store`] primitives on DynamoDB (the module's table says which request each makes),
//! and the helpers only they use: the guard and as-seen conditions, the claim's write, and
//! the reading of claimed and fenced answers.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::types::TransactWriteItem;
use futures_util::TryFutureExt;
use futures_util::future::BoxFuture;

use super::decode::Parts;
use super::error::map_sdk_error;
use super::item::{millis, n, s, secs};
use super::outcome::Placement;
use super::steps::{
    STEPS_VERSION_BUMP, TAKEOVER_OF_EXPIRED, bump_steps_version, list_as_read, steps_as_read,
    steps_value,
};
use super::writes::{Check, Expr, Write, sent};
use super::{DynamoDbStore, evidence, item};
use crate::error::StoreError;
use crate::key::{OperationKey, elsewhere};
use crate::record::{Evidence, Lease, Record, Settlement, Status, StepRecord};
use crate::store::{
    Answer, Claim, Committed, Fence, Guard, Request, Store, Target, TransactionalStore,
    writes_refused,
};

impl DynamoDbStore {
    /// The record's condition and names/values for a guard.
    pub(crate) fn guard(&self, guard: Guard<'_>) -> (Cow<'static, str>, Expr) {
        let expr = Expr::default().name("#status", &self.names.status);
        match guard {
            Guard::Lease(token) => (
                Cow::Borrowed("#status = :in_progress AND #lease_token = :mine"),
                expr.name("#lease_token", &self.names.lease_token)
                    .value(":in_progress", s(Status::InProgress.as_str()))
                    .value(":mine", s(token)),
            ),
            Guard::Indeterminate { token, attempt } => (
                Cow::Borrowed(
                    "#status = :indeterminate AND #lease_token = :mine AND #attempt = :seen_attempt",
                ),
                expr.name("#lease_token", &self.names.lease_token)
                    .name("#attempt", &self.names.attempt)
                    .value(":indeterminate", s(Status::Indeterminate.as_str()))
                    .value(":mine", s(token))
                    .value(":seen_attempt", n(u64::from(attempt))),
            ),
            Guard::Expired {
                token,
                attempt,
                now,
                steps_version,
                steps,
            } => {
                let expr = expr
                    .name("#lease_token", &self.names.lease_token)
                    .name("#lease_expires_at", &self.names.lease_expires_at)
                    .name("#attempt", &self.names.attempt)
                    .value(":in_progress", s(Status::InProgress.as_str()))
                    .value(":mine", s(token))
                    .value(":seen_attempt", n(u64::from(attempt)))
                    .value(":now_ms", millis(now));
                // A step its holder recorded after the operator looked fails the resolution,
                // a holder before 0.5 (which counts no step writes) included.
                let (steps, expr) = list_as_read(steps, steps_version, &self.names, expr);
                (
                    Cow::Owned(format!(
                        "#status = :in_progress AND #lease_token = :mine AND #attempt = :seen_attempt AND #lease_expires_at < :now_ms AND {steps}"
                    )),
                    expr,
                )
            }
        }
    }

    /// The condition that the record is still as an operator saw it (the same status, lease
    /// token and step list), or, when it saw none, that it is absent or settled and expired.
    fn as_seen(&self, seen: Option<&Record>, now: SystemTime) -> (Cow<'static, str>, Expr) {
        let names = &self.names;
        let expr = Expr::default().name("#status", &names.status);
        let Some(seen) = seen else {
            return (
                Cow::Borrowed(
                    "attribute_not_exists(#pk) OR (#expires_at < :now_s AND #status IN (:completed, :failed))",
                ),
                expr.name("#pk", &names.partition_key)
                    .name("#expires_at", &names.expires_at)
                    .value(":now_s", secs(now))
                    .value(":completed", s(Status::Completed.as_str()))
                    .value(":failed", s(Status::Failed.as_str())),
            );
        };
        let expr = expr
            .name("#lease_token", &names.lease_token)
            .name("#attempt", &names.attempt)
            .value(":seen_status", s(seen.status.as_str()))
            .value(":seen_token", s(&seen.lease.token))
            .value(":seen_attempt", n(u64::from(seen.lease.attempt)));
        let (steps, expr) = list_as_read(&seen.steps, seen.steps_version, names, expr);
        match seen.status {
            Status::InProgress => (
                Cow::Owned(format!(
                    "#status = :seen_status AND #lease_token = :seen_token AND #attempt = :seen_attempt AND #lease_expires_at < :now_ms AND {steps}"
                )),
                expr.name("#lease_expires_at", &names.lease_expires_at)
                    .value(":now_ms", millis(now)),
            ),
            _ => (
                Cow::Owned(format!(
                    "#status = :seen_status AND #lease_token = :seen_token AND #attempt = :seen_attempt AND {steps}"
                )),
                expr,
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
        let mut checks = checks.into_iter();
        if let Some(existing) = checks.next().and_then(Check::into_failed_item) {
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
        match checks.find_map(Check::into_failed_item) {
            Some(Some(item)) => Ok(Claim::IdentityTaken(evidence::decode(&item)?)),
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
        if let Some(current) = checks.into_iter().next().and_then(Check::into_failed_item) {
            return Ok(Fence::Lost {
                current: self.decode(current, parts).await?.map(Box::new),
            });
        }
        Err(StoreError::evidence_not_owned(target.key))
    }

    /// The writes of a settlement (the record's update, then the evidence's), and where its
    /// outcome goes: its parts (if any) are to be written first ([`Self::put_parts`]).
    pub(super) fn settlement_writes(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<(Vec<Write>, Placement), StoreError> {
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
        if let Some(steps) = &settlement.steps {
            update.push_str(", #steps = :steps, ");
            update.push_str(STEPS_VERSION_BUMP);
            expr = bump_steps_version(expr.name("#steps", &names.steps), names)
                .value(":steps", steps_value(steps));
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
            &condition,
            expr,
        )?];
        if let Some(identity) = target.identity {
            let uniqueness = self.uniqueness()?;
            writes.push(match settlement.releases_identity {
                true => evidence::release_write(uniqueness, target, identity)?,
                false => evidence::settle_write(uniqueness, target, identity, settlement)?,
            });
        }
        Ok((writes, placement))
    }
}

impl DynamoDbStore {
    /// The record of `key` (a consistent read), its outcome's parts read as `parts` says, all
    /// its attributes or only those `projection` names (an expression and its names).
    async fn get_with(
        &self,
        key: &OperationKey,
        parts: Parts<'_>,
        projection: Option<(String, HashMap<String, String>)>,
    ) -> Result<Option<Record>, StoreError> {
        let (projection, names) = projection.unzip();
        let output = sent(
            self.client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(self.names.key(key)))
                .consistent_read(true)
                .set_projection_expression(projection)
                .set_expression_attribute_names(names)
                .send(),
        )
        .await
        .map_err(|err| map_sdk_error("get", &self.table, err))?;
        self.decode(output.item, parts).await
    }

    /// The record of `key` as its summary ([`AttributeNames::summary`](super::AttributeNames)):
    /// what its status, lease and times say, with no outcome, steps or audit read (a
    /// `GetItem` projected to those attributes, strongly consistent).
    pub(crate) async fn get_summary(
        &self,
        key: &OperationKey,
    ) -> Result<Option<Record>, StoreError> {
        let projection = self.names.summary_projection();
        self.get_with(key, Parts::Skip, Some(projection)).await
    }
}

impl Store for DynamoDbStore {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        match request {
            Request::Claim { record, now } => {
                Box::pin(self.send_claim(record, now).map_ok(Answer::Claim))
            }
            Request::Adopt {
                record,
                orphan,
                now,
            } => Box::pin(self.send_adopt(record, orphan, now).map_ok(Answer::Claim)),
            Request::TakeOver {
                previous,
                lease,
                expires_at,
                now,
            } => Box::pin(
                self.send_take_over(previous, lease, expires_at, now)
                    .map_ok(Answer::Fence),
            ),
            Request::Shorten { target, until } => {
                Box::pin(self.send_shorten(target, until).map_ok(Answer::Fence))
            }
            Request::Settle { target, settlement } => {
                Box::pin(self.send_settle(target, settlement).map_ok(Answer::Fence))
            }
            Request::RecordSteps { target, steps } => {
                Box::pin(self.send_record_steps(target, steps).map_ok(Answer::Fence))
            }
            Request::Release { target } => {
                Box::pin(self.send_release(target).map_ok(Answer::Fence))
            }
            Request::ReleaseByOperator {
                seen,
                evidence,
                released,
                now,
            } => Box::pin(
                self.send_release_by_operator(seen, evidence, released, now)
                    .map_ok(Answer::Written),
            ),
            Request::SettleEvidence {
                seen,
                settlement,
                now,
            } => Box::pin(
                self.send_settle_evidence(seen, settlement, now)
                    .map_ok(Answer::Written),
            ),
            Request::Get { key } => {
                Box::pin(self.get_with(key, Parts::Kept, None).map_ok(Answer::Record))
            }
            Request::Evidence { identity } => {
                Box::pin(self.send_evidence(identity).map_ok(Answer::Evidence))
            }
        }
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        Some(self)
    }
}

/// Each core request as the DynamoDB requests it sends.
impl DynamoDbStore {
    async fn send_claim(&self, record: &Record, now: SystemTime) -> Result<Claim, StoreError> {
        self.checked_replication().await?;
        let mut writes = vec![self.claim_write(record, now)?];
        if let Some(identity) = &record.identity {
            let uniqueness = self.uniqueness()?;
            writes.push(evidence::claim_write(uniqueness, record, identity)?);
            writes.extend(evidence::global_before_0_5_check(uniqueness, identity)?);
            if self.unscoped_evidence {
                for place in elsewhere(identity, &record.key) {
                    writes.push(evidence::elsewhere_check(uniqueness, &place)?);
                }
            }
        }
        self.claimed("claim", record, writes).await
    }

    async fn send_adopt(
        &self,
        record: &Record,
        orphan: &Evidence,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        self.checked_replication().await?;
        let writes = vec![
            self.claim_write(record, now)?,
            evidence::adopt_write(self.uniqueness()?, orphan)?,
        ];
        self.claimed("adopt", record, writes).await
    }

    async fn send_take_over(
        &self,
        previous: &Record,
        lease: &Lease,
        expires_at: SystemTime,
        now: SystemTime,
    ) -> Result<Fence, StoreError> {
        let names = &self.names;
        // The steps as the taker read them: a late write of the expired holder (an intent, a
        // result, a commit, a withdrawal: any change of the list) between that read and this
        // takeover fails it, so that the taker never starts from steps older than the record's.
        // Conditioned on what writers store for that purpose (the list's write count, its
        // length, each pending step's attempt), never on the list's bytes, which another build
        // encodes otherwise.
        let (steps_as_read, steps_expr) = steps_as_read(previous, names);
        let write = Write::update(
            &self.table,
            names.key(&previous.key),
            "SET #lease_token = :token, #attempt = :attempt, #lease_expires_at = :lease_expires_at, #expires_at = :expires_at",
            &format!("{TAKEOVER_OF_EXPIRED} AND {steps_as_read}"),
            steps_expr
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

    async fn send_settle(
        &self,
        target: Target<'_>,
        settlement: &Settlement,
    ) -> Result<Fence, StoreError> {
        let (writes, placement) = self.settlement_writes(target, settlement)?;
        self.put_parts(target.key, &placement, settlement.expires_at)
            .await?;
        // Lost: the caller only needs to know whether the record is its own settlement.
        self.fenced(
            "settle",
            target,
            writes,
            Parts::Known(&placement, settlement),
        )
        .await
    }

    async fn send_shorten(
        &self,
        target: Target<'_>,
        until: SystemTime,
    ) -> Result<Fence, StoreError> {
        let (condition, expr) = self.guard(target.guard);
        // Never later: a lease already at or before `until` stands as it is.
        let write = Write::update(
            &self.table,
            self.names.key(target.key),
            "SET #lease_expires_at = :until",
            &format!("{condition} AND #lease_expires_at > :until"),
            expr.name("#lease_expires_at", &self.names.lease_expires_at)
                .value(":until", millis(until)),
        )?;
        let target = Target {
            identity: None,
            ..target
        };
        match self
            .fenced("shorten", target, vec![write], Parts::Skip)
            .await?
        {
            Fence::Lost {
                current: Some(current),
            } if target.guard.admits(&current) && current.lease.expires_at <= until => {
                Ok(Fence::Held)
            }
            fence => Ok(fence),
        }
    }

    async fn send_record_steps(
        &self,
        target: Target<'_>,
        steps: &[StepRecord],
    ) -> Result<Fence, StoreError> {
        let (condition, expr) = self.guard(target.guard);
        let write = Write::update(
            &self.table,
            self.names.key(target.key),
            &format!("SET #steps = :steps, {STEPS_VERSION_BUMP}"),
            &condition,
            bump_steps_version(expr.name("#steps", &self.names.steps), &self.names)
                .value(":steps", steps_value(steps)),
        )?;
        let target = Target {
            identity: None,
            ..target
        };
        self.fenced("record_steps", target, vec![write], Parts::Skip)
            .await
    }

    async fn send_release(&self, target: Target<'_>) -> Result<Fence, StoreError> {
        let (condition, expr) = self.guard(target.guard);
        let mut writes = vec![Write::delete(
            &self.table,
            self.names.key(target.key),
            &condition,
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

    async fn send_release_by_operator(
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
            &condition,
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

    async fn send_settle_evidence(
        &self,
        seen: &Evidence,
        settlement: &Settlement,
        now: SystemTime,
    ) -> Result<bool, StoreError> {
        // The record must still be gone: a redelivery that adopted the evidence holds a claim.
        let (condition, expr) = self.as_seen(None, now);
        let writes = vec![
            Write::check(&self.table, self.names.key(&seen.key), &condition, expr)?,
            evidence::operator_settle_write(self.uniqueness()?, seen, settlement)?,
        ];
        Ok(self.apply("settle_evidence", writes).await?.is_none())
    }

    async fn send_evidence(&self, identity: &str) -> Result<Option<Evidence>, StoreError> {
        let table = self.uniqueness()?;
        let output = sent(
            self.client
                .get_item()
                .table_name(table)
                .set_key(Some(evidence::key(identity)))
                .consistent_read(true)
                .send(),
        )
        .await
        .map_err(|err| match map_sdk_error("evidence", table, err) {
            StoreError::TableNotFound { .. } => self.not_found(table),
            other => other,
        })?;
        output.item().map(evidence::decode).transpose()
    }
}

impl TransactionalStore for DynamoDbStore {
    fn commit<'a>(
        &'a self,
        request: Request<'a>,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        match request {
            Request::RecordSteps { target, steps } => {
                Box::pin(self.commit_steps(target, steps, writes, token))
            }
            Request::Settle { target, settlement } => {
                Box::pin(self.settle_committing(target, settlement, writes, token))
            }
            other => Box::pin(async move { Ok(writes_refused(other)) }),
        }
    }

    /// Checks the tables' replication unless a check (`prime`'s) already described the
    /// idempotency table: a table's consistency mode cannot change.
    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            if !self.described() {
                self.check_replication().await?;
            }
            match self.strongly_consistent_table() {
                Some(table) => Err(StoreError::TransactionalWritesUnsupported {
                    table: table.to_owned(),
                }),
                None => Ok(()),
            }
        })
    }
}
