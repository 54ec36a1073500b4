//! Where the DynamoDB store keeps outcomes (`OutcomeStorage`), read back from the table itself:
//! a record that stays at one write unit however large its outcome, compression, part items
//! past the 400 KB item limit with the record's TTL plus a margin, and the faults a two-step
//! settlement meets (a part throttled past every retry, a settlement whose answer is lost, a
//! part that is gone) — never a partial replay, never a second run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::reconcile::{Checked, Recovery, Takeover};
use lambda_idempotency::record::{Status, epoch_secs};
use lambda_idempotency::store::{
    DynamoDbStore, OutcomeStorage, PART_BYTES, PART_TTL_MARGIN, StoreExt,
};
use lambda_idempotency::testing::conformance::{counted, invocation, start_time};
use lambda_idempotency::testing::dynamo::{self, Dynamo, item_size};
use lambda_idempotency::testing::interceptor::{
    FaultInterceptor, SDK_ATTEMPTS, SdkFault, SdkOperation, client_with,
};
use lambda_idempotency::testing::outcomes::{compressible, incompressible};
use lambda_idempotency::{BoxError, Config, Error, Idempotency, Invocation, Origin, StoreError};
use serde_json::json;

type Item = std::collections::HashMap<String, AttributeValue>;

/// An engine over a fresh table, with faults and a manual clock.
struct Rig {
    idem: Idempotency,
    faults: FaultInterceptor,
    dynamo: Dynamo,
    clock: ManualClock,
}

impl Rig {
    async fn new(storage: OutcomeStorage) -> Self {
        let clock = ManualClock::new(start_time());
        let dynamo = dynamo::start_with_clock(clock.clone()).await;
        let faults = FaultInterceptor::new();
        let store =
            DynamoDbStore::new(client_with(dynamo.endpoint.clone(), &faults), &dynamo.table)
                .with_uniqueness_table(&dynamo.uniqueness_table)
                .with_outcome_storage(storage);
        let idem = Idempotency::new(store).with_clock(clock.clone());
        Self {
            idem,
            faults,
            dynamo,
            clock,
        }
    }

    /// Every item of the table, as stored.
    async fn items(&self) -> Vec<Item> {
        self.dynamo
            .client
            .scan()
            .table_name(&self.dynamo.table)
            .send()
            .await
            .expect("scan")
            .items
            .unwrap_or_default()
    }

    /// The record item of `inv`, as stored.
    async fn record_item(&self, inv: &Invocation) -> Item {
        self.items()
            .await
            .into_iter()
            .find(|item| item["pk"].as_s().ok().map(String::as_str) == Some(inv.key().as_str()))
            .expect("the record item")
    }

    /// Requests the store has sent so far: (PutItem, GetItem).
    fn sent(&self) -> (usize, usize) {
        (
            self.faults.requests(SdkOperation::PutItem),
            self.faults.requests(SdkOperation::GetItem),
        )
    }

    /// The part items of `inv`'s outcome.
    async fn parts(&self, inv: &Invocation) -> Vec<Item> {
        let prefix = format!("{}#outcome#", inv.key().as_str());
        self.items()
            .await
            .into_iter()
            .filter(|item| item["pk"].as_s().is_ok_and(|pk| pk.starts_with(&prefix)))
            .collect()
    }
}

fn manifest_number(item: &Item, field: &str) -> Option<u64> {
    item.get("outcome_format")?
        .as_m()
        .ok()?
        .get(field)?
        .as_n()
        .ok()?
        .parse()
        .ok()
}

