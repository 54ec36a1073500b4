//! The in-process cache in front of both stores: the whole conformance suite through it, and
//! the requests a duplicate costs.

use std::time::Duration;

use lambda_idempotency::store::{CachedStore, DynamoDbStore, MemoryStore, Store};
use lambda_idempotency::testing::conformance::{Fixture, memory_fixture, start_time};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::outcomes::incompressible;
use lambda_idempotency::{Fingerprint, Idempotency, Invocation, OperationKey, OperationScope};

/// 16 MiB, the documented default size.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// The cache in front of the engine's store (`S`).
fn cache<S: Store>(idem: &Idempotency) -> &CachedStore<S> {
    idem.store()
        .downcast_ref::<CachedStore<S>>()
        .expect("a cached store of this type")
}

fn cached<S>(fixture: Fixture<S>) -> Fixture<CachedStore<S>> {
    fixture.map_store(|store| CachedStore::new(store, CACHE_BYTES))
}

mod over_memory {
    use super::*;

    async fn fixture() -> Fixture<CachedStore<lambda_idempotency::store::MemoryStore>> {
        cached(memory_fixture(start_time()))
    }

    lambda_idempotency::conformance_tests!(fixture());
}

mod over_dynamodb {
    use super::*;

    async fn fixture() -> Fixture<CachedStore<lambda_idempotency::store::DynamoDbStore>> {
        cached(dynamo::fixture(start_time()).await)
    }

    lambda_idempotency::conformance_tests!(fixture());
}

#[tokio::test]
async fn a_replay_of_500_keys_costs_no_request() {
    const KEYS: usize = 500;
    let db = dynamo::start().await;
    let store = CachedStore::new(db.store(), CACHE_BYTES);
    let idem = Idempotency::new(store);
    let scope = OperationScope::new("cache-test", "orders").expect("scope");
    let invocation = |i: usize| {
        let key = OperationKey::derive(&scope, None, &format!("order-{i}")).expect("key");
        let intent = Fingerprint::of(&i).expect("fingerprint");
        Invocation::new(key, intent, Duration::from_secs(30))
    };
    let outcome = |i: usize| async move { Ok::<_, std::io::Error>(format!("{i:0>300}")) };

    for i in 0..KEYS {
        idem.execute(&invocation(i), |_| outcome(i))
            .await
            .expect("first");
    }
    let before = db.requests.count();
    for i in 0..KEYS {
        let replay = idem
            .execute(&invocation(i), |_| outcome(usize::MAX))
            .await
            .expect("replay");
        assert!(replay.is_replay());
        assert_eq!(replay.value(), &format!("{i:0>300}"));
    }

    assert_eq!(
        db.requests.since(before).len(),
        0,
        "no request for 500 duplicates"
    );
    assert_eq!(cache::<DynamoDbStore>(&idem).hits(), KEYS as u64);
    let err = idem
        .execute(
            &Invocation::new(
                invocation(7).key().clone(),
                Fingerprint::of(&"changed").expect("fingerprint"),
                Duration::from_secs(30),
            ),
            |_| outcome(7),
        )
        .await
        .expect_err("a changed payload is still a conflict");
    assert!(matches!(
        err,
        lambda_idempotency::Error::PayloadConflict { .. }
    ));
}

#[tokio::test]
async fn an_outcome_up_to_the_default_limit_is_cached_in_the_documented_size() {
    let db = dynamo::start().await;
    let store = CachedStore::new(db.store(), CACHE_BYTES);
    let idem = Idempotency::new(store);
    let scope = OperationScope::new("cache-test", "reports").expect("scope");
    let key = OperationKey::derive(&scope, None, "large").expect("key");
    let inv = Invocation::new(
        key,
        Fingerprint::of(&1).expect("fingerprint"),
        Duration::from_secs(30),
    );
    // Over a default shard's share on a machine with 2 cores or more (16 MiB / 8 shards).
    let outcome = incompressible(5 * 1024 * 1024, 1);

    idem.execute(&inv, |_| async { Ok::<_, std::io::Error>(outcome.clone()) })
        .await
        .expect("first");
    let before = db.requests.count();
    let replay = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(String::new()) })
        .await
        .expect("replay");

    assert_eq!(replay.value(), &outcome);
    assert_eq!(
        db.requests.since(before).len(),
        0,
        "answered from the cache"
    );
    assert_eq!(cache::<DynamoDbStore>(&idem).hits(), 1);
    assert!(cache::<DynamoDbStore>(&idem).cached_bytes() > 5 * 1024 * 1024);
}

