//! Records as every released version's own code wrote them, read by today's code.
//!
//! `tests/fixtures/records/v0.N.json` holds the items each release's engine wrote on the
//! embedded server (written once by `scripts/write-record-fixtures.sh`, which builds the
//! release's commit and runs its writer from `tests/fixtures/records/writers/`; never by
//! today's encoder). Each file is loaded item by item into fresh tables, and today's code, on
//! the DynamoDB store and through the in-process cache over it, must replay every outcome byte
//! for byte, refuse a changed intent, take over a crashed claim without running it blind,
//! continue a crashed attempt's steps, let an operator release what is held, and, once TTL has
//! deleted the records, keep the evidence's answer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine as _;
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::effects::{Checked, Destination, OutboxRecord};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::CachedStore;
use lambda_idempotency::testing::conformance::{LEASE, invocation, operator};
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::{
    BoxError, Config, Error, ExecutionContext, Idempotency, Invocation, KeyPolicy, OperationScope,
    Origin, Resolution,
};
use serde::Deserialize;
use serde_json::{Value, json};

/// The states a release's writer leaves its cases in, each judged below.
const STATES: [&str; 6] = [
    "COMPLETED",
    "FAILED_TERMINAL",
    "RELEASED",
    "RELEASED_BY_OPERATOR",
    "IN_PROGRESS",
    "INDETERMINATE",
];

/// One release's fixture file.
#[derive(Debug, Deserialize)]
struct Written {
    version: String,
    commit: String,
    written_at_ms: u64,
    lease_ms: u64,
    tables: BTreeMap<String, Vec<HashMap<String, Value>>>,
    cases: Vec<Case>,
}

/// One scenario the release's writer ran, and what it left.
#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    /// The key material `conformance::invocation` took, or JSON material for a key policy.
    material: Option<String>,
    material_json: Option<Value>,
    intent: Value,
    identity: Option<String>,
    state: String,
    outcome: Option<Value>,
    #[serde(default)]
    steps: Vec<StepWritten>,
    /// The outbox events the completion committed (0.4 on).
    #[serde(default)]
    events: Vec<EventWritten>,
}

/// An outbox event as the release's writer declared it.
#[derive(Debug, Deserialize)]
struct EventWritten {
    name: String,
    destination: String,
    target: String,
    payload: Value,
}

/// A step the crashed or completed attempt recorded.
#[derive(Debug, Deserialize)]
struct StepWritten {
    name: String,
    result: Option<Value>,
}

fn load(file: &str) -> Written {
    let path = format!(
        "{}/tests/fixtures/records/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// An item's attribute from DynamoDB's JSON form (`{"S": ".."}`, `{"B": "<base64>"}`, ...).
fn attribute(value: &Value) -> AttributeValue {
    let (kind, inner) = value
        .as_object()
        .and_then(|o| o.iter().next())
        .unwrap_or_else(|| panic!("not an attribute value: {value}"));
    let text = |v: &Value| v.as_str().expect("a string").to_owned();
    let blob = |v: &Value| {
        Blob::new(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().expect("base64"))
                .expect("valid base64"),
        )
    };
    let list = |v: &Value| v.as_array().expect("a list").clone();
    match kind.as_str() {
        "S" => AttributeValue::S(text(inner)),
        "N" => AttributeValue::N(text(inner)),
        "B" => AttributeValue::B(blob(inner)),
        "BOOL" => AttributeValue::Bool(inner.as_bool().expect("a bool")),
        "NULL" => AttributeValue::Null(true),
        "SS" => AttributeValue::Ss(list(inner).iter().map(text).collect()),
        "NS" => AttributeValue::Ns(list(inner).iter().map(text).collect()),
        "BS" => AttributeValue::Bs(list(inner).iter().map(blob).collect()),
        "L" => AttributeValue::L(list(inner).iter().map(attribute).collect()),
        "M" => AttributeValue::M(item(inner.as_object().expect("a map"))),
        other => panic!("unknown attribute type {other}"),
    }
}

fn item<'a>(
    attributes: impl IntoIterator<Item = (&'a String, &'a Value)>,
) -> HashMap<String, AttributeValue> {
    attributes
        .into_iter()
        .map(|(name, value)| (name.clone(), attribute(value)))
        .collect()
}

