//! Operators' tools pointed at a table someone else can write: records whose outcomes and steps
//! are compression bombs or corrupt, on the embedded server. Reads are bounded by the store's
//! outcome limit and the steps' bounds (a typed corrupt-record error, never the memory), and
//! the stuck check and `stats` read only the records' summaries, so such records neither break
//! them nor are opened.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::effects::{MAX_STEP_RESULTS_BYTES, MAX_STEPS};
use lambda_idempotency::record::{Status, epoch_millis};
use lambda_idempotency::store::{DynamoDbStore, OutcomeStorage, StoreExt};
use lambda_idempotency::testing::{dynamo, local};
use lambda_idempotency::{Fingerprint, OperationKey, OperationScope, StoreError};

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn b(value: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(value))
}

fn key(material: &str) -> OperationKey {
    let scope = OperationScope::new("hostile", "charge").expect("scope");
    OperationKey::derive(&scope, None, material).expect("key")
}

/// `bytes` zeros, zstd-compressed: a few dozen bytes per MiB.
fn zeros(bytes: usize) -> Vec<u8> {
    zstd::bulk::compress(&vec![0u8; bytes], 3).expect("compressed")
}

/// A record item as a writer to the table may leave it: `status`, its lease an hour gone.
fn record_item(key: &OperationKey, status: &str) -> HashMap<String, AttributeValue> {
    let now = SystemTime::now();
    let hour_ago = now - Duration::from_secs(3600);
    HashMap::from([
        ("pk".to_owned(), s(key.as_str())),
        ("status".to_owned(), s(status)),
        (
            "fingerprint".to_owned(),
            s(Fingerprint::of(&"intent").expect("fp").as_str()),
        ),
        ("lease_token".to_owned(), s("token-1")),
        ("attempt".to_owned(), n(1)),
        ("lease_expires_at_ms".to_owned(), n(epoch_millis(hour_ago))),
        (
            "expires_at".to_owned(),
            n(epoch_millis(now + Duration::from_secs(86_400)) / 1000),
        ),
        (
            "created_at".to_owned(),
            n(epoch_millis(hour_ago - Duration::from_secs(60))),
        ),
    ])
}

async fn put(db: &dynamo::Dynamo, item: HashMap<String, AttributeValue>) {
    db.client
        .put_item()
        .table_name(&db.table)
        .set_item(Some(item))
        .send()
        .await
        .expect("put");
}

fn corrupt(read: &Result<Option<lambda_idempotency::record::Record>, StoreError>) -> bool {
    matches!(read, Err(StoreError::CorruptRecord { .. }))
}

/// A COMPLETED record whose inline outcome is a compression bomb: refused as a corrupt record
/// at the store's outcome limit, whether its manifest states the bomb's length (past the
/// limit) or understates it, and a manifest naming part items past the limit is refused before
/// a part is read. Within the limit the same bytes restore exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compression_bomb_is_a_corrupt_record_at_the_outcome_limit() {
    let db = dynamo::start().await;
    let limit = 64 * 1024;
    let store = db
        .store()
        .with_outcome_storage(OutcomeStorage::default().max_outcome_bytes(limit));
    let bomb = zeros(8 << 20);
    assert!(bomb.len() < 1024, "a bomb: {} bytes", bomb.len());

    // The manifest says what the bomb expands to: 8 MiB, past the limit (old code: restored,
    // 8 MiB in memory, as the store had no limit of its own below 16 MiB).
    let stated = key("stated");
    let mut item = record_item(&stated, "COMPLETED");
    item.insert("outcome".into(), b(&bomb));
    item.insert(
        "outcome_format".into(),
        AttributeValue::M(HashMap::from([
            ("codec".into(), s("zstd")),
            ("length".into(), n(8 << 20)),
        ])),
    );
    put(&db, item).await;
    let read = store.get(&stated).await;
    assert!(corrupt(&read), "{read:?}");

    // The manifest understates it: within the limit, but the bytes expand past it.
    let understated = key("understated");
    let mut item = record_item(&understated, "COMPLETED");
    item.insert("outcome".into(), b(&bomb));
    item.insert(
        "outcome_format".into(),
        AttributeValue::M(HashMap::from([
            ("codec".into(), s("zstd")),
            ("length".into(), n(1000)),
        ])),
    );
    put(&db, item).await;
    let read = store.get(&understated).await;
    assert!(corrupt(&read), "{read:?}");

    // Parts past the limit: refused before any part is read (none exists).
    let parted = key("parted");
    let mut item = record_item(&parted, "COMPLETED");
    item.insert(
        "outcome_format".into(),
        AttributeValue::M(HashMap::from([
            ("parts".into(), n(2)),
            ("bytes".into(), n(2 * 384 * 1024)),
            ("chunk".into(), n(384 * 1024)),
            ("sha256".into(), s(&"0".repeat(64))),
        ])),
    );
    put(&db, item).await;
    let before = db.requests.count();
    let read = store.get(&parted).await;
    assert!(corrupt(&read), "{read:?}");
    assert_eq!(
        db.requests.since(before),
        vec!["GetItem"],
        "the record alone is read"
    );

    // The same kind of bytes within the limit restore exactly.
    let honest = key("honest");
    let raw = br#"{"lines":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#.repeat(200);
    let mut item = record_item(&honest, "COMPLETED");
    item.insert(
        "outcome".into(),
        b(&zstd::bulk::compress(&raw, 3).expect("compressed")),
    );
    item.insert(
        "outcome_format".into(),
        AttributeValue::M(HashMap::from([
            ("codec".into(), s("zstd")),
            ("length".into(), n(raw.len() as u64)),
        ])),
    );
    put(&db, item).await;
    let record = store.get(&honest).await.expect("read").expect("record");
    assert_eq!(record.outcome.as_deref(), Some(&raw[..]));

    // A settlement past the store's limit is rejected before it is written, never stored as
    // a record this store could not read back.
    let writer = DynamoDbStore::new(db.client.clone(), &db.table)
        .with_outcome_storage(OutcomeStorage::default().max_outcome_bytes(1024));
    let idem = lambda_idempotency::Idempotency::new(writer);
    let inv = lambda_idempotency::Invocation::new(
        key("too-large"),
        Fingerprint::of(&"too-large").expect("fp"),
        Duration::from_secs(30),
    );
    let done = idem
        .execute(&inv, |_| async {
            Ok::<_, std::io::Error>(serde_json::json!("x".repeat(4096)))
        })
        .await;
    assert!(done.is_err(), "the outcome cannot be stored: {done:?}");
}