#[tokio::test]
async fn a_duplicate_meets_a_record_of_at_most_one_kilobyte_whatever_the_outcome() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let runs = AtomicUsize::new(0);
    let cases = [
        ("small", json!({"id": "o-1", "status": "paid"}), 0),
        ("json-100k", compressible(100 * 1024), 0),
        ("plain-1200k", json!(incompressible(1200 * 1024, 9)), 3),
    ];
    for (material, outcome, parts) in cases {
        let inv = invocation(material, &json!({"case": material}));
        let first = rig
            .idem
            .execute(&inv, |_| counted(&runs, outcome.clone()))
            .await
            .expect("stored");
        let record = rig.record_item(&inv).await;
        assert!(
            item_size(&record) <= 1024,
            "{material}: the record is {} bytes",
            item_size(&record)
        );

        let (puts, gets) = rig.sent();
        let replay = rig
            .idem
            .execute(&inv, |_| counted(&runs, json!(null)))
            .await
            .expect("replayed");
        assert_eq!(
            replay.raw_json().get(),
            first.raw_json().get(),
            "{material}"
        );
        let reads = manifest_number(&record, "parts").unwrap_or(0) as usize;
        let (puts_after, gets_after) = rig.sent();
        assert_eq!(
            (puts_after - puts, gets_after - gets),
            (1, reads),
            "{material}: the failed claim, then one read per part"
        );
        if parts > 0 {
            assert!(reads >= parts, "{material}: {reads} parts");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn compression_keeps_a_compressible_outcome_small_and_can_be_turned_off() {
    let outcome = compressible(100 * 1024);
    let raw_len = serde_json::to_string(&outcome).expect("json").len();
    for (storage, compressed) in [
        (OutcomeStorage::default(), true),
        (OutcomeStorage::default().compression(false), false),
    ] {
        let rig = Rig::new(storage).await;
        let inv = invocation("json", &json!({"amount": 1}));
        rig.idem
            .execute(&inv, |_| async { Ok::<_, std::io::Error>(outcome.clone()) })
            .await
            .expect("stored");
        let record = rig.record_item(&inv).await;
        let stored = manifest_number(&record, "bytes").expect("kept in parts") as usize;
        if compressed {
            assert_eq!(manifest_number(&record, "length"), Some(raw_len as u64));
            assert!(stored * 5 < raw_len, "{stored} of {raw_len} bytes");
        } else {
            assert_eq!(
                (manifest_number(&record, "length"), stored),
                (None, raw_len)
            );
        }
        let replay = rig
            .idem
            .execute(&inv, |_| async { Ok::<_, std::io::Error>(json!(null)) })
            .await
            .expect("replayed");
        assert_eq!(replay.value(), &outcome);
    }
}

#[tokio::test]
async fn a_larger_inline_limit_keeps_replays_at_one_request() {
    let rig = Rig::new(OutcomeStorage::default().inline_up_to(64 * 1024)).await;
    let inv = invocation("inline", &json!({"amount": 1}));
    let outcome = incompressible(20 * 1024, 5);
    rig.idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(outcome.clone()) })
        .await
        .expect("stored");
    let record = rig.record_item(&inv).await;
    assert!(record.contains_key("outcome"), "inline");
    assert!(rig.parts(&inv).await.is_empty());
    let (puts, gets) = rig.sent();
    rig.idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(String::new()) })
        .await
        .expect("replayed");
    assert_eq!(rig.sent(), (puts + 1, gets), "the failed claim only");
}

#[tokio::test]
async fn parts_carry_the_records_ttl_plus_a_margin() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let inv = invocation("ttl", &json!({"amount": 1}));
    let outcome = incompressible(2 * PART_BYTES, 11);
    rig.idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(outcome.clone()) })
        .await
        .expect("stored");
    let record = rig.record_item(&inv).await;
    let record_ttl: u64 = record["expires_at"]
        .as_n()
        .expect("ttl")
        .parse()
        .expect("n");
    let parts = rig.parts(&inv).await;
    assert_eq!(
        parts.len() as u64,
        manifest_number(&record, "parts").expect("parts")
    );
    for part in &parts {
        let ttl: u64 = part["expires_at"].as_n().expect("ttl").parse().expect("n");
        assert_eq!(ttl, record_ttl + PART_TTL_MARGIN.as_secs());
        assert!(item_size(part) <= 400 * 1024);
        assert!(!part.contains_key("status"), "a part is not a record");
    }
    let (records, skipped, _) = rig
        .idem
        .store()
        .downcast_ref::<DynamoDbStore>()
        .expect("a DynamoDB store")
        .scan_page(None)
        .await
        .expect("scan");
    assert_eq!(
        (records.len(), skipped),
        (1, 0),
        "scans list records, not parts"
    );
    assert_eq!(
        epoch_secs(records[0].expires_at),
        record_ttl,
        "the record's own retention"
    );
}

