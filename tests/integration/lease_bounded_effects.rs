//! An effect is never started where it could land after its lease's end: a takeover after the
//! lease would check the step before the effect lands, find nothing and run it again. Such a
//! step is not started, its intent is withdrawn and the claim given back at once, so that the
//! next delivery runs it once under a fresh lease. On both stores, with an injected clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::reconcile::{BoxFuture, Recovery};
use lambda_idempotency::store::{Answer, AnyStore, Request, Store, TransactionalStore};
use lambda_idempotency::testing::conformance::{LEASE, invocation};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency, Invocation, StoreError};

use super::backends::both;
use super::late_effects::{Provider, attempt_after};

/// How long after it is sent a charge lands downstream, and the step's declared timeout.
const LANDS_AFTER: Duration = Duration::from_secs(8);
const EFFECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One attempt whose handler starts its charge `into_lease` after its claim; the charge's
/// request times out on our side while the provider lands it [`LANDS_AFTER`] it was sent.
async fn attempt(
    idem: &Idempotency,
    inv: &Invocation,
    provider: &Arc<Provider>,
    clock: &ManualClock,
    into_lease: Duration,
) -> Result<String, Error> {
    attempt_after(idem, inv, provider, clock, Some(EFFECT_TIMEOUT), into_lease).await
}

#[tokio::test]
async fn an_effect_that_could_outlast_the_lease_is_not_started_and_runs_once_later() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        // The default recovery: a takeover of a crashed attempt would be held, so the
        // refusal must leave nothing that reads as one.
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let inv = invocation("late-in-lease", &serde_json::json!({"order": "o-late"}));
        let provider = Arc::new(Provider::landing_after(LANDS_AFTER));

        // 25 s into a 30 s lease a charge declared to land within 10 s (plus 5 s of skew) could
        // land after a takeover at 30 s checked it: it is not sent.
        let late = attempt(
            &idem,
            &inv,
            &provider,
            &clock,
            LEASE - Duration::from_secs(5),
        )
        .await;
        assert!(
            matches!(late, Err(Error::LeaseLost { attempt: 1, .. })),
            "{name}: the step is not started, nothing recorded, the claim released: {late:?}"
        );
        assert_eq!(
            provider.sends.load(Ordering::SeqCst),
            0,
            "{name}: nothing sent"
        );

        // The claim was released: the next delivery, with a whole lease, runs afresh and sends
        // the charge without asking a check (no intent was written); its request times out and
        // the claim is kept until the charge can have landed, where the check finds it.
        let next = attempt(&idem, &inv, &provider, &clock, Duration::ZERO).await;
        assert!(next.is_err(), "{name}: the charge timed out on our side");
        assert_eq!(provider.sends.load(Ordering::SeqCst), 1, "{name}");
        clock.advance(EFFECT_TIMEOUT + Duration::from_secs(6));
        let last = attempt(&idem, &inv, &provider, &clock, Duration::ZERO).await;
        assert_eq!(last.expect("checked, applied"), "ch_1", "{name}");
        assert_eq!(
            provider.sends.load(Ordering::SeqCst),
            1,
            "{name}: charged once"
        );
    }
}

#[tokio::test]
async fn an_effect_that_lands_inside_the_lease_starts_late_in_it() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let inv = invocation("inside-lease", &serde_json::json!({"order": "o-in"}));
        let provider = Arc::new(Provider::landing_after(LANDS_AFTER));

        // 15 s into the lease, 10 s plus 5 s of skew still end within it: the charge is sent.
        let first = attempt(&idem, &inv, &provider, &clock, Duration::from_secs(15)).await;
        assert!(first.is_err(), "{name}: the charge timed out on our side");
        assert_eq!(provider.sends.load(Ordering::SeqCst), 1, "{name}");
        clock.advance(LEASE);
        let later = attempt(&idem, &inv, &provider, &clock, Duration::ZERO).await;
        assert_eq!(later.expect("checked, applied"), "ch_1", "{name}");
        assert_eq!(provider.sends.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_step_refused_after_a_recorded_one_gives_the_claim_back_with_it() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let inv = invocation("after-a-step", &serde_json::json!({"order": "o-two"}));
        let (reserved, shipped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let run = |into_lease: Duration| {
            let (reserved, shipped, clock) =
                (Arc::clone(&reserved), Arc::clone(&shipped), clock.clone());
            idem.execute(&inv, move |ctx: ExecutionContext| async move {
                let stock: u32 = ctx
                    .step("reserve")
                    .run(|_key| async move {
                        reserved.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(7)
                    })
                    .await?;
                clock.advance(into_lease);
                ctx.step("ship")
                    .effect_timeout(EFFECT_TIMEOUT)
                    .run(|_key| async move {
                        shipped.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(stock)
                    })
                    .await
                    .map_err(BoxError::from)
            })
        };

        let late = run(LEASE - Duration::from_secs(5)).await;
        assert!(
            matches!(late, Err(Error::AlreadyInProgress { attempt: 1, retry_after, .. }) if retry_after.is_zero()),
            "{name}: given back with its recorded step, at once: {late:?}"
        );
        assert_eq!(shipped.load(Ordering::SeqCst), 0, "{name}: not shipped");

        // Under the default recovery the given-back steps replay: the reservation is not made
        // again, and the shipment runs once.
        clock.advance(Duration::from_millis(1));
        let next = run(Duration::ZERO).await.expect("taken over, continued");
        assert_eq!(next.value(), &7, "{name}");
        assert_eq!(reserved.load(Ordering::SeqCst), 1, "{name}: reserved once");
        assert_eq!(shipped.load(Ordering::SeqCst), 1, "{name}: shipped once");
    }
}

