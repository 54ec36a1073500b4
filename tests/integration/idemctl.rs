//! The operator CLI against the embedded server: stuck, stats, get, resolve, tables create.

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::reconcile::{Checked, Takeover};
use lambda_idempotency::testing::conformance::crash_after_claim;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{
    BoxError, Config, Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use serde_json::{Value, json};
use sha2::Digest;

fn invocation(material: &str) -> Invocation {
    let scope = OperationScope::new("cli-test", "charge").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    Invocation::new(
        key,
        Fingerprint::of(&material).expect("fingerprint"),
        Duration::from_secs(30),
    )
}

/// An endpoint nothing listens on: STS out of reach (and never AWS's own).
fn unreachable() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// idemctl on the embedded server, STS out of reach.
pub(crate) fn idemctl(db: &dynamo::Dynamo, args: &[&str]) -> Output {
    idemctl_with(db, args, &unreachable(), None)
}

/// idemctl on the embedded server, STS at `sts`, `stdin` typed in (none: no input).
fn idemctl_with(db: &dynamo::Dynamo, args: &[&str], sts: &str, stdin: Option<&str>) -> Output {
    use std::io::Write;
    use std::process::Stdio;

    let mut child = Command::new(env!("CARGO_BIN_EXE_idemctl"))
        .args(args)
        .env("DYNAMODB_ENDPOINT", &db.endpoint)
        .env("AWS_ENDPOINT_URL_STS", sts)
        .env("IDEMPOTENCY_TABLE", &db.table)
        .env("UNIQUENESS_TABLE", &db.uniqueness_table)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("idemctl runs");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("typed");
    }
    drop(input);
    child.wait_with_output().expect("idemctl ends")
}

/// Every item of the audit trail on the uniqueness table.
async fn audit_trail(db: &dynamo::Dynamo) -> Vec<HashMap<String, AttributeValue>> {
    db.client
        .scan()
        .table_name(&db.uniqueness_table)
        .filter_expression("begins_with(pk, :audit)")
        .expression_attribute_values(":audit", AttributeValue::S("#audit#".into()))
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default()
}

/// `idemctl stats --json`.
fn stats_of(db: &dynamo::Dynamo) -> Value {
    serde_json::from_str(&stdout(&idemctl(db, &["stats", "--json"]))).expect("JSON stats")
}

