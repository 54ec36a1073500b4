//! Conformance cases for outcomes of every size: replayed byte for byte however a store keeps
//! them (inline, compressed, in parts past DynamoDB's item limit), through their retention,
//! fenced against a zombie, and limited only by the configured size.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::config::DEFAULT_MAX_OUTCOME_BYTES;
use lambda_idempotency::record::{FailureKind, Status};
use lambda_idempotency::store::{Store, StoreExt};
use lambda_idempotency::{
    Config, Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope, Origin,
};
use serde_json::json;

use super::conformance::{
    Capability, Fixture, LEASE, blocked_worker, counted, engine, evidence_key, invocation,
    rerunning, stored,
};

/// A string of `len` characters that compresses poorly (pseudo-random base64 characters:
/// about 6 bits of entropy per byte), different for each `seed`.
pub fn incompressible(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64: deterministic, no dependency.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state >> 58) as usize])
        })
        .collect()
}

/// A JSON document of about `len` bytes that compresses well (repeated line items).
pub fn compressible(len: usize) -> serde_json::Value {
    let items = (0..len / 64 + 1)
        .map(|i| json!({"sku": format!("sku-{}", i % 50), "qty": i % 7, "note": "gift wrap"}))
        .collect::<Vec<_>>();
    json!({"order": "o-1", "items": items})
}

/// Delivers `inv` again after its outcome was too large to store: the retained failure answers,
/// the handler does not run.
async fn redelivery_meets_the_retained_failure(
    idem: &Idempotency,
    inv: &Invocation,
    runs: &AtomicUsize,
) {
    let before = runs.load(Ordering::SeqCst);
    let err = idem
        .execute(inv, |_| counted(runs, String::new()))
        .await
        .expect_err("retained");
    assert!(
        matches!(&err, Error::Failed { failure, .. } if failure.kind == FailureKind::OutcomeTooLarge),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), before, "not run again");
}

/// The sizes every store must replay byte for byte: inline, around 4 KB, 100 KB, past
/// DynamoDB's 400 KB item limit, and several parts' worth.
const SIZES: [usize; 5] = [100, 4 * 1024, 100 * 1024, 500 * 1024, 1536 * 1024];

/// Case: outcomes of 100 B to 1.5 MB, compressible or not, replay byte for byte without
/// running the handler, and the store gives back exactly the bytes the first caller got.
pub async fn outcomes_of_every_size_replay_byte_for_byte<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::LargeOutcomes);
    let (idem, _, _) = engine(fx, Config::default());
    let runs = AtomicUsize::new(0);
    let mut cases = Vec::new();
    for (seed, size) in SIZES.into_iter().enumerate() {
        cases.push((
            format!("plain-{size}"),
            json!(incompressible(size, seed as u64)),
        ));
        cases.push((format!("json-{size}"), compressible(size)));
    }
    for (material, outcome) in &cases {
        let inv = invocation(material, &json!({"case": material}));
        let first = idem
            .execute(&inv, |_| counted(&runs, outcome.clone()))
            .await
            .expect("stored");
        let replay = idem
            .execute(&inv, |_| counted(&runs, json!("rerun")))
            .await
            .expect("replayed");

        assert_eq!(replay.origin(), Origin::Replayed, "{material}");
        assert_eq!(replay.value(), outcome, "{material}");
        assert_eq!(
            replay.raw_json().get(),
            first.raw_json().get(),
            "{material}: byte for byte"
        );
        let record = stored(&idem, inv.key(), "settled").await;
        assert_eq!(
            record.outcome.as_deref(),
            Some(first.raw_json().get().as_bytes()),
            "{material}: the store gives back the exact bytes"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        cases.len(),
        "one run per operation"
    );
}

/// Case: an outcome kept past the item limit is replayed whole until its record's retention
/// runs out, TTL sweeps included (its parts outlive the record); then the key is new again.
pub async fn a_large_outcome_lasts_its_whole_retention<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::LargeOutcomes);
    let retention = Duration::from_secs(3600);
    let config = Config::builder()
        .retention(retention)
        .build()
        .expect("config");
    let (idem, clock, sweep) = engine(fx, config);
    let inv = invocation("large-retained", &json!({"amount": 10}));
    let runs = AtomicUsize::new(0);
    let outcome = incompressible(900 * 1024, 7);

    let first = idem
        .execute(&inv, |_| counted(&runs, outcome.clone()))
        .await
        .expect("stored");
    clock.advance(retention - Duration::from_secs(1));
    sweep().await;
    let replay = idem
        .execute(&inv, |_| counted(&runs, String::new()))
        .await
        .expect("still replayed");
    assert_eq!(replay.raw_json().get(), first.raw_json().get());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    clock.advance(Duration::from_secs(2));
    sweep().await;
    let again = idem
        .execute(&inv, |_| counted(&runs, String::from("new")))
        .await
        .expect("runs again once retention ran out");
    assert_eq!(
        (again.value().as_str(), again.origin()),
        ("new", Origin::Executed { attempt: 1 })
    );
}