/// Fresh tables holding exactly the release's records and evidence, and the clock at the
/// moment it finished.
async fn tables(written: &Written, encoding: Encoding) -> (Dynamo, ManualClock) {
    let clock = ManualClock::new(written_at(written));
    let db = dynamo::start_with_clock(clock.clone()).await;
    let (tables, rewritten) = encoded(written, encoding);
    // Each re-encoding changes something on every release: 0.1 compressed nothing, so only its
    // "stored raw" encoding has nothing to undo.
    let nothing_to_undo = matches!(encoding, Encoding::Uncompressed) && written.version == "0.1.0";
    assert!(
        rewritten > 0 || matches!(encoding, Encoding::AsWritten) || nothing_to_undo,
        "{} {encoding:?}: no value re-encoded",
        written.version
    );
    for (role, items) in &tables {
        let table = match role.as_str() {
            "records" => &db.table,
            "uniqueness" => &db.uniqueness_table,
            // The handler's own table, which the relay reads from its stream (below).
            "outbox" => continue,
            other => panic!(
                "{}: a table today's store does not have: {other}",
                written.version
            ),
        };
        for attributes in items {
            db.client
                .put_item()
                .table_name(table)
                .set_item(Some(item(attributes)))
                .send()
                .await
                .expect("load an item");
        }
    }
    (db, clock)
}

/// Whether 0.1 keyed `case` otherwise than today (an integer past 2^53 in its key material).
fn rekeyed(written: &Written, case: &Case) -> bool {
    written.version.starts_with("0.1.") && case.material_json.is_some()
}

fn written_at(written: &Written) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(written.written_at_ms)
}

/// The engine a release's records are read by, over the DynamoDB store or the in-process cache
/// over it: today's defaults, and for 0.1's records the 0.1 rule with the cut-over at the end of
/// the deploy (the upgrade notes' setting: 0.1 derived keys by RFC 8785 alone).
fn engine(written: &Written, db: &Dynamo, clock: &ManualClock, cached: bool) -> Idempotency {
    let idem = if cached {
        Idempotency::new(CachedStore::new(db.store(), 64 << 20))
    } else {
        Idempotency::new(db.store())
    };
    let mut config = Config::builder();
    if written.version.starts_with("0.1.") {
        config = config.rfc8785_records_before(written_at(written) + Duration::from_secs(1));
    }
    idem.with_clock(clock.clone())
        .with_config(config.build().expect("config"))
}

/// `case`'s invocation, derived by today's code from what the release's writer passed.
fn invocation_of(case: &Case, lease_ms: u64) -> Invocation {
    invocation_with(case, &case.intent, lease_ms)
}

/// `case`'s invocation with `intent` in place of the one it was written with.
fn invocation_with(case: &Case, intent: &Value, lease_ms: u64) -> Invocation {
    assert_eq!(
        Duration::from_millis(lease_ms),
        LEASE,
        "the release's writer used the suite's lease"
    );
    let inv = match (&case.material, &case.material_json) {
        (Some(material), None) => invocation(material, intent),
        (None, Some(material)) => {
            // As a door derives it: key material and intent read from the event.
            let policy = KeyPolicy::from_fns(
                |event: &(Value, Value)| Some(event.0.clone()),
                |event: &(Value, Value)| Some(event.1.clone()),
            );
            let scope = OperationScope::new("conformance", "op").expect("scope");
            policy
                .invocation(&scope, &(material.clone(), intent.clone()), LEASE)
                .expect("the release's key material")
        }
        _ => panic!("{}: material or material_json", case.name),
    };
    match &case.identity {
        Some(identity) => inv.with_identity(identity).expect("the release's identity"),
        None => inv,
    }
}

