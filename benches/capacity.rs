//! The capacity and cost of each path, in DynamoDB write and read units.
//!
//! ```text
//! cargo bench --bench capacity --features testing
//! ```
//!
//! 1. **Outcome inline, uncompressed**: the record layout before `OutcomeStorage` (and the
//!    one Powertools uses), computed from the item sizes (`AttributeNames::item_size`) for
//!    outcomes of 100 B, 4 KB, 100 KB and the largest that fitted, for every path, beside
//!    Powertools' request pattern with its item layout. This model was checked write by write
//!    against the server's `ConsumedCapacity` while the store wrote that layout.
//! 2. **`OutcomeStorage` (the default now), measured** on the embedded DynamoDB-compatible
//!    server, for outcomes of 100 B to 5 MB, JSON (compressible) and random text: the
//!    first execution's write units as the server reports them (claim, parts, settlement); a
//!    duplicate's failed claim, billed by the record that stands (read back from the table:
//!    a refused write's error carries no `ConsumedCapacity`, in DynamoDB as here), and its
//!    reads as the server reports them; with the same figures for the inline layout beside.
//!
//! DynamoDB's rules, as the model applies them: a write costs one unit per started KB of the
//! larger of the item before and after it, also when its condition fails; a delete, the item
//! it removes; every item of a `TransactWriteItems` costs double, also when the transaction is
//! cancelled. On-demand prices: us-east-1, standard table class.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextMut,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemOutput;
use aws_sdk_dynamodb::operation::get_item::GetItemOutput;
use aws_sdk_dynamodb::operation::put_item::PutItemOutput;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use lambda_idempotency::testing::{dynamo, local, outcomes};
use lambda_idempotency::{Idempotency, Invocation};
use serde_json::Value;

use lambda_idempotency::OperationKey;
use lambda_idempotency::key::{Fingerprint, KeyRule};
use lambda_idempotency::record::{Lease, Record, Status};
use lambda_idempotency::store::AttributeNames;

/// US dollars per million write request units (on demand, us-east-1).
const DOLLARS_PER_MILLION_WRITES: f64 = 0.625;
/// US dollars per million read request units (on demand, us-east-1).
const DOLLARS_PER_MILLION_READS: f64 = 0.125;
/// The outcome sizes measured with `OutcomeStorage`.
const MEASURED: [(&str, usize); 6] = [
    ("100 B", 100),
    ("4 KB", 4 * 1024),
    ("100 KB", 100 * 1024),
    ("398 KB", 398 * 1024),
    ("1 MB", 1024 * 1024),
    ("5 MB", 5 * 1024 * 1024),
];
/// The outcome sizes modelled; the last is the largest the store keeps with this key.
const OUTCOMES: [(&str, usize); 4] = [
    ("100 B", 100),
    ("4 KB", 4 * 1024),
    ("100 KB", 100 * 1024),
    ("max ~398 KB", 398 * 1024),
];

/// One request's item sizes: before and after it (0: no item).
#[derive(Clone, Copy)]
struct Write {
    before: usize,
    after: usize,
    transaction: bool,
}

impl Write {
    fn units(self) -> u64 {
        let larger = self.before.max(self.after).max(1);
        let units = larger.div_ceil(1024) as u64;
        if self.transaction { 2 * units } else { units }
    }
}

fn put(before: usize, after: usize) -> Write {
    Write {
        before,
        after,
        transaction: false,
    }
}

fn transact(before: usize, after: usize) -> Write {
    Write {
        before,
        after,
        transaction: true,
    }
}

/// The sizes of this crate's items for an outcome of `outcome` bytes.
struct Ours {
    claim: usize,
    settled: usize,
    released_failure: usize,
    evidence: usize,
    settled_evidence: usize,
}