/// How many records of operation `charge` `stats` counts under `status`.
fn charge_count(stats: &Value, status: &str) -> u64 {
    stats
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row["status"] == status && row["operation"] == "charge")
        .map_or(0, |row| row["count"].as_u64().expect("count"))
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "idemctl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_and_resolves_stuck_work() {
    let db = dynamo::start().await;
    // An hour ago, so that leases have long run out by the CLI's clock.
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let (done, crashed, held) = (
        invocation("done"),
        invocation("crashed"),
        invocation("held"),
    );
    idem.execute(&done, |_| async { Ok::<_, std::io::Error>(json!(1)) })
        .await
        .expect("completed");
    crash_after_claim(&idem, &crashed).await;
    crash_after_claim(&idem, &held).await;
    clock.advance(Duration::from_secs(60));
    let unknown = idem
        .clone()
        .with_reconciler(|_: Takeover| async { Ok::<_, BoxError>(Checked::Unknown) });
    let err = unknown
        .execute(&held, |_| async { Ok::<_, std::io::Error>(json!(0)) })
        .await
        .expect_err("held for an operator");
    assert!(matches!(err, Error::Indeterminate { .. }));

    let listed: Vec<Value> = stdout(&idemctl(&db, &["stuck", "--older-than", "1m", "--json"]))
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    let keys: Vec<&str> = listed
        .iter()
        .map(|r| r["key"].as_str().expect("key"))
        .collect();
    assert!(keys.contains(&crashed.key().as_str()), "{listed:?}");
    assert!(keys.contains(&held.key().as_str()));
    assert!(
        !keys.contains(&done.key().as_str()),
        "a completed record is not stuck"
    );
    assert!(
        listed.iter().all(|r| r.get("outcome").is_none()),
        "no outcome bytes shown"
    );
    assert!(
        listed.iter().all(|r| ["steps", "identity", "audit"]
            .iter()
            .all(|unread| r.get(unread).is_none())),
        "what the scan does not read is not shown as empty: {listed:?}"
    );

    let stats = stats_of(&db);
    let count = |status: &str| charge_count(&stats, status);
    assert_eq!(
        (
            count("COMPLETED"),
            count("IN_PROGRESS"),
            count("INDETERMINATE")
        ),
        (1, 1, 1)
    );

    let result = std::env::temp_dir().join(format!("idemctl-{}.json", std::process::id()));
    std::fs::write(&result, r#"{"charged":"found by the operator"}"#).expect("write");
    let key = held.key().as_str().to_owned();
    let path = result.to_string_lossy().to_string();
    stdout(&idemctl(
        &db,
        &[
            "resolve",
            "--key",
            &key,
            "--retention",
            "24h",
            "--completed",
            &path,
            "--operator",
            "alice",
            "--yes",
        ],
    ));
    let replay = idem
        .execute(&held, |_| async { Ok::<_, std::io::Error>(json!(0)) })
        .await
        .expect("replay");
    assert_eq!(replay.value(), &json!({"charged": "found by the operator"}));
    let shown: Value =
        serde_json::from_str(&stdout(&idemctl(&db, &["get", "--key", &key]))).expect("JSON record");
    assert_eq!(shown["status"], "COMPLETED");

    let again = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            &key,
            "--retention",
            "24h",
            "--release",
            "--operator",
            "alice",
            "--yes",
        ],
    );
    assert!(
        !again.status.success(),
        "a settled record is not held for an operator"
    );
    let unconfirmed = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            crashed.key().as_str(),
            "--retention",
            "24h",
            "--release",
            "--operator",
            "alice",
        ],
    );
    assert!(
        !unconfirmed.status.success(),
        "no --yes and no answer: nothing changed"
    );
    // A release leaves a FAILED record already past its retention (the next delivery runs
    // afresh): `stats` counts it apart, not as a failure.
    stdout(&idemctl(
        &db,
        &[
            "resolve",
            "--key",
            crashed.key().as_str(),
            "--retention",
            "24h",
            "--release",
            "--operator",
            "alice",
            "--yes",
        ],
    ));
    let stats = stats_of(&db);
    let count = |status: &str| charge_count(&stats, status);
    assert_eq!(
        (
            count("COMPLETED"),
            count("IN_PROGRESS"),
            count("FAILED"),
            count("EXPIRED")
        ),
        (2, 0, 0, 1),
        "{stats}"
    );
    let _ = std::fs::remove_file(result);

    let fresh = format!("{}-created", db.table);
    stdout(&idemctl(
        &db,
        &[
            "--table",
            &fresh,
            "--uniqueness-table",
            &format!("{fresh}-u"),
            "tables",
            "create",
            "--unprotected",
        ],
    ));
    let described = db.client.describe_table().table_name(&fresh).send().await;
    assert!(described.is_ok(), "the table exists");
    let deleted = db.client.delete_table().table_name(&fresh).send().await;
    assert!(deleted.is_ok(), "unprotected: it can be deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_every_held_state_on_a_single_table_layout_and_leaves_a_trace() {
    use lambda_idempotency::store::{AttributeNames, DynamoDbStore, SortKey};
    use lambda_idempotency::testing::local::unique_table_name;

    let db = dynamo::start().await;
    let names = AttributeNames {
        sort_key: Some(SortKey {
            attribute: "sk".into(),
            value: "idempotency".into(),
        }),
        expires_at: "ttl".into(),
        status: "state".into(),
        ..AttributeNames::default()
    };
    let (table, uniqueness) = (unique_table_name("cli-single"), unique_table_name("cli-u"));
    let store = DynamoDbStore::new(db.client.clone(), &table)
        .with_uniqueness_table(&uniqueness)
        .with_attribute_names(names);
    store.create_table().await.expect("tables");
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let retention = Config::builder()
        .retention(Duration::from_secs(60))
        .build()
        .expect("config");
    let idem = Idempotency::new(store.clone())
        .with_config(retention)
        .with_clock(clock.clone());
    let (stuck, orphan) = (
        invocation("stuck")
            .with_identity("invoice:stuck")
            .expect("a valid identity"),
        invocation("orphan")
            .with_identity("invoice:orphan")
            .expect("a valid identity"),
    );
    crash_after_claim(&idem, &stuck).await;
    crash_after_claim(&idem, &orphan).await;
    // The orphan's record is deleted by TTL; the stuck one's is not (yet).
    db.client
        .delete_item()
        .table_name(&table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(orphan.key().to_string()),
        )
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::S("idempotency".into()),
        )
        .send()
        .await
        .expect("TTL's deletion");
    let layout = [
        "--table",
        &table,
        "--uniqueness-table",
        &uniqueness,
        "--sort-key",
        "sk=idempotency",
        "--attribute",
        "expires_at=ttl",
        "--attribute",
        "status=state",
    ];
    let cli = |args: &[&str]| {
        let mut all: Vec<&str> = layout.to_vec();
        all.extend_from_slice(args);
        idemctl(&db, &all)
    };

    let key = stuck.key().as_str().to_owned();
    let released = cli(&[
        "resolve",
        "--key",
        &key,
        "--retention",
        "24h",
        "--release",
        "--operator",
        "bob",
        "--reason",
        "no charge at the provider",
        "--yes",
    ]);
    stdout(&released);
    let said = String::from_utf8_lossy(&released.stderr);
    let identity = stuck.evidence_key().expect("identity");
    assert!(
        said.contains("IN_PROGRESS"),
        "it says what it found: {said}"
    );
    assert!(
        said.contains(&format!(
            "DELETE the permanent evidence of identity {identity}"
        )),
        "a release says it deletes the evidence: {said}"
    );
    let shown: Value = serde_json::from_str(&stdout(&cli(&["get", "--key", &key]))).expect("JSON");
    assert_eq!(shown["status"], "FAILED");
    assert_eq!(
        shown["audit"]["by"], "unverified:bob",
        "STS is out of reach: the name given is recorded as unverified"
    );
    assert_eq!(shown["audit"]["action"], "released from IN_PROGRESS");
    assert_eq!(shown["audit"]["reason"], "no charge at the provider");
    let gone = cli(&["get", "--identity", &identity]);
    assert!(!gone.status.success(), "the evidence was deleted");

    let orphan_identity = orphan.evidence_key().expect("identity");
    let listed = stdout(&cli(&["stuck", "--older-than", "1m", "--json"]));
    let orphaned: Vec<Value> = listed
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .filter(|line: &Value| line["identity"] == orphan_identity.as_str())
        .collect();
    assert_eq!(
        orphaned.len(),
        1,
        "the orphaned evidence is listed: {listed}"
    );
    assert_eq!(orphaned[0]["status"], "IN_PROGRESS");

    let result = std::env::temp_dir().join(format!("idemctl-ref-{}.json", std::process::id()));
    std::fs::write(&result, r#""inv-orphan-1""#).expect("write");
    let path = result.to_string_lossy().to_string();
    stdout(&cli(&[
        "resolve",
        "--identity",
        &orphan_identity,
        "--retention",
        "24h",
        "--completed",
        &path,
        "--operator",
        "bob",
        "--yes",
    ]));
    let evidence: Value =
        serde_json::from_str(&stdout(&cli(&["get", "--identity", &orphan_identity])))
            .expect("JSON");
    assert_eq!(evidence["status"], "COMPLETED");
    assert_eq!(evidence["result_ref"], "inv-orphan-1");
    assert_eq!(evidence["audit"]["action"], "completed from IN_PROGRESS");
    let _ = std::fs::remove_file(result);

    let unchecked = std::env::temp_dir().join(format!("idemctl-bad-{}.json", std::process::id()));
    std::fs::write(&unchecked, "{not json").expect("write");
    let refused = cli(&[
        "resolve",
        "--key",
        orphan.key().as_str(),
        "--retention",
        "24h",
        "--completed",
        &unchecked.to_string_lossy(),
        "--operator",
        "bob",
        "--yes",
    ]);
    assert!(
        !refused.status.success(),
        "a file that is not JSON is refused"
    );
    let _ = std::fs::remove_file(unchecked);

    // Evidence resolved as failed keeps the failure's kind and message in its trace.
    let declined = invocation("orphan-2")
        .with_identity("invoice:orphan-2")
        .expect("a valid identity");
    crash_after_claim(&idem, &declined).await;
    db.client
        .delete_item()
        .table_name(&table)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(declined.key().to_string()),
        )
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::S("idempotency".into()),
        )
        .send()
        .await
        .expect("TTL's deletion");
    let declined_identity = declined.evidence_key().expect("identity");
    stdout(&cli(&[
        "resolve",
        "--identity",
        &declined_identity,
        "--retention",
        "24h",
        "--failed",
        "declined",
        "--message",
        "the card was declined at the provider",
        "--reason",
        "checked the provider",
        "--operator",
        "bob",
        "--yes",
    ]));
    let evidence: Value =
        serde_json::from_str(&stdout(&cli(&["get", "--identity", &declined_identity])))
            .expect("JSON");
    assert_eq!(evidence["status"], "FAILED");
    assert_eq!(
        evidence["audit"]["reason"],
        "checked the provider (failed declined: the card was declined at the provider)"
    );
}

