//! The conformance suite against the DynamoDB store on a DynamoDB-compatible server, and what
//! only DynamoDB has: request counts, item decoding, key schemas, error mapping.

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::store::{AttributeNames, DynamoDbStore, SortKey, StoreExt};
use lambda_idempotency::{
    Error, Fingerprint, Idempotency, Invocation, OperationKey, OperationScope, StoreError,
};

use lambda_idempotency::testing::conformance::{Fixture, start_time};
use lambda_idempotency::testing::dynamo;

async fn fixture() -> Fixture<DynamoDbStore> {
    dynamo::fixture(start_time()).await
}

lambda_idempotency::conformance_tests!(fixture());

/// A single-table layout: a sort key naming the record kind, the TTL attribute renamed.
fn single_table_names() -> AttributeNames {
    AttributeNames {
        sort_key: Some(SortKey {
            attribute: "sk".into(),
            value: "idempotency".into(),
        }),
        expires_at: "ttl".into(),
        ..AttributeNames::default()
    }
}

/// The whole conformance suite again on a single-table layout (a sort key naming the record
/// kind, the TTL attribute renamed): every write's key and condition as that layout builds them.
mod single_table {
    use std::sync::Arc;

    use lambda_idempotency::clock::Clock;
    use lambda_idempotency::store::DynamoDbStore;
    use lambda_idempotency::testing::conformance::{Fixture, Sweeper, start_time};
    use lambda_idempotency::testing::dynamo;
    use lambda_idempotency::testing::local::unique_table_name;

    async fn fixture() -> Fixture<DynamoDbStore> {
        let base = dynamo::fixture(start_time()).await;
        let names = super::single_table_names();
        let store = DynamoDbStore::new(base.store.client().clone(), unique_table_name("single"))
            .with_uniqueness_table(unique_table_name("single-uniqueness"))
            .with_attribute_names(names.clone());
        store.create_table().await.expect("single-table tables");
        // The embedded server's sweep covers every table; another endpoint's covers only the
        // base table, so this one is swept too, under its own TTL attribute.
        let client = store.client().clone();
        let (table, ttl) = (store.table().to_owned(), names.expires_at);
        let (clock, base_sweep) = (base.clock.clone(), base.sweep.clone());
        let sweep: Sweeper = Arc::new(move || {
            let (client, table, ttl) = (client.clone(), table.clone(), ttl.clone());
            let (now, base_sweep) = (clock.now(), base_sweep.clone());
            Box::pin(async move {
                base_sweep().await + dynamo::sweep_table(&client, &table, &ttl, now).await
            })
        });
        Fixture {
            store,
            sweep,
            ..base
        }
    }

    lambda_idempotency::conformance_tests!(fixture());
}

fn invocation(material: &str) -> Invocation {
    let scope = OperationScope::new("dynamodb", "op").expect("scope");
    let key = OperationKey::derive(&scope, None, material).expect("key");
    Invocation::new(
        key,
        Fingerprint::of(&material).expect("fingerprint"),
        Duration::from_secs(30),
    )
}

async fn ok(value: u32) -> Result<u32, std::io::Error> {
    Ok(value)
}

#[tokio::test]
async fn round_trips_first_execution_two_duplicate_one() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());

    // A store never primed checks its tables' replication once, before its first claim.
    let before = db.requests.count();
    idem.execute(&invocation("first-of-the-store"), |_| ok(0))
        .await
        .expect("the store's first");
    assert_eq!(
        db.requests.since(before),
        ["DescribeTable", "DescribeTable", "PutItem", "UpdateItem"],
        "the replication check of both tables, once; then claim + complete"
    );
    let inv = invocation("round-trips");
    let before = db.requests.count();
    idem.execute(&inv, |_| ok(1)).await.expect("first");
    let first = db.requests.since(before);
    let before = db.requests.count();
    idem.execute(&inv, |_| ok(2)).await.expect("duplicate");
    let duplicate = db.requests.since(before);

    assert_eq!(
        first,
        ["PutItem", "UpdateItem"],
        "first execution: claim + complete"
    );
    assert_eq!(
        duplicate,
        ["PutItem"],
        "duplicate: the failed claim returns the record"
    );
}

#[tokio::test]
async fn round_trips_failure_two() {
    let db = dynamo::start().await;
    let store = db.store();
    store
        .prime()
        .await
        .expect("primed: its replication checked");
    let idem = Idempotency::new(store);
    let inv = invocation("failure-round-trips");

    let before = db.requests.count();
    let _ = idem
        .execute(&inv, |_| async {
            Err::<u32, _>(std::io::Error::other("boom"))
        })
        .await;

    assert_eq!(
        db.requests.since(before),
        ["PutItem", "DeleteItem"],
        "claim + release"
    );
}