/// A step list past the steps' bounds (more entries than any writer keeps; results that
/// expand past the budget together) is a corrupt record on every read that decodes steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_lists_past_their_bounds_are_corrupt_records() {
    let db = dynamo::start().await;
    let store = db.store();
    let half = MAX_STEP_RESULTS_BYTES / 2 + 1;
    let bomb = zeros(half);
    let step = |name: String| {
        AttributeValue::M(HashMap::from([
            ("name".into(), s(&name)),
            ("attempt".into(), n(1)),
            ("result".into(), b(&bomb)),
            ("codec".into(), s("zstd")),
            ("length".into(), n(half as u64)),
        ]))
    };
    // Old code: 2,000 results of 128 KiB each (250 MiB) decompressed to read one record.
    let many = key("many");
    let mut item = record_item(&many, "IN_PROGRESS");
    item.insert(
        "steps".into(),
        AttributeValue::L((0..2000).map(|i| step(format!("s{i}"))).collect()),
    );
    put(&db, item).await;
    let read = store.get(&many).await;
    assert!(corrupt(&read), "{read:?}");

    let two = key("two");
    let mut item = record_item(&two, "IN_PROGRESS");
    item.insert(
        "steps".into(),
        AttributeValue::L(vec![step("a".into()), step("b".into())]),
    );
    put(&db, item).await;
    let read = store.get(&two).await;
    assert!(corrupt(&read), "{read:?}");

    // At the bounds, it reads.
    let most = key("most");
    let mut item = record_item(&most, "IN_PROGRESS");
    let mut steps: Vec<AttributeValue> = (0..MAX_STEPS - 1)
        .map(|i| {
            AttributeValue::M(HashMap::from([
                ("name".into(), s(&format!("s{i}"))),
                ("attempt".into(), n(1)),
            ]))
        })
        .collect();
    steps.push(step("last".into()));
    item.insert("steps".into(), AttributeValue::L(steps));
    put(&db, item).await;
    let record = store.get(&most).await.expect("read").expect("record");
    assert_eq!(record.steps.len(), MAX_STEPS);
}

/// Records every Scan request's body.
#[derive(Debug, Clone, Default)]
struct Scans(Arc<Mutex<Vec<serde_json::Value>>>);

impl Scans {
    fn bodies(&self) -> Vec<serde_json::Value> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Intercept for Scans {
    fn name(&self) -> &'static str {
        "Scans"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        if request.headers().get("x-amz-target") == Some("DynamoDB_20120810.Scan") {
            let body = request.body().bytes().unwrap_or_default();
            let body = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(body);
        }
        Ok(())
    }
}

