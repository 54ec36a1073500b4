//! An effect is never started where it could land after its lease's end: a takeover after the
//! lease would check the step before the effect lands, find nothing and run it again. Such a
//! step is not started, its intent is withdrawn and the claim given back at once, so that the
//! next delivery runs it once under a fresh lease. On both stores, with an injected clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::effects::Checked;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::conformance::{LEASE, invocation};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency, Invocation};

use super::backends::both;

/// How long after it is sent a charge lands downstream, and the step's declared timeout.
const LANDS_AFTER: Duration = Duration::from_secs(8);
const EFFECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A payment provider whose charges land [`LANDS_AFTER`] they are sent.
#[derive(Default)]
struct Provider {
    sent: std::sync::Mutex<Vec<SystemTime>>,
    sends: AtomicUsize,
}

impl Provider {
    fn landed(&self, now: SystemTime) -> usize {
        let sent = self.sent.lock().expect("charges");
        sent.iter().filter(|lands| **lands <= now).count()
    }
}

/// One attempt whose handler starts its charge `into_lease` after its claim; the charge's
/// request times out on our side while the provider lands it later.
async fn attempt(
    idem: &Idempotency,
    inv: &Invocation,
    provider: &Arc<Provider>,
    clock: &ManualClock,
    into_lease: Duration,
) -> Result<String, Error> {
    idem.execute(inv, |ctx: ExecutionContext| {
        let (provider, clock) = (Arc::clone(provider), clock.clone());
        async move {
            clock.advance(into_lease);
            let (checked, check_clock) = (Arc::clone(&provider), clock.clone());
            let charged = ctx
                .step("charge")
                .effect_timeout(EFFECT_TIMEOUT)
                .checked_by(move |_key: String| async move {
                    Ok::<_, BoxError>(match checked.landed(check_clock.now()) {
                        0 => Checked::NotApplied,
                        _ => Checked::Applied(String::from("ch_1")),
                    })
                })
                .run(|_key| async move {
                    provider.sends.fetch_add(1, Ordering::SeqCst);
                    provider
                        .sent
                        .lock()
                        .expect("charges")
                        .push(clock.now() + LANDS_AFTER);
                    Err::<String, BoxError>("the provider timed out".into())
                })
                .await?;
            Ok::<_, BoxError>(charged)
        }
    })
    .await
    .map(|execution| execution.value().clone())
}

#[tokio::test]
async fn an_effect_that_could_outlast_the_lease_is_not_started_and_runs_once_later() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let inv = invocation("late-in-lease", &serde_json::json!({"order": "o-late"}));
        let provider = Arc::new(Provider::default());

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
            matches!(late, Err(Error::AlreadyInProgress { retry_after, .. }) if retry_after.is_zero()),
            "{name}: the step is not started and the caller may retry at once: {late:?}"
        );
        assert_eq!(
            provider.sends.load(Ordering::SeqCst),
            0,
            "{name}: nothing sent"
        );

        // The claim was given back at once: the next delivery, with a whole lease, sends the
        // charge without asking a check (the intent was withdrawn); its request times out and
        // the claim is kept until the charge can have landed, where the check finds it.
        clock.advance(Duration::from_millis(1));
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
        let provider = Arc::new(Provider::default());

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
