//! Latency figures for the idempotency path, printed as medians (the machines are noisy):
//!
//! - key + fingerprint derivation for a small order event;
//! - first execution and duplicate on the in-memory store (the engine's own overhead);
//! - first execution and duplicate on the DynamoDB store against the embedded server over
//!   loopback HTTP (2 requests and 1 request), or `DYNAMODB_ENDPOINT`;
//! - the duplicate again with the in-process cache in front (no request);
//! - the crate's own cost per call on DynamoDB: key derivation plus `execute`, against the same
//!   requests (same items, expressions and conditions) sent bare through the SDK, interleaved
//!   sample by sample on one thread so that drift and the server's share cancel out.
//!
//! ```text
//! cargo bench --bench engine
//! ```

#[path = "../src/testing/local.rs"]
mod local_dynamodb;

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use lambda_idempotency::store::{CachedStore, DynamoDbStore, MemoryStore};
use lambda_idempotency::{Idempotency, Invocation, KeyPolicy, OperationScope};
use serde_json::{Value, json};

const SAMPLES: usize = 400;

fn order(i: usize) -> Value {
    json!({"order_id": format!("o-{i}"), "customer": "c-42", "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "total": 1999})
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn report(what: &str, samples: Vec<Duration>) -> Duration {
    let p90 = {
        let mut sorted = samples.clone();
        sorted.sort();
        sorted[sorted.len() * 9 / 10]
    };
    let median = median(samples);
    println!(
        "{what:<52} median {:>9.1} µs   p90 {:>9.1} µs",
        micros(median),
        micros(p90)
    );
    median
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

async fn first_and_duplicate(
    label: &str,
    idem: &Idempotency,
    policy: &KeyPolicy<Value>,
    scope: &OperationScope,
) -> (Duration, Duration) {
    let (mut first, mut duplicate) = (Vec::with_capacity(SAMPLES), Vec::with_capacity(SAMPLES));
    for i in 0..SAMPLES {
        let (key, fingerprint) = policy.derive(scope, &order(i)).expect("derive");
        let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
        let start = Instant::now();
        idem.execute(&invocation, |_| async {
            Ok::<_, std::io::Error>(json!({"placed": true}))
        })
        .await
        .expect("first");
        first.push(start.elapsed());
        let start = Instant::now();
        idem.execute(&invocation, |_| async {
            Ok::<_, std::io::Error>(json!({"placed": false}))
        })
        .await
        .expect("duplicate");
        duplicate.push(start.elapsed());
    }
    (
        report(&format!("{label}: first execution"), first),
        report(&format!("{label}: duplicate (replay)"), duplicate),
    )
}

/// The requests the DynamoDB store sends for a first execution (a conditional `PutItem`, then
/// a fenced `UpdateItem` with the outcome) and a duplicate (the `PutItem`, refused with the
/// stored item), built by hand with the store's attribute names and expressions.
struct BareSdk {
    client: Client,
    table: String,
}

impl BareSdk {
    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |now| now.as_millis() as u64)
    }

    async fn claim(&self, key: &str, fingerprint: &str, token: &str) -> bool {
        let now = Self::now_ms();
        let n = |value: u64| AttributeValue::N(value.to_string());
        let s = |value: &str| AttributeValue::S(value.to_owned());
        let answer = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(key))
            .item("status", s("IN_PROGRESS"))
            .item("fingerprint", s(fingerprint))
            .item("lease_token", s(token))
            .item("attempt", n(1))
            .item("lease_expires_at_ms", n(now + 35_000))
            .item("expires_at", n(now / 1000 + 86_435))
            .item("created_at", n(now))
            .condition_expression(
                "attribute_not_exists(#pk) OR (#expires_at < :now_s AND #status IN (:completed, :failed))",
            )
            .expression_attribute_names("#pk", "pk")
            .expression_attribute_names("#expires_at", "expires_at")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":now_s", n(now / 1000))
            .expression_attribute_values(":completed", s("COMPLETED"))
            .expression_attribute_values(":failed", s("FAILED"))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        answer.is_ok()
    }

    async fn complete(&self, key: &str, token: &str, outcome: &[u8]) {
        let now = Self::now_ms();
        let n = |value: u64| AttributeValue::N(value.to_string());
        let s = |value: &str| AttributeValue::S(value.to_owned());
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(key))
            .update_expression(
                "SET #status = :status, #expires_at = :expires_at, #completed_at = :completed_at, #outcome = :outcome",
            )
            .condition_expression("#status = :in_progress AND #lease_token = :mine")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#lease_token", "lease_token")
            .expression_attribute_names("#expires_at", "expires_at")
            .expression_attribute_names("#completed_at", "completed_at")
            .expression_attribute_names("#outcome", "outcome")
            .expression_attribute_values(":in_progress", s("IN_PROGRESS"))
            .expression_attribute_values(":mine", s(token))
            .expression_attribute_values(":status", s("COMPLETED"))
            .expression_attribute_values(":expires_at", n(now / 1000 + 86_400))
            .expression_attribute_values(":completed_at", n(now))
            .expression_attribute_values(":outcome", AttributeValue::B(outcome.to_vec().into()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await
            .expect("bare completion");
    }
}

/// The crate's cost per call over the bare requests, on a store whose table the bare requests
/// share: each sample runs a bare first execution and duplicate, then the crate's, on fresh keys.
async fn overhead_over_bare_sdk(
    store: DynamoDbStore,
    policy: &KeyPolicy<Value>,
    scope: &OperationScope,
) {
    let bare = BareSdk {
        client: store.client().clone(),
        table: store.table().to_owned(),
    };
    let idem = Idempotency::new(store);
    let outcome = serde_json::to_vec(&json!({"placed": true})).expect("JSON");
    let samples = SAMPLES * 2;
    let mut timings: [Vec<Duration>; 4] = std::array::from_fn(|_| Vec::with_capacity(samples));
    for i in 0..samples {
        let (key, fingerprint) = policy.derive(scope, &order(1_000_000 + i)).expect("derive");
        let token = uuid::Uuid::new_v4().to_string();
        let start = Instant::now();
        assert!(bare.claim(key.as_str(), fingerprint.as_str(), &token).await);
        bare.complete(key.as_str(), &token, &outcome).await;
        timings[0].push(start.elapsed());
        let start = Instant::now();
        assert!(!bare.claim(key.as_str(), fingerprint.as_str(), &token).await);
        timings[1].push(start.elapsed());

        for (slot, placed) in [(2, true), (3, false)] {
            let event = order(2_000_000 + i);
            let start = Instant::now();
            let (key, fingerprint) = policy.derive(scope, &event).expect("derive");
            let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
            let done = idem
                .execute(&invocation, |_| async move {
                    Ok::<_, std::io::Error>(json!({"placed": placed}))
                })
                .await
                .expect("execute");
            timings[slot].push(start.elapsed());
            assert_eq!(done.is_replay(), !placed);
        }
    }
    let [bare_first, bare_duplicate, first, duplicate] = timings;
    let bare_first = report("bare SDK: PutItem + UpdateItem", bare_first);
    let first = report("crate: derive + execute, first execution", first);
    let bare_duplicate = report("bare SDK: PutItem refused (ALL_OLD)", bare_duplicate);
    let duplicate = report("crate: derive + execute, duplicate", duplicate);
    println!(
        "the crate's own cost per call (median difference): first execution {:+.1} µs, duplicate {:+.1} µs",
        micros(first) - micros(bare_first),
        micros(duplicate) - micros(bare_duplicate)
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_idempotency::BoxError> {
    let scope = OperationScope::new("bench", "place-order")?;
    let policy = KeyPolicy::<Value>::pointer("/order_id")?;

    let derive: Vec<Duration> = (0..SAMPLES * 10)
        .map(|i| {
            let event = order(i);
            let start = Instant::now();
            let derived = policy.derive(&scope, &event);
            let elapsed = start.elapsed();
            assert!(derived.is_ok());
            elapsed
        })
        .collect();
    report("key + fingerprint (RFC 8785, SHA-256)", derive);

    let memory = Idempotency::new(MemoryStore::new());
    first_and_duplicate("memory store", &memory, &policy, &scope).await;

    let dynamodb = Idempotency::new(local_dynamodb::local_store("bench").await?);
    let (first, duplicate) = first_and_duplicate(
        "DynamoDB store (embedded, loopback)",
        &dynamodb,
        &policy,
        &scope,
    )
    .await;
    println!(
        "duplicate / first execution on DynamoDB: {:.2}",
        duplicate.as_secs_f64() / first.as_secs_f64()
    );

    overhead_over_bare_sdk(
        local_dynamodb::local_store("bench-bare").await?,
        &policy,
        &scope,
    )
    .await;

    let cache = CachedStore::new(local_dynamodb::local_store("bench-cached").await?, 16 << 20);
    let cached = Idempotency::new(cache.clone());
    let (_, cached_duplicate) = first_and_duplicate(
        "DynamoDB store + in-process cache",
        &cached,
        &policy,
        &scope,
    )
    .await;
    println!(
        "cached duplicate / uncached duplicate: {:.3}; cache hits {} of {SAMPLES} duplicates ({:.0} requests per duplicate)",
        cached_duplicate.as_secs_f64() / duplicate.as_secs_f64(),
        cache.hits(),
        (SAMPLES as u64 - cache.hits()) as f64 / SAMPLES as f64
    );
    Ok(())
}
