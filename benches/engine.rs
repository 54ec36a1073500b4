//! Latency figures for the idempotency path, printed as medians (the machines are noisy):
//!
//! - key + fingerprint derivation for a small order event;
//! - first execution and duplicate on the in-memory store (the engine's own overhead);
//! - first execution and duplicate on the DynamoDB store against the embedded server over
//!   loopback HTTP (2 requests and 1 request), or `DYNAMODB_ENDPOINT`;
//! - the duplicate again with the in-process cache in front (no request).
//!
//! ```text
//! cargo bench --bench engine
//! ```

#[path = "../src/testing/local.rs"]
mod local_dynamodb;

use std::time::{Duration, Instant};

use lambda_idempotency::store::{CachedStore, MemoryStore, Store};
use lambda_idempotency::{Config, Idempotency, Invocation, KeyPolicy, OperationScope};
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

async fn first_and_duplicate<S: Store>(
    label: &str,
    idem: &Idempotency<S>,
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

#[tokio::main]
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

    let memory = Idempotency::new(MemoryStore::new(), Config::default());
    first_and_duplicate("memory store", &memory, &policy, &scope).await;

    let dynamodb = Idempotency::new(
        local_dynamodb::local_store("bench").await?,
        Config::default(),
    );
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

    let cached = Idempotency::new(
        CachedStore::new(local_dynamodb::local_store("bench-cached").await?, 16 << 20),
        Config::default(),
    );
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
        cached.store().hits(),
        (SAMPLES as u64 - cached.store().hits()) as f64 / SAMPLES as f64
    );
    Ok(())
}
