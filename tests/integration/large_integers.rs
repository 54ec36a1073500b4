//! Integers past 2^53 (snowflake ids, u64 sequence numbers, DynamoDB `N` values) in keys and
//! intents, and records 0.1 wrote for them: two ids that differ above 2^53 are two operations,
//! two amounts that differ there are a payload conflict (through every door: `exact_ids`), and
//! 0.1's rule reads only the records 0.1 may have written, where the deployer turns it on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::{
    Config, Error, Fingerprint, Idempotency, Invocation, KeyPolicy, OperationKey, OperationScope,
};
use serde_json::{Value, json};

use super::backends::{Backend, both};

/// Two ids that RFC 8785 alone writes alike: both round to the double 2^60.
const FIRST: u64 = (1 << 60) + 1;
const SECOND: u64 = (1 << 60) + 2;

fn engine(backend: Backend) -> Idempotency {
    Idempotency::new(backend.store).with_clock(backend.clock)
}

fn scope() -> OperationScope {
    OperationScope::new("large-integers", "charge").expect("scope")
}

#[test]
fn ids_and_amounts_that_differ_above_2_53_are_told_apart() {
    let policy = KeyPolicy::<Value>::pointer("/order_id")
        .expect("pointer")
        .with_intent(lambda_idempotency::key::JsonPointer::new("/amount").expect("pointer"));
    let (key_a, fp_a) = policy
        .derive(&scope(), &json!({"order_id": FIRST, "amount": FIRST}))
        .expect("derive");
    let (key_b, fp_b) = policy
        .derive(&scope(), &json!({"order_id": SECOND, "amount": FIRST}))
        .expect("derive");
    let (_, fp_c) = policy
        .derive(&scope(), &json!({"order_id": FIRST, "amount": SECOND}))
        .expect("derive");
    assert_ne!(key_a, key_b, "two ids, two operations");
    assert_eq!(fp_a, fp_b, "the same amount");
    assert_ne!(fp_a, fp_c, "two amounts, two intents");
    // Within ±2^53 every key is what RFC 8785 alone gives (the same as before 0.2).
    let small = OperationKey::derive(&scope(), None, &json!({"id": 9_007_199_254_740_991_u64}))
        .expect("key");
    let same =
        OperationKey::derive(&scope(), None, &json!({"id": 9_007_199_254_740_991.0})).expect("key");
    assert_eq!(small, same);
}

