//! A transactional step whose every commit the store refused outright (a transaction conflict
//! on a hot item): nothing applied, so nothing is uncertain. The next delivery runs the step
//! again, under the default recovery too, and is never held for an operator. (Throttling is
//! not such a refusal: it may answer the SDK's retry of an attempt that applied.)

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use lambda_idempotency::Idempotency;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::faults::{FaultKind, FaultyStore, Primitive};

use crate::transactions::{Shop, place};

#[tokio::test]
async fn a_step_whose_every_commit_was_refused_runs_again_on_the_next_delivery() {
    for shop in Shop::both().await {
        for (n, kind) in [FaultKind::Contention].into_iter().enumerate() {
            let label = format!("{kind:?}, records in memory: {}", shop.in_memory());
            let faulty = FaultyStore::new(shop.store());
            // The default recovery: an uncertain step would be held for an operator.
            let idem = Idempotency::new(faulty.clone()).with_clock(shop.clock.clone());
            let order = format!("o-hot-{n}");
            let inv = invocation(&order, &serde_json::json!({"order": order}));
            let builds = AtomicUsize::new(0);
            let outage_ends = shop.clock.now() + Duration::from_secs(5);
            faulty.outage(
                &[Primitive::CommitSteps],
                kind,
                outage_ends,
                shop.clock.clone(),
            );

            idem.execute(&inv, |ctx| place(&shop, ctx, &order, &builds))
                .await
                .expect_err("every commit refused");
            assert!(!shop.has_order(&order).await, "{label}");

            shop.clock.advance(Duration::from_secs(6));
            let done = idem
                .execute(&inv, |ctx| place(&shop, ctx, &order, &builds))
                .await
                .unwrap_or_else(|err| panic!("{label}: run again, not held: {err:?}"));
            assert_eq!(done.value(), &format!("placed {order}"), "{label}");
            assert!(shop.has_order(&order).await, "{label}");
            let record = idem
                .store()
                .get(inv.key())
                .await
                .expect("get")
                .expect("record");
            assert_eq!(record.status, Status::Completed, "{label}");
        }
    }
}
