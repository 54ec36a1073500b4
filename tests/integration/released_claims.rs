//! An operator's release that lands between a redelivery's read and its takeover: the
//! takeover's condition fails and the store answers with the released record, whose retention
//! the release ended. That record answers nothing: the redelivery claims again and runs, as
//! the release meant, on both stores. (It used to answer the release's failure, which the
//! batch doors treat as permanent: a Kinesis record acknowledged, never run.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use lambda_idempotency::engine::Resolution;
use lambda_idempotency::reconcile::{BoxFuture, Recovery};
use lambda_idempotency::store::{Answer, AnyStore, Request, Store, TransactionalStore};
use lambda_idempotency::testing::conformance::{counted, crash_after_run, invocation, operator};
use lambda_idempotency::{Idempotency, OperationKey, StoreError};
use serde_json::{Value, json};

use super::backends::both;

/// Releases `key` through `operator_engine` (over the same store) just before the first
/// takeover it is sent reaches the store.
struct ReleasedFirst {
    inner: AnyStore,
    operator_engine: Idempotency,
    key: OperationKey,
    released: AtomicBool,
}

impl std::fmt::Debug for ReleasedFirst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleasedFirst").finish_non_exhaustive()
    }
}

impl Store for ReleasedFirst {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            if matches!(request, Request::TakeOver { .. })
                && !self.released.swap(true, Ordering::SeqCst)
            {
                let released = self
                    .operator_engine
                    .resolve::<Value>(&self.key, Resolution::Release, &operator())
                    .await
                    .expect("released");
                assert!(released, "the stuck claim is released");
            }
            self.inner.call(request).await
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner.transactional()
    }
}

#[tokio::test]
async fn a_release_that_lands_before_a_takeover_lets_the_redelivery_run() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let inv = invocation("released-meanwhile", &json!({"order": "o-31"}));
        let runs = Arc::new(AtomicUsize::new(0));
        crash_after_run(&idem, &inv, &runs).await;
        clock.advance(std::time::Duration::from_secs(3600));

        let racing = ReleasedFirst {
            inner: backend.store.clone(),
            operator_engine: idem.clone(),
            key: inv.key().clone(),
            released: AtomicBool::new(false),
        };
        let redelivery = Idempotency::new(racing)
            .with_clock(clock.clone())
            .with_recovery(Recovery::Rerun);
        let done = redelivery
            .execute(&inv, |_| counted(&runs, 7))
            .await
            .unwrap_or_else(|err| panic!("{name}: the redelivery runs: {err}"));
        assert!(!done.is_replay(), "{name}");
        assert_eq!(*done.value(), 7, "{name}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "{name}: the crashed run and this one"
        );
    }
}