/// `tables create` against moto's DynamoDB (the embedded server keeps no backups): both tables
/// protected from deletion, with point-in-time recovery, as template.yaml deploys them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_create_protects_both_tables_as_the_template_does() {
    let moto = lambda_idempotency::testing::moto::start()
        .await
        .expect("moto's server");
    let client = aws_sdk_dynamodb::Client::new(&moto.sdk_config());
    let table = lambda_idempotency::testing::local::unique_table_name("cli-protected");
    let uniqueness = format!("{table}-u");
    let created = Command::new(env!("CARGO_BIN_EXE_idemctl"))
        .args(["--table", &table, "--uniqueness-table", &uniqueness])
        .args(["tables", "create"])
        .env("DYNAMODB_ENDPOINT", &moto.endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("idemctl runs");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    for name in [&table, &uniqueness] {
        let described = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .expect("described");
        assert_eq!(
            described
                .table()
                .and_then(|t| t.deletion_protection_enabled()),
            Some(true),
            "{name}: protected from deletion"
        );
        let backups = client
            .describe_continuous_backups()
            .table_name(name)
            .send()
            .await
            .expect("backups described");
        let recovery = backups
            .continuous_backups_description()
            .and_then(|d| d.point_in_time_recovery_description())
            .and_then(|p| p.point_in_time_recovery_status().cloned());
        assert_eq!(
            recovery,
            Some(aws_sdk_dynamodb::types::PointInTimeRecoveryStatus::Enabled),
            "{name}: point-in-time recovery"
        );
        let deleted = client.delete_table().table_name(name).send().await;
        assert!(deleted.is_err(), "{name}: a delete is refused");
    }
}

