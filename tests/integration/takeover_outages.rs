//! A takeover whose write committed with its answer lost, its retries then failing for the rest
//! of its patience (a throttling burst), ran nothing. When the attempt it took over had given
//! its claim back knowingly (its steps are all it did), it hands that give-back's mark on, so
//! that the next delivery continues from the steps as this one would have, instead of reading
//! an attempt that crashed and holding the operation for an operator. So does one whose task
//! is cancelled as its takeover commits (a timeout around the handler's service). On both
//! stores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency, Origin};
use serde_json::json;

use crate::backends::both;

/// How attempt 2 ends before its handler runs, its takeover committed.
#[derive(Debug, Clone, Copy)]
enum Lost {
    /// The takeover's answer lost, every retry throttled.
    ToAnOutage,
    /// The task cancelled as the takeover commits.
    ToACancellation,
}

#[tokio::test]
async fn a_takeover_lost_to_an_outage_hands_the_give_back_on() {
    a_lost_takeover_hands_the_give_back_on(Lost::ToAnOutage).await;
}

#[tokio::test]
async fn a_takeover_cancelled_as_it_commits_hands_the_give_back_on() {
    a_lost_takeover_hands_the_give_back_on(Lost::ToACancellation).await;
}

async fn a_lost_takeover_hands_the_give_back_on(lost: Lost) {
    for backend in both().await {
        let name = backend.name;
        let faulty = FaultyStore::new(backend.store.clone());
        let idem =
            Idempotency::new(AnyStore::new(faulty.clone())).with_clock(backend.clock.clone());
        let inv = invocation("takeover-outage", &json!({"order": "o-1"}));
        let (runs, charges) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let handler = |ctx: ExecutionContext| {
            let (runs, charges) = (&runs, &charges);
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                let charge = ctx
                    .step("charge")
                    .run(|_key| async move {
                        charges.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(7_u32)
                    })
                    .await?;
                match run {
                    0 => Err::<u32, BoxError>("the receipt service timed out".into()),
                    _ => Ok(charge),
                }
            }
        };

        // Attempt 1 charges, then fails retryably: its claim is given back with its step.
        idem.execute(&inv, handler).await.expect_err("retryable");
        let given_back = backend
            .store
            .get(inv.key())
            .await
            .expect("read")
            .expect("kept");
        assert!(
            given_back
                .steps
                .last()
                .is_some_and(|mark| mark.marks_given_back()),
            "{name}: given back"
        );
        backend.clock.advance(Duration::from_secs(1));

        // Attempt 2's takeover commits, and attempt 2 ends before its handler runs.
        match lost {
            Lost::ToAnOutage => {
                faulty.inject(Primitive::TakeOver, Fault::FailAfter(FaultKind::Throttled));
                let outage_ends = backend.clock.now() + Duration::from_secs(600);
                faulty.outage(
                    &[Primitive::TakeOver],
                    FaultKind::Throttled,
                    outage_ends,
                    backend.clock.clone(),
                );
                let err = idem
                    .execute(&inv, handler)
                    .await
                    .expect_err("the store failed");
                assert!(matches!(err, Error::Store(_)), "{name}: {err:?}");
            }
            Lost::ToACancellation => {
                faulty.inject(Primitive::TakeOver, Fault::CancelAfter);
                let cut = faulty.cancellable(idem.execute(&inv, handler)).await;
                assert!(cut.is_none(), "{name}: cancelled");
            }
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: attempt 2 ran nothing"
        );
        // A cancelled task's give-back runs in a task of its own: a bounded number of reads
        // lets it on.
        let mut taken = None;
        for _ in 0..10_000 {
            let record = backend
                .store
                .get(inv.key())
                .await
                .expect("read")
                .expect("kept");
            if record.steps.last().is_some_and(|mark| mark.attempt == 2) {
                taken = Some(record);
                break;
            }
            tokio::task::yield_now().await;
        }
        let taken = taken.expect("attempt 2 handed the give-back on");
        assert_eq!(taken.lease.attempt, 2, "{name}: the takeover committed");

        // The next delivery continues from the step: not held for an operator.
        backend.clock.advance(Duration::from_secs(601));
        let done = idem
            .execute(&inv, handler)
            .await
            .expect("continued from its steps");
        assert_eq!(*done.value(), 7, "{name}");
        assert_eq!(done.origin(), Origin::Executed { attempt: 3 }, "{name}");
        assert_eq!(charges.load(Ordering::SeqCst), 1, "{name}: charged once");
    }
}