#[tokio::test]
async fn corrupt_item_is_a_typed_error() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let inv = invocation("corrupt");
    db.client
        .put_item()
        .table_name(&db.table)
        .item("pk", AttributeValue::S(inv.key().to_string()))
        .item("status", AttributeValue::S("BOGUS".into()))
        .item("expires_at", AttributeValue::N("99999999999".into()))
        .send()
        .await
        .expect("seed a corrupt item");

    let err = idem
        .execute(&inv, |_| ok(1))
        .await
        .expect_err("corrupt record");

    assert!(
        matches!(err, Error::Store(StoreError::CorruptRecord { .. })),
        "got {err:?}"
    );
}

#[tokio::test]
async fn missing_table_is_a_typed_error() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(DynamoDbStore::new(db.client.clone(), "no-such-table"));

    let err = idem
        .execute(&invocation("no-table"), |_| ok(1))
        .await
        .expect_err("no table");

    assert!(
        matches!(&err, Error::Store(StoreError::TableNotFound { table }) if table == "no-such-table"),
        "got {err:?}"
    );
}

#[tokio::test]
async fn prime_reads_once_and_stores_nothing() {
    let db = dynamo::start().await;
    let store = db.store();
    let idem = Idempotency::new(store.clone());

    let before = db.requests.count();
    store.prime().await.expect("prime");
    let mut primed = db.requests.since(before);
    primed.sort();
    let before = db.requests.count();
    idem.execute(&invocation("after-prime"), |_| ok(1))
        .await
        .expect("first");

    assert_eq!(
        primed,
        ["DescribeTable", "DescribeTable", "GetItem"],
        "priming is one read, and the replication check describes each table"
    );
    assert_eq!(db.requests.since(before), ["PutItem", "UpdateItem"]);
    let (records, _, _) = store.scan_page(None).await.expect("scan");
    assert_eq!(records.len(), 1, "priming wrote nothing");
}

#[tokio::test]
async fn prime_finds_a_missing_table() {
    let db = dynamo::start().await;
    let store = DynamoDbStore::new(db.client.clone(), "no-such-table");

    let err = store.prime().await.expect_err("no table");

    assert!(
        matches!(&err, StoreError::TableNotFound { table } if table == "no-such-table"),
        "got {err:?}"
    );
    assert!(!err.is_transient(), "a missing table fails an init");
}

#[tokio::test]
async fn sort_key_and_renamed_attributes_work() {
    let db = dynamo::start().await;
    let table = lambda_idempotency::testing::local::unique_table_name("single-table");
    let names = single_table_names();
    let store = DynamoDbStore::new(db.client.clone(), &table).with_attribute_names(names);
    store
        .create_table()
        .await
        .expect("create a table with a sort key");
    let idem = Idempotency::new(store);
    let inv = invocation("sorted");

    idem.execute(&inv, |_| ok(5)).await.expect("first");
    let replay = idem.execute(&inv, |_| ok(6)).await.expect("replay");

    assert!(replay.is_replay());
    assert_eq!(*replay.value(), 5);
    let item = db
        .client
        .get_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(inv.key().to_string()))
        .key("sk", AttributeValue::S("idempotency".into()))
        .send()
        .await
        .expect("get")
        .item
        .expect("the item under its own partition, the record kind in the sort key");
    assert!(
        item.contains_key("ttl"),
        "retention under the renamed TTL attribute"
    );
    assert_eq!(
        idem.store()
            .get(inv.key())
            .await
            .expect("get")
            .map(|r| r.lease.attempt),
        Some(1)
    );

    // Another operation has a partition of its own; another kind of item under the same
    // partition key is not this store's, and a scan leaves it out.
    let other = invocation("sorted-other");
    idem.execute(&other, |_| ok(7)).await.expect("other");
    db.client
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S(inv.key().to_string()))
        .item("sk", AttributeValue::S("order-line".into()))
        .send()
        .await
        .expect("a foreign item");
    let (records, skipped, _) = idem
        .store()
        .downcast_ref::<DynamoDbStore>()
        .expect("a DynamoDB store")
        .scan_page(None)
        .await
        .expect("scan");
    let mut keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    let mut expected = [inv.key().as_str(), other.key().as_str()];
    expected.sort_unstable();
    assert_eq!(
        keys, expected,
        "one partition per operation, the foreign item left out"
    );
    assert_eq!(skipped, 0);
}

