//! Latency figures for the idempotency path, printed as medians (the machines are noisy):
//!
//! - key + fingerprint derivation for a small order event;
//! - first execution and duplicate on the in-memory store (the engine's own overhead);
//! - first execution and duplicate on the DynamoDB store against the embedded server over
//!   loopback HTTP (2 requests and 1 request), or `DYNAMODB_ENDPOINT`;
//! - the duplicate again with the in-process cache in front (no request);
//! - the crate's own cost per call on DynamoDB: key derivation plus `execute`, against the same
//!   requests sent bare through the same client: the store's own `PutItem` and `UpdateItem`,
//!   recorded by an interceptor and replayed under other keys (so the bare side cannot drift
//!   from what the store sends), interleaved sample by sample on one thread so that drift and
//!   the server's share cancel out;
//! - allocations per call on every path.
//!
//! ```text
//! cargo bench --bench engine
//! ```
//!
//! The last lines (`figure <name> <µs>`) are for `scripts/bench-engine.py`, which runs this
//! benchmark alternately against the last release's engine and today's and compares their
//! medians over repeated runs with confidence intervals.

#[path = "../src/testing/local.rs"]
mod local_dynamodb;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::put_item::PutItemInput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemInput;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::store::{CachedStore, DynamoDbStore, MemoryStore};
use lambda_idempotency::{Idempotency, Invocation, KeyPolicy, OperationScope};
use serde_json::{Value, json};

const SAMPLES: usize = 400;

/// The system allocator, counting the allocations (and reallocations) made through it: the
/// allocations-per-call figures. One relaxed increment each, on every side of a comparison.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` and `layout` came from this allocator, that is from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations made so far.
fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// A path's figures: median latencies and allocations per call.
struct PathFigures {
    first: Duration,
    duplicate: Duration,
    first_allocations: f64,
    duplicate_allocations: f64,
}

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
) -> PathFigures {
    let (mut first, mut duplicate) = (Vec::with_capacity(SAMPLES), Vec::with_capacity(SAMPLES));
    let (mut first_allocations, mut duplicate_allocations) = (0, 0);
    for i in 0..SAMPLES {
        let (key, fingerprint) = policy.derive(scope, &order(i)).expect("derive");
        let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
        let (start, allocated) = (Instant::now(), allocations());
        idem.execute(&invocation, |_| async {
            Ok::<_, std::io::Error>(json!({"placed": true}))
        })
        .await
        .expect("first");
        first.push(start.elapsed());
        first_allocations += allocations() - allocated;
        let (start, allocated) = (Instant::now(), allocations());
        idem.execute(&invocation, |_| async {
            Ok::<_, std::io::Error>(json!({"placed": false}))
        })
        .await
        .expect("duplicate");
        duplicate.push(start.elapsed());
        duplicate_allocations += allocations() - allocated;
    }
    let per_call = |total: u64| total as f64 / SAMPLES as f64;
    println!(
        "{label}: allocations per call: first execution {:.1}, duplicate {:.1}",
        per_call(first_allocations),
        per_call(duplicate_allocations)
    );
    PathFigures {
        first: report(&format!("{label}: first execution"), first),
        duplicate: report(&format!("{label}: duplicate (replay)"), duplicate),
        first_allocations: per_call(first_allocations),
        duplicate_allocations: per_call(duplicate_allocations),
    }
}

/// The store's own requests, recorded as the SDK is handed them: the first `PutItem` (a claim)
/// and `UpdateItem` (its completion) of an execution.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<(Option<PutItemInput>, Option<UpdateItemInput>)>>);

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "Recorder"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let mut recorded = self.0.lock().expect("recorder");
        if let Some(put) = context.input().downcast_ref::<PutItemInput>() {
            recorded.0.get_or_insert_with(|| put.clone());
        }
        if let Some(update) = context.input().downcast_ref::<UpdateItemInput>() {
            recorded.1.get_or_insert_with(|| update.clone());
        }
        Ok(())
    }
}

/// The store's requests for a first execution (its conditional `PutItem`, then its fenced
/// `UpdateItem` with the outcome) and a duplicate (the `PutItem`, refused with the stored
/// item), sent bare through the same client: recorded from the store itself, so that they
/// are the very requests (items, expressions, conditions) whatever the store's version, and
/// replayed under other keys.
struct BareSdk {
    client: Client,
    claim: PutItemInput,
    completion: UpdateItemInput,
}

