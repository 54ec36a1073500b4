//! EventBridge events keyed by a `detail` field, on both stores: the key is scoped to the
//! event's source and account, so that another account (or source) that may put events on
//! the bus and sends the same id neither suppresses nor answers this one's; and a redelivery
//! that 0.4 keyed by the field alone is not run again once the cut-over rule names it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::config::Config;
use lambda_idempotency::key::{Fingerprint, OperationKey};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, Operation, OperationScope};
use lambda_runtime::Context;
use serde_json::{Value, json};

use crate::backends::both;

fn placed(source: &str, account: &str) -> EventBridgeEvent<Value> {
    serde_json::from_value(
        json!({"version": "0", "id": "e-1", "detail-type": "OrderPlaced",
        "source": source, "account": account, "time": "2026-12-07T10:00:00Z",
        "region": "eu-west-1", "resources": [], "detail": {"order_id": "o-1", "amount": 5}}),
    )
    .expect("an EventBridge event")
}

fn scope() -> OperationScope {
    OperationScope::new("shipments", "notify").expect("scope")
}

#[tokio::test]
async fn another_account_or_source_sending_the_same_id_runs_its_own() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let operation = Operation::new(
            idem.clone(),
            scope(),
            sources::eventbridge_detail::<Value>("/order_id").expect("policy"),
        );
        let runs = AtomicUsize::new(0);
        for event in [
            placed("shop.orders", "111111111111"),
            placed("shop.orders", "222222222222"),
            placed("another.shop", "111111111111"),
            placed("shop.orders", "111111111111"),
        ] {
            let invocation = operation
                .invocation(&event, &Context::default())
                .expect("invocation");
            idem.execute(&invocation, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(json!({"notified": true}))
            })
            .await
            .unwrap_or_else(|err| panic!("{name}: {err:?}"));
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "{name}: one run per sender, the redelivery replayed"
        );
    }
}

#[tokio::test]
async fn a_redelivery_0_4_keyed_by_the_field_alone_is_not_run_again() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let cutover = clock.now() + Duration::from_secs(60);
        let config = Config::builder()
            .keyed_by_0_4_before(cutover)
            .build()
            .expect("config");
        let v0_4 = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let v0_5 = Idempotency::new(backend.store)
            .with_clock(clock.clone())
            .with_config(config);
        let event = placed("shop.orders", "111111111111");
        // 0.4 keyed the event by `order_id` alone, fingerprinted its detail, named no rule.
        let by_0_4 = Fingerprint::of(&event.detail).expect("fingerprint");
        let recorded_by_0_4 = Invocation::new(
            OperationKey::derive(&scope(), None, &json!("o-1")).expect("key"),
            Fingerprint::from_stored(by_0_4.as_str()),
            Duration::from_secs(60),
        );
        let runs = AtomicUsize::new(0);
        v0_4.execute(&recorded_by_0_4, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(json!({"notified": true}))
        })
        .await
        .expect("0.4's run");
        clock.advance(Duration::from_secs(120));

        let operation = Operation::new(
            v0_5.clone(),
            scope(),
            sources::eventbridge_detail::<Value>("/order_id").expect("policy"),
        );
        let invocation = operation
            .invocation(&event, &Context::default())
            .expect("invocation");
        assert_ne!(invocation.key(), recorded_by_0_4.key(), "{name}: a new key");
        let again = v0_5
            .execute(&invocation, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(json!({"notified": true}))
            })
            .await;
        assert!(
            matches!(again, Err(Error::KeyExpiredConflict { .. })),
            "{name}: answered by 0.4's record's state: {again:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: not run again");
    }
}
