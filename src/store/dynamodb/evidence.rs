//! The uniqueness table: permanent evidence of business identities, one item each, no TTL.

use super::item::{Decoder, Item, audit_value, corrupt, millis, n, read_audit, read_s, s};
use super::writes::{Expr, Write};
use crate::error::StoreError;
use crate::key::{Elsewhere, Fingerprint, OperationKey, Refusing, Scoped, global_before_0_5};
use crate::record::{Evidence, Record, Settlement, Status};
use crate::store::Target;

/// Attribute names of the uniqueness table.
const IDENTITY: &str = "pk";
const OPERATION_KEY: &str = "operation_key";
const FINGERPRINT: &str = "fingerprint";
const KEY_RULE: &str = "key_rule";
const STATUS: &str = "status";
const RESULT_REF: &str = "result_ref";
const CREATED_AT: &str = "created_at";
const COMPLETED_AT: &str = "completed_at";
const AUDIT: &str = "audit";

/// The primary key of `identity`'s item.
pub(crate) fn key(identity: &str) -> Item {
    Item::from([(IDENTITY.to_owned(), s(identity))])
}

/// The item of `evidence`.
fn encode(evidence: &Evidence) -> Item {
    let mut item = key(&evidence.identity);
    item.insert(OPERATION_KEY.to_owned(), s(evidence.key.as_str()));
    item.insert(FINGERPRINT.to_owned(), s(evidence.fingerprint.as_str()));
    if let Some(rule) = evidence.fingerprint.rule().stored() {
        item.insert(KEY_RULE.to_owned(), n(u64::from(rule)));
    }
    item.insert(STATUS.to_owned(), s(evidence.status.as_str()));
    item.insert(CREATED_AT.to_owned(), millis(evidence.created_at));
    if let Some(result_ref) = &evidence.result_ref {
        item.insert(RESULT_REF.to_owned(), s(result_ref));
    }
    if let Some(completed_at) = evidence.completed_at {
        item.insert(COMPLETED_AT.to_owned(), millis(completed_at));
    }
    if let Some(audit) = &evidence.audit {
        item.insert(AUDIT.to_owned(), audit_value(audit));
    }
    item
}

/// The evidence in `item`.
pub(crate) fn decode(item: &Item) -> Result<Evidence, StoreError> {
    let key = OperationKey::from_stored(
        read_s(item, OPERATION_KEY).map_err(|reason| corrupt("?", reason))?,
    );
    let decoder = Decoder { item, key: &key };
    let status = decoder.s(STATUS)?;
    let status = Status::parse(status)
        .ok_or_else(|| corrupt(key.short(), format!("unknown evidence status `{status}`")))?;
    Ok(Evidence {
        identity: decoder.s(IDENTITY)?.to_owned(),
        fingerprint: Fingerprint::from_stored_under(
            decoder.s(FINGERPRINT)?,
            decoder.key_rule(KEY_RULE)?,
        ),
        status,
        result_ref: decoder.optional(RESULT_REF, |value| value.as_s().ok().cloned())?,
        created_at: decoder.millis(CREATED_AT)?,
        completed_at: decoder.optional_millis(COMPLETED_AT)?,
        audit: decoder.optional(AUDIT, read_audit)?,
        key,
    })
}

/// The claim's `Put` of new evidence: only where none stands.
pub(crate) fn claim_write(
    table: &str,
    record: &Record,
    identity: &str,
) -> Result<Write, StoreError> {
    Write::put(
        table,
        encode(&Evidence::of_claim(record, identity)),
        "attribute_not_exists(#pk)",
        Expr::default().name("#pk", IDENTITY),
    )
}

/// The claim's check on evidence of this identity kept in another form ([`Elsewhere`]: under
/// another identity scope, before a deploy changed it, or under
/// the bare identity before 0.2): such evidence of an operation the claim's scope shares the
/// identity with refuses the claim as its own evidence does; another's does not.
pub(crate) fn elsewhere_check(table: &str, place: &Elsewhere) -> Result<Write, StoreError> {
    let expr = Expr::default().name("#pk", IDENTITY);
    let (condition, expr) = match &place.refusing {
        Refusing::Anyone => ("attribute_not_exists(#pk)", expr),
        Refusing::Namespace(namespace) => (
            "attribute_not_exists(#pk) OR NOT begins_with(#operation_key, :namespace)",
            expr.name("#operation_key", OPERATION_KEY)
                .value(":namespace", s(&format!("{namespace}#"))),
        ),
        Refusing::Tenant { namespace, tenant } => (
            "attribute_not_exists(#pk) OR NOT (begins_with(#operation_key, :namespace) AND contains(#operation_key, :tenant))",
            expr.name("#operation_key", OPERATION_KEY)
                .value(":namespace", s(&format!("{namespace}#")))
                .value(":tenant", s(&format!("#t={tenant}#"))),
        ),
    };
    Write::check(table, key(&place.evidence_key), condition, expr)
}