impl BareSdk {
    async fn claim(&self, key: &str) -> bool {
        let input = self.claim.clone();
        let mut item = input.item.unwrap_or_default();
        item.insert("pk".into(), AttributeValue::S(key.to_owned()));
        self.client
            .put_item()
            .set_table_name(input.table_name)
            .set_item(Some(item))
            .set_condition_expression(input.condition_expression)
            .set_expression_attribute_names(input.expression_attribute_names)
            .set_expression_attribute_values(input.expression_attribute_values)
            .set_return_values(input.return_values)
            .set_return_values_on_condition_check_failure(
                input.return_values_on_condition_check_failure,
            )
            .send()
            .await
            .is_ok()
    }

    async fn complete(&self, key: &str) {
        let input = self.completion.clone();
        self.client
            .update_item()
            .set_table_name(input.table_name)
            .key("pk", AttributeValue::S(key.to_owned()))
            .set_update_expression(input.update_expression)
            .set_condition_expression(input.condition_expression)
            .set_expression_attribute_names(input.expression_attribute_names)
            .set_expression_attribute_values(input.expression_attribute_values)
            .set_return_values(input.return_values)
            .set_return_values_on_condition_check_failure(
                input.return_values_on_condition_check_failure,
            )
            .send()
            .await
            .expect("bare completion");
    }
}

/// The crate's cost per call over the bare requests, on a store whose table the bare requests
/// share: each sample runs a bare first execution and duplicate, then the crate's, on fresh keys.
async fn overhead_over_bare_sdk(policy: &KeyPolicy<Value>, scope: &OperationScope) -> OwnCost {
    let recorder = Recorder::default();
    let config = local_dynamodb::sdk_config()
        .await
        .expect("SDK configuration")
        .interceptor(recorder.clone())
        .build();
    let store = DynamoDbStore::new(
        Client::from_conf(config),
        local_dynamodb::unique_table_name("bench-bare-idempotency"),
    )
    .with_uniqueness_table(local_dynamodb::unique_table_name("bench-bare-uniqueness"));
    store.create_table().await.expect("tables");
    let idem = Idempotency::new(store.clone());
    let (key, fingerprint) = policy.derive(scope, &order(999_999)).expect("derive");
    idem.execute(
        &Invocation::new(key, fingerprint, Duration::from_secs(30)),
        |_| async { Ok::<_, std::io::Error>(json!({"placed": true})) },
    )
    .await
    .expect("recorded execution");
    let (claim, completion) = recorder.0.lock().expect("recorder").clone();
    let bare = BareSdk {
        // The store's own client: the same configuration, timeouts included.
        client: store.client().clone(),
        claim: claim.expect("the store's claim recorded"),
        completion: completion.expect("the store's completion recorded"),
    };
    let samples = SAMPLES * 2;
    let mut timings: [Vec<Duration>; 4] = std::array::from_fn(|_| Vec::with_capacity(samples));
    let mut allocated = [0_u64; 4];
    for i in 0..samples {
        let key = format!("bench#bare#v1#{i:064}");
        let (start, before) = (Instant::now(), allocations());
        assert!(bare.claim(&key).await);
        bare.complete(&key).await;
        timings[0].push(start.elapsed());
        allocated[0] += allocations() - before;
        let (start, before) = (Instant::now(), allocations());
        assert!(!bare.claim(&key).await);
        timings[1].push(start.elapsed());
        allocated[1] += allocations() - before;

        for (slot, placed) in [(2, true), (3, false)] {
            let event = order(2_000_000 + i);
            let (start, before) = (Instant::now(), allocations());
            let (key, fingerprint) = policy.derive(scope, &event).expect("derive");
            let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
            let done = idem
                .execute(&invocation, |_| async move {
                    Ok::<_, std::io::Error>(json!({"placed": placed}))
                })
                .await
                .expect("execute");
            timings[slot].push(start.elapsed());
            allocated[slot] += allocations() - before;
            assert_eq!(done.is_replay(), !placed);
        }
    }
    let [bare_first, bare_duplicate, first, duplicate] = timings;
    let own_cost = |crate_samples: &[Duration], bare_samples: &[Duration]| {
        let differences: Vec<f64> = crate_samples
            .iter()
            .zip(bare_samples)
            .map(|(ours, bare)| micros(*ours) - micros(*bare))
            .collect();
        median_of(differences)
    };
    let first_cost = own_cost(&first, &bare_first);
    let duplicate_cost = own_cost(&duplicate, &bare_duplicate);
    let bare_first = report("bare SDK: PutItem + UpdateItem", bare_first);
    let first = report("crate: derive + execute, first execution", first);
    let bare_duplicate = report("bare SDK: PutItem refused (ALL_OLD)", bare_duplicate);
    let duplicate = report("crate: derive + execute, duplicate", duplicate);
    println!(
        "the crate's own cost per call (difference of medians): first execution {:+.1} µs, duplicate {:+.1} µs",
        micros(first) - micros(bare_first),
        micros(duplicate) - micros(bare_duplicate)
    );
    println!(
        "the crate's own cost per call (median of paired differences): first execution {first_cost:+.1} µs, duplicate {duplicate_cost:+.1} µs"
    );
    // The server shares the thread: its allocations are on both sides and cancel.
    let own_allocations = |ours: usize, bare: usize| {
        (allocated[ours] as f64 - allocated[bare] as f64) / samples as f64
    };
    let (first_allocations, duplicate_allocations) = (own_allocations(2, 0), own_allocations(3, 1));
    println!(
        "the crate's own allocations per call: first execution {first_allocations:+.1}, duplicate {duplicate_allocations:+.1}"
    );
    OwnCost {
        first: first_cost,
        duplicate: duplicate_cost,
        first_allocations,
        duplicate_allocations,
    }
}

