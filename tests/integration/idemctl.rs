//! The operator CLI against the embedded server: stuck, stats, get, resolve, tables create.

use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::reconcile::{Reconciliation, Takeover};
use lambda_idempotency::testing::conformance::crash_after_claim;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{
    BoxError, Config, Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope,
};
use serde_json::{Value, json};

fn invocation(material: &str) -> Invocation {
    let scope = OperationScope::new("cli-test", "charge").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    Invocation::new(
        key,
        Fingerprint::of(&material).expect("fingerprint"),
        Duration::from_secs(30),
    )
}

fn idemctl(db: &dynamo::Dynamo, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemctl"))
        .args(args)
        .env("DYNAMODB_ENDPOINT", &db.endpoint)
        .env("IDEMPOTENCY_TABLE", &db.table)
        .env("UNIQUENESS_TABLE", &db.uniqueness_table)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("idemctl runs")
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
        .with_reconciler(|_: Takeover| async { Ok::<_, BoxError>(Reconciliation::Unknown) });
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

    let stats: Value =
        serde_json::from_str(&stdout(&idemctl(&db, &["stats", "--json"]))).expect("JSON stats");
    let count = |status: &str| {
        stats
            .as_array()
            .expect("rows")
            .iter()
            .find(|row| row["status"] == status && row["operation"] == "charge")
            .map_or(0, |row| row["count"].as_u64().expect("count"))
    };
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
            "--by",
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
            "--by",
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
            "--by",
            "alice",
        ],
    );
    assert!(
        !unconfirmed.status.success(),
        "no --yes and no answer: nothing changed"
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
        "--by",
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
    assert_eq!(shown["audit"]["by"], "bob");
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
        "--by",
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
        "--by",
        "bob",
        "--yes",
    ]);
    assert!(
        !refused.status.success(),
        "a file that is not JSON is refused"
    );
    let _ = std::fs::remove_file(unchecked);
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
            .run(|_| async { Err::<String, _>(std::io::Error::other("no answer")) })
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
    let released = idemctl(
        &db,
        &[
            "resolve",
            "--key",
            &key,
            "--retention",
            "24h",
            "--release",
            "--by",
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