/// A release clears the record's steps: `resolve --release` names the steps the next
/// execution runs again as new (done and uncertain), and says that transactional ones commit
/// again and outbox events get new ids, before it asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_names_the_steps_it_runs_again() {
    let db = dynamo::start().await;
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let held = invocation("stepped");
    let charge_then_ship = |ctx: lambda_idempotency::ExecutionContext| async move {
        ctx.step("charge")
            .run(|_| async { Ok::<_, BoxError>(String::from("ch_1")) })
            .await?;
        ctx.step("ship")
            .effect_timeout(Duration::from_secs(1))
            .run(|_| async { Err::<String, _>(std::io::Error::other("no answer").into()) })
            .await?;
        Ok::<_, BoxError>(json!("shipped"))
    };
    idem.execute(&held, charge_then_ship)
        .await
        .expect_err("the shipment's answer was lost: given back");
    // Past the shipment's declared 1 s and the clocks' 5 s skew.
    clock.advance(Duration::from_secs(7));
    let err = idem
        .execute(&held, charge_then_ship)
        .await
        .expect_err("the uncertain shipment has no check");
    assert!(matches!(err, Error::Indeterminate { .. }), "{err:?}");

    let key = held.key().as_str().to_owned();
    // `get` lists each step: the charge done with its result's size, the shipment uncertain.
    let shown: Value =
        serde_json::from_str(&stdout(&idemctl(&db, &["get", "--key", &key]))).expect("JSON record");
    let steps = shown["steps"].as_array().expect("the steps");
    let named = |name: &str| {
        steps
            .iter()
            .find(|step| step["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {shown}"))
    };
    assert_eq!(named("charge")["done"], true);
    assert_eq!(named("charge")["result_bytes"], "\"ch_1\"".len());
    assert_eq!(named("ship")["done"], false, "the shipment is uncertain");
    let released = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            &key,
            "--retention",
            "24h",
            "--release",
            "--operator",
            "carol",
            "--yes",
        ],
    );
    stdout(&released);
    let said = String::from_utf8_lossy(&released.stderr);
    assert!(
        said.contains("run again as new (done: charge; uncertain: ship)"),
        "it names the steps it runs again: {said}"
    );
    assert!(
        said.contains("new event id"),
        "and what consumers see: {said}"
    );
}

