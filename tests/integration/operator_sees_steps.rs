//! An operator resolves a stuck claim as it saw it: when its holder, its lease run out but its
//! step still in flight, records that step between the operator's read and the operator's
//! write, the resolution changes nothing (a release would have wiped the step and let the next
//! delivery repeat its effect), on both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::engine::Resolution;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::record::{RetainedFailure, Status, StepRecord};
use lambda_idempotency::store::{
    Answer, AnyStore, Fence, Guard, Request, Store, StoreExt, Target, TransactionalStore,
};
use lambda_idempotency::testing::conformance::{crash_after_run, invocation, operator};
use lambda_idempotency::{Idempotency, StoreError};
use serde_json::{Value, json};

use super::backends::both;

/// Lets the stuck holder record a step just before the operator's write reaches the store.
struct HolderWritesFirst {
    inner: AnyStore,
    wrote: AtomicBool,
}

impl std::fmt::Debug for HolderWritesFirst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HolderWritesFirst").finish_non_exhaustive()
    }
}

impl HolderWritesFirst {
    /// The holder's late write: its step's intent, fenced on its own (expired) lease token.
    async fn holder_records_a_step(&self, request: &Request<'_>) {
        let key = match request {
            Request::ReleaseByOperator {
                seen: Some(seen), ..
            } => &seen.key,
            Request::Settle { target, .. } if matches!(target.guard, Guard::Expired { .. }) => {
                target.key
            }
            _ => return,
        };
        if self.wrote.swap(true, Ordering::SeqCst) {
            return;
        }
        let record = self
            .inner
            .get(key)
            .await
            .expect("read")
            .expect("the stuck claim");
        let mut steps = record.steps.clone();
        steps.push(StepRecord::intent("charge", record.lease.attempt));
        let target = Target {
            key,
            identity: None,
            guard: Guard::Lease(&record.lease.token),
        };
        let fence = self
            .inner
            .record_steps(target, &steps)
            .await
            .expect("recorded");
        assert_eq!(
            fence,
            Fence::Held,
            "a lease run out still fences its own holder's step"
        );
    }
}

impl Store for HolderWritesFirst {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            self.holder_records_a_step(&request).await;
            self.inner.call(request).await
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner.transactional()
    }
}

#[tokio::test]
async fn a_step_recorded_after_the_operator_looked_fails_the_resolution() {
    let resolutions = [
        ("release", Resolution::Release),
        ("completed", Resolution::Completed(json!({"charged": true}))),
        (
            "failed",
            Resolution::Failed(RetainedFailure {
                kind: "refunded_by_hand".into(),
                message: "refunded".into(),
            }),
        ),
    ];
    // The holder crashed before any step (no step count stored), or after one (a count).
    for ((what, resolution), earlier_steps) in resolutions
        .into_iter()
        .flat_map(|resolution| [(resolution.clone(), 0), (resolution, 1)])
    {
        for backend in both().await {
            let name = format!("{} {what} after {earlier_steps} steps", backend.name);
            let clock = backend.clock.clone();
            let idem = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
            let material = format!("stepped-{what}-{earlier_steps}");
            let inv = invocation(&material, &json!({"order": "o-41"}));
            let runs = Arc::new(AtomicUsize::new(0));
            let stuck = crash_after_run(&idem, &inv, &runs).await;
            if earlier_steps > 0 {
                let target = Target {
                    key: inv.key(),
                    identity: None,
                    guard: Guard::Lease(&stuck.lease.token),
                };
                let reserve = [StepRecord::intent("reserve", stuck.lease.attempt)];
                let fence = backend.store.record_steps(target, &reserve).await;
                assert_eq!(fence.expect("recorded"), Fence::Held, "{name}");
            }
            clock.advance(Duration::from_secs(3600));

            let racing = HolderWritesFirst {
                inner: backend.store.clone(),
                wrote: AtomicBool::new(false),
            };
            let operator_engine = Idempotency::new(racing).with_clock(clock.clone());
            let resolved = operator_engine
                .resolve::<Value>(inv.key(), resolution.clone(), &operator())
                .await
                .unwrap_or_else(|err| panic!("{name}: {err}"));
            assert!(
                !resolved,
                "{name}: the record changed after the operator looked"
            );

            let record = backend.store.get(inv.key()).await.expect("read");
            let record = record.unwrap_or_else(|| panic!("{name}: the claim stands"));
            assert_eq!(record.status, Status::InProgress, "{name}");
            let names: Vec<&str> = record.steps.iter().map(|step| step.name.as_str()).collect();
            let expected: &[&str] = match earlier_steps {
                0 => &["charge"],
                _ => &["reserve", "charge"],
            };
            assert_eq!(names, expected, "{name}: the holder's steps stand");
        }
    }
}