#[tokio::test]
async fn a_missing_part_is_a_corrupt_record_never_a_partial_replay_or_a_rerun() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let inv = invocation("lost-part", &json!({"amount": 1}));
    let runs = AtomicUsize::new(0);
    rig.idem
        .execute(&inv, |_| counted(&runs, incompressible(900 * 1024, 3)))
        .await
        .expect("stored");
    let part = rig.parts(&inv).await.pop().expect("a part");
    rig.dynamo
        .client
        .delete_item()
        .table_name(&rig.dynamo.table)
        .key("pk", part["pk"].clone())
        .send()
        .await
        .expect("delete a part");

    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, String::from("again")))
        .await
        .expect_err("no partial replay");
    assert!(
        matches!(err, Error::Store(StoreError::CorruptRecord { .. })),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again");
    assert_eq!(
        rig.record_item(&inv).await["status"]
            .as_s()
            .ok()
            .map(String::as_str),
        Some(Status::Completed.as_str()),
        "the record is left for an operator"
    );
}

/// TTL deletes a record's parts an hour past its retention, in its own time, which can come
/// before the record's: the record, read as stored (`StoreExt::get`), comes without its
/// outcome, so that what reads it for its state (the 0.4 key rule, the 0.1 rule, a waiting
/// caller, an operator) sees an expired record, not a corrupt one; with the 0.4 key rule on,
/// the redelivery of an SQS message whose record expired so runs again instead of failing
/// until TTL gets to the record too.
#[tokio::test]
async fn an_expired_record_whose_parts_ttl_deleted_first_reads_as_expired_not_corrupt() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let config = Config::builder()
        .keyed_by_0_4_before(rig.clock.now() + Duration::from_secs(60))
        .build()
        .expect("config");
    let operation = lambda_idempotency::Operation::new(
        rig.idem.clone().with_config(config),
        lambda_idempotency::OperationScope::new("outcomes", "orders").expect("scope"),
        lambda_idempotency::lambda::sources::sqs(Some("/order_id")).expect("policy"),
    );
    let mut message = crate::backends::sqs_message("m-1", json!({"order_id": "o-1"}));
    message
        .attributes
        .insert("SenderId".into(), "AROAPRODUCER:i-1".into());
    let key = operation
        .invocation(&message, &lambda_runtime::Context::default())
        .expect("invocation")
        .key()
        .clone();
    let batch = operation.batch();
    let runs = AtomicUsize::new(0);
    let place = |_message, _ctx| counted(&runs, incompressible(900 * 1024, 5));
    let first = batch
        .process(
            vec![message.clone()],
            &lambda_runtime::Context::default(),
            place,
        )
        .await;
    assert!(first.sqs_response().batch_item_failures.is_empty());

    rig.clock
        .advance(Config::DEFAULT_RETENTION + PART_TTL_MARGIN + Duration::from_secs(60));
    let parts: Vec<Item> = rig
        .items()
        .await
        .into_iter()
        .filter(|item| {
            item["pk"]
                .as_s()
                .is_ok_and(|pk| pk.starts_with(&format!("{}#outcome#", key.as_str())))
        })
        .collect();
    assert!(!parts.is_empty(), "the outcome is in parts");
    for part in parts {
        rig.dynamo
            .client
            .delete_item()
            .table_name(&rig.dynamo.table)
            .key("pk", part["pk"].clone())
            .send()
            .await
            .expect("TTL deletes a part");
    }

    let read = rig.idem.store().get(&key).await.expect("read, not corrupt");
    let record = read.expect("the record stands");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.outcome, None, "its outcome left out");

    let again = batch
        .process(vec![message], &lambda_runtime::Context::default(), place)
        .await;
    assert!(
        again.sqs_response().batch_item_failures.is_empty(),
        "{:?}",
        again.records
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "past its retention, the redelivery runs as a new operation"
    );
}