/// Case: a zombie that settles a large outcome after a takeover settled another is fenced,
/// and every replay gives the owner's bytes, whole.
pub async fn a_zombie_cannot_change_a_large_outcome<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::LargeOutcomes);
    let (idem, clock, _) = rerunning(fx, Config::default());
    let inv = invocation("large-zombie", &json!({"amount": 10}));
    let zombie_outcome = incompressible(700 * 1024, 1);
    let owner_outcome = incompressible(600 * 1024, 2);
    let (zombie, resume) = blocked_worker(&idem, &inv, Ok(zombie_outcome)).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let owner = idem
        .execute(&inv, |_| async {
            Ok::<_, std::io::Error>(owner_outcome.clone())
        })
        .await
        .expect("the takeover completes");
    assert_eq!(owner.origin(), Origin::Executed { attempt: 2 });

    let _ = resume.send(());
    let err = zombie.await.expect("join").expect_err("fenced");
    assert!(
        matches!(err, Error::LeaseLost { attempt: 1, .. }),
        "got {err:?}"
    );
    let replay = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(String::new()) })
        .await
        .expect("replay");
    assert_eq!(replay.value(), &owner_outcome, "the owner's outcome, whole");
}

/// Case: the outcome limit is the configured one whatever the rest of the record takes (the
/// longest scope, tenant, identity and request id): a large outcome beside them is stored and
/// replayed, one over the limit is retained as FAILED before any write, identically on every
/// store; an oversized result reference is left out of the evidence.
pub async fn outcome_limit_is_the_configured_one<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let limit = 512 * 1024;
    let config = Config::builder()
        .max_outcome_bytes(limit)
        .build()
        .expect("config");
    let (idem, _, _) = engine(fx, config);
    let scope = OperationScope::new("n".repeat(256), "o".repeat(256)).expect("longest scope");
    let long = |material: &str| {
        let key = OperationKey::derive(&scope, Some(&"t".repeat(256)), material).expect("key");
        Invocation::new(key, Fingerprint::of(&10).expect("fingerprint"), LEASE)
            .with_identity(format!("invoice:{material}:{}", "i".repeat(1000)))
            .expect("a valid identity")
            .with_request_id("r".repeat(300))
    };
    let runs = AtomicUsize::new(0);

    let fits = long("edge-10a");
    let largest = incompressible(limit - 2, 3); // + 2 quotes: the limit exactly
    idem.execute(&fits, |_| counted(&runs, largest.clone()))
        .await
        .expect("stored beside the long attributes");
    let replay = idem
        .execute(&fits, |_| counted(&runs, String::new()))
        .await
        .expect("replayed");
    assert_eq!(replay.value(), &largest);

    let over = long("edge-10b");
    let err = idem
        .execute(&over, |_| counted(&runs, incompressible(limit - 1, 4)))
        .await
        .expect_err("over the limit");
    assert!(
        matches!(err, Error::OutcomeTooLarge { size, limit: l, .. } if size == limit + 1 && l == limit),
        "got {err:?}"
    );
    redelivery_meets_the_retained_failure(&idem, &over, &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each effect once");

    let long_ref = invocation("edge-10c", &json!({"amount": 10}))
        .with_identity("invoice:edge-10c")
        .expect("a valid identity")
        .with_result_ref(
            lambda_idempotency::key::JsonPointer::new("/invoice_id").expect("pointer"),
        );
    idem.execute(&long_ref, |_| {
        counted(&runs, json!({"invoice_id": "x".repeat(5000)}))
    })
    .await
    .expect("stored without the oversized reference");
    let evidence = idem
        .store()
        .evidence(&evidence_key("invoice:edge-10c"))
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(
        (evidence.status, evidence.result_ref),
        (Status::Completed, None)
    );
}

/// Case: the default limit admits any result a Lambda function can return (6 MiB), and one
/// byte more is retained, not run again.
pub async fn default_limit_is_lambdas_response_limit<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::LargeOutcomes);
    let (idem, _, _) = engine(fx, Config::default());
    let runs = AtomicUsize::new(0);
    let largest = invocation("default-largest", &json!({"amount": 10}));
    let text = "y".repeat(DEFAULT_MAX_OUTCOME_BYTES - 2);
    idem.execute(&largest, |_| counted(&runs, text.clone()))
        .await
        .expect("stored");
    let replay = idem
        .execute(&largest, |_| counted(&runs, String::new()))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(replay.value().len(), DEFAULT_MAX_OUTCOME_BYTES - 2);

    let over = invocation("default-over", &json!({"amount": 10}));
    let err = idem
        .execute(&over, |_| {
            counted(&runs, "x".repeat(DEFAULT_MAX_OUTCOME_BYTES))
        })
        .await
        .expect_err("too large");
    assert!(
        matches!(err, Error::OutcomeTooLarge { size, limit, .. }
            if size == DEFAULT_MAX_OUTCOME_BYTES + 2 && limit == DEFAULT_MAX_OUTCOME_BYTES),
        "got {err:?}"
    );
    redelivery_meets_the_retained_failure(&idem, &over, &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the effect is not repeated");
}