impl Ours {
    fn new(outcome: usize) -> Self {
        let names = AttributeNames::default();
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_946_400_123);
        let claim = Record {
            // A function name as namespace, the operation, the version, the SHA-256.
            key: OperationKey::from_stored(format!(
                "orders-prod-place#place-order#v1#{}",
                "a".repeat(64)
            )),
            status: Status::InProgress,
            fingerprint: Fingerprint::from_stored_under("b".repeat(64), KeyRule::CURRENT),
            lease: Lease {
                token: "6f1c2a9e-3b7d-4c1e-9a8f-0d2e4b6c8a10".into(),
                attempt: 1,
                expires_at: at + Duration::from_secs(35),
            },
            expires_at: at + Duration::from_secs(86_435),
            outcome: None,
            created_at: at,
            completed_at: None,
            request_id: Some("c0ffee00-1234-4abc-9def-0123456789ab".into()),
            identity: None,
            audit: None,
            steps: Vec::new(),
            steps_version: 0,
        };
        let settled = Record {
            status: Status::Completed,
            outcome: Some(vec![b'x'; outcome]),
            completed_at: Some(at + Duration::from_millis(40)),
            ..claim.clone()
        };
        let failure = Record {
            status: Status::Failed,
            outcome: Some(vec![b'x'; 120]),
            completed_at: Some(at + Duration::from_millis(40)),
            ..claim.clone()
        };
        // The uniqueness table's item: pk (the identity under its scope), operation_key,
        // fingerprint, status, created_at (and completed_at, result_ref once settled); names
        // are fixed.
        let identity = "orders-prod-place#id=invoice:o-418:rev-2";
        let evidence = ("pk".len() + identity.len())
            + ("operation_key".len() + claim.key.as_str().len())
            + ("fingerprint".len() + 64)
            + ("status".len() + "IN_PROGRESS".len())
            + ("created_at".len() + 8);
        let settled_evidence = evidence - "IN_PROGRESS".len()
            + "COMPLETED".len()
            + ("completed_at".len() + 8)
            + ("result_ref".len() + "inv-0000418".len());
        Self {
            claim: names.item_size(&claim),
            settled: names.item_size(&settled),
            released_failure: names.item_size(&failure),
            evidence,
            settled_evidence,
        }
    }

    /// Each path's writes.
    fn paths(&self) -> Vec<(&'static str, Vec<Write>)> {
        let (claim, settled) = (self.claim, self.settled);
        vec![
            ("first execution", vec![put(0, claim), put(claim, settled)]),
            ("duplicate", vec![put(settled, claim)]),
            (
                "handler failure, retryable (released)",
                vec![put(0, claim), put(claim, 0)],
            ),
            (
                "handler failure, terminal (retained)",
                vec![put(0, claim), put(claim, self.released_failure)],
            ),
            (
                "takeover of a crashed claim, then completion",
                vec![put(claim, claim), put(claim, claim), put(claim, settled)],
            ),
            (
                "first execution, business identity",
                vec![
                    transact(0, claim),
                    transact(0, self.evidence),
                    // The check of the evidence versions before 0.2 kept under the bare
                    // identity (an absent item: one unit, transactional).
                    transact(0, 0),
                    transact(claim, settled),
                    transact(self.evidence, self.settled_evidence),
                ],
            ),
            (
                "duplicate, business identity",
                vec![
                    transact(settled, claim),
                    transact(self.settled_evidence, self.evidence),
                ],
            ),
            ("duplicate, in-process cache hit", vec![]),
        ]
    }
}

/// Powertools' items (id, expiration, in_progress_expiration, status, data as a JSON
/// string, validation) for the same outcome, and the same request counts.
fn powertools(outcome: usize) -> Vec<(&'static str, Vec<Write>)> {
    let id = "id".len() + "orders-prod-place.app.handler#".len() + 32; // md5 hex by default
    let claim = id
        + ("expiration".len() + 6)
        + ("in_progress_expiration".len() + 8)
        + ("status".len() + "INPROGRESS".len());
    let settled = claim - "INPROGRESS".len() + "COMPLETED".len() + "data".len() + outcome;
    vec![
        ("first execution", vec![put(0, claim), put(claim, settled)]),
        ("duplicate", vec![put(settled, claim)]),
        (
            "handler failure, retryable (released)",
            vec![put(0, claim), put(claim, 0)],
        ),
    ]
}