#[tokio::test]
async fn every_cache_of_8_mib_or_more_keeps_an_outcome_of_the_default_limit() {
    let scope = OperationScope::new("cache-test", "sizes").expect("scope");
    let outcome = "y".repeat(lambda_idempotency::config::DEFAULT_MAX_OUTCOME_BYTES - 2);
    for mib in [8, 16, 24, 40, 72, 1024] {
        let store = CachedStore::new(lambda_idempotency::store::MemoryStore::new(), mib << 20);
        let idem = Idempotency::new(store);
        let key = OperationKey::derive(&scope, None, &format!("{mib}")).expect("key");
        let inv = Invocation::new(
            key,
            Fingerprint::of(&mib).expect("fingerprint"),
            Duration::from_secs(30),
        );
        idem.execute(&inv, |_| async { Ok::<_, std::io::Error>(outcome.clone()) })
            .await
            .expect("first");
        idem.execute(&inv, |_| async { Ok::<_, std::io::Error>(String::new()) })
            .await
            .expect("replay");
        assert_eq!(
            cache::<MemoryStore>(&idem).hits(),
            1,
            "a {mib} MiB cache keeps it"
        );
    }
}

#[tokio::test]
async fn a_payload_conflict_does_not_cache_a_record_without_its_outcome() {
    let db = dynamo::start().await;
    let scope = OperationScope::new("cache-test", "reports").expect("scope");
    let key = OperationKey::derive(&scope, None, "report-1").expect("key");
    let intent = |n: u32| {
        Invocation::new(
            key.clone(),
            Fingerprint::of(&n).expect("fp"),
            Duration::from_secs(30),
        )
    };
    let report = incompressible(200 * 1024, 3); // kept in part items
    let writer = Idempotency::new(db.store());
    writer
        .execute(&intent(1), |_| async {
            Ok::<_, std::io::Error>(report.clone())
        })
        .await
        .expect("stored in parts");

    // Another process, its cache cold: a conflicting request first (its parts are not read),
    // then a true duplicate, which must get the report back, not an unreadable outcome.
    let reader = Idempotency::new(CachedStore::new(db.store(), CACHE_BYTES));
    let conflict = reader
        .execute(&intent(2), |_| async {
            Ok::<_, std::io::Error>(String::new())
        })
        .await
        .expect_err("another intent");
    assert!(
        matches!(conflict, lambda_idempotency::Error::PayloadConflict { .. }),
        "{conflict:?}"
    );
    let replay = reader
        .execute(&intent(1), |_| async {
            Ok::<_, std::io::Error>(String::new())
        })
        .await
        .expect("the duplicate replays");
    assert!(replay.is_replay());
    assert_eq!(replay.value(), &report);
}

/// The engine's store is reached by the type it was given: a `CachedStore` over DynamoDB is
/// that type, not a `DynamoDbStore`, whose methods are reached through it.
#[tokio::test]
async fn the_store_is_reached_by_the_type_the_engine_was_given() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(CachedStore::new(db.store(), CACHE_BYTES));
    assert!(idem.store().downcast_ref::<DynamoDbStore>().is_none());
    let cached = idem
        .store()
        .downcast_ref::<CachedStore<DynamoDbStore>>()
        .expect("the type it was given");
    assert_eq!(cached.inner().table(), db.table);
    let plain = Idempotency::new(db.store());
    assert!(plain.store().downcast_ref::<DynamoDbStore>().is_some());
}
