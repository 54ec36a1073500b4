//! A step cut off inside an attempt (a timeout around it drops its future mid-effect) while
//! the handler goes on: a transactional step whose commit applied without the step hearing so
//! is never committed again (not by a release that deletes its record, nor by a later step's
//! write over it), and no step runs after it in that attempt. On both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::effects::StepError;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::faults::{Fault, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, ExecutionContext};

use super::transactions::Shop;

/// One transactional step placing `order` against the stock's version as read, counting its
/// builds.
async fn place(
    shop: &Shop,
    ctx: &ExecutionContext,
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

/// What the handler does once its step was cut off.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// Gives up with a retryable error (nothing recorded, as the step saw it).
    GivesUp,
    /// Runs its next step.
    RunsTheNextStep,
}

#[tokio::test]
async fn a_transactional_step_cut_off_mid_commit_commits_once() {
    for then in [Then::GivesUp, Then::RunsTheNextStep] {
        for shop in Shop::both().await {
            a_transactional_step_cut_off_mid_commit_commits_once_on(shop, then).await;
        }
    }
}

async fn a_transactional_step_cut_off_mid_commit_commits_once_on(shop: Shop, then: Then) {
    let name = format!(
        "{then:?} ({})",
        if shop.in_memory() {
            "memory"
        } else {
            "dynamodb"
        }
    );
    let shop = Arc::new(shop);
    let faulty = FaultyStore::new(shop.store());
    let idem = shop.engine(faulty.clone());
    let inv = invocation("tx-cut-off", &serde_json::json!({"order": "o-9"}));
    let (builds, notified) = (&AtomicUsize::new(0), &AtomicUsize::new(0));
    let (shop, faulty, name) = (&shop, &faulty, &name);
    // The commit applies; the step's future is dropped before its answer arrives.
    faulty.inject(Primitive::CommitSteps, Fault::CancelAfter);
    let first = idem
        .execute(&inv, |ctx| async move {
            let cut = faulty.cancellable(place(shop, &ctx, "o-9", builds)).await;
            assert!(cut.is_none(), "{name}: the step was cut off");
            if let Then::RunsTheNextStep = then {
                let next = ctx
                    .step("notify")
                    .run(|_key| async {
                        notified.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(())
                    })
                    .await;
                assert!(
                    matches!(next, Err(StepError::Stopped { .. })),
                    "{name}: no step runs after one whose commit is unknown: {next:?}"
                );
            }
            Err::<String, BoxError>("the order timed out".into())
        })
        .await;
    assert!(
        matches!(first, Err(Error::Store(_))),
        "{name}: the attempt stopped on the unknown commit: {first:?}"
    );
    assert_eq!(shop.reserved().await, 1, "{name}: the commit applied");

    shop.clock.advance(Duration::from_secs(1));
    let again = idem
        .execute(&inv, |ctx| async move {
            let placed = place(shop, &ctx, "o-9", builds).await?;
            ctx.step("notify")
                .run(|_key| async {
                    notified.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(())
                })
                .await?;
            Ok::<_, BoxError>(placed)
        })
        .await
        .expect("the next delivery continues from the committed step");
    assert_eq!(again.value(), "placed o-9", "{name}");
    assert_eq!(
        builds.load(Ordering::SeqCst),
        1,
        "{name}: the committed step replayed, not built again"
    );
    assert_eq!(shop.reserved().await, 1, "{name}: committed once");
    assert_eq!(notified.load(Ordering::SeqCst), 1, "{name}: notified once");
}
