//! The storage-format policy, checked: today's code reads every record an earlier version
//! wrote (each version's attributes only, written here with the raw SDK as that version wrote
//! them), and a record of a handler that uses nothing new is written with no attribute an
//! earlier version does not know, so that a rolling deploy's older readers read it too.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::testing::conformance::{invocation, start_time, stored};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, Origin};

/// The attributes each version writes on a settled record (with a business identity, an
/// operator's trace, steps where the version has them), by default name.
const V0_1: &[&str] = &[
    "pk",
    "status",
    "fingerprint",
    "lease_token",
    "attempt",
    "lease_expires_at_ms",
    "expires_at",
    "created_at",
    "outcome",
    "completed_at",
    "request_id",
    "identity",
];
/// 0.2 and 0.3 add the outcome's format (compressed, or in parts) and an operator's trace.
const V0_3_ADDED: &[&str] = &["outcome_format", "audit"];
/// 0.5 marks every record with the rule that derived its key and fingerprint: an attribute
/// every earlier reader ignores (they read attributes by name).
const V0_5_MARKER: &str = "key_rule";

/// `inv`'s record as the table holds it, attribute by attribute.
async fn raw_record(db: &dynamo::Dynamo, inv: &Invocation) -> HashMap<String, AttributeValue> {
    db.client
        .get_item()
        .table_name(&db.table)
        .key("pk", AttributeValue::S(inv.key().to_string()))
        .consistent_read(true)
        .send()
        .await
        .expect("read")
        .item
        .expect("the record")
}

fn millis(at: SystemTime) -> AttributeValue {
    let ms = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    AttributeValue::N(ms.to_string())
}

fn secs(at: SystemTime) -> AttributeValue {
    let s = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    AttributeValue::N(s.to_string())
}

