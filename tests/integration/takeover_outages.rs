//! A takeover whose write committed with its answer lost, its retries then failing for the rest
//! of its patience (a throttling burst), ran nothing. When the attempt it took over had given
//! its claim back knowingly (its steps are all it did), it hands that give-back's mark on, so
//! that the next delivery continues from the steps as this one would have, instead of reading
//! an attempt that crashed and holding the operation for an operator. On both stores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency, Origin};
use serde_json::json;

use crate::backends::both;

#[tokio::test]
async fn a_takeover_lost_to_an_outage_hands_the_give_back_on() {
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

        // Attempt 2's takeover commits, its answer lost; every retry is throttled.
        faulty.inject(Primitive::TakeOver, Fault::FailAfter(FaultKind::Throttled));
        let outage_ends = backend.clock.now() + Duration::from_secs(600);
        faulty.outage(
            &[Primitive::TakeOver],
            FaultKind::Throttled,
            outage_ends,
            backend.clock.clone(),
        );
        let lost = idem
            .execute(&inv, handler)
            .await
            .expect_err("the store failed");
        assert!(matches!(lost, Error::Store(_)), "{name}: {lost:?}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: attempt 2 ran nothing"
        );
        let taken = backend
            .store
            .get(inv.key())
            .await
            .expect("read")
            .expect("kept");
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
