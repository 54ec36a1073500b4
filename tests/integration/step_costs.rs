//! What steps cost in requests, as the effects guide's cost table states it, counted on the
//! embedded DynamoDB server: a plain step adds one fenced `UpdateItem` (its intent; its result
//! rides on the next write), a replayed step adds none, and a transactional step adds one
//! `TransactWriteItems` and no intent write.

use lambda_idempotency::BoxError;
use lambda_idempotency::testing::conformance::invocation;
use serde_json::json;

use super::transactions::Shop;

/// The requests of one execution of `handler` under `key`, by operation name.
async fn requests_of<F, Fut>(shop: &Shop, key: &str, handler: F) -> Vec<String>
where
    F: FnOnce(lambda_idempotency::ExecutionContext) -> Fut,
    Fut: Future<Output = Result<String, BoxError>>,
{
    let idem = shop.engine(shop.db.store());
    let from = shop.db.requests.count();
    idem.execute(&invocation(key, &json!({"key": key})), handler)
        .await
        .expect("runs");
    shop.db.requests.since(from)
}

#[tokio::test]
async fn a_plain_step_costs_one_update_and_a_transactional_step_one_transaction() {
    let shop = Shop::open().await;
    let bare = requests_of(&shop, "bare", |_| async { Ok("done".to_owned()) }).await;
    let stepped = requests_of(&shop, "stepped", |ctx| async move {
        Ok(ctx
            .step("email")
            .run(|_key| async { Ok::<_, BoxError>("sent".to_owned()) })
            .await?)
    })
    .await;
    let two = requests_of(&shop, "two-steps", |ctx| async move {
        ctx.step("first")
            .run(|_key| async { Ok::<_, BoxError>(1) })
            .await?;
        ctx.step("second")
            .run(|_key| async { Ok::<_, BoxError>(2) })
            .await?;
        Ok("both".to_owned())
    })
    .await;
    let transactional = requests_of(&shop, "transactional", |ctx| {
        let shop = &shop;
        async move {
            let seen = shop.stock_item("version").await;
            Ok(ctx
                .step("place")
                .transact(|_key| async move { Ok::<_, BoxError>(shop.place("o-cost", seen)) })
                .await?)
        }
    })
    .await;

    let count = |requests: &[String], operation: &str| {
        requests.iter().filter(|sent| *sent == operation).count()
    };
    assert_eq!(
        count(&stepped, "UpdateItem"),
        count(&bare, "UpdateItem") + 1,
        "one fenced UpdateItem per step: {bare:?} / {stepped:?}"
    );
    assert_eq!(
        count(&two, "UpdateItem"),
        count(&bare, "UpdateItem") + 2,
        "{two:?}"
    );
    assert_eq!(stepped.len(), bare.len() + 1, "nothing else: {stepped:?}");
    // The transactional step: its own TransactWriteItems, no intent write; the stock read is
    // the handler's.
    assert_eq!(
        count(&transactional, "TransactWriteItems"),
        count(&bare, "TransactWriteItems") + 1,
        "{transactional:?}"
    );
    assert_eq!(
        count(&transactional, "UpdateItem"),
        count(&bare, "UpdateItem"),
        "no intent write: {transactional:?}"
    );
}

#[tokio::test]
async fn a_replayed_step_costs_nothing() {
    let shop = Shop::open().await;
    let idem = shop.engine(shop.db.store());
    let inv = invocation("replayed-step", &json!({}));
    // The first attempt records its step's result, then fails retryably: its claim is given
    // back with the step, which the next delivery replays.
    let failed = idem
        .execute(&inv, |ctx| async move {
            ctx.step("email")
                .run(|_key| async { Ok::<_, BoxError>("sent".to_owned()) })
                .await?;
            ctx.step("charge")
                .run(|_key| async { Ok::<_, BoxError>("charged".to_owned()) })
                .await?;
            Err::<String, BoxError>("the ledger is down".into())
        })
        .await;
    assert!(failed.is_err());
    shop.clock
        .advance(std::time::Duration::from_secs(24 * 3600));
    let from = shop.db.requests.count();
    let replayed = idem
        .execute(&inv, |ctx| async move {
            ctx.step("email")
                .run(|_key| async { Ok::<_, BoxError>("sent again".to_owned()) })
                .await?;
            Ok::<_, BoxError>(
                ctx.step("charge")
                    .run(|_key| async { Ok::<_, BoxError>("charged again".to_owned()) })
                    .await?,
            )
        })
        .await
        .expect("replayed");
    assert_eq!(
        replayed.value(),
        "charged",
        "the recorded result, not a second run"
    );
    let replay = shop.db.requests.since(from);
    // The takeover (read, take over) and the completion: no step write.
    let updates = replay.iter().filter(|sent| *sent == "UpdateItem").count();
    assert_eq!(
        updates, 2,
        "the takeover and the completion only: {replay:?}"
    );
}