/// A handler that counts its runs: anything it is asked to run the fixtures must not need.
fn counted(runs: &Arc<AtomicUsize>) -> impl Fn(ExecutionContext) -> Handled + use<> {
    let runs = Arc::clone(runs);
    move |_ctx| {
        runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok::<Value, BoxError>(json!({"ran": "today"})) })
    }
}

type Handled = std::pin::Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>;

/// How the items are stored: as the release wrote them, or as another build may encode the same
/// records (each read by today's code as it reads the release's own).
#[derive(Debug, Clone, Copy)]
enum Encoding {
    /// The items exactly as the release wrote them.
    AsWritten,
    /// Compressed values at zstd level 19 (today writes level 3): other bytes, same values.
    OtherZstdLevel,
    /// Short values compressed too (an outcome or a step result today keeps raw).
    ShortValuesCompressed,
    /// Compressed inline outcomes stored raw instead (a build without compression).
    Uncompressed,
    /// An attribute a later build added, on every item, step and outcome format.
    UnknownAttributes,
}

const ENCODINGS: [Encoding; 5] = [
    Encoding::AsWritten,
    Encoding::OtherZstdLevel,
    Encoding::ShortValuesCompressed,
    Encoding::Uncompressed,
    Encoding::UnknownAttributes,
];

fn b64(bytes: &[u8]) -> Value {
    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn unb64(value: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(value.as_str().expect("base64"))
        .expect("valid base64")
}

/// `value` (a blob or a step result, raw or zstd as `format` says) re-encoded as `encoding`
/// says; `format` (a map holding `codec` and `length`, or none) is updated to match. Whether
/// anything changed.
fn re_encode(
    value: &mut Value,
    format: &mut serde_json::Map<String, Value>,
    encoding: Encoding,
) -> bool {
    let compressed = format.get("codec") == Some(&json!({"S": "zstd"}));
    let raw = match compressed {
        true => zstd::stream::decode_all(unb64(value).as_slice()).expect("a zstd value"),
        false => unb64(value),
    };
    let compress = |level| {
        let length = json!({"N": raw.len().to_string()});
        (
            zstd::bulk::compress(&raw, level).expect("compressed"),
            length,
        )
    };
    match encoding {
        // Level 19, whether the release compressed the value or kept it raw.
        Encoding::OtherZstdLevel => {
            let (bytes, length) = compress(19);
            *value = b64(&bytes);
            format.insert("codec".to_owned(), json!({"S": "zstd"}));
            format.insert("length".to_owned(), length);
            true
        }
        Encoding::ShortValuesCompressed if !compressed => {
            let (bytes, length) = compress(3);
            *value = b64(&bytes);
            format.insert("codec".to_owned(), json!({"S": "zstd"}));
            format.insert("length".to_owned(), length);
            true
        }
        Encoding::Uncompressed if compressed => {
            *value = b64(&raw);
            format.remove("codec");
            format.remove("length");
            true
        }
        _ => false,
    }
}

/// The release's items as `encoding` stores them, and how many values it rewrote.
fn encoded(
    written: &Written,
    encoding: Encoding,
) -> (BTreeMap<String, Vec<HashMap<String, Value>>>, usize) {
    let mut tables = written.tables.clone();
    let mut rewritten = 0;
    for item in tables.values_mut().flatten() {
        if let Encoding::UnknownAttributes = encoding {
            item.insert("later_field".to_owned(), json!({"S": "a later build's"}));
            rewritten += 1;
        }
        // An inline outcome (never one in parts: those are named by their digest, and a part
        // item is kept as written).
        let parts = item
            .get("outcome_format")
            .is_some_and(|f| f["M"].get("parts").is_some());
        if parts {
            continue;
        }
        if let Some(mut outcome) = item.remove("outcome") {
            let mut format = item
                .remove("outcome_format")
                .and_then(|f| f["M"].as_object().cloned())
                .unwrap_or_default();
            let is_record = item.contains_key("status");
            if is_record && re_encode(&mut outcome["B"], &mut format, encoding) {
                rewritten += 1;
            }
            if let Encoding::UnknownAttributes = encoding {
                format.insert("later".to_owned(), json!({"S": "x"}));
            }
            item.insert("outcome".to_owned(), outcome);
            if !format.is_empty() {
                item.insert("outcome_format".to_owned(), json!({"M": format}));
            }
        }
        if let Some(steps) = item.get_mut("steps").and_then(|s| s["L"].as_array_mut()) {
            for step in steps {
                let step = step["M"].as_object_mut().expect("a step map");
                if let Some(mut result) = step.remove("result") {
                    if re_encode(&mut result["B"], step, encoding) {
                        rewritten += 1;
                    }
                    step.insert("result".to_owned(), result);
                }
                if let Encoding::UnknownAttributes = encoding {
                    step.insert("note".to_owned(), json!({"S": "a later field"}));
                }
            }
        }
    }
    (tables, rewritten)
}

fn names(written: &Written) -> BTreeSet<&str> {
    written.cases.iter().map(|c| c.name.as_str()).collect()
}

/// The cases each release's writer has (README of tests/fixtures/records): 0.1 could not keep
/// a 500 KB outcome, and steps and the outbox came with 0.4.
fn expected_cases(version: &str) -> BTreeSet<&'static str> {
    let mut cases = BTreeSet::from([
        "completed",
        "completed_compressed",
        "failed_terminal",
        "failed_retryable",
        "in_progress_crashed",
        "in_progress_with_identity",
        "completed_with_identity",
        "indeterminate",
        "released_by_operator",
        "large_id",
    ]);
    if version != "0.1.0" {
        cases.insert("completed_parts");
    }
    if version == "0.4.0" {
        cases.extend(["steps_crashed", "steps_completed", "outbox"]);
    }
    cases
}

