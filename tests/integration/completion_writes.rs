//! Writes committed with the completion (`ExecutionContext::complete_with`) on the embedded
//! DynamoDB server: the handler's own writes and outbox events commit in one
//! `TransactWriteItems` with the record turning COMPLETED, or nothing does — across refused
//! conditions, lost answers, fences, identities, DynamoDB's limits and the memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::effects::{Destination, Outbox, OutboxEvent, StepError, Writes, event_id};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::{FailureKind, Status};
use lambda_idempotency::store::{MemoryStore, StoreExt};
use lambda_idempotency::testing::conformance::{evidence_key, invocation, stored};
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, ErrorKind, ExecutionContext, Idempotency, Origin};
use tokio::sync::oneshot;

use super::transactions::{Shop, outbox_items};

/// The order put and the stock update of [`Shop::place`], as writes of the completion.
fn placing(shop: &Shop, order: &str, seen: u64) -> Writes {
    shop.place(order, seen)
        .writes()
        .iter()
        .fold(Writes::default(), |tx, write| tx.write(write.clone()))
}

/// The handler: reads the stock's version, then places `order` with its completion.
async fn place(
    shop: &Shop,
    ctx: ExecutionContext,
    order: &str,
    runs: &AtomicUsize,
) -> Result<String, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let seen = shop.stock_item("version").await;
    ctx.complete_with(placing(shop, order, seen))?;
    Ok(format!("placed {order}"))
}

/// A handler that completes with `put` alone, counted in `runs`.
async fn completing_with(
    ctx: ExecutionContext,
    runs: &AtomicUsize,
    put: Put,
) -> Result<u32, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    ctx.complete_with(Writes::default().put(put))?;
    Ok(1)
}

/// The handler's refusal: the completion's write at `index` failed its condition.
fn is_refused(err: &Error, index: usize) -> bool {
    let Error::Handler { source } = err else {
        return false;
    };
    matches!(
        source.downcast_ref::<StepError>(),
        Some(StepError::Refused { write, .. }) if *write == index
    )
}