/// The trace names the caller as AWS identifies it: STS `GetCallerIdentity` (moto's, on
/// loopback), never `$USER` or a name typed in. When STS cannot be reached, nothing is written
/// unless `--operator` is passed (then recorded as `unverified:NAME`, as the other cases here
/// show); `--by` is gone. The confirmation shows exactly what is written: the outcome's bytes
/// and digest, the retention and the trace, and `n` leaves the record as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_names_the_caller_as_aws_identifies_it() {
    let db = dynamo::start().await;
    let moto = lambda_idempotency::testing::moto::start()
        .await
        .expect("moto's server");
    let arn = aws_sdk_sts::Client::new(&moto.sdk_config())
        .get_caller_identity()
        .send()
        .await
        .expect("moto answers")
        .arn()
        .expect("an ARN")
        .to_owned();
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let held = invocation("sts");
    crash_after_claim(&idem, &held).await;
    let key = held.key().as_str().to_owned();
    let result = std::env::temp_dir().join(format!("idemctl-sts-{}.json", std::process::id()));
    std::fs::write(&result, r#"{"charged": "ch_9"}"#).expect("write");
    let path = result.to_string_lossy().to_string();
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "resolve",
            "--key",
            &key,
            "--retention",
            "2h",
            "--completed",
            &path,
            "--reason",
            "checked the ledger",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let status = || async {
        let shown: Value =
            serde_json::from_str(&stdout(&idemctl(&db, &["get", "--key", &key]))).expect("JSON");
        shown["status"].as_str().expect("status").to_owned()
    };
    fn args(args: &[String]) -> Vec<&str> {
        args.iter().map(String::as_str).collect()
    }

    let by = idemctl_with(
        &db,
        &args(&resolve(&["--by", "alice", "--yes"])),
        &moto.endpoint,
        None,
    );
    assert!(!by.status.success());
    assert!(String::from_utf8_lossy(&by.stderr).contains("--by is gone"));

    let unknown = idemctl(&db, &args(&resolve(&["--yes"])));
    assert!(!unknown.status.success(), "STS out of reach, no --operator");
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(said.contains("AWS cannot say who you are"), "{said}");
    assert_eq!(status().await, "IN_PROGRESS", "nothing was written");
    // A blank name names nobody: as if none were passed.
    let blank = idemctl(&db, &args(&resolve(&["--operator", " ", "--yes"])));
    assert!(
        !blank.status.success(),
        "STS out of reach, a blank --operator"
    );
    let said = String::from_utf8_lossy(&blank.stderr);
    assert!(said.contains("AWS cannot say who you are"), "{said}");
    assert_eq!(status().await, "IN_PROGRESS", "nothing was written");
    // A failure's message is refused where no failure is recorded, never dropped unsaid.
    let message = idemctl(
        &db,
        &args(&resolve(&[
            "--message",
            "provider confirms",
            "--operator",
            "alice",
            "--yes",
        ])),
    );
    assert!(!message.status.success(), "--message without --failed");
    let said = String::from_utf8_lossy(&message.stderr);
    assert!(said.contains("--failed"), "{said}");
    assert_eq!(status().await, "IN_PROGRESS", "nothing was written");
    // A failure named as the engine names its own (an effect applied, its result not kept;
    // a release), or a blank value, is refused: what is kept says what the operator found.
    for (failed, refused) in [
        ("outcome_too_large", "the engine's own"),
        ("released", "the engine's own"),
        (" ", "not blank"),
    ] {
        let answer = idemctl(
            &db,
            &[
                "resolve",
                "--key",
                &key,
                "--failed",
                failed,
                "--message",
                "the provider refused it",
                "--retention",
                "2h",
                "--reason",
                "checked the ledger",
                "--operator",
                "alice",
                "--yes",
            ],
        );
        assert!(!answer.status.success(), "--failed {failed:?}");
        let said = String::from_utf8_lossy(&answer.stderr);
        assert!(said.contains(refused), "--failed {failed:?}: {said}");
        assert_eq!(status().await, "IN_PROGRESS", "nothing was written");
    }

    let declined = idemctl_with(&db, &args(&resolve(&[])), &moto.endpoint, Some("n\n"));
    assert!(!declined.status.success(), "not confirmed");
    let prompt = String::from_utf8_lossy(&declined.stderr);
    let outcome = br#"{"charged":"ch_9"}"#;
    let digest = hex::encode(sha2::Sha256::digest(outcome));
    for line in [
        format!("record     {key}"),
        "status     COMPLETED".to_owned(),
        format!(
            "outcome    {} bytes, sha256 {digest}: {{\"charged\":\"ch_9\"}}",
            outcome.len()
        ),
        // The crashed claim is kept a day by its own retention: the resolution keeps it so.
        "(the record's own expiry, later than 2h from the write)".to_owned(),
        format!("trace by   {arn}"),
        "trace what completed from IN_PROGRESS".to_owned(),
        "trace why  checked the ledger".to_owned(),
    ] {
        assert!(
            prompt.contains(&line),
            "the prompt shows `{line}`: {prompt}"
        );
    }
    assert_eq!(
        status().await,
        "IN_PROGRESS",
        "declined: nothing was written"
    );

    // With --operator too, AWS's answer is what the trace keeps.
    stdout(&idemctl_with(
        &db,
        &args(&resolve(&["--operator", "alice", "--yes"])),
        &moto.endpoint,
        None,
    ));
    let shown: Value =
        serde_json::from_str(&stdout(&idemctl(&db, &["get", "--key", &key]))).expect("JSON");
    assert_eq!(shown["status"], "COMPLETED");
    assert_eq!(shown["audit"]["by"], arn.as_str());
    assert_eq!(shown["audit"]["reason"], "checked the ledger");
    let _ = std::fs::remove_file(result);
}

/// Whether `c` would reach a terminal as something other than a character shown: controls
/// (ANSI escapes, `\r`, C1) other than the output's own newlines, and bidirectional or
/// invisible format characters.
fn unsafe_char(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(
            c,
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}'
        )
}