/// An id that JSON readers round (an integer beyond `u64`, one written with a fraction or an
/// exponent past 2^53) is refused as key material by variant, never keyed: two such ids are
/// read as one double and would share one operation, the second replaying the first's result.
/// A 64-bit integer keys exactly, and such a number elsewhere in the event (in the intent) is
/// no refusal. Before, both ids beyond `u64` derived one key.
#[test]
fn an_id_that_json_readers_round_is_refused_not_keyed() {
    let policy = KeyPolicy::<Value>::pointer("/order_id").expect("pointer");
    let event = |text: &str| -> Value { serde_json::from_str(text).expect("JSON") };
    for id in [
        "18446744073709551616",
        "18446744073709551617",
        "100000000000000000000000000000000000001",
        "9007199254740993.0",
        "-9007199254740993.0",
        "1e20",
    ] {
        let refused = policy.derive(&scope(), &event(&format!(r#"{{"order_id": {id}}}"#)));
        assert!(
            matches!(&refused, Err(Error::InvalidEvent { reason }) if !reason.contains(id)),
            "{id}: {refused:?}"
        );
    }
    let nested = OperationKey::derive(
        &scope(),
        None,
        &event(r#"{"ids": [1, 18446744073709551616]}"#),
    );
    assert!(
        matches!(nested, Err(Error::InvalidEvent { .. })),
        "{nested:?}"
    );
    assert!(
        policy
            .derive(
                &scope(),
                &event(r#"{"order_id": 18446744073709551615, "amount": 1e30}"#)
            )
            .is_ok()
    );
}

#[test]
fn a_fingerprint_matches_its_exact_digest_only() {
    let intent = json!({"order": "o-1", "amount": FIRST});
    // What 0.1 stored for it: RFC 8785 read the amount as the double 2^60 (and wrote it
    // `1152921504606847000`), as the document with that double still is.
    let before =
        Fingerprint::of(&json!({"order": "o-1", "amount": (1_u64 << 60) as f64})).expect("fp");
    let now = Fingerprint::of(&intent).expect("fp");
    assert_ne!(now, before);
    assert!(now.matches(&Fingerprint::from_stored(now.as_str())));
    // Only the engine, for a record the compatibility rule reads as 0.1's, reads 0.1's digest.
    assert!(!now.matches(&Fingerprint::from_stored(before.as_str())));
    assert!(!before.matches(&Fingerprint::from_stored(now.as_str())));
}

/// The engine on `backend`, reading records that name no rule and were created before
/// `cutover` as 0.1 wrote them.
/// A cut-over after every record these cases write (their clocks start at [`start_time`]).
fn after_the_records() -> SystemTime {
    start_time() + Duration::from_secs(365 * 24 * 3600)
}

fn compatible_engine(backend: Backend, cutover: SystemTime) -> Idempotency {
    let config = Config::builder()
        .rfc8785_records_before(cutover)
        .build()
        .expect("config");
    engine(backend).with_config(config)
}

/// A redelivery, after the upgrade, of an operation 0.1 recorded under `key` (the record names
/// no rule, its fingerprint is the digest 0.1 derived), on an engine with `config`: what it
/// answers, and how often the handler ran.
async fn redelivery_of_a_0_1_record(
    backend: Backend,
    cutover: Option<SystemTime>,
) -> (Result<Value, Error>, usize) {
    let idem = match cutover {
        Some(cutover) => compatible_engine(backend, cutover),
        None => engine(backend),
    };
    let key = OperationKey::derive(&scope(), None, "o-legacy").expect("key");
    let rounded = Fingerprint::of(&json!({"order": "o-legacy", "amount": (1_u64 << 60) as f64}))
        .expect("fingerprint");
    let lease = Duration::from_secs(30);
    let before = Invocation::new(
        key.clone(),
        Fingerprint::from_stored(rounded.as_str()),
        lease,
    );
    let runs = AtomicUsize::new(0);
    let charge = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(json!("charged"))
    };
    let first = idem.execute(&before, charge).await.expect("0.1's delivery");
    assert_eq!(first.value(), &json!("charged"));
    let intent = json!({"order": "o-legacy", "amount": FIRST});
    let after = Invocation::new(key, Fingerprint::of(&intent).expect("fingerprint"), lease);
    let again = idem
        .execute(&after, charge)
        .await
        .map(|execution| execution.value().clone());
    (again, runs.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_0_1_record_replays_to_its_redelivery_only_under_the_compatibility_rule() {
    for backend in both().await {
        let name = backend.name;
        let (answer, runs) = redelivery_of_a_0_1_record(backend, Some(after_the_records())).await;
        assert_eq!(
            answer.expect("no payload conflict"),
            json!("charged"),
            "{name}"
        );
        assert_eq!(runs, 1, "{name}: replayed, not run again");
    }
    // Off (the default), or for a record created after the cut-over: 0.1's digest is another
    // intent's, refused, never run.
    for cutover in [None, Some(start_time() - Duration::from_secs(1))] {
        for backend in both().await {
            let name = backend.name;
            let (answer, runs) = redelivery_of_a_0_1_record(backend, cutover).await;
            assert!(
                matches!(answer, Err(Error::PayloadConflict { .. })),
                "{name}, {cutover:?}: {answer:?}"
            );
            assert_eq!(runs, 1, "{name}");
        }
    }
}

#[tokio::test]
async fn a_record_of_this_version_never_reads_as_0_1s_even_before_the_cutover() {
    for backend in both().await {
        let name = backend.name;
        let idem = compatible_engine(backend, after_the_records());
        let key = OperationKey::derive(&scope(), None, "o-marked").expect("key");
        let lease = Duration::from_secs(30);
        // The anchor 1152921504606847000: RFC 8785 writes it as it is, and its neighbour alike.
        let anchor = Invocation::new(
            key.clone(),
            Fingerprint::of(&json!({"amount": 1_152_921_504_606_847_000_u64})).expect("fp"),
            lease,
        );
        idem.execute(&anchor, |_| async {
            Ok::<_, std::io::Error>(json!("charged"))
        })
        .await
        .expect("the anchor's charge");
        let neighbour = Invocation::new(
            key,
            Fingerprint::of(&json!({"amount": 1_152_921_504_606_847_001_u64})).expect("fp"),
            lease,
        );
        let err = idem
            .execute(&neighbour, |_| async {
                Ok::<_, std::io::Error>(json!("again"))
            })
            .await
            .expect_err("another amount");
        assert!(
            matches!(err, Error::PayloadConflict { .. }),
            "{name}: {err:?}"
        );
    }
}

/// What a version before 0.2 derived for order 2^60 + 1 under `policy` (amount 10): the key of
/// the id read as the double 2^60, written by RFC 8785 alone, which today's keys refuse.
fn derived_by_0_1(policy: &KeyPolicy<Value>) -> Invocation {
    use sha2::Digest;
    let rounded = serde_json_canonicalizer::to_vec(&json!((1_u64 << 60) as f64)).expect("JSON");
    let today = OperationKey::derive(&scope(), None, &json!(1)).expect("key");
    let (scope_part, _) = today.as_str().rsplit_once('#').expect("a digest");
    let key = format!(
        "{scope_part}#{}",
        hex::encode(sha2::Sha256::digest(rounded))
    );
    let fingerprint = policy
        .invocation(
            &scope(),
            &json!({"order_id": 1, "amount": 10}),
            Duration::from_secs(30),
        )
        .expect("invocation")
        .fingerprint()
        .clone();
    Invocation::new(
        OperationKey::from_stored(key),
        fingerprint,
        Duration::from_secs(30),
    )
}

#[tokio::test]
async fn an_operation_recorded_under_its_key_before_exact_integers_is_continued_there() {
    for backend in both().await {
        let name = backend.name;
        let idem = compatible_engine(backend, after_the_records());
        let policy = KeyPolicy::<Value>::pointer("/order_id")
            .expect("pointer")
            .with_intent(lambda_idempotency::key::JsonPointer::new("/amount").expect("pointer"));
        // What a version before 0.2 derived for order 2^60 + 1.
        let derived = derived_by_0_1(&policy);
        // As 0.1 wrote it: no rule marker.
        let before = Invocation::new(
            derived.key().clone(),
            Fingerprint::from_stored(derived.fingerprint().as_str()),
            Duration::from_secs(30),
        );
        idem.execute(&before, |_| async {
            Ok::<_, std::io::Error>(json!("charged o-1 once"))
        })
        .await
        .expect("the first delivery, before the upgrade");

        let redelivered = policy
            .invocation(
                &scope(),
                &json!({"order_id": FIRST, "amount": 10}),
                Duration::from_secs(30),
            )
            .expect("invocation");
        assert_ne!(redelivered.key(), before.key(), "the key changed");
        let again = idem
            .execute(&redelivered, |_| async {
                Ok::<_, std::io::Error>(json!("charged twice"))
            })
            .await
            .expect("continued under the earlier key");
        assert!(again.is_replay(), "{name}");
        assert_eq!(again.value(), &json!("charged o-1 once"), "{name}");

        // Another order that collided under the old rule, with another intent: its own run.
        let other = policy
            .invocation(
                &scope(),
                &json!({"order_id": SECOND, "amount": 99}),
                Duration::from_secs(30),
            )
            .expect("invocation");
        let own = idem
            .execute(&other, |_| async {
                Ok::<_, std::io::Error>(json!("charged o-2"))
            })
            .await
            .expect("its own operation");
        assert!(!own.is_replay(), "{name}");
        assert_eq!(own.value(), &json!("charged o-2"), "{name}");
    }
}

/// Releases the record at `key` by an operator's hand just after the engine first reads it:
/// a record 0.1 left that goes while the engine turns to it.
#[derive(Debug)]
struct ReleasedAfterRead {
    inner: lambda_idempotency::AnyStore,
    operator: Idempotency,
    key: OperationKey,
    fired: std::sync::atomic::AtomicBool,
}

impl lambda_idempotency::store::Store for ReleasedAfterRead {
    fn call<'a>(
        &'a self,
        request: lambda_idempotency::store::Request<'a>,
    ) -> lambda_idempotency::reconcile::BoxFuture<
        'a,
        Result<lambda_idempotency::store::Answer, lambda_idempotency::StoreError>,
    > {
        Box::pin(async move {
            let read_here = matches!(
                request,
                lambda_idempotency::store::Request::Get { key } if *key == self.key
            );
            let answer = self.inner.call(request).await;
            if read_here && !self.fired.swap(true, Ordering::SeqCst) {
                let released = self
                    .operator
                    .resolve::<Value>(
                        &self.key,
                        lambda_idempotency::engine::Resolution::Release,
                        &lambda_idempotency::testing::conformance::operator(),
                    )
                    .await;
                assert_eq!(released.ok(), Some(true), "released by the operator");
            }
            answer
        })
    }

    fn transactional(&self) -> Option<&dyn lambda_idempotency::store::TransactionalStore> {
        None
    }
}

/// A crashed attempt 0.1 left under its key, released by an operator while the engine turns to
/// it, is not claimed afresh there: today's rule would name that claim, no later duplicate
/// would look there, and the operation would run again under today's key. It runs under
/// today's key, once, and every later duplicate replays it.
#[tokio::test]
async fn a_0_1_record_that_goes_meanwhile_is_not_claimed_afresh_at_its_key() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let inner = backend.store.clone();
        let policy = KeyPolicy::<Value>::pointer("/order_id")
            .expect("pointer")
            .with_intent(lambda_idempotency::key::JsonPointer::new("/amount").expect("pointer"));
        let derived = derived_by_0_1(&policy);
        let before = Invocation::new(
            derived.key().clone(),
            Fingerprint::from_stored(derived.fingerprint().as_str()),
            Duration::from_secs(30),
        );
        let plain = Idempotency::new(inner.clone()).with_clock(clock.clone());
        lambda_idempotency::testing::conformance::crash_after_claim(&plain, &before).await;
        clock.advance(Duration::from_secs(60));

        let store = ReleasedAfterRead {
            inner,
            operator: plain.clone(),
            key: before.key().clone(),
            fired: std::sync::atomic::AtomicBool::new(false),
        };
        let config = Config::builder()
            .rfc8785_records_before(after_the_records())
            .build()
            .expect("config");
        let idem = Idempotency::new(store)
            .with_clock(clock.clone())
            .with_config(config);
        let redelivered = policy
            .invocation(
                &scope(),
                &json!({"order_id": FIRST, "amount": 10}),
                Duration::from_secs(30),
            )
            .expect("invocation");
        let runs = AtomicUsize::new(0);
        for delivery in 0..2 {
            let answer = idem
                .execute(&redelivered, |_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(json!("charged"))
                })
                .await
                .expect("answered");
            assert_eq!(answer.is_replay(), delivery == 1, "{name}: {delivery}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: one run");
        let today = plain.store().get(redelivered.key()).await.expect("read");
        assert!(
            today.is_some_and(
                |record| record.status == lambda_idempotency::record::Status::Completed
            ),
            "{name}: settled under today's key"
        );
    }
}

/// 0.1 keyed an SQS message by its body's id alone (it read no producer) with the id read as
/// a double. A redelivery across a 0.1 → 0.5 upgrade, whose key now names the producer, with
/// both compatibility rules on, finds 0.1's record there and is answered by its state, never
/// run again (it was looked for only under the producer's key, where 0.1 never wrote).
#[tokio::test]
async fn a_0_1_record_of_an_sqs_message_is_found_though_0_5_keys_its_producer() {
    use lambda_idempotency::Operation;
    use lambda_idempotency::lambda::batch::{BatchProcessor, RecordOutcome};
    use lambda_idempotency::lambda::sources;
    for backend in both().await {
        let name = backend.name;
        let config = Config::builder()
            .rfc8785_records_before(after_the_records())
            .keyed_by_0_4_before(after_the_records())
            .build()
            .expect("config");
        let idem = engine(backend).with_config(config);
        // What 0.1 wrote: the key of the id read as the double 2^60, the body's digest as 0.1
        // wrote it, no rule marker.
        let rounded_id =
            serde_json_canonicalizer::to_vec(&json!((1_u64 << 60) as f64)).expect("JSON");
        let today = OperationKey::derive(&scope(), None, &json!(1)).expect("key");
        let (scope_part, _) = today.as_str().rsplit_once('#').expect("a digest");
        let key_by_0_1 = {
            use sha2::Digest;
            format!(
                "{scope_part}#{}",
                hex::encode(sha2::Sha256::digest(rounded_id))
            )
        };
        let fingerprint_by_0_1 =
            Fingerprint::of(&json!({"order_id": (1_u64 << 60) as f64, "amount": 10}))
                .expect("fingerprint");
        let runs = AtomicUsize::new(0);
        idem.execute(
            &Invocation::new(
                OperationKey::from_stored(key_by_0_1),
                Fingerprint::from_stored(fingerprint_by_0_1.as_str()),
                Duration::from_secs(30),
            ),
            |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(json!("charged"))
            },
        )
        .await
        .expect("0.1's delivery");

        let mut message =
            super::backends::sqs_message("m-1", json!({"order_id": FIRST, "amount": 10}));
        message
            .attributes
            .insert("SenderId".into(), "AROAEXAMPLE:session-1".into());
        let queue: BatchProcessor<aws_lambda_events::event::sqs::SqsMessage> = Operation::new(
            idem,
            scope(),
            sources::sqs(Some("/order_id")).expect("policy"),
        )
        .batch();
        let report = queue
            .process(vec![message], &Default::default(), |_, _| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(String::from("charged again")) }
            })
            .await;

        assert!(
            matches!(report.records[0].1, RecordOutcome::AlreadyDone),
            "{name}: {:?}",
            report.records[0].1
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: not run again");
    }
}