/// Every case of `file`, on the DynamoDB store and through the cache over it, in every encoding.
async fn read_by_today(file: &str) {
    let written = load(file);
    assert_eq!(
        names(&written),
        expected_cases(&written.version),
        "{}: the cases its writer wrote",
        written.version
    );
    for encoding in ENCODINGS {
        for cached in [false, true] {
            check(&written, encoding, cached).await;
            orphaned_evidence(&written, encoding, cached).await;
        }
    }
}

async fn check(written: &Written, encoding: Encoding, cached: bool) {
    let (db, clock) = tables(written, encoding).await;
    let idem = engine(written, &db, &clock, cached);
    let at = |case: &Case| {
        format!(
            "{} ({}) {}, {encoding:?}, cached {cached}",
            written.version, written.commit, case.name
        )
    };
    let runs = Arc::new(AtomicUsize::new(0));
    for case in &written.cases {
        assert!(
            STATES.contains(&case.state.as_str()),
            "{}: a state this reader does not judge",
            at(case)
        );
    }

    // While every settled record is within its retention: replayed byte for byte, the handler
    // not run; a changed intent refused.
    for case in &written.cases {
        let inv = invocation_of(case, written.lease_ms);
        match case.state.as_str() {
            "COMPLETED" => {
                let replayed = idem
                    .execute(&inv, counted(&runs))
                    .await
                    .unwrap_or_else(|e| panic!("{}: replayed: {e:?}", at(case)));
                assert_eq!(replayed.origin(), Origin::Replayed, "{}", at(case));
                let outcome: Value = serde_json::from_str(replayed.raw_json().get()).expect("JSON");
                assert_eq!(Some(&outcome), case.outcome.as_ref(), "{}", at(case));
                let changed_intent = json!({"changed": case.intent});
                let changed = invocation_with(case, &changed_intent, written.lease_ms);
                let changed_runs = Arc::new(AtomicUsize::new(0));
                let answer = idem.execute(&changed, counted(&changed_runs)).await;
                if rekeyed(written, case) {
                    // Under 0.1's key a record of another intent is another operation that
                    // collided under the old rule (0.1 kept no key material to tell): left
                    // alone, and this one runs under its own key (the 0.1 rule's documented
                    // limit).
                    let ran = answer.unwrap_or_else(|e| panic!("{}: runs: {e:?}", at(case)));
                    assert!(
                        matches!(ran.origin(), Origin::Executed { .. }),
                        "{}",
                        at(case)
                    );
                    assert_eq!(changed_runs.load(Ordering::SeqCst), 1, "{}", at(case));
                    continue;
                }
                let refused = answer
                    .err()
                    .unwrap_or_else(|| panic!("{}: a changed intent ran", at(case)));
                assert!(
                    matches!(refused, Error::PayloadConflict { .. }),
                    "{}: got {refused:?}",
                    at(case)
                );
            }
            "FAILED_TERMINAL" => {
                let retained = idem
                    .execute(&inv, counted(&runs))
                    .await
                    .err()
                    .unwrap_or_else(|| panic!("{}: a retained failure ran", at(case)));
                let expected = case.outcome.as_ref().and_then(|o| o["error"].as_str());
                assert!(
                    matches!(&retained, Error::Failed { failure, .. }
                        if Some(failure.message.as_str()) == expected),
                    "{}: got {retained:?}",
                    at(case)
                );
            }
            _ => {}
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "{}: nothing settled re-ran",
        written.version
    );
    outbox_items_are_relayed_as_written(written);

    // Released records run again.
    for case in written
        .cases
        .iter()
        .filter(|c| c.state.starts_with("RELEASED"))
    {
        let before = runs.load(Ordering::SeqCst);
        let ran = idem
            .execute(&invocation_of(case, written.lease_ms), counted(&runs))
            .await
            .unwrap_or_else(|e| panic!("{}: runs again: {e:?}", at(case)));
        assert!(
            matches!(ran.origin(), Origin::Executed { .. }),
            "{}",
            at(case)
        );
        assert_eq!(runs.load(Ordering::SeqCst), before + 1, "{}", at(case));
    }

    // Past every lease: a crashed claim is taken over and held, never run blind; a crashed
    // attempt's steps continue where it stopped; an operator's release lets it run.
    clock.advance(Duration::from_millis(written.lease_ms) + Duration::from_secs(60));
    let settled = runs.load(Ordering::SeqCst);
    for case in &written.cases {
        let inv = invocation_of(case, written.lease_ms);
        match case.state.as_str() {
            "IN_PROGRESS" if !case.steps.is_empty() => {
                continue_steps(&idem, &inv, case, &at(case)).await;
            }
            "IN_PROGRESS" | "INDETERMINATE" => {
                let held = idem
                    .execute(&inv, counted(&runs))
                    .await
                    .expect_err("held: the crashed attempt may have acted");
                assert!(
                    matches!(held, Error::Indeterminate { .. }),
                    "{}: got {held:?}",
                    at(case)
                );
                released_by_an_operator(&idem, &inv, &runs, &at(case)).await;
            }
            _ => {}
        }
    }
    let released = written
        .cases
        .iter()
        .filter(|c| {
            matches!(c.state.as_str(), "IN_PROGRESS" | "INDETERMINATE") && c.steps.is_empty()
        })
        .count();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        settled + released,
        "{}: only what an operator released ran",
        written.version
    );

    // Past every retention, TTL having deleted the records: an operation with evidence (each
    // completed by now, by the release or today's run) is never treated as new.
    clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert!(
        db.sweep().await > 0,
        "{}: TTL deleted records",
        written.version
    );
    for case in written.cases.iter().filter(|c| c.identity.is_some()) {
        expired_with_completed_evidence(&idem, case, written, &runs, &at(case)).await;
    }
}