/// Everything idemctl prints from a table is escaped: keys, identities, operations, the
/// trace's fields, in tables, JSON (which still parses to the stored strings) and the
/// confirmation; and text an operator types with a control character is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idemctl_escapes_what_a_table_holds() {
    use aws_sdk_dynamodb::types::AttributeValue as A;
    use lambda_idempotency::record::epoch_millis;
    use std::collections::HashMap;

    let db = dynamo::start().await;
    let hour_ago = epoch_millis(SystemTime::now() - Duration::from_secs(3600));
    let n = |v: u64| A::N(v.to_string());
    let s = |v: &str| A::S(v.to_owned());
    let key = "hostile\u{1b}[31m#charge\r\u{202e}#v1#abc";
    let by = "mallory\u{1b}]0;pwned\u{7}";
    let action = "completed\r\u{1b}[2K from IN_PROGRESS";
    let reason = "\u{202e}gnp.exe\u{9b}1m";
    let identity = "hostile#id=\u{1b}[41minv\u{2066}";
    let record = HashMap::from([
        ("pk".to_owned(), s(key)),
        ("status".to_owned(), s("INDETERMINATE")),
        ("fingerprint".to_owned(), s(&"0".repeat(64))),
        ("lease_token".to_owned(), s("t\u{1b}")),
        ("attempt".to_owned(), n(2)),
        ("lease_expires_at_ms".to_owned(), n(hour_ago)),
        ("expires_at".to_owned(), n(hour_ago / 1000 + 86_400 * 2)),
        ("created_at".to_owned(), n(hour_ago)),
        ("completed_at".to_owned(), n(hour_ago)),
        ("request_id".to_owned(), s("req\u{1b}[1A")),
        ("identity".to_owned(), s("inv\u{9b}31m")),
        (
            "audit".to_owned(),
            A::M(HashMap::from([
                ("by".to_owned(), s(by)),
                ("at".to_owned(), n(hour_ago)),
                ("action".to_owned(), s(action)),
                ("reason".to_owned(), s(reason)),
            ])),
        ),
    ]);
    db.client
        .put_item()
        .table_name(&db.table)
        .set_item(Some(record))
        .send()
        .await
        .expect("put");
    let evidence = HashMap::from([
        ("pk".to_owned(), s(identity)),
        (
            "operation_key".to_owned(),
            s("hostile#charge\u{1b}[8m#v1#gone"),
        ),
        ("fingerprint".to_owned(), s(&"0".repeat(64))),
        ("status".to_owned(), s("IN_PROGRESS")),
        ("created_at".to_owned(), n(hour_ago)),
    ]);
    db.client
        .put_item()
        .table_name(&db.uniqueness_table)
        .set_item(Some(evidence))
        .send()
        .await
        .expect("put");

    let clean = |output: &Output, what: &str| {
        for stream in [&output.stdout, &output.stderr] {
            let text = String::from_utf8_lossy(stream);
            assert!(
                !text.chars().any(unsafe_char),
                "{what} prints a raw control or bidi character: {text:?}"
            );
        }
    };
    let get = idemctl(&db, &["get", "--key", key]);
    clean(&get, "get --key");
    let shown: Value = serde_json::from_str(&stdout(&get)).expect("JSON");
    assert_eq!(shown["key"], key, "JSON parses back to the stored strings");
    assert_eq!(shown["audit"]["by"], by);
    assert_eq!(shown["audit"]["action"], action);
    assert_eq!(shown["audit"]["reason"], reason);
    assert_eq!(shown["identity"], "inv\u{9b}31m");

    let get = idemctl(&db, &["get", "--identity", identity]);
    clean(&get, "get --identity");
    let shown: Value = serde_json::from_str(&stdout(&get)).expect("JSON");
    assert_eq!(shown["identity"], identity);

    for args in [
        &["stuck", "--older-than", "1m"][..],
        &["stuck", "--older-than", "1m", "--json"],
        &["stats"],
        &["stats", "--json"],
    ] {
        let output = idemctl(&db, args);
        clean(&output, &args.join(" "));
        let text = stdout(&output);
        assert!(text.contains("charge"), "{args:?} lists it: {text}");
        if args == ["stats"] {
            assert!(text.contains("charge\\u{d}\\u{202e}"), "escaped: {text}");
        }
        if !args.contains(&"--json") && args[0] == "stuck" {
            assert!(
                text.contains("hostile\\u{1b}[31m#charge\\u{d}\\u{202e}#v1#abc"),
                "escaped, readable: {text}"
            );
        }
    }
    let listed = stdout(&idemctl(&db, &["stuck", "--older-than", "1m", "--json"]));
    let keys: Vec<Value> = listed
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("JSON line"))
        .collect();
    assert!(keys.iter().any(|line| line["key"] == key), "{listed}");
    assert!(
        keys.iter().any(|line| line["identity"] == identity),
        "{listed}"
    );

    // The confirmation, declined: escaped too.
    let prompt = idemctl_with(
        &db,
        &[
            "resolve",
            "--key",
            key,
            "--retention",
            "24h",
            "--release",
            "--operator",
            "ops",
        ],
        &unreachable(),
        Some("n\n"),
    );
    assert!(!prompt.status.success());
    clean(&prompt, "resolve's confirmation");
    let said = String::from_utf8_lossy(&prompt.stderr);
    assert!(said.contains("trace by   unverified:ops"), "{said}");
    assert!(
        said.contains("trace what released from INDETERMINATE"),
        "{said}"
    );

    let typed = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            key,
            "--retention",
            "24h",
            "--release",
            "--operator",
            "ops",
            "--reason",
            "fine\u{1b}[1A",
            "--yes",
        ],
    );
    assert!(
        !typed.status.success(),
        "a reason with an escape is refused"
    );
    clean(&typed, "the refusal");
}