#[tokio::test]
async fn parts_throttled_past_every_retry_leave_no_outcome_to_replay() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let inv = invocation("throttled-parts", &json!({"amount": 1}));
    let runs = AtomicUsize::new(0);
    // The claim passes; every part write after the first is throttled past every retry.
    rig.faults.pass(SdkOperation::PutItem, 2);
    rig.faults
        .inject_times(SdkOperation::PutItem, SdkFault::Throttle, 1000);
    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, incompressible(1200 * 1024, 4)))
        .await
        .expect_err("the completion could not be stored");
    assert!(
        matches!(err, Error::Store(ref store) if store.is_transient()),
        "got {err:?}"
    );
    assert!(rig.faults.fired(SdkOperation::PutItem, SdkFault::Throttle) >= SDK_ATTEMPTS as usize);
    rig.faults.clear();

    let record = rig
        .idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("kept");
    assert_eq!((record.status, record.outcome), (Status::InProgress, None));
    assert!(!rig.record_item(&inv).await.contains_key("outcome_format"));
    let err = rig
        .idem
        .execute(&inv, |_| counted(&runs, String::from("dup")))
        .await
        .expect_err("still held");
    assert!(
        matches!(err, Error::AlreadyInProgress { .. }),
        "got {err:?}"
    );

    rig.clock.advance(Duration::from_secs(31));
    // The handler had acted: without a reconciler, re-running it is the declared policy of a
    // handler safe to repeat (Recovery::Rerun), and exactly one re-run happens.
    let taker = rig.idem.clone().with_recovery(Recovery::Rerun);
    let taken_over = taker
        .execute(&inv, |_| counted(&runs, incompressible(1200 * 1024, 5)))
        .await
        .expect("taken over");
    assert_eq!(taken_over.origin(), Origin::Executed { attempt: 2 });
    let replay = rig
        .idem
        .execute(&inv, |_| counted(&runs, String::new()))
        .await
        .expect("replayed");
    assert_eq!(
        replay.value(),
        taken_over.value(),
        "the taker's outcome, whole"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the run and its one declared re-run"
    );

    // With a reconciler the takeover records the downstream's evidence instead: no re-run.
    let again = invocation("throttled-parts-reconciled", &json!({"amount": 1}));
    rig.faults.pass(SdkOperation::PutItem, 2);
    rig.faults
        .inject_times(SdkOperation::PutItem, SdkFault::Throttle, 1000);
    let runs = AtomicUsize::new(0);
    let _ = rig
        .idem
        .execute(&again, |_| counted(&runs, incompressible(1200 * 1024, 6)))
        .await
        .expect_err("the completion could not be stored");
    rig.faults.clear();
    rig.clock.advance(Duration::from_secs(31));
    let found = incompressible(1200 * 1024, 6);
    let reconciled = rig.idem.clone().with_reconciler(move |_: Takeover| {
        let found = found.clone();
        async move { Ok::<_, BoxError>(Checked::Applied(json!(found))) }
    });
    let done = reconciled
        .execute(&again, |_| counted(&runs, String::new()))
        .await
        .expect("reconciled");
    assert_eq!(done.origin(), Origin::Reconciled { attempt: 2 });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test]