/// An operator releases `inv`'s held record; the next delivery runs it, once.
async fn released_by_an_operator(
    idem: &Idempotency,
    inv: &Invocation,
    runs: &Arc<AtomicUsize>,
    at: &str,
) {
    let released = idem
        .resolve::<Value>(inv.key(), Resolution::Release, &operator())
        .await
        .unwrap_or_else(|e| panic!("{at}: released: {e:?}"));
    assert!(released, "{at}: an operator releases it");
    let before = runs.load(Ordering::SeqCst);
    let ran = idem
        .execute(inv, counted(runs))
        .await
        .unwrap_or_else(|e| panic!("{at}: runs once released: {e:?}"));
    assert!(matches!(ran.origin(), Origin::Executed { .. }), "{at}");
    assert_eq!(runs.load(Ordering::SeqCst), before + 1, "{at}: ran once");
}

/// `case`'s record is gone and its evidence says COMPLETED: refused, not run.
async fn expired_with_completed_evidence(
    idem: &Idempotency,
    case: &Case,
    written: &Written,
    runs: &Arc<AtomicUsize>,
    at: &str,
) {
    let before = runs.load(Ordering::SeqCst);
    let answer = idem
        .execute(&invocation_of(case, written.lease_ms), counted(runs))
        .await
        .err()
        .unwrap_or_else(|| panic!("{at}: ran though its evidence stands"));
    assert!(
        matches!(&answer, Error::KeyExpiredConflict { evidence, .. }
            if evidence.status == Status::Completed),
        "{at}: got {answer:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), before, "{at}: not re-run");
}

/// The release's evidence on its own: on fresh tables, TTL deletes every record past its
/// retention before any delivery comes back. Completed evidence refuses its operation; the
/// evidence of a crashed claim (an orphan) is adopted and held, never run blind, until an
/// operator releases it.
async fn orphaned_evidence(written: &Written, encoding: Encoding, cached: bool) {
    let (db, clock) = tables(written, encoding).await;
    let idem = engine(written, &db, &clock, cached);
    let at = |case: &Case| {
        format!(
            "{} {} (orphans), {encoding:?}, cached {cached}",
            written.version, case.name
        )
    };
    let runs = Arc::new(AtomicUsize::new(0));
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert!(
        db.sweep().await > 0,
        "{}: TTL deleted records",
        written.version
    );
    for case in written.cases.iter().filter(|c| c.identity.is_some()) {
        let inv = invocation_of(case, written.lease_ms);
        match case.state.as_str() {
            "COMPLETED" => {
                expired_with_completed_evidence(&idem, case, written, &runs, &at(case)).await;
            }
            "IN_PROGRESS" => {
                let held = idem
                    .execute(&inv, counted(&runs))
                    .await
                    .err()
                    .unwrap_or_else(|| panic!("{}: an orphan ran blind", at(case)));
                assert!(
                    matches!(held, Error::Indeterminate { .. }),
                    "{}: got {held:?}",
                    at(case)
                );
                assert_eq!(runs.load(Ordering::SeqCst), 0, "{}: not run", at(case));
                released_by_an_operator(&idem, &inv, &runs, &at(case)).await;
            }
            other => panic!("{}: no orphan judgement for {other}", at(case)),
        }
    }
}

/// A crashed attempt with recorded steps, taken over under [`Recovery::Steps`]: a step with a
/// recorded result answers it without running or asking its check; a step whose effect was
/// under way (its intent recorded, no result) is asked its check, which says it did not apply,
/// and runs; the steps after it run; the operation settles.
async fn continue_steps(idem: &Idempotency, inv: &Invocation, case: &Case, at: &str) {
    let idem = idem.clone().with_recovery(Recovery::Steps);
    let (step_runs, checks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let names: Vec<String> = case.steps.iter().map(|s| s.name.clone()).collect();
    let recorded: Vec<Option<Value>> = case.steps.iter().map(|s| s.result.clone()).collect();
    let (run_count, check_count) = (Arc::clone(&step_runs), Arc::clone(&checks));
    let done = idem
        .execute(inv, move |ctx: ExecutionContext| async move {
            let mut results = Vec::new();
            for name in names.iter().chain(std::iter::once(&"after".to_owned())) {
                let (runs, checks) = (Arc::clone(&run_count), Arc::clone(&check_count));
                let result: Value = ctx
                    .step(name)
                    .checked_by(move |_key: String| {
                        checks.fetch_add(1, Ordering::SeqCst);
                        async { Ok::<Checked<Value>, BoxError>(Checked::NotApplied) }
                    })
                    .run(|_key| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(json!({"ran": "today"}))
                    })
                    .await?;
                results.push(result);
            }
            Ok::<_, BoxError>(Value::Array(results))
        })
        .await
        .unwrap_or_else(|e| panic!("{at}: continued: {e:?}"));
    let results: Value = serde_json::from_str(done.raw_json().get()).expect("JSON");
    for (i, recorded) in recorded.iter().enumerate() {
        if let Some(recorded) = recorded {
            assert_eq!(
                &results[i], recorded,
                "{at}: step {i} answered its recorded result"
            );
        }
    }
    let uncertain = recorded.iter().filter(|r| r.is_none()).count();
    assert_eq!(
        checks.load(Ordering::SeqCst),
        uncertain,
        "{at}: only uncertain steps asked"
    );
    assert_eq!(
        step_runs.load(Ordering::SeqCst),
        uncertain + 1,
        "{at}: only the uncertain step and the next ran"
    );
}

/// The outbox event the relay reads from a stream record that inserts `item` (DynamoDB JSON):
/// through the relay's own reader, [`inserted`](lambda_idempotency::lambda::relay::inserted).
#[cfg(feature = "relay")]
fn relayed(item: &impl serde::Serialize) -> Option<OutboxRecord> {
    let record = serde_json::from_value(json!({
        "eventID": "1",
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "eventVersion": "1.1",
        "awsRegion": "us-east-1",
        "dynamodb": {"NewImage": item, "SequenceNumber": "1", "SizeBytes": 1},
    }))
    .expect("a stream record");
    lambda_idempotency::lambda::relay::inserted(&record)
}

/// Without the relay: the outbox item's image read as [`OutboxRecord::from_image`] reads it.
#[cfg(not(feature = "relay"))]
fn relayed(item: &impl serde::Serialize) -> Option<OutboxRecord> {
    OutboxRecord::from_image(&serde_json::to_value(item).expect("JSON"))
}

/// 0.4's outbox items, as the relay reads them from the outbox table's stream (a new image in
/// DynamoDB JSON, as the fixture holds them): each event of a completed case, its destination and
/// its payload's bytes as written.
fn outbox_items_are_relayed_as_written(written: &Written) {
    let items = written
        .tables
        .get("outbox")
        .map(Vec::as_slice)
        .unwrap_or_default();
    let declared: Vec<&EventWritten> = written.cases.iter().flat_map(|c| &c.events).collect();
    assert_eq!(
        items.len(),
        declared.len(),
        "{}: one item per event",
        written.version
    );
    for (item, event) in items.iter().zip(declared) {
        let record = relayed(item)
            .unwrap_or_else(|| panic!("{}: an outbox item today's relay reads", written.version));
        assert_eq!(record.name, event.name);
        let target = match (&record.destination, event.destination.as_str()) {
            (Destination::Sqs { queue_url }, "sqs") => queue_url,
            (Destination::Sns { topic_arn }, "sns") => topic_arn,
            (Destination::EventBridge { bus, .. }, "eventbridge") => bus,
            (other, declared) => panic!("{}: {other:?} for {declared}", written.version),
        };
        assert_eq!(target, &event.target);
        let payload: Value = serde_json::from_str(&record.payload).expect("the payload is JSON");
        assert_eq!(payload, event.payload);
        let envelope: Value =
            serde_json::from_str(&record.envelope().expect("an envelope")).expect("JSON");
        assert_eq!(envelope["event_id"], json!(record.id));
        assert_eq!(envelope["payload"], event.payload);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_0_1_wrote_are_read_by_todays_code() {
    read_by_today("v0.1.json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_0_2_wrote_are_read_by_todays_code() {
    read_by_today("v0.2.json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_0_3_wrote_are_read_by_todays_code() {
    read_by_today("v0.3.json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_0_4_wrote_are_read_by_todays_code() {
    read_by_today("v0.4.json").await;
}