/// Every resolution is on the audit trail before it is written, with its result after, and the
/// trail outlives the next claim of the operation and its record's TTL: it is kept in the
/// uniqueness table (no TTL, no claim touches it), under keys no function's role may write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_stays_on_the_audit_trail_after_the_next_claim_and_ttl() {
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let held = invocation("audited");
    crash_after_claim(&idem, &held).await;
    clock.advance(Duration::from_secs(60));
    let key = held.key().as_str().to_owned();

    stdout(&idemctl(
        &db,
        &[
            "resolve",
            "--key",
            &key,
            "--retention",
            "1s",
            "--release",
            "--operator",
            "alice",
            "--reason",
            "provider shows no charge",
            "--yes",
        ],
    ));
    // The next delivery claims afresh and completes; the released record then expires and
    // TTL deletes it.
    let rerun = idem
        .execute(&held, |_| async { Ok::<_, std::io::Error>(json!("ran")) })
        .await
        .expect("runs after the release");
    assert!(!rerun.is_replay());
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert!(db.sweep().await >= 1, "TTL deleted the operation's record");

    let items = audit_trail(&db).await;
    let attempt = items
        .iter()
        .find(|item| item.get("event") == Some(&AttributeValue::S("resolution".into())))
        .expect("the attempt is on the trail");
    let text = |name: &str| {
        attempt
            .get(name)
            .and_then(|value| value.as_s().ok())
            .cloned()
    };
    assert_eq!(text("target").as_deref(), Some(key.as_str()));
    assert_eq!(text("by").as_deref(), Some("unverified:alice"));
    assert_eq!(text("reason").as_deref(), Some("provider shows no charge"));
    assert!(
        attempt
            .get("writes")
            .and_then(|writes| writes.as_l().ok())
            .is_some_and(|writes| !writes.is_empty()),
        "the trail keeps what the resolution wrote"
    );
    let result = items
        .iter()
        .find(|item| item.get("event") == Some(&AttributeValue::S("resolution_result".into())))
        .expect("the result is on the trail");
    assert_eq!(result.get("resolved"), Some(&AttributeValue::Bool(true)));
    assert_eq!(items.len(), 2);

    // The stuck check's evidence scan passes the trail by.
    let (evidence, skipped, _) = db
        .store()
        .scan_unsettled_evidence(None)
        .await
        .expect("evidence scan");
    assert_eq!((evidence.len(), skipped), (0, 0));
}

/// `idemctl resolve --release` of a key no table holds, with `table` in `IDEMPOTENCY_TABLE`
/// and `uniqueness` in `UNIQUENESS_TABLE` (`None`: unset).
fn release_with(db: &dynamo::Dynamo, table: &str, uniqueness: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemctl"));
    command
        .args([
            "resolve",
            "--key",
            "ns#op#v1#00",
            "--retention",
            "24h",
            "--release",
            "--operator",
            "alice",
            "--yes",
        ])
        .env("DYNAMODB_ENDPOINT", &db.endpoint)
        .env("AWS_ENDPOINT_URL_STS", unreachable())
        .env("IDEMPOTENCY_TABLE", table)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    match uniqueness {
        Some(uniqueness) => command.env("UNIQUENESS_TABLE", uniqueness),
        None => command.env_remove("UNIQUENESS_TABLE"),
    };
    command.output().expect("idemctl runs")
}

#[tokio::test]
async fn a_resolution_without_a_uniqueness_table_needs_to_say_so() {
    let db = dynamo::start().await;
    let output = release_with(&db, &db.table, None);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--without-audit-trail"));
}

/// A blank table variable (an empty export, a pasted line break) reads as unset, and a padded
/// name as the name, as the functions read them: never a table named "" or "t\n".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_and_padded_table_variables_read_as_the_functions_read_them() {
    let db = dynamo::start().await;
    let output = release_with(&db, &format!(" {}\n", db.table), Some(""));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--without-audit-trail"),
        "the blank uniqueness table is none: {stderr}"
    );
    let mut padded = db.table.clone();
    padded.insert(0, ' ');
    padded.push('\n');
    let stats = stdout(&idemctl(&db, &["stats", "--json", "--table", &padded]));
    assert!(stats.trim_start().starts_with('['), "{stats}");
}

/// What the confirmation shows is what is written: a failure kind or message past what a
/// record keeps is refused, not cut on the way to the table.
#[tokio::test]
async fn a_failure_longer_than_a_record_keeps_is_refused() {
    let db = dynamo::start().await;
    let long_kind = "k".repeat(129);
    let long_message = "m".repeat(1025);
    for (kind, message) in [
        (long_kind.as_str(), "short"),
        ("declined", long_message.as_str()),
    ] {
        let output = idemctl(
            &db,
            &[
                "resolve",
                "--key",
                "ns#op#v1#00",
                "--retention",
                "24h",
                "--failed",
                kind,
                "--message",
                message,
                "--operator",
                "alice",
                "--yes",
            ],
        );
        assert!(!output.status.success());
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("takes at most"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A claim whose lease ran out moments ago by the operator's clock (which may run ahead of the
/// holder's) is not resolved: the holder may still be running its effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_just_ran_out_is_not_resolved() {
    let db = dynamo::start().await;
    // The claim was made 40 s ago with a 30 s lease: it ran out 10 s ago.
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(40));
    let idem = Idempotency::new(db.store()).with_clock(clock);
    let inv = invocation("just-expired");
    let crashed = crash_after_claim(&idem, &inv).await;

    let output = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            inv.key().as_str(),
            "--retention",
            "24h",
            "--release",
            "--operator",
            "alice",
            "--yes",
        ],
    );
    assert!(!output.status.success(), "refused");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("may run ahead"), "{stderr}");
    let record = lambda_idempotency::store::StoreExt::get(&db.store(), inv.key())
        .await
        .expect("read");
    assert_eq!(record, Some(crashed), "nothing changed");
}