async fn a_large_settlement_whose_answer_is_lost_is_the_callers_own() {
    for identity in [false, true] {
        let rig = Rig::new(OutcomeStorage::default()).await;
        let mut inv = invocation("ambiguous", &json!({"amount": 1}));
        let settle = if identity {
            inv = inv
                .with_identity("invoice:ambiguous")
                .expect("a valid identity");
            SdkOperation::TransactWriteItems
        } else {
            SdkOperation::UpdateItem
        };
        // The claim passes (a transaction with an identity); the settlement commits and its
        // answer is lost: the SDK's retry finds its own manifest standing.
        rig.faults.pass(settle, usize::from(identity));
        rig.faults.inject(settle, SdkFault::DropResponse);
        let runs = AtomicUsize::new(0);
        let outcome = incompressible(800 * 1024, 6);
        let first = rig
            .idem
            .execute(&inv, |_| counted(&runs, outcome.clone()))
            .await
            .expect("the settlement is recognised as the caller's own");
        assert_eq!(rig.faults.fired(settle, SdkFault::DropResponse), 1);
        assert_eq!(first.origin(), Origin::Executed { attempt: 1 });
        let replay = rig
            .idem
            .execute(&inv, |_| counted(&runs, String::new()))
            .await
            .expect("replayed");
        assert_eq!(replay.value(), &outcome, "identity: {identity}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn a_small_outcome_stays_inline_beside_a_long_key_and_identity() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let scope =
        lambda_idempotency::OperationScope::new("n".repeat(200), "o".repeat(200)).expect("scope");
    let key = lambda_idempotency::OperationKey::derive(&scope, Some(&"t".repeat(200)), "long")
        .expect("key");
    let inv = Invocation::new(
        key,
        lambda_idempotency::Fingerprint::of(&1).expect("fingerprint"),
        Duration::from_secs(30),
    )
    .with_identity(format!("invoice:{}", "i".repeat(500)))
    .expect("a valid identity");
    rig.idem
        .execute(&inv, |_| async {
            Ok::<_, std::io::Error>(json!({"id": 1}))
        })
        .await
        .expect("stored");

    let record = rig.record_item(&inv).await;
    assert!(item_size(&record) > 1024, "the key alone passes 1 KB");
    assert!(
        record.contains_key("outcome") && !record.contains_key("outcome_format"),
        "parts would cost the same write units and a read more"
    );
    assert!(rig.parts(&inv).await.is_empty());
}

#[tokio::test]
async fn a_zombie_lost_fence_reads_no_part_and_cannot_shorten_the_parts_ttl() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let short = Idempotency::new(rig.idem.store().clone())
        .with_config(
            Config::builder()
                .retention(Duration::from_secs(3600))
                .build()
                .expect("config"),
        )
        .with_clock(rig.clock.clone());
    let rerun = rig.idem.clone().with_recovery(Recovery::Rerun);
    let inv = invocation("zombie-ttl", &json!({"amount": 1}));
    let outcome = incompressible(600 * 1024, 8);
    // A zombie with a shorter retention (an older deployment) produces the same bytes as the
    // owner that took over from it, and settles after it.
    let (zombie, resume) =
        lambda_idempotency::testing::conformance::blocked_worker(&short, &inv, Ok(outcome.clone()))
            .await;
    rig.clock.advance(Duration::from_secs(31));
    rerun
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(outcome.clone()) })
        .await
        .expect("the owner completes");
    let gets = rig.faults.requests(SdkOperation::GetItem);
    let _ = resume.send(());
    let err = zombie.await.expect("join").expect_err("fenced");

    assert!(
        matches!(err, Error::LeaseLost { attempt: 1, .. }),
        "got {err:?}"
    );
    assert_eq!(
        rig.faults.requests(SdkOperation::GetItem),
        gets,
        "a lost fence reads no part"
    );
    let record_ttl: u64 = rig.record_item(&inv).await["expires_at"]
        .as_n()
        .expect("ttl")
        .parse()
        .expect("n");
    for part in rig.parts(&inv).await {
        let ttl: u64 = part["expires_at"].as_n().expect("ttl").parse().expect("n");
        assert_eq!(ttl, record_ttl + PART_TTL_MARGIN.as_secs(), "not cut short");
    }
}

#[tokio::test]
async fn a_manifest_with_an_impossible_length_is_a_corrupt_record() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let inv = invocation("bad-manifest", &json!({"amount": 1}));
    rig.idem
        .execute(&inv, |_| async {
            Ok::<_, std::io::Error>(incompressible(500 * 1024, 2))
        })
        .await
        .expect("stored");
    rig.dynamo
        .client
        .update_item()
        .table_name(&rig.dynamo.table)
        .key("pk", AttributeValue::S(inv.key().as_str().to_owned()))
        .update_expression("SET outcome_format.#bytes = :huge")
        .expression_attribute_names("#bytes", "bytes")
        .expression_attribute_values(":huge", AttributeValue::N((1_u64 << 62).to_string()))
        .send()
        .await
        .expect("corrupt the manifest");

    let err = rig
        .idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(String::new()) })
        .await
        .expect_err("corrupt");
    assert!(
        matches!(err, Error::Store(StoreError::CorruptRecord { .. })),
        "got {err:?}"
    );
}