fn units(writes: &[Write]) -> u64 {
    writes.iter().map(|write| write.units()).sum()
}

fn dollars_per_million(units: u64) -> f64 {
    units as f64 * DOLLARS_PER_MILLION_WRITES
}

/// Asks every request for `ConsumedCapacity` and keeps what each successful one reports, in
/// order: `(read, units)`.
#[derive(Debug, Clone, Default)]
struct Consumed(Arc<Mutex<Vec<(bool, f64)>>>);

impl Consumed {
    /// The write and read units reported since the last call.
    fn take(&self) -> (f64, f64) {
        let taken = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        let sum = |reads: bool| {
            taken
                .iter()
                .filter(|(read, _)| *read == reads)
                .map(|(_, units)| units)
                .sum::<f64>()
                + 0.0
        };
        (sum(false), sum(true))
    }
}

impl Intercept for Consumed {
    fn name(&self) -> &'static str {
        "Consumed"
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request_mut();
        let Some(mut body) = request
            .body()
            .bytes()
            .and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok())
        else {
            return Ok(());
        };
        body["ReturnConsumedCapacity"] = Value::from("TOTAL");
        let body = serde_json::to_vec(&body)?;
        request
            .headers_mut()
            .insert("content-length", body.len().to_string());
        *request.body_mut() = body.into();
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Ok(output) = context.output_or_error() else {
            return Ok(());
        };
        let (read, capacity) = if let Some(put) = output.downcast_ref::<PutItemOutput>() {
            (
                false,
                put.consumed_capacity().cloned().into_iter().collect(),
            )
        } else if let Some(update) = output.downcast_ref::<UpdateItemOutput>() {
            (
                false,
                update.consumed_capacity().cloned().into_iter().collect(),
            )
        } else if let Some(delete) = output.downcast_ref::<DeleteItemOutput>() {
            (
                false,
                delete.consumed_capacity().cloned().into_iter().collect(),
            )
        } else if let Some(transaction) = output.downcast_ref::<TransactWriteItemsOutput>() {
            (false, transaction.consumed_capacity().to_vec())
        } else if let Some(get) = output.downcast_ref::<GetItemOutput>() {
            (true, get.consumed_capacity().cloned().into_iter().collect())
        } else {
            (false, Vec::new())
        };
        let units: f64 = capacity.iter().filter_map(|c| c.capacity_units()).sum();
        if !capacity.is_empty() {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((read, units));
        }
        Ok(())
    }
}

/// One outcome's figures with `OutcomeStorage`.
struct Measured {
    first_writes: f64,
    record_bytes: usize,
    duplicate_writes: u64,
    duplicate_reads: f64,
    duplicate_round_trips: usize,
}