/// The audit trail keeps a completed resolution's outcome by its length and digest, never its
/// text: the trail has no TTL and the stuck check's role scans its table, while the record
/// drops the outcome with its retention. The operator still sees the text before confirming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_keeps_an_outcomes_digest_never_its_text() {
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let held = invocation("audited-outcome");
    crash_after_claim(&idem, &held).await;
    clock.advance(Duration::from_secs(600));
    let outcome = r#"{"card":"4111-1111-1111-1111"}"#;
    let result = std::env::temp_dir().join(format!("idemctl-trail-{}.json", std::process::id()));
    std::fs::write(&result, outcome).expect("write");
    let path = result.to_string_lossy().to_string();

    let output = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            held.key().as_str(),
            "--retention",
            "24h",
            "--completed",
            &path,
            "--operator",
            "alice",
            "--yes",
        ],
    );
    stdout(&output);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("4111-1111-1111-1111"),
        "the operator sees what is written"
    );

    let writes: Vec<String> = audit_trail(&db)
        .await
        .iter()
        .filter_map(|item| item.get("writes").and_then(|writes| writes.as_l().ok()))
        .flatten()
        .filter_map(|line| line.as_s().ok().cloned())
        .collect();
    let digest = hex::encode(sha2::Sha256::digest(outcome.as_bytes()));
    assert!(
        writes.iter().any(
            |line| line.contains(&digest) && line.contains(&format!("{} bytes", outcome.len()))
        ),
        "the outcome by its length and digest: {writes:?}"
    );
    assert!(
        !writes.iter().any(|line| line.contains("4111")),
        "never its text: {writes:?}"
    );
}

/// A resolution the engine would refuse (a live lease, a settled record) is refused before
/// anything is written: no attempt on the audit trail, the record as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_of_what_no_operator_holds_leaves_no_trail() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let live = invocation("still-running");
    let held = crash_after_claim(&idem, &live).await;
    let settled = invocation("settled");
    idem.execute(&settled, |_| async {
        Ok::<_, std::io::Error>(json!("done"))
    })
    .await
    .expect("completes");
    let completed = lambda_idempotency::store::StoreExt::get(&db.store(), settled.key())
        .await
        .expect("read");

    // Evidence whose record still stands: the record is what an operator resolves.
    let with_identity = invocation("with-evidence")
        .with_identity("payment:p-9")
        .expect("identity");
    crash_after_claim(&idem, &with_identity).await;
    let evidence_key = with_identity.evidence_key().expect("an identity");

    for (flag, target, why) in [
        ("--key", live.key().as_str(), "its lease is live"),
        ("--key", settled.key().as_str(), "COMPLETED, settled"),
        (
            "--identity",
            evidence_key.as_str(),
            "its record still stands",
        ),
    ] {
        let output = idemctl(
            &db,
            &[
                "resolve",
                flag,
                target,
                "--retention",
                "24h",
                "--release",
                "--operator",
                "alice",
                "--yes",
            ],
        );
        assert!(!output.status.success(), "refused");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(why), "{stderr}");
    }
    assert_eq!(audit_trail(&db).await, Vec::new(), "nothing on the trail");
    let store = db.store();
    for (key, was) in [(live.key(), Some(held)), (settled.key(), completed)] {
        let now = lambda_idempotency::store::StoreExt::get(&store, key).await;
        assert_eq!(now.expect("read"), was, "nothing changed");
    }
}

/// An attempt on the trail always gets its result: when the engine's call fails (here an
/// outcome over the limit), the result says not resolved, and the error's kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_ends_in_an_error_has_its_result_on_the_trail() {
    let clock = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock.clone());
    let held = invocation("too-large-resolution");
    crash_after_claim(&idem, &held).await;
    clock.advance(Duration::from_secs(600));
    let result =
        std::env::temp_dir().join(format!("idemctl-too-large-{}.json", std::process::id()));
    let outcome = json!("x".repeat(lambda_idempotency::config::DEFAULT_MAX_OUTCOME_BYTES));
    std::fs::write(&result, outcome.to_string()).expect("write");
    let path = result.to_string_lossy().to_string();

    let output = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            held.key().as_str(),
            "--retention",
            "24h",
            "--completed",
            &path,
            "--operator",
            "alice",
            "--yes",
        ],
    );
    let _ = std::fs::remove_file(&result);
    assert!(!output.status.success(), "the engine refused it");
    let items = audit_trail(&db).await;
    let event = |name: &str| {
        items
            .iter()
            .find(|item| item.get("event") == Some(&AttributeValue::S(name.into())))
            .cloned()
    };
    assert!(event("resolution").is_some(), "the attempt: {items:?}");
    let outcome = event("resolution_result").expect("its result");
    assert_eq!(outcome.get("resolved"), Some(&AttributeValue::Bool(false)));
    assert_eq!(
        outcome.get("error"),
        Some(&AttributeValue::S("OutcomeTooLarge".into()))
    );
}