/// The claim's check on evidence that versions 0.2 to 0.4 kept for a global identity holding
/// a `#` under the bare identity (0.5 keeps it under `#g#{identity}`): such evidence refuses
/// the claim, unless it is the scoped evidence the identity spells (a key such as
/// `billing#t=acme#id=invoice:o-1` belongs to acme's operation in `billing`, never to a global
/// identity). `None` for an evidence key in another form. (A 0.4 global identity that spells
/// the scoped key of its own namespace and tenant cannot be told from that scoped evidence: it
/// is read as scoped, and refuses nothing.)
pub(crate) fn global_before_0_5_check(
    table: &str,
    evidence_key: &str,
) -> Result<Option<Write>, StoreError> {
    let Some(bare) = global_before_0_5(evidence_key) else {
        return Ok(None);
    };
    let expr = Expr::default().name("#pk", IDENTITY);
    let (condition, expr) = match Scoped::parse(bare) {
        Some(scoped) => {
            let expr = expr
                .name("#operation_key", OPERATION_KEY)
                .value(":namespace", s(&format!("{}#", scoped.namespace)));
            match scoped.tenant {
                Some(tenant) => (
                    "attribute_not_exists(#pk) OR (begins_with(#operation_key, :namespace) AND contains(#operation_key, :tenant))",
                    expr.value(":tenant", s(&format!("#t={tenant}#"))),
                ),
                None => (
                    "attribute_not_exists(#pk) OR begins_with(#operation_key, :namespace)",
                    expr,
                ),
            }
        }
        None => ("attribute_not_exists(#pk)", expr),
    };
    Write::check(table, key(bare), condition, expr).map(Some)
}

/// An adoption's `Update` of the evidence: it must still be the orphan's (this operation's,
/// IN_PROGRESS, created when the orphan was); it stays as it is.
pub(crate) fn adopt_write(table: &str, orphan: &Evidence) -> Result<Write, StoreError> {
    let expr = Expr::default()
        .name("#operation_key", OPERATION_KEY)
        .name("#status", STATUS)
        .name("#created_at", CREATED_AT)
        .value(":key", s(orphan.key.as_str()))
        .value(":in_progress", s(Status::InProgress.as_str()))
        .value(":created_at", millis(orphan.created_at));
    Write::update(
        table,
        key(&orphan.identity),
        "SET #status = :in_progress",
        "#operation_key = :key AND #status = :in_progress AND #created_at = :created_at",
        expr,
    )
}

/// The settlement's `Update` of the evidence, conditioned on it being this operation's.
pub(crate) fn settle_write(
    table: &str,
    target: Target<'_>,
    identity: &str,
    settlement: &Settlement,
) -> Result<Write, StoreError> {
    let (update, expr) = settled(settlement, owned(target));
    Write::update(table, key(identity), &update, OWNED, expr)
}

/// The update expression that settles evidence as `settlement` says, on `expr`.
fn settled(settlement: &Settlement, expr: Expr) -> (String, Expr) {
    let mut update = "SET #status = :status, #completed_at = :completed_at".to_owned();
    let mut expr = expr
        .name("#status", STATUS)
        .name("#completed_at", COMPLETED_AT)
        .name("#result_ref", RESULT_REF)
        .name("#audit", AUDIT)
        .value(":status", s(settlement.status.as_str()))
        .value(":completed_at", millis(settlement.completed_at));
    let mut removed = Vec::new();
    match &settlement.result_ref {
        Some(result_ref) => {
            update.push_str(", #result_ref = :result_ref");
            expr = expr.value(":result_ref", s(result_ref));
        }
        None => removed.push("#result_ref"),
    }
    match &settlement.audit {
        Some(audit) => {
            update.push_str(", #audit = :audit");
            expr = expr.value(":audit", audit_value(audit));
        }
        None => removed.push("#audit"),
    }
    if !removed.is_empty() {
        update.push_str(" REMOVE ");
        update.push_str(&removed.join(", "));
    }
    (update, expr)
}

/// The condition that the evidence is still as an operator saw it: the same operation and
/// status, created at the same moment.
const AS_SEEN: &str =
    "#operation_key = :key AND #status = :seen_status AND #created_at = :created_at";

fn as_seen(seen: &Evidence) -> Expr {
    Expr::default()
        .name("#operation_key", OPERATION_KEY)
        .name("#status", STATUS)
        .name("#created_at", CREATED_AT)
        .value(":key", s(seen.key.as_str()))
        .value(":seen_status", s(seen.status.as_str()))
        .value(":created_at", millis(seen.created_at))
}

/// An operator's `Update` of evidence whose record is gone, as `settlement` says.
pub(crate) fn operator_settle_write(
    table: &str,
    seen: &Evidence,
    settlement: &Settlement,
) -> Result<Write, StoreError> {
    let (update, expr) = settled(settlement, as_seen(seen));
    Write::update(table, key(&seen.identity), &update, AS_SEEN, expr)
}

/// An operator's `Delete` of evidence, as it saw it (a release: the next delivery runs).
pub(crate) fn operator_delete_write(table: &str, seen: &Evidence) -> Result<Write, StoreError> {
    Write::delete(table, key(&seen.identity), AS_SEEN, as_seen(seen))
}

/// The release's `Delete` of the evidence, conditioned on it being this operation's.
pub(crate) fn release_write(
    table: &str,
    target: Target<'_>,
    identity: &str,
) -> Result<Write, StoreError> {
    Write::delete(table, key(identity), OWNED, owned(target))
}

/// The condition that the evidence belongs to the target's operation.
const OWNED: &str = "#operation_key = :key";

fn owned(target: Target<'_>) -> Expr {
    Expr::default()
        .name("#operation_key", OPERATION_KEY)
        .value(":key", s(target.key.as_str()))
}