#[tokio::test]
async fn an_owned_claims_step_is_not_refused_its_lease_is_the_owners() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let inv = invocation("owned-late", &serde_json::json!({"order": "o-own"}))
            .with_owner("arn:aws:lambda:eu-west-1:111122223333:function:orders:durable/exec-1");
        let shipped = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&shipped);
        let ran = idem
            .execute(&inv, move |ctx: ExecutionContext| async move {
                clock.advance(LEASE - Duration::from_secs(5));
                ctx.step("ship")
                    .effect_timeout(EFFECT_TIMEOUT)
                    .run(|_key| async move {
                        counted.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(String::from("shipped"))
                    })
                    .await
                    .map_err(BoxError::from)
            })
            .await;
        // A durable execution replays its steps under its own token: a refusal would be
        // checkpointed and met on every replay.
        assert_eq!(ran.expect("ran").value(), "shipped", "{name}");
        assert_eq!(shipped.load(Ordering::SeqCst), 1, "{name}");
    }
}

/// A store whose first write of the steps (a step's intent) takes `slow` on the injected clock:
/// an outage the write's retries rode out.
#[derive(Debug)]
struct SlowFirstStepWrite {
    inner: AnyStore,
    clock: ManualClock,
    slow: Duration,
    writes: AtomicUsize,
}

impl Store for SlowFirstStepWrite {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            let first = matches!(request, Request::RecordSteps { .. })
                && self.writes.fetch_add(1, Ordering::SeqCst) == 0;
            let answer = self.inner.call(request).await;
            if first {
                self.clock.advance(self.slow);
            }
            answer
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }
}

#[tokio::test]
async fn an_intent_whose_write_used_the_lease_up_is_withdrawn_and_the_step_runs_later_unchecked() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let store = SlowFirstStepWrite {
            inner: backend.store,
            clock: clock.clone(),
            slow: LEASE - Duration::from_secs(10),
            writes: AtomicUsize::new(0),
        };
        let idem = Idempotency::new(store).with_clock(backend.clock);
        let inv = invocation("slow-intent", &serde_json::json!({"order": "o-slow"}));
        let (checks, shipped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let run = || {
            let (checks, shipped) = (Arc::clone(&checks), Arc::clone(&shipped));
            idem.execute(&inv, move |ctx: ExecutionContext| async move {
                ctx.step("ship")
                    .effect_timeout(EFFECT_TIMEOUT)
                    .checked_by(move |_key: String| async move {
                        checks.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(lambda_idempotency::effects::Checked::<String>::Unknown)
                    })
                    .run(|_key| async move {
                        shipped.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(String::from("shipped"))
                    })
                    .await
                    .map_err(BoxError::from)
            })
        };

        // The intent's write ended 20 s into a 30 s lease: the 10 s effect (plus 5 s of skew)
        // no longer fits, so it is not started and the intent is withdrawn with the release.
        let late = run().await;
        assert!(
            matches!(late, Err(Error::LeaseLost { attempt: 1, .. })),
            "{name}: not started, released: {late:?}"
        );
        assert_eq!(shipped.load(Ordering::SeqCst), 0, "{name}: not shipped");

        // Nothing reads as an uncertain step: the next delivery ships without a check (whose
        // Unknown would hold the operation).
        clock.advance(Duration::from_millis(1));
        let next = run().await.expect("run afresh");
        assert_eq!(next.value(), "shipped", "{name}");
        assert_eq!(shipped.load(Ordering::SeqCst), 1, "{name}: shipped once");
        assert_eq!(checks.load(Ordering::SeqCst), 0, "{name}: nothing to check");
    }
}
