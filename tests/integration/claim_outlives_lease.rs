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
use lambda_idempotency::testing::conformance::{LEASE, crash_after_claim, invocation};
use lambda_idempotency::{Error, ExecutionContext, Idempotency, StoreError};

use super::backends::both;

/// Answers the first claim (or, `takeover`, the first takeover) only after the lease it wrote
/// ran out.
#[derive(Debug)]
struct SlowFirstClaim {
    inner: AnyStore,
    clock: ManualClock,
    takeover: bool,
    claims: AtomicUsize,
}

impl Store for SlowFirstClaim {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            let slowed = match self.takeover {
                false => matches!(request, Request::Claim { .. }),
                true => matches!(request, Request::TakeOver { .. }),
            };
            let first = slowed && self.claims.fetch_add(1, Ordering::SeqCst) == 0;
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

/// A handler answering 7, its runs counted in `runs`.
fn counting(
    runs: &Arc<AtomicUsize>,
) -> impl FnOnce(ExecutionContext) -> std::future::Ready<Result<u32, std::io::Error>> {
    let runs = Arc::clone(runs);
    move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(7))
    }
}

#[tokio::test]
async fn a_claim_answered_after_its_lease_ran_out_runs_nothing_and_is_given_back() {
    for (backend, owned) in both()
        .await
        .into_iter()
        .zip([false, true])
        .chain(both().await.into_iter().zip([true, false]))
    {
        let name = format!("{} (owned: {owned})", backend.name);
        let store = SlowFirstClaim {
            inner: backend.store.clone(),
            clock: backend.clock.clone(),
            takeover: false,
            claims: AtomicUsize::new(0),
        };
        // Rerun: a takeover of a lease that ran out would run the handler again beside it.
        let idem = Idempotency::new(store)
            .with_clock(backend.clock.clone())
            .with_recovery(Recovery::Rerun);
        let inv = invocation("slow-claim", &serde_json::json!({"order": "o-late"}));
        // An owner's fresh claim too: nothing ran under it, nothing of it is kept.
        let inv = match owned {
            true => inv.with_owner("arn:aws:lambda:eu-west-1:111122223333:function:f:durable/e-1"),
            false => inv,
        };
        let runs = Arc::new(AtomicUsize::new(0));
        let run = || counting(&runs);

        let late = idem.execute(&inv, run()).await;
        assert!(
            matches!(late, Err(Error::LeaseLost { attempt: 1, .. })),
            "{name}: {late:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not started");
        // The guard gives the claim back as it drops, on a task of its own.
        let mut given_back = false;
        for _ in 0..500 {
            let left = backend.store.get(inv.key()).await.expect("read");
            given_back = left.is_none_or(|record| record.counts_as_absent(backend.clock.now()));
            if given_back {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(given_back, "{name}: given back whole");

        let next = idem.execute(&inv, run()).await.expect("the next delivery");
        assert_eq!(next.into_value(), 7, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}

/// The same for a takeover of a crashed attempt: not run under, its lease cut short, and the
/// next delivery takes over and runs once.
#[tokio::test]
async fn a_takeover_answered_after_its_lease_ran_out_runs_nothing() {
    for backend in both().await {
        let name = backend.name;
        let store = SlowFirstClaim {
            inner: backend.store.clone(),
            clock: backend.clock.clone(),
            takeover: true,
            claims: AtomicUsize::new(0),
        };
        let idem = Idempotency::new(store)
            .with_clock(backend.clock.clone())
            .with_recovery(Recovery::Rerun);
        let inv = invocation("slow-takeover", &serde_json::json!({"order": "o-late"}));
        crash_after_claim(&idem, &inv).await;
        backend.clock.advance(LEASE + Duration::from_secs(1));
        let runs = Arc::new(AtomicUsize::new(0));
        let run = || counting(&runs);

        let late = idem.execute(&inv, run()).await;
        assert!(
            matches!(late, Err(Error::LeaseLost { attempt: 2, .. })),
            "{name}: {late:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: not started");

        // Past the given-back lease's grace, the next delivery takes over and runs once.
        let mut next = None;
        for _ in 0..500 {
            backend.clock.advance(Duration::from_secs(10));
            match idem.execute(&inv, run()).await {
                Err(Error::AlreadyInProgress { .. }) => tokio::task::yield_now().await,
                answer => {
                    next = Some(answer);
                    break;
                }
            }
        }
        let next = next.expect("taken over").expect("the next delivery");
        assert_eq!(next.into_value(), 7, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: run once");
    }
}
