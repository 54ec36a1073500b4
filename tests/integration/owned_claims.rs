//! Owned claims at their edges ([`Invocation::with_owner`], what a durable execution's
//! invocation is): a first claim whose answer is lost is given back whole, a waiting owner keeps
//! the lease it asked for, and a sibling run of the owner in the same process waits for the
//! first as any duplicate does. On both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Idempotency, Invocation, KeyPolicy, Operation, OperationScope};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::backends::both;
use super::held_runs::HeldRun;
use super::waiting::PauseSignal;

const OWNER: &str =
    "arn:aws:lambda:us-east-1:123456789012:function:fulfil:$LATEST/durable-execution/a/1";
const OTHER_OWNER: &str =
    "arn:aws:lambda:us-east-1:123456789012:function:fulfil:$LATEST/durable-execution/b/1";

fn operation(engine: Idempotency) -> Operation<Value> {
    Operation::new(
        engine,
        OperationScope::new("owned", "fulfil").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("policy"),
    )
}

fn invocation(operation: &Operation<Value>, order: &Value) -> Invocation {
    operation
        .invocation(order, &lambda_runtime::Context::default())
        .expect("invocation")
}

#[tokio::test]
async fn an_owners_first_claim_with_its_answer_lost_is_given_back_whole() {
    // The claim commits, its answer is lost, and every retry fails: nothing ran under it, so it
    // is released, and the next execution runs at once (not held for the owner's long lease).
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        let fulfil = operation(
            Idempotency::new(AnyStore::new(faulty.clone())).with_clock(backend.clock.clone()),
        );
        let order = json!({"order_id": "o-1"});
        faulty.inject(Primitive::Claim, Fault::FailAfter(FaultKind::Unavailable));
        let until = backend.clock.now() + Duration::from_secs(3600);
        faulty.outage(
            &[Primitive::Claim],
            FaultKind::Unavailable,
            until,
            backend.clock.clone(),
        );

        let runs = AtomicUsize::new(0);
        let failed = fulfil
            .engine()
            .execute(
                &invocation(&fulfil, &order)
                    .with_owner(OWNER)
                    .with_lease(Duration::from_secs(2 * 3600)),
                |_ctx| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(json!("by a"))
                },
            )
            .await;
        assert!(failed.is_err(), "{name}: {failed:?}");
        faulty.clear();
        let key = invocation(&fulfil, &order).key().clone();
        assert!(
            backend.store.get(&key).await.expect("read").is_none(),
            "{name}: the committed claim was given back"
        );

        let next = fulfil
            .engine()
            .execute(
                &invocation(&fulfil, &order).with_owner(OTHER_OWNER),
                |_ctx| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(json!("by b"))
                },
            )
            .await
            .expect("the next execution runs");
        assert_eq!(next.value(), &json!("by b"), "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn an_owner_that_waited_keeps_the_lease_it_asked_for() {
    // A crashed plain holder, then an owner that waits for it with a two-hour lease and a
    // ten-minute deadline: once the holder's lease runs out, the owner takes over under its
    // own two hours, not the deadline's ten minutes.
    for backend in both().await {
        let name = backend.name;
        let fulfil = operation(
            Idempotency::new(backend.store.clone())
                .with_clock(backend.clock.clone())
                .with_recovery(Recovery::Rerun),
        );
        let order = json!({"order_id": "o-2"});
        let crashed = {
            let (fulfil, invocation) = (fulfil.clone(), invocation(&fulfil, &order));
            tokio::spawn(async move {
                fulfil
                    .engine()
                    .execute(&invocation, |_ctx| async {
                        std::future::pending::<Result<Value, BoxError>>().await
                    })
                    .await
            })
        };
        tokio::task::yield_now().await;
        let key = invocation(&fulfil, &order).key().clone();
        while backend.store.get(&key).await.expect("read").is_none() {
            tokio::task::yield_now().await;
        }

        let asked = Duration::from_secs(2 * 3600);
        let now = backend.clock.now();
        let leases = Arc::new(std::sync::Mutex::new(Vec::new()));
        let owner = invocation(&fulfil, &order)
            .with_owner(OWNER)
            .with_lease(asked)
            .with_deadline(now + Duration::from_secs(600))
            .with_wait_for_result(Duration::from_secs(300));
        let (store, seen) = (backend.store.clone(), Arc::clone(&leases));
        let clock = backend.clock.clone();
        let ran = fulfil
            .engine()
            .execute(&owner, |_ctx| async move {
                let record = store.get(&key).await?.ok_or("no record")?;
                let left = record.lease.expires_at.duration_since(clock.now())?;
                seen.lock().expect("leases").push(left);
                Ok::<_, BoxError>(json!("by the owner"))
            })
            .await
            .expect("the owner took over");
        assert_eq!(ran.value(), &json!("by the owner"), "{name}");
        let left = leases.lock().expect("leases")[0];
        assert!(
            left > Duration::from_secs(3600),
            "{name}: the owner's lease after the wait is {left:?}, not about {asked:?}"
        );
        crashed.abort();
    }
}

#[tokio::test]
async fn a_sibling_run_that_waits_gets_the_first_runs_outcome() {
    // Two runs of one owner's operation in one process (durable branches share the ARN): the
    // second, waiting for results, waits for the first and replays its outcome.
    for backend in both().await {
        let name = backend.name;
        let (pauses_tx, mut pauses) = mpsc::unbounded_channel();
        let fulfil = operation(Idempotency::new(backend.store).with_clock(PauseSignal(pauses_tx)));
        let order = json!({"order_id": "o-3"});
        let first = HeldRun::start(
            fulfil.engine().clone(),
            invocation(&fulfil, &order).with_owner(OWNER),
            json!("first branch"),
        )
        .await;
        let runs = Arc::clone(&first.runs);
        let sibling = {
            let (fulfil, invocation) = (
                fulfil.clone(),
                invocation(&fulfil, &order)
                    .with_owner(OWNER)
                    .with_wait_for_result(Duration::from_secs(30)),
            );
            let runs = Arc::clone(&runs);
            tokio::spawn(async move {
                fulfil
                    .engine()
                    .execute(&invocation, |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(json!("second branch"))
                    })
                    .await
            })
        };
        // The sibling is waiting: the first ends.
        tokio::time::timeout(Duration::from_secs(10), pauses.recv())
            .await
            .expect("the sibling waits (it does not answer at once)")
            .expect("the sibling pauses");
        let first = first.finish().await.expect("the first run");
        let sibling = sibling
            .await
            .expect("joined")
            .expect("the sibling's answer");
        assert_eq!(first.value(), &json!("first branch"), "{name}");
        assert!(sibling.is_replay(), "{name}");
        assert_eq!(sibling.value(), &json!("first branch"), "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}