#[tokio::test]
async fn a_part_write_whose_answer_is_lost_is_retried_and_the_outcome_replays_whole() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let inv = invocation("part-dropped", &json!({"amount": 1}));
    let runs = AtomicUsize::new(0);
    let outcome = incompressible(900 * 1024, 12);
    // The claim passes; the first part is written and its answer lost: the SDK's retry finds
    // the same part standing (its condition fails) and carries on.
    rig.faults.pass(SdkOperation::PutItem, 1);
    rig.faults
        .inject(SdkOperation::PutItem, SdkFault::DropResponse);

    let first = rig
        .idem
        .execute(&inv, |_| counted(&runs, outcome.clone()))
        .await
        .expect("stored");
    assert_eq!(
        rig.faults
            .fired(SdkOperation::PutItem, SdkFault::DropResponse),
        1
    );
    let replay = rig
        .idem
        .execute(&inv, |_| counted(&runs, String::new()))
        .await
        .expect("replayed");

    assert_eq!(first.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(replay.value(), &outcome);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Polls `inner` at most `polls` times, then drops it (a cancelled invocation): `None`.
async fn cancelled_after<F: std::future::Future>(polls: usize, inner: F) -> Option<F::Output> {
    let mut inner = std::pin::pin!(inner);
    let mut left = polls;
    std::future::poll_fn(move |cx| {
        if left == 0 {
            return std::task::Poll::Ready(None);
        }
        left -= 1;
        inner.as_mut().poll(cx).map(Some)
    })
    .await
}

#[tokio::test]
async fn a_cancellation_anywhere_in_a_large_settlement_never_leaves_part_of_an_outcome() {
    let rig = Rig::new(OutcomeStorage::default()).await;
    let outcome = incompressible(1200 * 1024, 13);
    let (mut cancelled, mut completed) = (0, 0);
    for polls in [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 1000] {
        let inv = invocation(&format!("cancelled-{polls}"), &json!({"amount": 1}));
        let runs = AtomicUsize::new(0);
        let first = cancelled_after(
            polls,
            rig.idem.execute(&inv, |_| counted(&runs, outcome.clone())),
        )
        .await;
        let ran_first = runs.load(Ordering::SeqCst);
        // Past any lease a cancelled attempt left (given back or not). A cancelled attempt
        // whose handler had run is taken over and re-run: the declared Recovery::Rerun.
        rig.clock.advance(Duration::from_secs(60));
        let next = rig
            .idem
            .clone()
            .with_recovery(Recovery::Rerun)
            .execute(&inv, |_| counted(&runs, outcome.clone()))
            .await
            .expect("the next delivery completes or replays");
        let reran = usize::from(!next.is_replay());
        assert_eq!(
            runs.load(Ordering::SeqCst),
            ran_first + reran,
            "cancelled after {polls} polls: one run each, no more"
        );
        assert!(ran_first <= 1);

        assert_eq!(next.value(), &outcome, "cancelled after {polls} polls");
        if let Some(Ok(first)) = first {
            assert_eq!(
                next.origin(),
                Origin::Replayed,
                "completed before the cancellation"
            );
            assert_eq!(first.value(), &outcome);
            completed += 1;
        } else {
            cancelled += 1;
        }
    }
    println!("{cancelled} cancelled, {completed} completed");
    assert!(cancelled > 0 && completed > 0, "both ends are reached");
}

#[tokio::test]
async fn a_payload_conflict_with_an_outcome_in_parts_costs_one_request() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let original = invocation("report-1", &json!(1));
    let report = incompressible(200 * 1024, 7);
    idem.execute(&original, |_| async {
        Ok::<_, std::io::Error>(report.clone())
    })
    .await
    .expect("a report kept in parts");

    let before = db.requests.count();
    let changed = invocation("report-1", &json!(2));
    let err = idem
        .execute(&changed, |_| async {
            Ok::<_, std::io::Error>(String::new())
        })
        .await
        .expect_err("another intent");
    assert!(matches!(err, Error::PayloadConflict { .. }), "{err:?}");
    assert_eq!(db.requests.since(before), ["PutItem"], "no part was read");

    let before = db.requests.count();
    let replay = idem
        .execute(&original, |_| async {
            Ok::<_, std::io::Error>(String::new())
        })
        .await
        .expect("replay");
    assert_eq!(replay.value(), &report);
    let sent = db.requests.since(before);
    assert_eq!(sent[0], "PutItem");
    assert!(
        sent[1..]
            .iter()
            .all(|op| op == "GetItem" || op == "BatchGetItem"),
        "{sent:?}"
    );
    assert!(
        sent.len() > 1,
        "a duplicate of the same intent reads its parts: {sent:?}"
    );
}
