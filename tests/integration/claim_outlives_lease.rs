//! A claim whose answer comes after its lease ran out (its tries took the lease, and an
//! invocation through the engine's own door has no deadline to cut them) is never run under:
//! another caller may take an expired lease over at once and run beside it. The handler is not
//! started, the claim is given back whole, and the next delivery runs the operation once. On
//! both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::store::{Answer, AnyStore, Request, Store, StoreExt, TransactionalStore};
use lambda_idempotency::testing::conformance::{LEASE, invocation};
use lambda_idempotency::{Error, Idempotency, StoreError};

use super::backends::both;

/// Answers the first claim only after the lease it wrote ran out.
#[derive(Debug)]
struct SlowFirstClaim {
    inner: AnyStore,
    clock: ManualClock,
    claims: AtomicUsize,
}

impl Store for SlowFirstClaim {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            let first = matches!(request, Request::Claim { .. })
                && self.claims.fetch_add(1, Ordering::SeqCst) == 0;
            let answer = self.inner.call(request).await;
            if first {
                self.clock.advance(LEASE + Duration::from_secs(1));
            }
            answer
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}

#[tokio::test]
async fn a_claim_answered_after_its_lease_ran_out_runs_nothing_and_is_given_back() {
    for backend in both().await {
        let name = backend.name;
        let store = SlowFirstClaim {
            inner: backend.store.clone(),
            clock: backend.clock.clone(),
            claims: AtomicUsize::new(0),
        };
        // Rerun: a takeover of a lease that ran out would run the handler again beside it.
        let idem = Idempotency::new(store)
            .with_clock(backend.clock.clone())
            .with_recovery(Recovery::Rerun);
        let inv = invocation("slow-claim", &serde_json::json!({"order": "o-late"}));
        let runs = Arc::new(AtomicUsize::new(0));
        let run = || {
            let runs = Arc::clone(&runs);
            move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(7_u32)
            }
        };

        let late = idem.execute(&inv, run()).await;
        assert!(
            matches!(late, Err(Error::LeaseLost { attempt: 1, .. })),
            "{name}: {late:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not started");
        // The guard gives the claim back as it drops (on a spawned task, or inline).
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let left = backend.store.get(inv.key()).await.expect("read");
        assert!(
            left.is_none_or(|record| record.counts_as_absent(backend.clock.now())),
            "{name}: given back whole"
        );

        let next = idem.execute(&inv, run()).await.expect("the next delivery");
        assert_eq!(next.into_value(), 7, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}