#[tokio::test]
async fn round_trips_takeover_three() {
    let db = dynamo::start().await;
    let clock = ManualClock::new(SystemTime::now());
    // A handler safe to repeat: the takeover runs it again.
    let idem = Idempotency::new(db.store())
        .with_clock(clock.clone())
        .with_recovery(Recovery::Rerun);
    let inv = invocation("takeover-round-trips");
    lambda_idempotency::testing::conformance::crash_after_claim(&idem, &inv).await;
    clock.advance(Duration::from_secs(31));

    let before = db.requests.count();
    let done = idem
        .execute(&inv, |ctx| ok(ctx.attempt()))
        .await
        .expect("takeover");

    assert_eq!(*done.value(), 2);
    assert_eq!(
        db.requests.since(before),
        ["PutItem", "UpdateItem", "UpdateItem"],
        "claim (takes over) + record attempt 2 + complete"
    );
}

#[tokio::test]
async fn round_trips_with_evidence_are_transactions() {
    let db = dynamo::start().await;
    let store = db.store();
    store
        .prime()
        .await
        .expect("primed: its replication checked");
    let idem = Idempotency::new(store);
    let inv = invocation("evidence-round-trips")
        .with_identity("invoice:rt:1")
        .expect("a valid identity");

    let before = db.requests.count();
    idem.execute(&inv, |_| ok(1)).await.expect("first");
    let first = db.requests.since(before);
    let before = db.requests.count();
    idem.execute(&inv, |_| ok(2)).await.expect("duplicate");

    assert_eq!(
        first,
        ["TransactWriteItems", "TransactWriteItems"],
        "claim + complete, both tables each"
    );
    assert_eq!(
        db.requests.since(before),
        ["TransactWriteItems"],
        "duplicate: the cancelled claim returns the record"
    );
}

#[tokio::test]
async fn identity_without_uniqueness_table_is_a_typed_error() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(DynamoDbStore::new(db.client.clone(), &db.table));
    let inv = invocation("no-uniqueness")
        .with_identity("invoice:none:1")
        .expect("a valid identity");

    let err = idem
        .execute(&inv, |_| ok(1))
        .await
        .expect_err("no uniqueness table");

    assert!(
        matches!(err, Error::Store(StoreError::NoUniquenessTable)),
        "got {err:?}"
    );
    assert_eq!(
        idem.store().get(inv.key()).await.expect("get"),
        None,
        "nothing written"
    );
}

#[tokio::test]
async fn an_out_of_range_stored_time_is_a_corrupt_record_not_a_panic() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let inv = invocation("extreme-time");
    idem.execute(&inv, |_| ok(1)).await.expect("first");
    db.client
        .update_item()
        .table_name(&db.table)
        .key("pk", AttributeValue::S(inv.key().to_string()))
        .update_expression("SET expires_at = :max")
        .expression_attribute_values(":max", AttributeValue::N(u64::MAX.to_string()))
        .send()
        .await
        .expect("store an extreme time");

    let err = idem
        .execute(&inv, |_| ok(2))
        .await
        .expect_err("corrupt record");

    assert!(
        matches!(err, Error::Store(StoreError::CorruptRecord { .. })),
        "got {err:?}"
    );
}

/// Evidence as versions before 0.2 wrote it: under the bare identity, naming its operation.
async fn seed_unscoped_evidence(
    db: &dynamo::Dynamo,
    identity: &str,
    key: &OperationKey,
    status: &str,
) {
    db.client
        .put_item()
        .table_name(&db.uniqueness_table)
        .item("pk", AttributeValue::S(identity.into()))
        .item("operation_key", AttributeValue::S(key.to_string()))
        .item(
            "fingerprint",
            AttributeValue::S(Fingerprint::of(&"o-1").expect("fp").to_string()),
        )
        .item("status", AttributeValue::S(status.into()))
        .item("created_at", AttributeValue::N("1790000000000".into()))
        .item("completed_at", AttributeValue::N("1790000001000".into()))
        .send()
        .await
        .expect("seed evidence in the old layout");
}