/// The crate's own cost per call over the bare SDK: median paired differences (µs) and
/// allocations per call.
struct OwnCost {
    first: f64,
    duplicate: f64,
    first_allocations: f64,
    duplicate_allocations: f64,
}

/// The median of `values` (not empty).
fn median_of(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_idempotency::BoxError> {
    let scope = OperationScope::new("bench", "place-order")?;
    let policy = KeyPolicy::<Value>::pointer("/order_id")?;

    let mut derive_allocations = 0;
    let derive: Vec<Duration> = (0..SAMPLES * 10)
        .map(|i| {
            let event = order(i);
            let (start, before) = (Instant::now(), allocations());
            let derived = policy.derive(&scope, &event);
            let elapsed = start.elapsed();
            derive_allocations += allocations() - before;
            assert!(derived.is_ok());
            drop(derived);
            elapsed
        })
        .collect();
    let derive = report("key + fingerprint (RFC 8785, SHA-256)", derive);
    let derive_allocations = derive_allocations as f64 / (SAMPLES * 10) as f64;
    println!("key + fingerprint: allocations per call {derive_allocations:.1}");

    let memory = Idempotency::new(MemoryStore::new());
    let memory = first_and_duplicate("memory store", &memory, &policy, &scope).await;

    let dynamodb = Idempotency::new(local_dynamodb::local_store("bench").await?);
    let on_dynamodb = first_and_duplicate(
        "DynamoDB store (embedded, loopback)",
        &dynamodb,
        &policy,
        &scope,
    )
    .await;
    println!(
        "duplicate / first execution on DynamoDB: {:.2}",
        on_dynamodb.duplicate.as_secs_f64() / on_dynamodb.first.as_secs_f64()
    );

    let own_cost = overhead_over_bare_sdk(&policy, &scope).await;

    let cache = CachedStore::new(local_dynamodb::local_store("bench-cached").await?, 16 << 20);
    let cached = Idempotency::new(cache.clone());
    let cached_path = first_and_duplicate(
        "DynamoDB store + in-process cache",
        &cached,
        &policy,
        &scope,
    )
    .await;
    println!(
        "cached duplicate / uncached duplicate: {:.3}; cache hits {} of {SAMPLES} duplicates ({:.0} requests per duplicate)",
        cached_path.duplicate.as_secs_f64() / on_dynamodb.duplicate.as_secs_f64(),
        cache.hits(),
        (SAMPLES as u64 - cache.hits()) as f64 / SAMPLES as f64
    );
    // The same duplicates again, back to back: no DynamoDB round trip between two of them to
    // evict the caches (what a function answering a burst of redeliveries sees).
    let mut back_to_back = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let (key, fingerprint) = policy.derive(&scope, &order(i)).expect("derive");
        let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
        let start = Instant::now();
        let done = cached
            .execute(&invocation, |_| async {
                Ok::<_, std::io::Error>(json!({"placed": false}))
            })
            .await
            .expect("duplicate");
        back_to_back.push(start.elapsed());
        assert!(done.is_replay());
    }
    let back_to_back = report(
        "DynamoDB store + in-process cache: duplicates back to back",
        back_to_back,
    );
    for (name, figure) in [
        ("derive", micros(derive)),
        ("memory_first", micros(memory.first)),
        ("memory_duplicate", micros(memory.duplicate)),
        ("own_cost_first", own_cost.first),
        ("own_cost_duplicate", own_cost.duplicate),
        ("cached_duplicate", micros(cached_path.duplicate)),
        ("cached_duplicate_back_to_back", micros(back_to_back)),
        ("allocations_derive", derive_allocations),
        ("allocations_memory_first", memory.first_allocations),
        ("allocations_memory_duplicate", memory.duplicate_allocations),
        ("allocations_own_first", own_cost.first_allocations),
        ("allocations_own_duplicate", own_cost.duplicate_allocations),
        (
            "allocations_cached_duplicate",
            cached_path.duplicate_allocations,
        ),
    ] {
        println!("figure {name} {figure:.2}");
    }
    Ok(())
}