/// The hostile records of [`the_stuck_check_and_stats_never_open_outcomes_or_steps`]: each
/// IN_PROGRESS past its lease, each with what a full read would choke on.
async fn hostile_records(db: &dynamo::Dynamo) -> Vec<OperationKey> {
    let mut keys = Vec::new();
    // An outcome in a format no version writes.
    let unknown = key("unknown-format");
    let mut item = record_item(&unknown, "IN_PROGRESS");
    item.insert("outcome".into(), b(&zeros(16 << 20)));
    item.insert(
        "outcome_format".into(),
        AttributeValue::M(HashMap::from([("codec".into(), s("lzma-from-the-future"))])),
    );
    put(db, item).await;
    keys.push(unknown);
    // A compression bomb stated at 16 MiB, and a step list of bombs past every bound.
    let bombed = key("bombed");
    let mut item = record_item(&bombed, "IN_PROGRESS");
    item.insert("outcome".into(), b(&zeros(16 << 20)));
    item.insert(
        "outcome_format".into(),
        AttributeValue::M(HashMap::from([
            ("codec".into(), s("zstd")),
            ("length".into(), n(16 << 20)),
        ])),
    );
    let step_bomb = zeros(MAX_STEP_RESULTS_BYTES);
    item.insert(
        "steps".into(),
        AttributeValue::L(
            (0..1000)
                .map(|i| {
                    AttributeValue::M(HashMap::from([
                        ("name".into(), s(&format!("s{i}"))),
                        ("attempt".into(), n(1)),
                        ("result".into(), b(&step_bomb)),
                        ("codec".into(), s("zstd")),
                        ("length".into(), n(MAX_STEP_RESULTS_BYTES as u64)),
                    ]))
                })
                .collect(),
        ),
    );
    put(db, item).await;
    keys.push(bombed);
    keys
}

/// The stuck check (library and function alike) and `stats` read summaries only: every Scan
/// of the idempotency table carries a projection that names no outcome, manifest or step list,
/// and records whose outcome or steps are corrupt or bombs are found, not skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stuck_check_and_stats_never_open_outcomes_or_steps() {
    let db = dynamo::start().await;
    let keys = hostile_records(&db).await;
    let scans = Scans::default();
    let client = aws_sdk_dynamodb::Client::from_conf(
        local::config_for(db.endpoint.clone())
            .interceptor(scans.clone())
            .build(),
    );
    let store = DynamoDbStore::new(client, &db.table).with_uniqueness_table(&db.uniqueness_table);

    let now = SystemTime::now();
    let stuck = store
        .find_stuck(now, Duration::from_secs(60), 10)
        .await
        .expect("the check runs");
    let found: Vec<&OperationKey> = stuck.records.iter().map(|record| &record.key).collect();
    for key in &keys {
        assert!(found.contains(&key), "{key} is stuck: {found:?}");
    }
    assert_eq!(stuck.skipped, 0, "nothing was opened, so nothing failed");
    assert_eq!(stuck.count(Status::InProgress), keys.len() as u64);

    let (summaries, skipped, _) = store.scan_summary_page(None).await.expect("a page");
    assert_eq!((summaries.len(), skipped), (keys.len(), 0));
    assert!(
        summaries
            .iter()
            .all(|record| record.outcome.is_none() && record.steps.is_empty())
    );

    let idempotency_scans: Vec<serde_json::Value> = scans
        .bodies()
        .into_iter()
        .filter(|body| body["TableName"] == db.table.as_str())
        .collect();
    assert_eq!(idempotency_scans.len(), 2, "{idempotency_scans:?}");
    for body in &idempotency_scans {
        assert_eq!(body["Select"], "SPECIFIC_ATTRIBUTES", "{body}");
        let projection = body["ProjectionExpression"].as_str().expect("a projection");
        let projected: Vec<&str> = projection
            .split(',')
            .map(|placeholder| {
                body["ExpressionAttributeNames"][placeholder.trim()]
                    .as_str()
                    .expect("a name")
            })
            .collect();
        assert!(projected.contains(&"status") && projected.contains(&"pk"));
        for never in ["outcome", "outcome_format", "steps", "audit", "identity"] {
            assert!(!projected.contains(&never), "{never} is read: {body}");
        }
    }
}

/// `idemctl stats` and `idemctl stuck` against the same records: counted and listed, not
/// skipped (old code: `stats` read whole records, and skipped both).
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idemctl_counts_and_lists_records_it_cannot_open() {
    let db = dynamo::start().await;
    let keys = hostile_records(&db).await;
    let run = |args: &[&str]| {
        let output = crate::idemctl::idemctl(&db, args);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        (
            String::from_utf8(output.stdout).expect("utf-8"),
            String::from_utf8(output.stderr).expect("utf-8"),
        )
    };
    let (stats, said) = run(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("JSON");
    assert_eq!(
        stats,
        serde_json::json!([{"operation": "charge", "status": "IN_PROGRESS", "count": keys.len()}]),
        "{said}"
    );
    assert!(!said.contains("skipped"), "{said}");
    let (listed, _) = run(&["stuck", "--older-than", "1m", "--json"]);
    for key in &keys {
        assert!(listed.contains(key.as_str()), "{key}: {listed}");
    }
}