/// A record as 0.1 wrote it: the attributes of [`V0_1`], the outcome inline and uncompressed.
fn record_0_1(
    inv: &Invocation,
    status: &str,
    outcome: Option<&[u8]>,
    lease_expires_at: SystemTime,
) -> HashMap<String, AttributeValue> {
    let now = start_time();
    let mut item = HashMap::from([
        ("pk".to_owned(), AttributeValue::S(inv.key().to_string())),
        ("status".to_owned(), AttributeValue::S(status.to_owned())),
        (
            "fingerprint".to_owned(),
            AttributeValue::S(inv.fingerprint().as_str().to_owned()),
        ),
        (
            "lease_token".to_owned(),
            AttributeValue::S("0.1-token".to_owned()),
        ),
        ("attempt".to_owned(), AttributeValue::N("1".to_owned())),
        ("lease_expires_at_ms".to_owned(), millis(lease_expires_at)),
        (
            "expires_at".to_owned(),
            secs(now + Duration::from_secs(3600)),
        ),
        (
            "created_at".to_owned(),
            millis(now - Duration::from_secs(120)),
        ),
        (
            "request_id".to_owned(),
            AttributeValue::S("req-0.1".to_owned()),
        ),
    ]);
    if let Some(outcome) = outcome {
        item.insert(
            "outcome".to_owned(),
            AttributeValue::B(Blob::new(outcome.to_vec())),
        );
        item.insert(
            "completed_at".to_owned(),
            millis(now - Duration::from_secs(60)),
        );
    }
    item
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_an_earlier_version_wrote_are_read_by_todays_code() {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock);
    let put = |item: HashMap<String, AttributeValue>| {
        db.client
            .put_item()
            .table_name(&db.table)
            .set_item(Some(item))
            .send()
    };

    // COMPLETED by 0.1: replayed byte for byte, the handler not run.
    let completed = invocation("format-0.1-completed", &serde_json::json!({"order": 1}));
    let outcome = br#"{"charged":"o-1","amount":1200}"#;
    put(record_0_1(
        &completed,
        "COMPLETED",
        Some(outcome),
        start_time() - Duration::from_secs(90),
    ))
    .await
    .expect("a 0.1 record");
    let replayed = idem
        .execute(&completed, |_ctx| async {
            Ok::<_, BoxError>(serde_json::json!("ran again"))
        })
        .await
        .expect("replayed");
    assert_eq!(replayed.origin(), Origin::Replayed);
    assert_eq!(replayed.raw_json().get().as_bytes(), outcome);

    // COMPLETED by a later version: another rule marker and an attribute this one does not
    // know are read past, as earlier readers read past 0.5's marker.
    let later = invocation("format-later-completed", &serde_json::json!({"order": 4}));
    let mut item = record_0_1(
        &later,
        "COMPLETED",
        Some(outcome),
        start_time() - Duration::from_secs(90),
    );
    item.insert("key_rule".to_owned(), AttributeValue::N("3".into()));
    item.insert("later_field".to_owned(), AttributeValue::S("x".into()));
    put(item).await.expect("a later version's record");
    let replayed = idem
        .execute(&later, |_ctx| async {
            Ok::<_, BoxError>(serde_json::json!("ran again"))
        })
        .await
        .expect("replayed");
    assert_eq!(replayed.raw_json().get().as_bytes(), outcome);
    let record = stored(&idem, later.key(), "kept").await;
    assert_eq!(
        record.fingerprint.rule(),
        lambda_idempotency::key::KeyRule::Other(3)
    );

    // IN_PROGRESS by 0.1, its lease run out: taken over (held for an operator by default).
    let crashed = invocation("format-0.1-crashed", &serde_json::json!({"order": 2}));
    put(record_0_1(
        &crashed,
        "IN_PROGRESS",
        None,
        start_time() - Duration::from_secs(60),
    ))
    .await
    .expect("a 0.1 record");
    let held = idem
        .execute(&crashed, |_ctx| async {
            Ok::<_, BoxError>(serde_json::json!("ran again"))
        })
        .await
        .expect_err("held: the crashed attempt may have acted");
    assert!(matches!(held, Error::Indeterminate { .. }), "got {held:?}");
    let record = stored(&idem, crashed.key(), "kept").await;
    assert_eq!(record.lease.attempt, 2, "taken over from 0.1's attempt 1");

    // A 0.1 record whose intent differs: refused, not replayed.
    let other = invocation("format-0.1-completed", &serde_json::json!({"order": 99}));
    let conflict = idem
        .execute(&other, |_ctx| async {
            Ok::<_, BoxError>(serde_json::json!("ran"))
        })
        .await
        .expect_err("another intent");
    assert!(
        matches!(conflict, Error::PayloadConflict { .. }),
        "got {conflict:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_uses_nothing_new_writes_only_what_earlier_readers_know() {
    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock);
    let inv = invocation("format-today", &serde_json::json!({"order": 3}))
        .with_identity("invoice:format-today")
        .expect("identity");
    idem.execute(&inv, |_ctx| async {
        Ok::<_, BoxError>(serde_json::json!({"charged": "o-3"}))
    })
    .await
    .expect("completed");
    let item = raw_record(&db, &inv).await;
    assert_eq!(
        item.get(V0_5_MARKER),
        Some(&AttributeValue::N("2".into())),
        "the record names the exact-integers rule"
    );
    let written: BTreeSet<&str> = item.keys().map(String::as_str).collect();
    let known: BTreeSet<&str> = V0_1
        .iter()
        .chain(V0_3_ADDED)
        .chain([&V0_5_MARKER])
        .copied()
        .collect();
    let unknown: Vec<&&str> = written.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "a record without steps carries attributes 0.3 does not know: {unknown:?}"
    );
    let small: BTreeSet<&str> = V0_1.iter().chain([&V0_5_MARKER]).copied().collect();
    assert!(
        written.is_subset(&small),
        "a small outcome is written as 0.1 wrote it (inline, no format attribute), with the \
         rule marker: {written:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rolling_deploy_setting_keeps_outcomes_as_0_1_reads_them() {
    use lambda_idempotency::store::OutcomeStorage;

    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let storage = OutcomeStorage::default()
        .inline_up_to(OutcomeStorage::MAX_INLINE_ITEM_BYTES)
        .compression(false);
    let idem = Idempotency::new(db.store().with_outcome_storage(storage)).with_clock(clock);
    let inv = invocation("format-legacy-outcome", &serde_json::json!({"order": 4}));
    let report = "x".repeat(20 * 1024);
    let done = idem
        .execute(&inv, |_ctx| async {
            Ok::<_, BoxError>(serde_json::json!({ "report": report }))
        })
        .await
        .expect("completed");
    let item = raw_record(&db, &inv).await;
    assert!(
        !item.contains_key("outcome_format"),
        "inline and uncompressed: no format attribute"
    );
    assert_eq!(
        item["outcome"].as_b().map(|blob| blob.as_ref()),
        Ok(done.raw_json().get().as_bytes()),
        "the outcome's JSON bytes, as 0.1 wrote and reads them"
    );
}

