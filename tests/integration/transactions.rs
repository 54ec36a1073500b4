//! Transactional steps on the embedded DynamoDB server: the handler's own writes (an order
//! put, an optimistic stock update) commit with the step's record or not at all, across
//! crashes, lost answers, fences and DynamoDB's limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, Put, Update};
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::effects::{
    Destination, Outbox, OutboxEvent, StepError, Transaction, event_id,
};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::{FailureKind, Status};
use lambda_idempotency::store::{AnyStore, Committed, MemoryStore, Request, Store, StoreExt};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency};
use tokio::sync::oneshot;

/// The shop's own tables beside the ledger: orders, and stock with a version.
pub(crate) struct Shop {
    pub(crate) db: Dynamo,
    pub(crate) orders: String,
    pub(crate) stock: String,
    pub(crate) outbox: String,
    pub(crate) clock: ManualClock,
    /// The memory store the operation's records are kept in, when not the DynamoDB store.
    memory: Option<MemoryStore>,
}

impl Shop {
    /// The shop with its records on the DynamoDB store.
    pub(crate) async fn open() -> Self {
        let clock = ManualClock::new(SystemTime::now());
        Self::open_on(dynamo::start_with_clock(clock.clone()).await, clock, false).await
    }

    /// The shop on each store: records on the DynamoDB store, then in a memory store that
    /// commits the handler's writes into the shop's tables on an embedded server.
    pub(crate) async fn both() -> [Self; 2] {
        let clock = ManualClock::new(SystemTime::now());
        let in_memory = Self::open_on(
            dynamo::embedded_with_clock(clock.clone()).await,
            clock,
            true,
        )
        .await;
        [Self::open().await, in_memory]
    }

    /// The store the operation's records are kept in.
    pub(crate) fn store(&self) -> AnyStore {
        match &self.memory {
            Some(memory) => AnyStore::new(memory.clone()),
            None => AnyStore::new(self.db.store()),
        }
    }

    /// Whether the operation's records are kept in a memory store.
    pub(crate) fn in_memory(&self) -> bool {
        self.memory.is_some()
    }

    async fn open_on(db: Dynamo, clock: ManualClock, in_memory: bool) -> Self {
        let orders = lambda_idempotency::testing::local::unique_table_name("orders");
        let stock = lambda_idempotency::testing::local::unique_table_name("stock");
        let outbox = lambda_idempotency::testing::local::unique_table_name("outbox");
        for table in [&orders, &stock] {
            lambda_idempotency::testing::local::create_key_table(&db.client, table, false)
                .await
                .expect("create a shop table");
        }
        lambda_idempotency::testing::local::create_outbox_table(&db.client, &outbox)
            .await
            .expect("create the shop's outbox");
        db.client
            .put_item()
            .table_name(&stock)
            .item("pk", AttributeValue::S("sku-7".into()))
            .item("version", AttributeValue::N("1".into()))
            .item("reserved", AttributeValue::N("0".into()))
            .send()
            .await
            .expect("seed the stock");
        let memory = if in_memory {
            Some(db.memory_store().expect("an embedded server"))
        } else {
            None
        };
        Self {
            db,
            orders,
            stock,
            outbox,
            clock,
            memory,
        }
    }

    pub(crate) fn engine(&self, store: impl Store) -> Idempotency {
        Idempotency::new(store)
            .with_clock(self.clock.clone())
            .with_recovery(Recovery::Steps)
    }