#[tokio::test]
async fn the_writes_commit_with_the_completion_in_its_one_request() {
    let shop = Shop::open().await;
    let store = shop.db.store();
    store
        .prime()
        .await
        .expect("primed: its replication checked");
    let idem = shop.engine(store);
    let inv = invocation("done-with", &serde_json::json!({"order": "c-1"}));
    let runs = AtomicUsize::new(0);
    let before = shop.db.requests.count();
    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "c-1", &runs))
        .await
        .expect("completed");
    assert_eq!(done.value(), "placed c-1");
    let sent = shop.db.requests.since(before);
    // The claim, the handler's own read of the stock, and the completion: no extra trip.
    assert_eq!(sent, ["PutItem", "GetItem", "TransactWriteItems"]);
    assert!(shop.has_order("c-1").await);
    assert_eq!(shop.reserved().await, 1);
    let record = stored(&idem, inv.key(), "record").await;
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.outcome.as_deref(), Some(&br#""placed c-1""#[..]));

    let again = idem
        .execute(&inv, |ctx| place(&shop, ctx, "c-1", &runs))
        .await
        .expect("replayed");
    assert_eq!(again.origin(), Origin::Replayed);
    assert_eq!(again.value(), "placed c-1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(shop.reserved().await, 1, "reserved once");
}

#[tokio::test]
async fn a_refused_condition_commits_nothing_and_the_next_delivery_runs_again() {
    for shop in Shop::both().await {
        a_refused_condition_commits_nothing_and_the_next_delivery_runs_again_on(shop).await;
    }
}

async fn a_refused_condition_commits_nothing_and_the_next_delivery_runs_again_on(shop: Shop) {
    let idem = shop.engine(shop.store());
    let inv = invocation("done-refused", &serde_json::json!({"order": "c-2"}));
    let shop = &shop;
    let err = idem
        .execute(&inv, |ctx| async move {
            // A stale read: the stock's version is 1, not 7.
            ctx.complete_with(placing(shop, "c-2", 7))?;
            Ok::<_, BoxError>("placed c-2".to_owned())
        })
        .await
        .expect_err("refused");
    assert!(is_refused(&err, 1), "the stock update's condition: {err:?}");
    assert!(!shop.has_order("c-2").await, "nothing committed");
    assert_eq!(
        idem.store().get(inv.key()).await.expect("get"),
        None,
        "released (retryable by default): the result was not stored"
    );

    let runs = AtomicUsize::new(0);
    let done = idem
        .execute(&inv, |ctx| place(shop, ctx, "c-2", &runs))
        .await
        .expect("the next delivery reads again and commits");
    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(shop.reserved().await, 1);
}

/// The recovery table's cells for a refused completion without steps: released where the
/// handler's effects are declared to be its steps or safe to repeat, held for an operator
/// under the default (its effects outside the completion may have happened: never re-run
/// blind).
#[tokio::test]
async fn a_refused_completion_without_steps_is_re_run_only_where_declared() {
    for shop in Shop::both().await {
        a_refused_completion_without_steps_is_re_run_only_where_declared_on(shop).await;
    }
}

async fn a_refused_completion_without_steps_is_re_run_only_where_declared_on(shop: Shop) {
    let shop = &shop;
    for (case, recovery) in [
        ("default", Recovery::Indeterminate),
        ("steps", Recovery::Steps),
        ("rerun", Recovery::Rerun),
    ] {
        let idem = shop.engine(shop.store()).with_recovery(recovery);
        let order = format!("c-refused-{case}");
        let inv = invocation(&order, &serde_json::json!({"order": order}));
        let runs = AtomicUsize::new(0);
        let stale = |ctx: ExecutionContext| {
            let (order, runs) = (order.clone(), &runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                ctx.complete_with(placing(shop, &order, 7))?;
                Ok::<_, BoxError>(order)
            }
        };
        let err = idem.execute(&inv, stale).await.expect_err("refused");
        let left = idem.store().get(inv.key()).await.expect("get");
        let next = idem
            .execute(&inv, |ctx| place(shop, ctx, &order, &runs))
            .await;
        if recovery == Recovery::Indeterminate {
            assert!(
                matches!(err, Error::Indeterminate { .. }),
                "{case}: {err:?}"
            );
            assert_eq!(
                left.map(|record| record.status),
                Some(Status::Indeterminate)
            );
            assert!(
                matches!(next, Err(Error::Indeterminate { .. })),
                "{case}: {next:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}: never re-run blind");
            assert!(!shop.has_order(&order).await);
        } else {
            assert!(is_refused(&err, 1), "{case}: {err:?}");
            assert_eq!(left, None, "{case}: released");
            let done = next.unwrap_or_else(|err| panic!("{case}: {err:?}"));
            assert_eq!(done.origin(), Origin::Executed { attempt: 1 }, "{case}");
            assert_eq!(
                runs.load(Ordering::SeqCst),
                2,
                "{case}: run again, as declared"
            );
            assert!(shop.has_order(&order).await);
        }
    }
}

#[tokio::test]
async fn a_lost_answer_is_recognised_and_commits_once() {
    for shop in Shop::both().await {
        a_lost_answer_is_recognised_and_commits_once_on(shop).await;
    }
}

async fn a_lost_answer_is_recognised_and_commits_once_on(shop: Shop) {
    let faulty = FaultyStore::new(shop.store());
    let idem = shop.engine(faulty.clone());
    let inv = invocation("done-lost", &serde_json::json!({"order": "c-3"}));
    for _ in 0..3 {
        faulty.inject(Primitive::Settle, Fault::FailAfter(FaultKind::Unavailable));
    }
    let runs = AtomicUsize::new(0);
    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "c-3", &runs))
        .await
        .expect("the re-sent completion is recognised");
    assert_eq!(done.value(), "placed c-3");
    assert_eq!(shop.reserved().await, 1, "committed once");
    let record = stored(&idem, inv.key(), "record").await;
    assert_eq!(record.status, Status::Completed);

    // Never applied, every try failing before it: the claim stands, nothing committed, and
    // the next delivery (after the lease) runs the handler and commits once.
    let inv = invocation("done-unsent", &serde_json::json!({"order": "c-4"}));
    faulty.inject(Primitive::Settle, Fault::FailBefore(FaultKind::Unavailable));
    let ran = idem
        .execute(&inv, |ctx| async {
            let done = place(&shop, ctx, "c-4", &runs).await;
            // The settlement fails past the deadline: no try is left.
            shop.clock.advance(Duration::from_secs(31));
            done
        })
        .await;
    assert!(matches!(ran, Err(Error::Store(_))), "got {ran:?}");
    assert!(!shop.has_order("c-4").await);
    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "c-4", &runs))
        .await
        .expect("taken over: nothing was committed, the handler's effects are its completion");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(shop.reserved().await, 2, "c-3 and c-4, each once");
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
    let inv = invocation("done-zombie", &serde_json::json!({"order": "c-5"}));
    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let zombie = tokio::spawn({
        let (idem, inv, shop) = (idem.clone(), inv.clone(), Arc::clone(&shop));
        async move {
            idem.execute(&inv, |ctx| async move {
                let _ = started_tx.send(());
                let _ = resume_rx.await;
                ctx.complete_with(placing(&shop, "c-5", 1))?;
                Ok::<_, BoxError>("zombie".to_owned())
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
        !shop.has_order("c-5").await,
        "the zombie's writes did not commit"
    );
    assert_eq!(shop.reserved().await, 0);
}

#[tokio::test]
async fn events_and_evidence_commit_with_the_completion() {
    for shop in Shop::both().await {
        events_and_evidence_commit_with_the_completion_on(shop).await;
    }
}

async fn events_and_evidence_commit_with_the_completion_on(shop: Shop) {
    let idem = shop.engine(shop.store());
    let outbox = Outbox::new(&shop.outbox);
    let inv = invocation("done-events", &serde_json::json!({"order": "c-6"}))
        .with_identity("order:c-6")
        .expect("identity");
    let (shop, outbox) = (&shop, &outbox);
    let done = idem
        .execute(&inv, |ctx| async move {
            let sqs = Destination::Sqs {
                queue_url: "http://127.0.0.1/000000000000/orders".into(),
            };
            let event = OutboxEvent::new("placed", sqs, &serde_json::json!({"order": "c-6"}))?;
            ctx.complete_with(placing(shop, "c-6", 1).publish(outbox, event.clone()))?;
            let refused = ctx
                .complete_with(Writes::default().publish(outbox, event))
                .expect_err("a second event of one name");
            assert!(matches!(refused, StepError::Rejected { .. }), "{refused:?}");
            Ok::<_, BoxError>("placed c-6".to_owned())
        })
        .await
        .expect("completed");
    assert_eq!(done.value(), "placed c-6");
    let record = stored(&idem, inv.key(), "record").await;
    let items = outbox_items(shop).await;
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0]["pk"].as_s().map(String::as_str),
        Ok(event_id(inv.key(), record.created_at, "", "placed").as_str()),
        "the completion's events take the step \"\""
    );
    let evidence = idem
        .store()
        .evidence(&evidence_key("order:c-6"))
        .await
        .expect("evidence")
        .expect("kept");
    assert_eq!(
        evidence.status,
        Status::Completed,
        "settled in the same transaction"
    );
    assert!(shop.has_order("c-6").await);
}

#[tokio::test]
async fn a_transaction_dynamodb_would_refuse_is_a_retained_failure() {
    let shop = Shop::open().await;
    let idem = shop.engine(shop.db.store());
    let inv = invocation("done-too-many", &serde_json::json!({}));
    let put = |n: usize| {
        Put::builder()
            .table_name(&shop.orders)
            .item("pk", AttributeValue::S(format!("bulk-{n}")))
            .build()
            .expect("put")
    };
    let before = shop.db.requests.count();
    let err = idem
        .execute(&inv, |ctx| async move {
            // 100 writes and the record's own update: 101 actions.
            ctx.complete_with((0..100).fold(Writes::default(), |tx, n| tx.put(put(n))))?;
            Ok::<_, BoxError>(0_u32)
        })
        .await
        .expect_err("refused before sending");
    assert_terminal_rejection(&err);
    assert!(
        !shop
            .db
            .requests
            .since(before)
            .iter()
            .any(|request| request == "TransactWriteItems"),
        "nothing sent"
    );
    let record = stored(&idem, inv.key(), "record").await;
    assert_eq!(
        record.status,
        Status::Failed,
        "retained: it would fail again"
    );
    assert!(!shop.has_order("bulk-0").await);
}

#[tokio::test]
async fn the_memory_store_retains_a_completion_with_writes_and_completes_one_without() {
    let idem = Idempotency::new(MemoryStore::new());
    let inv = invocation("done-memory", &serde_json::json!({}));
    let err = idem
        .execute(&inv, |ctx| async move {
            let put = Put::builder()
                .table_name("orders")
                .item("pk", AttributeValue::S("c-7".into()))
                .build()?;
            ctx.complete_with(Writes::default().put(put))?;
            Ok::<_, BoxError>(1_u32)
        })
        .await
        .expect_err("no DynamoDB behind the memory store");
    assert_terminal_rejection(&err);
    let replay = idem
        .execute(&inv, |_ctx| async { Ok::<_, BoxError>(2_u32) })
        .await
        .expect_err("the failure is replayed");
    assert!(matches!(replay, Error::Failed { .. }), "got {replay:?}");

    let inv = invocation("done-memory-empty", &serde_json::json!({}));
    let done = idem
        .execute(&inv, |ctx| async move {
            ctx.complete_with(Writes::default())?;
            Ok::<_, BoxError>(3_u32)
        })
        .await
        .expect("no writes: a plain completion");
    assert_eq!(*done.value(), 3);
}

#[tokio::test]
async fn writes_join_the_completion_only_from_inside_the_handler() {
    let idem = Idempotency::new(MemoryStore::new());
    let inv = invocation("done-late", &serde_json::json!({}));
    let (ctx_tx, ctx_rx) = oneshot::channel();
    idem.execute(&inv, |ctx| async move {
        let _ = ctx_tx.send(ctx.clone());
        Ok::<_, BoxError>(0_u32)
    })
    .await
    .expect("completed");
    let late = ctx_rx
        .await
        .expect("the context")
        .complete_with(Writes::default())
        .expect_err("the handler has returned");
    assert!(matches!(late, StepError::Invalid { .. }), "{late:?}");
}

/// `err` is the handler's terminal `StepError::Rejected` (kind `completion_rejected`).
fn assert_terminal_rejection(err: &Error) {
    let Error::Handler { source } = err else {
        panic!("got {err:?}");
    };
    let terminal = source
        .downcast_ref::<lambda_idempotency::failure::Terminal>()
        .expect("terminal");
    assert_eq!(terminal.kind(), "completion_rejected");
    let rejected =
        std::error::Error::source(terminal).and_then(|source| source.downcast_ref::<StepError>());
    assert!(
        matches!(rejected, Some(StepError::Rejected { .. })),
        "{source}"
    );
}

#[tokio::test]
async fn the_cache_remembers_a_completion_with_writes() {
    let shop = Shop::open().await;
    let idem = shop.engine(lambda_idempotency::store::CachedStore::new(
        shop.db.store(),
        8 << 20,
    ));
    let inv = invocation("done-cached", &serde_json::json!({"order": "c-8"}));
    let runs = AtomicUsize::new(0);
    idem.execute(&inv, |ctx| place(&shop, ctx, "c-8", &runs))
        .await
        .expect("completed");
    let before = shop.db.requests.count();
    let again = idem
        .execute(&inv, |ctx| place(&shop, ctx, "c-8", &runs))
        .await
        .expect("replayed");
    assert_eq!(again.origin(), Origin::Replayed);
    assert_eq!(
        shop.db.requests.since(before),
        Vec::<String>::new(),
        "served from the cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A classifier that calls every failure retryable, `Terminal` or not.
struct AlwaysRetry;

impl lambda_idempotency::failure::Classifier for AlwaysRetry {
    fn classify(
        &self,
        _: &(dyn std::error::Error + 'static),
    ) -> lambda_idempotency::failure::FailureClass {
        lambda_idempotency::failure::FailureClass::Retryable
    }
}

#[tokio::test]
async fn writes_that_cannot_be_sent_are_retained_whatever_the_classifier_says() {
    let idem = Idempotency::new(MemoryStore::new()).with_classifier(AlwaysRetry);
    let inv = invocation("done-classified", &serde_json::json!({}));
    let runs = AtomicUsize::new(0);
    let put = Put::builder()
        .table_name("orders")
        .item("pk", AttributeValue::S("c-9".into()))
        .build()
        .expect("put");
    let handler = |ctx| completing_with(ctx, &runs, put.clone());
    let err = idem
        .execute(&inv, handler)
        .await
        .expect_err("cannot be sent");
    assert_terminal_rejection(&err);
    let replay = idem.execute(&inv, handler).await.expect_err("replayed");
    let Error::Failed { failure, .. } = replay else {
        panic!("got {replay:?}");
    };
    assert!(
        matches!(failure.kind, FailureKind::CompletionRejected),
        "matched by variant: {:?}",
        failure.kind
    );
    assert_eq!(failure.kind.as_str(), "completion_rejected");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again");
}

#[tokio::test]
async fn a_refused_completion_after_a_step_gives_the_claim_back_and_the_step_replays() {
    for shop in Shop::both().await {
        a_refused_completion_after_a_step_gives_the_claim_back_and_the_step_replays_on(shop).await;
    }
}

async fn a_refused_completion_after_a_step_gives_the_claim_back_and_the_step_replays_on(
    shop: Shop,
) {
    let idem = shop.engine(shop.store());
    let inv = invocation("done-after-step", &serde_json::json!({"order": "c-10"}));
    let charges = AtomicUsize::new(0);
    let handler = |seen: u64| {
        let (shop, charges) = (&shop, &charges);
        move |ctx: ExecutionContext| async move {
            let charge: String = ctx
                .step("charge")
                .run(|key| async move {
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(key[..8].to_owned())
                })
                .await?;
            ctx.complete_with(placing(shop, "c-10", seen))?;
            Ok::<_, BoxError>(charge)
        }
    };
    let err = idem
        .execute(&inv, handler(7))
        .await
        .expect_err("a stale version");
    assert!(is_refused(&err, 1), "got {err:?}");
    let record = stored(
        &idem,
        inv.key(),
        "given back, not released: the step is kept",
    )
    .await;
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.steps.len(), 2, "the step, then the give-back's mark");
    assert!(record.steps[1].marks_given_back());
    assert!(!shop.has_order("c-10").await);

    shop.clock.advance(Duration::from_millis(2));
    let done = idem
        .execute(&inv, handler(1))
        .await
        .expect("taken over: the step replays, the completion commits");
    assert_eq!(done.origin(), Origin::Executed { attempt: 2 });
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(shop.reserved().await, 1);
}

/// The same refusal under the default recovery: the handler returned, so whatever it did
/// outside its steps and its completion happened; the operation is held for an operator with
/// its step kept, never given back to run again.
#[tokio::test]
async fn a_refused_completion_after_a_step_is_held_under_the_default() {
    for shop in Shop::both().await {
        a_refused_completion_after_a_step_is_held_under_the_default_on(shop).await;
    }
}

async fn a_refused_completion_after_a_step_is_held_under_the_default_on(shop: Shop) {
    let idem = shop
        .engine(shop.store())
        .with_recovery(Recovery::Indeterminate);
    let inv = invocation(
        "done-after-step-held",
        &serde_json::json!({"order": "c-12"}),
    );
    let runs = AtomicUsize::new(0);
    let handler = |ctx: ExecutionContext| {
        let (shop, runs) = (&shop, &runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let charge: String = ctx
                .step("charge")
                .run(|_| async { Ok::<_, BoxError>("ch_12".to_owned()) })
                .await?;
            ctx.complete_with(placing(shop, "c-12", 7))?;
            Ok::<_, BoxError>(charge)
        }
    };
    let err = idem
        .execute(&inv, handler)
        .await
        .expect_err("a stale version");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    let record = stored(&idem, inv.key(), "held").await;
    assert_eq!(record.status, Status::Indeterminate);
    assert!(record.steps[0].is_done(), "the charge's result is kept");
    assert!(!record.steps.iter().any(|step| step.marks_given_back()));

    shop.clock.advance(Duration::from_secs(60));
    let again = idem.execute(&inv, handler).await.expect_err("still held");
    assert!(
        matches!(again, Error::Indeterminate { .. }),
        "got {again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again blind");
    assert!(!shop.has_order("c-12").await);
}

#[tokio::test]
async fn a_large_outcome_in_parts_commits_with_the_writes() {
    let shop = Shop::open().await;
    let idem = shop.engine(shop.db.store());
    let inv = invocation("done-large", &serde_json::json!({"order": "c-11"}));
    let report = lambda_idempotency::testing::outcomes::incompressible(200 * 1024, 11);
    let done = idem
        .execute(&inv, |ctx| {
            let (shop, report) = (&shop, report.clone());
            async move {
                ctx.complete_with(placing(shop, "c-11", 1))?;
                Ok::<_, BoxError>(report)
            }
        })
        .await
        .expect("completed");
    assert_eq!(done.value().len(), report.len());
    assert!(shop.has_order("c-11").await);
    let again = idem
        .execute(&inv, |_ctx| async { Ok::<_, BoxError>(String::new()) })
        .await
        .expect("replayed");
    assert_eq!(again.origin(), Origin::Replayed);
    assert_eq!(
        *again.value(),
        report,
        "the outcome read back from its parts"
    );
}

#[tokio::test]
async fn a_transaction_dynamodb_refuses_is_retained_as_rejected_never_as_applied() {
    let shop = Shop::open().await;
    let idem = shop.engine(shop.db.store());
    let inv = invocation(
        "done-refused-by-dynamodb",
        &serde_json::json!({"order": "c-big"}),
    );
    let runs = AtomicUsize::new(0);
    // One item over DynamoDB's 400 KB: within the transaction's 4 MB, so only DynamoDB refuses.
    let put = Put::builder()
        .table_name(&shop.orders)
        .item("pk", AttributeValue::S("c-big".into()))
        .item("lines", AttributeValue::S("x".repeat(450 * 1024)))
        .build()
        .expect("put");
    let handler = |ctx| completing_with(ctx, &runs, put.clone());
    let err = idem
        .execute(&inv, handler)
        .await
        .expect_err("DynamoDB refuses the item");
    assert_terminal_rejection(&err);
    assert!(
        !shop.has_order("c-big").await,
        "nothing it carried committed"
    );
    let record = stored(&idem, inv.key(), "retained").await;
    assert_eq!(record.status, Status::Failed);
    let replay = idem.execute(&inv, handler).await.expect_err("replayed");
    let Error::Failed { failure, .. } = replay else {
        panic!("got {replay:?}");
    };
    assert!(
        matches!(failure.kind, FailureKind::CompletionRejected),
        "matched by variant: {:?}",
        failure.kind
    );
    assert_eq!(failure.kind.as_str(), "completion_rejected");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not run again blind");
}

/// A completion writing to a table that does not exist is answered alike on both stores: a
/// store error naming the table (retried by the next delivery once it exists), the record as
/// the DynamoDB store leaves it; never a refusal retained for good on one store alone.
#[tokio::test]
async fn a_write_to_a_missing_table_is_answered_alike_on_both_stores() {
    let mut seen = Vec::new();
    for shop in Shop::both().await {
        let idem = shop.engine(shop.store());
        let inv = invocation("done-missing-table", &serde_json::json!({}));
        let err = idem
            .execute(&inv, |ctx| async move {
                let put = Put::builder()
                    .table_name("no-such-table")
                    .item("pk", AttributeValue::S("c-9".into()))
                    .build()?;
                ctx.complete_with(Writes::default().put(put))?;
                Ok::<_, BoxError>(1_u32)
            })
            .await
            .expect_err("no such table");
        let status = idem
            .store()
            .get(inv.key())
            .await
            .expect("get")
            .map(|record| record.status);
        let named = matches!(
            &err,
            Error::Store(lambda_idempotency::StoreError::TableNotFound { table }) if table == "no-such-table"
        );
        seen.push((err.kind(), status, named));
    }
    assert_eq!(
        seen[0],
        (ErrorKind::Store, Some(Status::InProgress), true),
        "the DynamoDB store's answer"
    );
    assert_eq!(
        seen[0], seen[1],
        "the DynamoDB store's answer, then the memory store's"
    );
}

/// A result over the outcome limit from a handler whose writes wait for the completion: the
/// writes are the effect, so they commit with the retained failure (every caller is told the
/// operation was applied, which is then true), on both stores. They were dropped: the order
/// never written, its callers told it was applied.
#[tokio::test]
async fn a_result_too_large_to_keep_commits_the_writes_with_its_failure() {
    for shop in Shop::both().await {
        let store = if shop.in_memory() {
            "memory"
        } else {
            "dynamodb"
        };
        let config = lambda_idempotency::Config::builder()
            .max_outcome_bytes(64)
            .build()
            .expect("config");
        let idem = shop.engine(shop.store()).with_config(config);
        let inv = invocation("too-large", &serde_json::json!({"order": "c-9"}));
        let runs = AtomicUsize::new(0);
        let (shop, runs_ref) = (&shop, &runs);
        let large = |ctx: ExecutionContext| async move {
            place(shop, ctx, "c-9", runs_ref).await?;
            Ok::<_, BoxError>("x".repeat(100))
        };
        let first = idem.execute(&inv, large).await;
        assert!(
            matches!(first, Err(Error::OutcomeTooLarge { .. })),
            "{store}: {first:?}"
        );
        assert!(shop.has_order("c-9").await, "{store}: committed");
        assert_eq!(shop.reserved().await, 1, "{store}");
        let record = stored(&idem, inv.key(), "record").await;
        assert_eq!(record.status, Status::Failed, "{store}");

        let again = idem.execute(&inv, large).await;
        assert!(
            matches!(&again, Err(Error::Failed { failure, .. }) if failure.kind.took_effect()),
            "{store}: {again:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{store}: run once");
        assert_eq!(shop.reserved().await, 1, "{store}: reserved once");
    }
}