#[tokio::test]
async fn evidence_written_before_scoping_still_refuses_its_scope_and_only_its_scope() {
    let db = dynamo::start().await;
    let scope = OperationScope::new("billing", "issue-invoice").expect("scope");
    let key = |tenant: Option<&str>, order: &str| {
        OperationKey::derive(&scope, tenant, order).expect("key")
    };
    let claim = |tenant: Option<&str>, order: &str| {
        Invocation::new(
            key(tenant, order),
            Fingerprint::of(&order).expect("fingerprint"),
            Duration::from_secs(30),
        )
        .with_identity("invoice:o-1")
        .expect("a valid identity")
    };
    // Tenant acme's operation took effect before the upgrade; its record is long gone.
    seed_unscoped_evidence(&db, "invoice:o-1", &key(Some("acme"), "o-1"), "COMPLETED").await;
    let idem = Idempotency::new(db.store());

    let err = idem
        .execute(&claim(Some("acme"), "o-1"), |_| ok(1))
        .await
        .expect_err("acme's own old evidence");
    assert!(err.already_took_effect(), "{err:?}");
    let err = idem
        .execute(&claim(Some("acme"), "o-1-retry"), |_| ok(1))
        .await
        .expect_err("another operation of acme's with the same identity");
    assert!(matches!(err, Error::KeyExpiredConflict { .. }), "{err:?}");

    let globex = idem
        .execute(&claim(Some("globex"), "o-1"), |_| ok(2))
        .await
        .expect("another tenant's operation is its own");
    assert_eq!(*globex.value(), 2);
    let other_function = Idempotency::new(db.store());
    let shipping = OperationScope::new("shipping", "issue-invoice").expect("scope");
    let shipped = Invocation::new(
        OperationKey::derive(&shipping, Some("acme"), "o-1").expect("key"),
        Fingerprint::of(&"o-1").expect("fingerprint"),
        Duration::from_secs(30),
    )
    .with_identity("invoice:o-1")
    .expect("a valid identity");
    other_function
        .execute(&shipped, |_| ok(3))
        .await
        .expect("another namespace's operation is its own");

    let unchecked = Idempotency::new(db.store().with_unscoped_evidence_check(false));
    unchecked
        .execute(&claim(Some("acme"), "o-1-new"), |_| ok(4))
        .await
        .expect("without the check, old evidence is not looked at");
}

#[tokio::test]
async fn an_orphan_written_before_scoping_is_adopted_and_settled_where_it_stands() {
    let db = dynamo::start().await;
    let scope = OperationScope::new("billing", "issue-invoice").expect("scope");
    let key = OperationKey::derive(&scope, None, "o-7").expect("key");
    let fingerprint = Fingerprint::of(&"o-7").expect("fingerprint");
    // A crashed attempt of a version before 0.2: its record TTL deleted, its evidence orphaned.
    db.client
        .put_item()
        .table_name(&db.uniqueness_table)
        .item("pk", AttributeValue::S("invoice:o-7".into()))
        .item("operation_key", AttributeValue::S(key.to_string()))
        .item("fingerprint", AttributeValue::S(fingerprint.to_string()))
        .item("status", AttributeValue::S("IN_PROGRESS".into()))
        .item("created_at", AttributeValue::N("1790000000000".into()))
        .send()
        .await
        .expect("seed an orphan");
    let idem = Idempotency::new(db.store()).with_recovery(Recovery::Rerun);
    let inv = Invocation::new(key, fingerprint, Duration::from_secs(30))
        .with_identity("invoice:o-7")
        .expect("a valid identity");

    let done = idem
        .execute(
            &inv,
            |ctx| async move { Ok::<_, std::io::Error>(ctx.attempt()) },
        )
        .await
        .expect("adopted as a takeover");
    assert_eq!(*done.value(), 2, "the crashed attempt was 1");
    let old = db
        .store()
        .evidence("invoice:o-7")
        .await
        .expect("evidence")
        .expect("stands");
    assert_eq!(
        old.status,
        lambda_idempotency::record::Status::Completed,
        "settled in place"
    );
    let scoped = inv.evidence_key().expect("an identity");
    assert_eq!(db.store().evidence(&scoped).await.expect("evidence"), None);
}

/// A store without a uniqueness table keeps no evidence: it runs the suite with that
/// capability off (the cases that need it are reported ignored), and every other case still
/// holds it to the contract.
mod without_a_uniqueness_table {
    use super::*;
    use lambda_idempotency::testing::conformance::{Capabilities, Capability};

    async fn fixture() -> Fixture<DynamoDbStore> {
        let base = dynamo::fixture(start_time()).await;
        let store = DynamoDbStore::new(base.store.client().clone(), base.store.table());
        Fixture { store, ..base }.with_capabilities(Capabilities::ALL.without(Capability::Evidence))
    }

    lambda_idempotency::conformance_tests!(fixture(), without[Evidence]);
}