    /// The order put and the stock update, conditioned on the stock's version `seen`.
    pub(crate) fn place(&self, order: &str, seen: u64) -> Transaction<String> {
        let put = Put::builder()
            .table_name(&self.orders)
            .item("pk", AttributeValue::S(order.into()))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .expect("put");
        let update = Update::builder()
            .table_name(&self.stock)
            .key("pk", AttributeValue::S("sku-7".into()))
            .update_expression("SET version = :next ADD reserved :one")
            .condition_expression("version = :seen")
            .expression_attribute_values(":seen", AttributeValue::N(seen.to_string()))
            .expression_attribute_values(":next", AttributeValue::N((seen + 1).to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .build()
            .expect("update");
        Transaction::new(format!("placed {order}"))
            .put(put)
            .update(update)
    }

    pub(crate) async fn reserved(&self) -> u64 {
        self.stock_item("reserved").await
    }

    /// A number of the stock item.
    pub(crate) async fn stock_item(&self, attribute: &str) -> u64 {
        let item = self
            .db
            .client
            .get_item()
            .table_name(&self.stock)
            .key("pk", AttributeValue::S("sku-7".into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get stock");
        item.item()
            .and_then(|item| item.get(attribute))
            .and_then(|n| n.as_n().ok())
            .and_then(|n| n.parse().ok())
            .expect("a number")
    }

    pub(crate) async fn has_order(&self, order: &str) -> bool {
        self.db
            .client
            .get_item()
            .table_name(&self.orders)
            .key("pk", AttributeValue::S(order.into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get order")
            .item()
            .is_some()
    }
}

/// The handler: one transactional step placing `order` against the stock's version as read.
pub(crate) async fn place(
    shop: &Shop,
    ctx: ExecutionContext,
    order: &str,
    builds: &AtomicUsize,
) -> Result<String, StepError> {
    ctx.step("place")
        .transact(|_key| async {
            builds.fetch_add(1, Ordering::SeqCst);
            let seen = shop.stock_item("version").await;
            Ok::<_, BoxError>(shop.place(order, seen))
        })
        .await
}

#[tokio::test]
async fn the_writes_commit_with_the_step_and_a_takeover_replays_them_once() {
    for shop in Shop::both().await {
        the_writes_commit_with_the_step_and_a_takeover_replays_them_once_on(shop).await;
    }
}

async fn the_writes_commit_with_the_step_and_a_takeover_replays_them_once_on(shop: Shop) {
    let shop = Arc::new(shop);
    let idem = shop.engine(shop.store());
    let inv = invocation("tx-crash", &serde_json::json!({"order": "o-1"}));
    let builds = Arc::new(AtomicUsize::new(0));
    // Crash right after the transactional commit, before the settlement.
    let (committed_tx, committed_rx) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv, shop, builds) = (
            idem.clone(),
            inv.clone(),
            Arc::clone(&shop),
            Arc::clone(&builds),
        );
        async move {
            idem.execute(&inv, |ctx| async move {
                place(&shop, ctx, "o-1", &builds).await?;
                let _ = committed_tx.send(());
                std::future::pending::<Result<String, BoxError>>().await
            })
            .await
        }
    });
    committed_rx.await.expect("committed");
    drop(worker);
    assert!(shop.has_order("o-1").await);
    assert_eq!(shop.reserved().await, 1);
    let record = idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(record.steps.len(), 1);
    assert_eq!(
        record.steps[0].result.as_deref(),
        Some(&br#""placed o-1""#[..])
    );

    shop.clock.advance(Duration::from_secs(31));
    let done = idem
        .execute(&inv, |ctx| {
            let (shop, builds) = (Arc::clone(&shop), Arc::clone(&builds));
            async move {
                place(&shop, ctx, "o-1", &builds)
                    .await
                    .map_err(BoxError::from)
            }
        })
        .await
        .expect("the takeover replays the step");
    assert_eq!(done.value(), "placed o-1");
    assert_eq!(
        builds.load(Ordering::SeqCst),
        1,
        "the transaction was built once"
    );
    assert_eq!(shop.reserved().await, 1, "reserved once");
}

#[tokio::test]
async fn a_failed_condition_commits_nothing_and_names_the_write() {
    for shop in Shop::both().await {
        a_failed_condition_commits_nothing_and_names_the_write_on(shop).await;
    }
}

async fn a_failed_condition_commits_nothing_and_names_the_write_on(shop: Shop) {
    let idem = shop.engine(shop.store());
    let inv = invocation("tx-refused", &serde_json::json!({"order": "o-2"}));
    let shop = &shop;
    let err = idem
        .execute(&inv, |ctx| async move {
            let refused = ctx
                .step("place")
                .transact(|_key| async { Ok::<_, BoxError>(shop.place("o-2", 7)) })
                .await
                .expect_err("the stock's version is 1, not 7");
            assert!(
                matches!(&refused, StepError::Refused { write: 1, .. }),
                "the second write's condition: {refused:?}"
            );
            // Read again and run the step again, under the same name: nothing was recorded.
            ctx.step("place")
                .transact(|_key| async { Ok::<_, BoxError>(shop.place("o-2", 1)) })
                .await
        })
        .await;
    assert_eq!(err.expect("the second try commits").value(), "placed o-2");
    assert!(shop.has_order("o-2").await);
    assert_eq!(shop.reserved().await, 1);
}

#[tokio::test]
async fn a_zombie_commits_nothing_over_a_takeover() {
    for shop in Shop::both().await {
        a_zombie_commits_nothing_over_a_takeover_on(shop).await;
    }
}

async fn a_zombie_commits_nothing_over_a_takeover_on(shop: Shop) {
    let shop = Arc::new(shop);
    let idem = shop.engine(shop.store());
    let inv = invocation("tx-zombie", &serde_json::json!({"order": "o-3"}));
    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let zombie = tokio::spawn({
        let (idem, inv, shop) = (idem.clone(), inv.clone(), Arc::clone(&shop));
        async move {
            idem.execute(&inv, |ctx| async move {
                let _ = started_tx.send(());
                let _ = resume_rx.await;
                ctx.step("place")
                    .transact(|_key| async { Ok::<_, BoxError>(shop.place("o-3", 1)) })
                    .await
            })
            .await
        }
    });
    started_rx.await.expect("started");
    shop.clock.advance(Duration::from_secs(31));
    let owner = idem
        .execute(&inv, |_ctx| async {
            Ok::<_, BoxError>(String::from("owner"))
        })
        .await
        .expect("the takeover completes");
    assert_eq!(owner.value(), "owner");
    let _ = resume_tx.send(());
    let err = zombie.await.expect("join").expect_err("fenced");
    assert!(
        matches!(err, Error::LeaseLost { attempt: 1, .. }),
        "got {err:?}"
    );
    assert!(
        !shop.has_order("o-3").await,
        "the zombie's writes did not commit"
    );
    assert_eq!(shop.reserved().await, 0);
}

/// A commit whose answer the store lost (once, always, or that never applied) commits once.
/// Which mechanism recognises the re-send (the request token, or the record the refused
/// re-send returns) is shown apart, each by a test that fails without it, in `lost_commits`.
#[tokio::test]
async fn a_lost_commit_answer_never_commits_twice() {
    for shop in Shop::both().await {
        a_lost_commit_answer_never_commits_twice_on(shop).await;
    }
}

async fn a_lost_commit_answer_never_commits_twice_on(shop: Shop) {
    let faulty = FaultyStore::new(shop.store());
    let idem = shop.engine(faulty.clone());
    let builds = AtomicUsize::new(0);

    // Committed, its answer lost once: re-sent under the same token, answered as committed.
    let inv = invocation("tx-lost-once", &serde_json::json!({"order": "o-4"}));
    faulty.inject(
        Primitive::CommitSteps,
        Fault::FailAfter(FaultKind::Unavailable),
    );
    let done = idem
        .execute(&inv, |ctx| async {
            place(&shop, ctx, "o-4", &builds).await
        })
        .await
        .expect("the re-sent commit is recognised");
    assert_eq!(done.value(), "placed o-4");
    assert_eq!(
        shop.reserved().await,
        1,
        "committed once, not refused on the re-send"
    );

    // Committed, every answer lost: the attempt stops without overwriting the steps, and the
    // next delivery finds the step committed.
    let inv = invocation("tx-lost-always", &serde_json::json!({"order": "o-5"}));
    for _ in 0..5 {
        faulty.inject(
            Primitive::CommitSteps,
            Fault::FailAfter(FaultKind::Unavailable),
        );
    }
    let err = idem
        .execute(&inv, |ctx| async {
            place(&shop, ctx, "o-5", &builds).await
        })
        .await
        .expect_err("no answer");
    assert!(matches!(err, Error::Store(_)), "got {err:?}");
    let record = idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.steps.len(), 1, "the commit's steps stand");
    shop.clock.advance(Duration::from_millis(2));
    let builds_before = builds.load(Ordering::SeqCst);
    idem.execute(&inv, |ctx| async {
        place(&shop, ctx, "o-5", &builds).await
    })
    .await
    .expect("replayed");
    assert_eq!(
        builds.load(Ordering::SeqCst),
        builds_before,
        "not built again"
    );
    assert_eq!(shop.reserved().await, 2, "o-4 and o-5, each once");

    // Never applied: the next delivery commits it, once.
    let inv = invocation("tx-failed", &serde_json::json!({"order": "o-6"}));
    for _ in 0..5 {
        faulty.inject(
            Primitive::CommitSteps,
            Fault::FailBefore(FaultKind::Unavailable),
        );
    }
    idem.execute(&inv, |ctx| async {
        place(&shop, ctx, "o-6", &builds).await
    })
    .await
    .expect_err("no commit");
    assert!(!shop.has_order("o-6").await);
    shop.clock.advance(Duration::from_millis(2));
    idem.execute(&inv, |ctx| async {
        place(&shop, ctx, "o-6", &builds).await
    })
    .await
    .expect("committed on the next delivery");
    assert_eq!(shop.reserved().await, 3);
}

#[tokio::test]
async fn dynamodbs_limits_are_refused_before_sending() {
    for shop in Shop::both().await {
        dynamodbs_limits_are_refused_before_sending_on(shop).await;
    }
}

async fn dynamodbs_limits_are_refused_before_sending_on(shop: Shop) {
    let idem = shop.engine(shop.store());
    let put = |n: usize| {
        Put::builder()
            .table_name(&shop.orders)
            .item("pk", AttributeValue::S(format!("bulk-{n}")))
            .build()
            .expect("put")
    };
    let too_many = (0..100).fold(Transaction::new(0_u32), |tx, n| tx.put(put(n)));
    let same_item = shop.place("o-7", 1).update(
        Update::builder()
            .table_name(&shop.stock)
            .key("pk", AttributeValue::S("sku-7".into()))
            .update_expression("SET note = :n")
            .expression_attribute_values(":n", AttributeValue::S("x".into()))
            .build()
            .expect("update"),
    );
    let same_item = Transaction::new(0_u32)
        .write(same_item.writes()[1].clone())
        .write(same_item.writes()[2].clone());
    let huge = Transaction::new(0_u32).put(
        Put::builder()
            .table_name(&shop.orders)
            .item("pk", AttributeValue::S("huge".into()))
            .item("blob", AttributeValue::S("x".repeat(4 * 1024 * 1024)))
            .build()
            .expect("put"),
    );
    // Outbox events count among the 99 actions (the step's record is the 100th): 98 writes
    // and two events are one too many.
    let outbox = Outbox::new(&shop.outbox);
    let event = |n: usize| {
        let sqs = Destination::Sqs {
            queue_url: "http://127.0.0.1/000000000000/orders".into(),
        };
        OutboxEvent::new(format!("e-{n}"), sqs, &n).expect("event")
    };
    let with_events = (0..98)
        .fold(Transaction::new(0_u32), |tx, n| tx.put(put(n)))
        .publish(&outbox, event(0))
        .publish(&outbox, event(1));
    // The operation's own record is one of the items: a write to it is a second action on it.
    let own_record = Transaction::new(0_u32).put(
        Put::builder()
            .table_name(&shop.db.table)
            .item(
                "pk",
                AttributeValue::S(
                    invocation("tx-limits-own record", &serde_json::json!({}))
                        .key()
                        .as_str()
                        .into(),
                ),
            )
            .build()
            .expect("put"),
    );
    let mut cases = vec![
        ("too many", too_many),
        ("one item twice", same_item),
        ("over 4 MB", huge),
        ("writes and events", with_events),
    ];
    // The memory store keeps its records in no DynamoDB table: a write to the table the
    // DynamoDB store uses is a write to another table there.
    if !shop.in_memory() {
        cases.push(("own record", own_record));
    }
    for (case, transaction) in cases {
        let inv = invocation(&format!("tx-limits-{case}"), &serde_json::json!({}));
        let before = shop.db.requests.count();
        let err = idem
            .execute(&inv, |ctx| {
                let transaction = transaction.clone();
                async move {
                    ctx.step("bulk")
                        .transact(|_key| async move { Ok::<_, BoxError>(transaction) })
                        .await
                }
            })
            .await
            .expect_err(case);
        assert_rejected(&err, case);
        let sent = shop.db.requests.since(before);
        assert!(
            !sent.iter().any(|request| request == "TransactWriteItems"),
            "{case}: refused before sending, sent {sent:?}"
        );
        // The same handler would build the same writes: retained, never run again (it was
        // released, and every redelivery built and refused them until the source gave up).
        shop.clock.advance(Duration::from_millis(2));
        let again = idem
            .execute(&inv, |_| async { Ok::<_, BoxError>(1_u32) })
            .await
            .expect_err(case);
        assert!(
            matches!(&again, Error::Failed { failure, .. } if failure.kind == FailureKind::StepRejected),
            "{case}: {again:?}"
        );
    }
    // At the bound, 98 writes and one event (99 actions with the step's record) commit.
    let at_the_bound = (0..98)
        .fold(Transaction::new(0_u32), |tx, n| tx.put(put(1000 + n)))
        .publish(&outbox, event(2));
    let inv = invocation("tx-limits-at the bound", &serde_json::json!({}));
    idem.execute(&inv, |ctx| async move {
        ctx.step("bulk")
            .transact(|_key| async move { Ok::<_, BoxError>(at_the_bound) })
            .await
    })
    .await
    .expect("99 actions with the step's record commit");
}

#[tokio::test]
async fn the_memory_store_refuses_dynamodb_writes_but_keeps_a_step_without_any() {
    let idem = Idempotency::new(MemoryStore::new());
    let inv = invocation("tx-memory", &serde_json::json!({}));
    let done = idem
        .execute(&inv, |ctx| async move {
            let refused = ctx
                .step("order")
                .transact(|_key| async {
                    let put = Put::builder()
                        .table_name("orders")
                        .item("pk", AttributeValue::S("o-8".into()))
                        .build()?;
                    Ok::<_, BoxError>(Transaction::new(1_u32).put(put))
                })
                .await
                .expect_err("no DynamoDB behind the memory store");
            assert!(matches!(refused, StepError::Rejected { .. }), "{refused:?}");
            ctx.step("order")
                .transact(|_key| async { Ok::<_, BoxError>(Transaction::new(2_u32)) })
                .await
        })
        .await
        .expect("a transactional step without writes is a recorded step");
    assert_eq!(*done.value(), 2);
    let record = idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("record");
    assert_eq!(record.steps.len(), 1);
}

/// The outbox items, by event id.
pub(crate) async fn outbox_items(
    shop: &Shop,
) -> Vec<std::collections::HashMap<String, AttributeValue>> {
    let mut items = shop
        .db
        .client
        .scan()
        .table_name(&shop.outbox)
        .consistent_read(true)
        .send()
        .await
        .expect("scan the outbox")
        .items()
        .to_vec();
    items.sort_by_key(|item| item.get("pk").and_then(|pk| pk.as_s().ok()).cloned());
    items
}

#[tokio::test]
async fn outbox_events_commit_with_the_step_under_ids_stable_across_attempts() {
    for shop in Shop::both().await {
        outbox_events_commit_with_the_step_under_ids_stable_across_attempts_on(shop).await;
    }
}

async fn outbox_events_commit_with_the_step_under_ids_stable_across_attempts_on(shop: Shop) {
    let shop = Arc::new(shop);
    let idem = shop.engine(shop.store());
    let outbox = Outbox::new(&shop.outbox);
    let inv = invocation("tx-outbox", &serde_json::json!({"order": "o-9"}));
    let placed = |shop: &Shop, outbox: &Outbox| -> Result<Transaction<String>, BoxError> {
        let sqs = Destination::Sqs {
            queue_url: "http://127.0.0.1/000000000000/orders".into(),
        };
        let bus = Destination::EventBridge {
            bus: "shop".into(),
            source: "shop.orders".into(),
            detail_type: "OrderPlaced".into(),
        };
        Ok(shop
            .place("o-9", 1)
            .publish(
                outbox,
                OutboxEvent::new("order-placed", sqs, &serde_json::json!({"order": "o-9"}))?,
            )
            .publish(
                outbox,
                OutboxEvent::new("analytics", bus, &serde_json::json!({"n": 1}))?,
            ))
    };
    // Crash after the commit: the events are in the outbox with the order.
    let (committed_tx, committed_rx) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv, shop, outbox) =
            (idem.clone(), inv.clone(), Arc::clone(&shop), outbox.clone());
        async move {
            idem.execute(&inv, |ctx| async move {
                ctx.step("place")
                    .transact(|_key| async { placed(&shop, &outbox) })
                    .await?;
                let _ = committed_tx.send(());
                std::future::pending::<Result<String, BoxError>>().await
            })
            .await
        }
    });
    committed_rx.await.expect("committed");
    drop(worker);
    let items = outbox_items(&shop).await;
    assert_eq!(items.len(), 2);
    let mut ids: Vec<String> = items
        .iter()
        .map(|item| item["pk"].as_s().expect("id").clone())
        .collect();
    let created_at = idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("record")
        .created_at;
    let mut expected = vec![
        event_id(inv.key(), created_at, "place", "order-placed"),
        event_id(inv.key(), created_at, "place", "analytics"),
    ];
    ids.sort();
    expected.sort();
    assert_eq!(
        ids, expected,
        "ids derived from the operation, the step and the name"
    );
    let order = items
        .iter()
        .find(|item| item["event"].as_s().ok().map(String::as_str) == Some("order-placed"))
        .expect("the order event");
    assert_eq!(order["destination"].as_s().map(String::as_str), Ok("sqs"));
    assert_eq!(
        order["payload"].as_s().map(String::as_str),
        Ok(r#"{"order":"o-9"}"#)
    );
    // Pending until published: in the pending index (its shard the first hex digit of the
    // id's digest, after the producer's namespace), with no TTL (OUTBOX_RETENTION runs from the
    // publication).
    let id = order["pk"].as_s().expect("id");
    let (namespace, digest) = id.split_once('#').expect("a namespaced id");
    assert_eq!(namespace, "conformance", "the producer's namespace first");
    assert_eq!(
        order["pending"].as_s().map(String::as_str),
        Ok(format!("p{}", &digest[..1]).as_str())
    );
    assert!(!order.contains_key("expires_at"), "no TTL while pending");
    let committed_ms = created_at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_millis();
    let written_ms: u128 = order["created_at"]
        .as_n()
        .expect("created_at")
        .parse()
        .expect("epoch milliseconds");
    assert!(written_ms >= committed_ms, "committed after the claim");

    shop.clock.advance(Duration::from_secs(31));
    let done = idem
        .execute(&inv, |ctx| {
            let (shop, outbox) = (Arc::clone(&shop), outbox.clone());
            async move {
                ctx.step("place")
                    .transact(|_key| async { placed(&shop, &outbox) })
                    .await
            }
        })
        .await
        .expect("replayed");
    assert_eq!(done.value(), "placed o-9");
    assert_eq!(outbox_items(&shop).await, items, "no event written twice");

    // A later execution of the key (its record's retention over) publishes its own events,
    // under other ids: they are new items for the stream, never taken for the first ones.
    shop.clock.advance(Duration::from_secs(25 * 3600));
    let later = idem
        .execute(&inv, |ctx| {
            let outbox = outbox.clone();
            async move {
                ctx.step("place")
                    .transact(|_key| async move {
                        let sqs = Destination::Sqs {
                            queue_url: "http://127.0.0.1/000000000000/orders".into(),
                        };
                        let event = OutboxEvent::new("order-placed", sqs, &serde_json::json!({}))?;
                        Ok::<_, BoxError>(
                            Transaction::new(String::from("again")).publish(&outbox, event),
                        )
                    })
                    .await
            }
        })
        .await
        .expect("a new execution");
    assert_eq!(later.value(), "again");
    assert_eq!(
        outbox_items(&shop).await.len(),
        3,
        "its event is a new item"
    );

    let inv = invocation("tx-outbox-twice", &serde_json::json!({"order": "o-10"}));
    let err = idem
        .execute(&inv, |ctx| {
            let outbox = outbox.clone();
            async move {
                ctx.step("publish")
                    .transact(|_key| async move {
                        let sns = Destination::Sns {
                            topic_arn: "arn:aws:sns:us-east-1:000000000000:orders".into(),
                        };
                        let event = OutboxEvent::new("placed", sns, &1)?;
                        Ok::<_, BoxError>(
                            Transaction::new(0_u32)
                                .publish(&outbox, event.clone())
                                .publish(&outbox, event),
                        )
                    })
                    .await
            }
        })
        .await
        .expect_err("two events of one name");
    assert_rejected(&err, "two events of one name");
}

/// `err` is the handler's `StepError::Rejected`: nothing was sent.
pub(crate) fn assert_rejected(err: &Error, case: &str) {
    let Error::Handler { source } = err else {
        panic!("{case}: {err:?}");
    };
    assert!(
        matches!(
            source.downcast_ref::<StepError>(),
            Some(StepError::Rejected { .. })
        ),
        "{case}: {source}"
    );
}

/// A transactional step's result may fill the step results' limit exactly, never pass it:
/// with a 1,000-byte outcome limit, a step named `pay` whose result is a JSON string of 963
/// characters (965 bytes, with the 32 bytes a step takes besides and its name: 1,000) commits;
/// one of 964 is refused (`StepError::Rejected`), nothing of it written.
#[tokio::test]
async fn a_transactional_steps_result_may_fill_the_step_results_limit_never_pass_it() {
    for shop in Shop::both().await {
        let idem = limited_engine(&shop);
        for (order, chars, fits) in [("fills", 963, true), ("passes", 964, false)] {
            let inv = invocation(order, &serde_json::json!({ "order": order }));
            let put = Put::builder()
                .table_name(&shop.orders)
                .item("pk", AttributeValue::S(order.into()))
                .build()
                .expect("put");
            let answer = idem
                .execute(&inv, |ctx: ExecutionContext| {
                    let put = put.clone();
                    async move {
                        ctx.step("pay")
                            .transact(|_key| async move {
                                Ok::<_, BoxError>(Transaction::new("x".repeat(chars)).put(put))
                            })
                            .await
                    }
                })
                .await;
            match fits {
                true => assert_eq!(answer.expect("within the limit").value().len(), chars),
                false => assert_rejected(&answer.expect_err("past the limit"), order),
            }
            assert_eq!(shop.has_order(order).await, fits, "{order}: its write");
        }
    }
}

/// A commit whose every answer was lost after a plain step whose result is not saved yet: the
/// attempt stops without writing its own list over the store's (which holds both steps, the
/// commit having applied), and the next delivery replays both, the writes committed once.
#[tokio::test]
async fn a_lost_commit_after_a_plain_step_leaves_the_stores_steps_as_they_stand() {
    for shop in Shop::both().await {
        let faulty = FaultyStore::new(shop.store());
        let idem = shop.engine(faulty.clone());
        let (builds, quotes) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let inv = invocation("tx-after-a-step", &serde_json::json!({"order": "o-8"}));
        let handler = |ctx: ExecutionContext| async {
            let quoted = ctx
                .step("quote")
                .run(|_key| async {
                    quotes.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(7_u32)
                })
                .await?;
            let placed = place(&shop, ctx, "o-8", &builds).await?;
            Ok::<_, StepError>(format!("{placed} at {quoted}"))
        };
        for _ in 0..50 {
            faulty.inject(
                Primitive::CommitSteps,
                Fault::FailAfter(FaultKind::Unavailable),
            );
        }
        idem.execute(&inv, handler).await.expect_err("no answer");
        // As many as the engine's patience tries: the rest never fire.
        faulty.clear();
        let record = idem
            .store()
            .get(inv.key())
            .await
            .expect("get")
            .expect("record");
        assert_eq!(
            record
                .steps
                .iter()
                .map(|step| step.name.as_str())
                .collect::<Vec<_>>(),
            ["quote", "place"],
            "the commit's steps stand"
        );
        shop.clock.advance(Duration::from_millis(2));
        let done = idem.execute(&inv, handler).await.expect("replayed");
        assert_eq!(done.value(), "placed o-8 at 7");
        assert_eq!(builds.load(Ordering::SeqCst), 1, "not built again");
        assert_eq!(quotes.load(Ordering::SeqCst), 1, "not quoted again");
        assert_eq!(shop.reserved().await, 1, "committed once");
    }
}

/// Two transactional steps of one attempt commit each under a request token of its own: the
/// second is never taken for a re-send of the first (DynamoDB refuses a token reused with
/// other writes), and both orders are placed.
#[tokio::test]
async fn two_transactional_steps_of_one_attempt_commit_under_tokens_of_their_own() {
    for shop in Shop::both().await {
        let idem = shop.engine(shop.store());
        let builds = AtomicUsize::new(0);
        let inv = invocation(
            "tx-two-steps",
            &serde_json::json!({"orders": ["o-9", "o-10"]}),
        );
        let done = idem
            .execute(&inv, |ctx: ExecutionContext| {
                let (shop, builds) = (&shop, &builds);
                async move {
                    let first = place(shop, ctx.clone(), "o-9", builds).await?;
                    let second = ctx
                        .step("place again")
                        .transact(|_key| async {
                            let seen = shop.stock_item("version").await;
                            Ok::<_, BoxError>(shop.place("o-10", seen))
                        })
                        .await?;
                    Ok::<_, StepError>(format!("{first}, {second}"))
                }
            })
            .await
            .expect("both committed");
        assert_eq!(done.value(), "placed o-9, placed o-10");
        assert!(shop.has_order("o-9").await && shop.has_order("o-10").await);
        assert_eq!(shop.reserved().await, 2);
    }
}

/// A transactional step whose table does not exist commits nothing, and its attempt knows it:
/// it gives its claim back as a handler's retryable failure would (marked, the steps as they
/// stand), so that under the default recovery the next delivery, once the table exists, runs
/// it again instead of holding the operation for an operator.
#[tokio::test]
async fn a_step_refused_for_a_missing_table_is_given_back_knowingly() {
    for shop in Shop::both().await {
        let idem = Idempotency::new(shop.store()).with_clock(shop.clock.clone());
        let table = format!("{}-later", shop.orders);
        let inv = invocation("tx-missing-table", &serde_json::json!({"order": "o-11"}));
        let builds = AtomicUsize::new(0);
        let handler = |ctx: ExecutionContext| {
            let (table, builds) = (&table, &builds);
            async move {
                ctx.step("place")
                    .transact(|_key| async move {
                        builds.fetch_add(1, Ordering::SeqCst);
                        let put = Put::builder()
                            .table_name(table)
                            .item("pk", AttributeValue::S("o-11".into()))
                            .build()?;
                        Ok::<_, BoxError>(Transaction::new("placed o-11".to_owned()).put(put))
                    })
                    .await
            }
        };
        let err = idem
            .execute(&inv, handler)
            .await
            .expect_err("no such table");
        assert!(
            matches!(
                &err,
                Error::Store(lambda_idempotency::StoreError::TableNotFound { .. })
            ),
            "got {err:?}"
        );
        lambda_idempotency::testing::local::create_key_table(&shop.db.client, &table, false)
            .await
            .expect("the table, created");
        shop.clock.advance(Duration::from_secs(15 * 60));
        let done = idem
            .execute(&inv, handler)
            .await
            .expect("run again once the table exists, not held");
        assert_eq!(done.value(), "placed o-11");
        assert_eq!(builds.load(Ordering::SeqCst), 2);
    }
}

/// A plain step's result may fill the step results' limit exactly, never pass it, as a
/// transactional step's: 963 characters commit under a 1,000-byte limit; 964 stop the attempt
/// with `OutcomeTooLarge` naming the size the steps would take (1,001) and the limit.
#[tokio::test]
async fn a_plain_steps_result_may_fill_the_step_results_limit_never_pass_it() {
    for shop in Shop::both().await {
        let idem = limited_engine(&shop);
        for (order, chars) in [("fills-plain", 963), ("passes-plain", 964)] {
            let inv = invocation(order, &serde_json::json!({ "order": order }));
            let answer = idem
                .execute(&inv, |ctx: ExecutionContext| async move {
                    ctx.step("pay")
                        .run(|_key| async move { Ok::<_, BoxError>("x".repeat(chars)) })
                        .await
                })
                .await;
            match chars {
                963 => assert_eq!(answer.expect("within the limit").value().len(), chars),
                _ => {
                    let err = answer.expect_err("past the limit");
                    assert!(
                        matches!(
                            err,
                            Error::OutcomeTooLarge {
                                size: 1001,
                                limit: 1000,
                                ..
                            }
                        ),
                        "{order}: {err:?}"
                    );
                }
            }
        }
    }
}

/// The shop's engine with a 1,000-byte outcome limit: the step results' limit too.
fn limited_engine(shop: &Shop) -> Idempotency {
    let config = lambda_idempotency::Config::builder()
        .max_outcome_bytes(1000)
        .build()
        .expect("a config");
    shop.engine(shop.store()).with_config(config)
}

#[tokio::test]
async fn a_commit_of_a_request_that_commits_no_writes_is_refused_before_anything_is_sent() {
    for shop in Shop::both().await {
        let store = shop.store();
        let inv = invocation("tx-no-writes", &serde_json::json!({"order": "o-9"}));
        let idem = shop.engine(store.clone());
        // A record that stands, so that a claim or a read sent by mistake would find it.
        idem.execute(&inv, |_| async {
            Ok::<_, BoxError>("placed o-9".to_owned())
        })
        .await
        .expect("executed");
        let before = store
            .get(inv.key())
            .await
            .expect("read")
            .expect("the record");
        let put = Put::builder()
            .table_name(&shop.orders)
            .item("pk", AttributeValue::S("o-9".into()))
            .build()
            .expect("put");
        let writes = [aws_sdk_dynamodb::types::TransactWriteItem::builder()
            .put(put)
            .build()];
        let transactional = store
            .transactional()
            .expect("the shop's stores commit writes");
        for request in [
            Request::Get { key: inv.key() },
            Request::Claim {
                record: &before,
                now: SystemTime::now(),
            },
        ] {
            let committed = transactional
                .commit(request, &writes, "token-no-writes")
                .await
                .expect("answered");
            assert!(
                matches!(committed, Committed::Invalid { .. }),
                "{}: {committed:?}",
                request.name()
            );
        }
        assert!(!shop.has_order("o-9").await, "nothing was written");
        assert_eq!(
            store.get(inv.key()).await.expect("read"),
            Some(before),
            "the record stands as it was"
        );
    }
}
