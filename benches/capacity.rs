//! The capacity and cost model: DynamoDB write and read units per path, computed from the item
//! sizes the store really writes (`AttributeNames::item_size`), for outcomes of 100 B, 4 KB,
//! 100 KB and the largest that fits, beside Powertools' request pattern with its item layout.
//!
//! ```text
//! cargo bench --bench capacity --features testing
//! ```
//!
//! Then it checks the model against the embedded DynamoDB-compatible server, which reports
//! `ConsumedCapacity`: the engine runs each path through a client whose requests ask for it,
//! and every successful write's units are compared with the model's (a refused write's error
//! carries none, in DynamoDB as here).
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
use aws_sdk_dynamodb::operation::put_item::PutItemOutput;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use lambda_idempotency::testing::{dynamo, local};
use lambda_idempotency::{Config, Idempotency, Invocation};
use serde_json::Value;

use lambda_idempotency::OperationKey;
use lambda_idempotency::key::Fingerprint;
use lambda_idempotency::record::{Lease, Record, Status};
use lambda_idempotency::store::AttributeNames;

/// US dollars per million write request units (on demand, us-east-1).
const DOLLARS_PER_MILLION_WRITES: f64 = 0.625;
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
            fingerprint: Fingerprint::from_stored("b".repeat(64)),
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
        // The uniqueness table's item: pk (the identity), operation_key, fingerprint, status,
        // created_at (and completed_at, result_ref once settled); names are fixed.
        let identity = "invoice:o-418:rev-2";
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
/// order.
#[derive(Debug, Clone, Default)]
struct Consumed(Arc<Mutex<Vec<f64>>>);

impl Consumed {
    fn take(&self) -> Vec<f64> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
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
        let capacity = if let Some(put) = output.downcast_ref::<PutItemOutput>() {
            put.consumed_capacity().cloned().into_iter().collect()
        } else if let Some(update) = output.downcast_ref::<UpdateItemOutput>() {
            update.consumed_capacity().cloned().into_iter().collect()
        } else if let Some(delete) = output.downcast_ref::<DeleteItemOutput>() {
            delete.consumed_capacity().cloned().into_iter().collect()
        } else if let Some(transaction) = output.downcast_ref::<TransactWriteItemsOutput>() {
            transaction.consumed_capacity().to_vec()
        } else {
            Vec::new()
        };
        let units: f64 = capacity.iter().filter_map(|c| c.capacity_units()).sum();
        if !capacity.is_empty() {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(units);
        }
        Ok(())
    }
}

/// Runs a first execution, its duplicate and a released failure through the engine on the
/// embedded server, for each outcome size, and compares what the server charged for each
/// successful write with the model.
async fn check_against_the_server() -> Result<(), BoxError> {
    let db = dynamo::start().await;
    let consumed = Consumed::default();
    let client = aws_sdk_dynamodb::Client::from_conf(
        local::config_for(db.endpoint.clone())
            .interceptor(consumed.clone())
            .build(),
    );
    let store = lambda_idempotency::DynamoDbStore::new(client, &db.table);
    let idem = Idempotency::new(store, Config::default());
    println!(
        "
checked against the embedded server's ConsumedCapacity (successful writes):"
    );
    let with_identity = Idempotency::new(
        lambda_idempotency::DynamoDbStore::new(idem.store().client().clone(), &db.table)
            .with_uniqueness_table(&db.uniqueness_table),
        Config::default(),
    );
    let mut mismatches = 0;
    for (label, outcome) in OUTCOMES {
        let ours = Ours::new(outcome);
        let plain = [put(0, ours.claim), put(ours.claim, ours.settled)].map(Write::units);
        let identity = [
            transact(0, ours.claim).units() + transact(0, ours.evidence).units(),
            transact(ours.claim, ours.settled).units()
                + transact(ours.evidence, ours.settled_evidence).units(),
        ];
        for (path, engine, model, with) in [
            ("first execution", &idem, plain, None),
            (
                "first execution, business identity",
                &with_identity,
                identity,
                Some(format!("invoice:{label}")),
            ),
        ] {
            let scope = lambda_idempotency::OperationScope::new("capacity", path)?;
            let key = OperationKey::derive(&scope, None, label)?;
            let mut invocation =
                Invocation::new(key, Fingerprint::of(label)?, Duration::from_secs(30));
            if let Some(identity) = with {
                invocation = invocation.with_identity(identity);
            }
            let body = "x".repeat(outcome.saturating_sub(2));
            consumed.take();
            engine
                .execute(&invocation, |_| async {
                    Ok::<_, std::io::Error>(body.clone())
                })
                .await?;
            let measured = consumed.take();
            let matches = measured.len() == model.len()
                && measured
                    .iter()
                    .zip(model)
                    .all(|(units, model)| (*units - model as f64).abs() < f64::EPSILON);
            mismatches += usize::from(!matches);
            println!(
                "  {label:<12} {path}: server {measured:?}, model {model:?} WRU{}",
                if matches { "" } else { "  <- differs" }
            );
        }
    }
    if mismatches > 0 {
        return Err(format!("{mismatches} outcome sizes differ from the server").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    print_model();
    check_against_the_server().await
}

fn print_model() {
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