/// A step as another build may have encoded it: `result` stored as `encoding` says.
fn step_item(name: &str, result: Option<&[u8]>, encoding: &str) -> AttributeValue {
    let mut fields = HashMap::from([
        ("name".to_owned(), AttributeValue::S(name.to_owned())),
        ("attempt".to_owned(), AttributeValue::N("1".to_owned())),
    ]);
    if let Some(result) = result {
        let stored = match encoding {
            // Another zstd level than today's (3): other bytes for the same result.
            "zstd-19" => {
                fields.insert("codec".to_owned(), AttributeValue::S("zstd".to_owned()));
                fields.insert(
                    "length".to_owned(),
                    AttributeValue::N(result.len().to_string()),
                );
                zstd::bulk::compress(result, 19).expect("compressed")
            }
            // Uncompressed although today's code would compress it (a build without zstd).
            _ => result.to_vec(),
        };
        fields.insert("result".to_owned(), AttributeValue::B(Blob::new(stored)));
    }
    // A field a later build added: read past.
    fields.insert(
        "note".to_owned(),
        AttributeValue::S("a later field".to_owned()),
    );
    AttributeValue::M(fields)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_attempt_whose_steps_another_build_encoded_is_taken_over() {
    use lambda_idempotency::reconcile::Recovery;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store())
        .with_clock(clock)
        .with_recovery(Recovery::Steps);
    // The charge's recorded result: a JSON string long enough that today's code compresses it.
    let receipt = "r-".repeat(1500);
    let large = serde_json::to_vec(&receipt).expect("JSON");
    for (case, encoding, steps_version) in [
        ("uncompressed", "plain", None),
        ("zstd-19", "zstd-19", None),
        ("counted", "zstd-19", Some("4")),
    ] {
        let inv = invocation(
            &format!("format-steps-{case}"),
            &serde_json::json!({"order": case}),
        );
        let mut item = record_0_1(
            &inv,
            "IN_PROGRESS",
            None,
            start_time() - Duration::from_secs(60),
        );
        item.insert(
            "steps".to_owned(),
            AttributeValue::L(vec![
                step_item("charge", Some(&large), encoding),
                step_item("email", None, encoding),
            ]),
        );
        if let Some(version) = steps_version {
            item.insert(
                "steps_version".to_owned(),
                AttributeValue::N(version.to_owned()),
            );
        }
        db.client
            .put_item()
            .table_name(&db.table)
            .set_item(Some(item))
            .send()
            .await
            .expect("a crashed attempt's record");

        let charges = AtomicUsize::new(0);
        let emails = AtomicUsize::new(0);
        let (charges, emails) = (&charges, &emails);
        let done = idem
            .execute(&inv, |ctx| async move {
                let receipt: String = ctx
                    .step("charge")
                    .run(|_key| async move {
                        charges.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(String::new())
                    })
                    .await?;
                ctx.step("email")
                    .repeat_safe()
                    .run(|_key| async move {
                        emails.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(())
                    })
                    .await?;
                Ok::<_, BoxError>(receipt)
            })
            .await
            .unwrap_or_else(|err| panic!("{case}: taken over and finished: {err:?}"));
        assert_eq!(
            charges.load(Ordering::SeqCst),
            0,
            "{case}: the charge replayed"
        );
        assert_eq!(
            emails.load(Ordering::SeqCst),
            1,
            "{case}: the pending step ran"
        );
        assert_eq!(done.value(), &receipt, "{case}");
        let record = stored(&idem, inv.key(), "kept").await;
        assert_eq!(record.lease.attempt, 2, "{case}: attempt 2 took over");
    }
}

/// An operator resolves a stuck attempt as it read it, also when a build before 0.5 holds it
/// (a build that counts none of its step writes: no `steps_version`): when that holder, its
/// lease run out but still running, records its charge's result after the operator looked, the
/// release fails instead of letting a redelivery charge again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_never_resolves_past_a_step_a_holder_before_0_5_recorded_after_it_looked() {
    use lambda_idempotency::engine::Resolution;
    use lambda_idempotency::record::Status;
    use lambda_idempotency::testing::conformance::operator;

    let clock = ManualClock::new(start_time());
    let db = dynamo::start_with_clock(clock.clone()).await;
    let idem = Idempotency::new(db.store()).with_clock(clock);
    for (case, resolution) in [
        ("release", Resolution::Release),
        (
            "completed",
            Resolution::Completed(serde_json::json!({"charged": true})),
        ),
    ] {
        let inv = invocation(
            &format!("operator-past-0-4-step-{case}"),
            &serde_json::json!({"order": case}),
        );
        let mut item = record_0_1(
            &inv,
            "IN_PROGRESS",
            None,
            start_time() - Duration::from_secs(600),
        );
        item.insert(
            "steps".to_owned(),
            AttributeValue::L(vec![step_item("charge", None, "plain")]),
        );
        db.client
            .put_item()
            .table_name(&db.table)
            .set_item(Some(item))
            .send()
            .await
            .expect("a stuck attempt of a build before 0.5");
        let shown = stored(&idem, inv.key(), "shown").await;

        // The holder records the charge's result as its build does: no write count.
        db.client
            .update_item()
            .table_name(&db.table)
            .key("pk", AttributeValue::S(inv.key().to_string()))
            .update_expression("SET steps[0].#result = :result")
            .expression_attribute_names("#result", "result")
            .expression_attribute_values(
                ":result",
                AttributeValue::B(Blob::new(b"\"ch-1\"".to_vec())),
            )
            .send()
            .await
            .expect("the holder's step result");

        let resolved = idem
            .resolve_as_read::<serde_json::Value>(&shown, resolution, &operator())
            .await
            .expect("answered");
        assert!(
            !resolved,
            "{case}: the record changed since the operator looked"
        );
        let record = stored(&idem, inv.key(), "kept").await;
        assert_eq!(record.status, Status::InProgress, "{case}: not resolved");
        assert_eq!(
            record.steps[0].result.as_deref(),
            Some(&b"\"ch-1\""[..]),
            "{case}: the charge's result stands"
        );
    }
}
