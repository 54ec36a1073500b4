//! The effects guide's table of event ids, the rows where the execution is new: after an
//! operator's release, and after TTL deleted a record that never settled (no business
//! identity), the transactional step runs again as new and its events are new items under new
//! ids; the first execution's items stay as they were.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::effects::{Destination, Outbox, OutboxEvent, Transaction};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, Operator, Resolution};
use tokio::sync::oneshot;

use super::transactions::{Shop, outbox_items};

/// The step: an order line and its event, committed together; a new line per run.
async fn run_step(idem: &Idempotency, inv: &Invocation, shop: &Shop, outbox: &Outbox, run: u32) {
    idem.execute(inv, |ctx| async move {
        Ok::<_, BoxError>(
            ctx.step("place")
                .transact(|_key| async move {
                    let line = Put::builder()
                        .table_name(&shop.orders)
                        .item("pk", AttributeValue::S(format!("line-{run}")))
                        .build()?;
                    let sqs = Destination::Sqs {
                        queue_url: "http://127.0.0.1/000000000000/orders".into(),
                    };
                    let event =
                        OutboxEvent::new("order-placed", sqs, &serde_json::json!({"run": run}))?;
                    Ok::<_, BoxError>(Transaction::new(run).put(line).publish(outbox, event))
                })
                .await?,
        )
    })
    .await
    .expect("the step runs");
}

/// Commits the step and crashes before settling: the record stays IN_PROGRESS.
async fn commit_and_crash(idem: &Idempotency, inv: &Invocation, shop: &Arc<Shop>, outbox: &Outbox) {
    let (committed_tx, committed_rx) = oneshot::channel();
    let worker = tokio::spawn({
        let (idem, inv, shop, outbox) =
            (idem.clone(), inv.clone(), Arc::clone(shop), outbox.clone());
        async move {
            idem.execute(&inv, |ctx| async move {
                ctx.step("place")
                    .transact(|_key| async {
                        let sqs = Destination::Sqs {
                            queue_url: "http://127.0.0.1/000000000000/orders".into(),
                        };
                        let event =
                            OutboxEvent::new("order-placed", sqs, &serde_json::json!({"run": 0}))?;
                        let line = Put::builder()
                            .table_name(&shop.orders)
                            .item("pk", AttributeValue::S("line-0".into()))
                            .build()?;
                        Ok::<_, BoxError>(Transaction::new(0_u32).put(line).publish(&outbox, event))
                    })
                    .await?;
                let _ = committed_tx.send(());
                std::future::pending::<Result<u32, BoxError>>().await
            })
            .await
        }
    });
    committed_rx.await.expect("committed");
    worker.abort();
    let _ = worker.await;
}

fn ids(items: &[std::collections::HashMap<String, AttributeValue>]) -> Vec<String> {
    let mut ids: Vec<String> = items
        .iter()
        .filter_map(|item| item.get("pk").and_then(|pk| pk.as_s().ok()).cloned())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn after_an_operators_release_the_step_runs_again_under_new_ids() {
    let shop = Arc::new(Shop::open().await);
    let idem = shop.engine(shop.db.store());
    let outbox = Outbox::new(&shop.outbox);
    let inv = invocation("ids-released", &serde_json::json!({"order": "o-20"}));
    commit_and_crash(&idem, &inv, &shop, &outbox).await;
    let first = ids(&outbox_items(&shop).await);
    assert_eq!(first.len(), 1);

    shop.clock.advance(Duration::from_secs(3600));
    let operator = Operator::new("arn:aws:iam::1:user/alice").expect("operator");
    let released = idem
        .resolve::<u32>(inv.key(), Resolution::Release, &operator)
        .await
        .expect("resolved");
    assert!(released);
    run_step(&idem, &inv, &shop, &outbox, 1).await;

    let after = ids(&outbox_items(&shop).await);
    assert_eq!(
        after.len(),
        2,
        "the second run's event is a new item: {after:?}"
    );
    assert!(first.iter().all(|id| after.contains(id)), "the first stays");
}

#[tokio::test]
async fn after_ttl_deleted_an_unsettled_record_the_step_runs_again_under_new_ids() {
    let shop = Arc::new(Shop::open().await);
    let idem = shop.engine(shop.db.store());
    let outbox = Outbox::new(&shop.outbox);
    let inv = invocation("ids-expired", &serde_json::json!({"order": "o-21"}));
    commit_and_crash(&idem, &inv, &shop, &outbox).await;
    let first = ids(&outbox_items(&shop).await);

    // Past its lease and its retention: TTL deletes the unsettled record (not the outbox's
    // items, which live seven days).
    shop.clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert!(shop.db.sweep().await >= 1, "TTL deleted the record");
    run_step(&idem, &inv, &shop, &outbox, 1).await;

    let after = ids(&outbox_items(&shop).await);
    assert_eq!(after.len(), 2, "a new execution, a new item: {after:?}");
    assert!(first.iter().all(|id| after.contains(id)), "the first stays");
}

/// A name holding the id's separator could give two events of one execution one id (step
/// `a#event=b` publishing `c`, step `a` publishing `b#event=c`): refused at commit.
#[test]
fn an_event_name_with_the_ids_separator_is_refused() {
    let queue = || Destination::Sqs {
        queue_url: "https://sqs.us-east-1.amazonaws.com/1/orders".into(),
    };
    let refused = OutboxEvent::new("b#event=c", queue(), &"{}");
    assert!(
        matches!(refused, Err(Error::InvalidEvent { .. })),
        "{refused:?}"
    );
    assert!(OutboxEvent::new("order.placed", queue(), &"{}").is_ok());
}