/// Runs a first execution and its duplicate through the engine on the embedded server with the
/// default `OutcomeStorage`, for each outcome size and kind, and prints what they cost beside
/// the inline layout.
async fn measure_outcome_storage() -> Result<(), BoxError> {
    let db = dynamo::start().await;
    let consumed = Consumed::default();
    let client = aws_sdk_dynamodb::Client::from_conf(
        local::config_for(db.endpoint.clone())
            .interceptor(consumed.clone())
            .interceptor(db.requests.clone())
            .build(),
    );
    let idem = Idempotency::new(lambda_idempotency::DynamoDbStore::new(client, &db.table));
    println!(
        "\nwith OutcomeStorage (default: inline while the record is at most 1 KB, then zstd, \
         then parts), measured on the embedded server"
    );
    println!(
        "  {:<8} {:<6} {:>12} {:>9} {:>22} {:>11}   {:>26}",
        "outcome",
        "kind",
        "first WRU",
        "record",
        "duplicate WRU + RRU",
        "$ / million",
        "inline layout (before)"
    );
    for (label, size) in MEASURED {
        for kind in ["JSON", "random"] {
            let outcome = match kind {
                "JSON" => outcomes::compressible(size),
                _ => Value::from(outcomes::incompressible(size, size as u64)),
            };
            let m = measure(&idem, &db, &consumed, &format!("{label}-{kind}"), &outcome).await?;
            let inline = Ours::new(serde_json::to_string(&outcome)?.len());
            let before = if inline.settled <= 400 * 1024 {
                let units = put(inline.settled, inline.claim).units();
                format!("{units} WRU ${:.2}", dollars_per_million(units))
            } else {
                "over the item limit".to_owned()
            };
            let dollars = m.duplicate_writes as f64 * DOLLARS_PER_MILLION_WRITES
                + m.duplicate_reads * DOLLARS_PER_MILLION_READS;
            println!(
                "  {label:<8} {kind:<6} {:>12} {:>7} B {:>9} + {:>5} ({} req) {:>11.2}   {before:>26}",
                m.first_writes,
                m.record_bytes,
                m.duplicate_writes,
                m.duplicate_reads,
                m.duplicate_round_trips,
                dollars,
            );
        }
    }
    Ok(())
}

/// One first execution of `outcome` and its duplicate.
async fn measure(
    idem: &Idempotency,
    db: &dynamo::Dynamo,
    consumed: &Consumed,
    material: &str,
    outcome: &Value,
) -> Result<Measured, BoxError> {
    let scope = lambda_idempotency::OperationScope::new("orders-prod-place", "place-order")?;
    let key = OperationKey::derive(&scope, None, material)?;
    let invocation = Invocation::new(
        key.clone(),
        Fingerprint::of(material)?,
        Duration::from_secs(30),
    )
    .with_request_id("c0ffee00-1234-4abc-9def-0123456789ab");
    consumed.take();
    idem.execute(&invocation, |_| async {
        Ok::<_, std::io::Error>(outcome.clone())
    })
    .await?;
    let (first_writes, _) = consumed.take();
    let record = db
        .client
        .get_item()
        .table_name(&db.table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(key.as_str().to_owned()),
        )
        .consistent_read(true)
        .send()
        .await?
        .item
        .ok_or("the record")?;
    let record_bytes = dynamo::item_size(&record);
    consumed.take();
    let before = db.requests.count();
    let replay = idem
        .execute(&invocation, |_| async {
            Ok::<_, std::io::Error>(Value::Null)
        })
        .await?;
    if !replay.is_replay() || replay.value() != outcome {
        return Err("the duplicate was not replayed whole".into());
    }
    let (_, duplicate_reads) = consumed.take();
    let claim = Ours::new(0).claim;
    Ok(Measured {
        first_writes,
        record_bytes,
        duplicate_writes: put(record_bytes, claim).units(),
        duplicate_reads,
        duplicate_round_trips: db.requests.count() - before,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    print_model();
    measure_outcome_storage().await
}

fn print_model() {
    println!("outcome inline, uncompressed (the layout before OutcomeStorage; Powertools')");
    for (label, outcome) in OUTCOMES {
        let ours = Ours::new(outcome);
        println!(
            "\noutcome {label}: items of {} B (claim), {} B (settled), evidence {} B",
            ours.claim, ours.settled, ours.settled_evidence
        );
        println!(
            "  {:<46} {:>8} {:>12}   {:>16}",
            "path", "writes", "$ / million", "Powertools"
        );
        let peers = powertools(outcome);
        for (path, writes) in ours.paths() {
            let units = units(&writes);
            let peer = peers.iter().find(|(name, _)| *name == path).map_or_else(
                String::new,
                |(_, writes)| {
                    let units = self::units(writes);
                    format!("{units} WRU ${:.2}", dollars_per_million(units))
                },
            );
            println!(
                "  {path:<46} {units:>4} WRU {:>12.2}   {peer:>16}",
                dollars_per_million(units)
            );
        }
    }
}
