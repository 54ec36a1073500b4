//! A step's effect that lands after the step gave up on it: a claim given back after such a
//! step is not taken over before the effect can have landed (its declared effect timeout, else
//! the lease), so the next attempt's check sees it and the effect runs once. On both stores,
//! with an injected clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::effects::Checked;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::testing::conformance::{LEASE, invocation};
use lambda_idempotency::{BoxError, Error, ExecutionContext, Idempotency, Invocation};

use super::backends::both;

/// A payment provider whose charge lands `delay` after it was sent, whatever the caller saw.
pub(super) struct Provider {
    /// When each charge sent lands, by the injected clock.
    sent: std::sync::Mutex<Vec<std::time::SystemTime>>,
    /// How many charges were sent.
    pub(super) sends: AtomicUsize,
    /// How long after it is sent a charge lands.
    delay: Duration,
}

impl Default for Provider {
    fn default() -> Self {
        Self::landing_after(Duration::from_secs(4))
    }
}

impl Provider {
    /// A provider whose charges land `delay` after they are sent.
    pub(super) fn landing_after(delay: Duration) -> Self {
        Self {
            sent: std::sync::Mutex::default(),
            sends: AtomicUsize::new(0),
            delay,
        }
    }

    /// How many charges have landed by `clock`'s now.
    fn landed(&self, clock: &ManualClock) -> usize {
        let now = clock.now();
        let sent = self.sent.lock().expect("charges");
        sent.iter().filter(|lands| **lands <= now).count()
    }
}

/// One attempt: the charge (declared to land within `timeout`, if any) times out on our side
/// while the provider lands it later; the handler gives up with a retryable error.
async fn attempt(
    idem: &Idempotency,
    inv: &Invocation,
    provider: &Arc<Provider>,
    clock: &ManualClock,
    timeout: Option<Duration>,
) -> Result<String, Error> {
    attempt_after(idem, inv, provider, clock, timeout, Duration::ZERO).await
}

/// [`attempt`], whose handler starts its charge `into_lease` after its claim.
pub(super) async fn attempt_after(
    idem: &Idempotency,
    inv: &Invocation,
    provider: &Arc<Provider>,
    clock: &ManualClock,
    timeout: Option<Duration>,
    into_lease: Duration,
) -> Result<String, Error> {
    idem.execute(inv, |ctx: ExecutionContext| {
        let (provider, clock) = (Arc::clone(provider), clock.clone());
        async move {
            clock.advance(into_lease);
            let checked = Arc::clone(&provider);
            let check_clock = clock.clone();
            let mut step = ctx.step("charge");
            if let Some(timeout) = timeout {
                step = step.effect_timeout(timeout);
            }
            let charged = step
                .checked_by(move |_key: String| async move {
                    Ok::<_, BoxError>(match checked.landed(&check_clock) {
                        0 => Checked::NotApplied,
                        _ => Checked::Applied(String::from("ch_1")),
                    })
                })
                .run(|_key| async move {
                    provider.sends.fetch_add(1, Ordering::SeqCst);
                    let lands = clock.now() + provider.delay;
                    provider.sent.lock().expect("charges").push(lands);
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
async fn an_effect_that_lands_inside_its_declared_timeout_runs_once() {
    for timeout in [Some(Duration::from_secs(10)), None] {
        for backend in both().await {
            let name = format!("{} (effect timeout {timeout:?})", backend.name);
            let clock = backend.clock.clone();
            let idem = Idempotency::new(backend.store)
                .with_clock(backend.clock)
                .with_recovery(Recovery::Steps);
            let inv = invocation("late-charge", &serde_json::json!({"order": "o-late"}));
            let provider = Arc::new(Provider::default());

            let first = attempt(&idem, &inv, &provider, &clock, timeout).await;
            assert!(first.is_err(), "{name}: the first attempt gave up");
            // An immediate redelivery: the charge has not landed yet, and must not be re-sent.
            clock.advance(Duration::from_secs(1));
            let early = attempt(&idem, &inv, &provider, &clock, timeout).await;
            assert!(
                matches!(early, Err(Error::AlreadyInProgress { .. })),
                "{name}: the claim is kept while the charge may land: {early:?}"
            );
            // The charge lands at 4 s; past the declared 10 s and the clocks' 5 s skew (or the
            // whole lease) the next delivery takes over, and its check finds it.
            clock.advance(Duration::from_secs(match timeout {
                Some(_) => 15,
                None => 120,
            }));
            let later = attempt(&idem, &inv, &provider, &clock, timeout).await;
            assert_eq!(later.expect("taken over, checked"), "ch_1", "{name}");
            assert_eq!(
                provider.sends.load(Ordering::SeqCst),
                1,
                "{name}: charged once"
            );
        }
    }
}

#[tokio::test]
async fn a_step_cancelled_mid_effect_keeps_the_claim_until_its_effect_can_have_landed() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let inv = invocation("cancelled-charge", &serde_json::json!({"order": "o-cut"}));
        let provider = Arc::new(Provider::default());
        let sender = Arc::clone(&provider);
        let sent_at = clock.clone();
        // The handler gives up on the charge once it is sent (as a timeout around it would:
        // the step is dropped mid-effect) and fails retryably; the provider lands the charge
        // 4 s later.
        let first = idem
            .execute(&inv, |ctx: ExecutionContext| async move {
                let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
                let charging = ctx
                    .step("charge")
                    .effect_timeout(Duration::from_secs(10))
                    .run(|_key| async move {
                        sender.sends.fetch_add(1, Ordering::SeqCst);
                        let lands = sent_at.now() + Duration::from_secs(4);
                        sender.sent.lock().expect("charges").push(lands);
                        let _ = sent_tx.send(());
                        std::future::pending::<Result<String, BoxError>>().await
                    });
                tokio::select! {
                    charged = charging => panic!("the charge never answers: {charged:?}"),
                    sent = sent_rx => sent.expect("the charge was sent"),
                }
                Err::<String, BoxError>("the charge timed out".into())
            })
            .await;
        assert!(first.is_err(), "{name}");
        let redelivery = || {
            attempt(
                &idem,
                &inv,
                &provider,
                &clock,
                Some(Duration::from_secs(10)),
            )
        };
        clock.advance(Duration::from_secs(1));
        let early = redelivery().await;
        assert!(
            matches!(early, Err(Error::AlreadyInProgress { .. })),
            "{name}: kept while the charge may land: {early:?}"
        );
        // Past the declared 10 s and the clocks' 5 s skew.
        clock.advance(Duration::from_secs(15));
        let later = redelivery().await;
        assert_eq!(later.expect("taken over, checked"), "ch_1", "{name}");
        assert_eq!(
            provider.sends.load(Ordering::SeqCst),
            1,
            "{name}: charged once"
        );
    }
}

/// A clock that runs `ahead` of another (another Lambda environment's, within the lease
/// policy's skew).
#[derive(Debug)]
struct Ahead(ManualClock, Duration);

impl Clock for Ahead {
    fn now(&self) -> std::time::SystemTime {
        self.0.now() + self.1
    }
}

#[tokio::test]
async fn a_redelivery_whose_clock_runs_ahead_waits_for_the_late_effect_too() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store.clone())
            .with_clock(backend.clock.clone())
            .with_recovery(Recovery::Steps);
        // Another environment's clock, 4 s ahead (within the default 5 s skew).
        let ahead = Idempotency::new(backend.store)
            .with_clock(Ahead(clock.clone(), Duration::from_secs(4)))
            .with_recovery(Recovery::Steps);
        let inv = invocation("skewed-charge", &serde_json::json!({"order": "o-skew"}));
        // The charge lands 9 s after it is sent, inside its declared 10 s.
        let provider = Arc::new(Provider::landing_after(Duration::from_secs(9)));
        let timeout = Some(Duration::from_secs(10));

        let first = attempt(&idem, &inv, &provider, &clock, timeout).await;
        assert!(first.is_err(), "{name}: the first attempt gave up");
        // 7 s later by the true clock (11 s on the redelivery's, past the declared 10 s): the
        // charge has not landed yet, and a check now would hear NotApplied.
        clock.advance(Duration::from_secs(7));
        let early = attempt(&ahead, &inv, &provider, &clock, timeout).await;
        assert!(
            matches!(early, Err(Error::AlreadyInProgress { .. })),
            "{name}: a clock 4 s ahead still waits for the declared 10 s: {early:?}"
        );
        clock.advance(Duration::from_secs(9));
        let later = attempt(&ahead, &inv, &provider, &clock, timeout).await;
        assert_eq!(later.expect("taken over, checked"), "ch_1", "{name}");
        assert_eq!(
            provider.sends.load(Ordering::SeqCst),
            1,
            "{name}: charged once"
        );
    }
}

/// What a handler does after its charge step was cut off mid-effect (a timeout around it).
#[derive(Debug, Clone, Copy)]
enum AfterCutOff {
    /// Runs the charge again, under its name.
    RetriesIt,
    /// Goes on to its next step.
    GoesOn,
}

#[tokio::test]
async fn a_step_cut_off_mid_effect_is_not_checked_in_the_same_attempt() {
    for after in [AfterCutOff::RetriesIt, AfterCutOff::GoesOn] {
        for backend in both().await {
            let name = format!("{} ({after:?})", backend.name);
            let clock = backend.clock.clone();
            let idem = Idempotency::new(backend.store)
                .with_clock(backend.clock)
                .with_recovery(Recovery::Steps);
            let inv = invocation("cut-off-charge", &serde_json::json!({"order": "o-again"}));
            let provider = Arc::new(Provider::default());
            let (sender, sent_at) = (Arc::clone(&provider), clock.clone());
            let (checked, check_clock) = (Arc::clone(&provider), clock.clone());
            let first = idem
                .execute(&inv, |ctx: ExecutionContext| async move {
                    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
                    let charging = ctx
                        .step("charge")
                        .effect_timeout(Duration::from_secs(10))
                        .run(|_key| async move {
                            sender.sends.fetch_add(1, Ordering::SeqCst);
                            let lands = sent_at.now() + Duration::from_secs(4);
                            sender.sent.lock().expect("charges").push(lands);
                            let _ = sent_tx.send(());
                            std::future::pending::<Result<String, BoxError>>().await
                        });
                    tokio::select! {
                        charged = charging => panic!("the charge never answers: {charged:?}"),
                        sent = sent_rx => sent.expect("the charge was sent"),
                    }
                    // The charge has not landed: a check asked now would answer NotApplied.
                    let again = match after {
                        AfterCutOff::RetriesIt => {
                            ctx.step("charge")
                                .checked_by(move |_key: String| async move {
                                    Ok::<_, BoxError>(match checked.landed(&check_clock) {
                                        0 => Checked::NotApplied,
                                        _ => Checked::Applied(String::from("ch_1")),
                                    })
                                })
                                .run(|_key| async {
                                    Ok::<_, BoxError>(String::from("charged again"))
                                })
                                .await
                        }
                        AfterCutOff::GoesOn => {
                            ctx.step("receipt")
                                .run(|_key| async { Ok::<_, BoxError>(String::from("sent")) })
                                .await
                        }
                    };
                    Ok::<_, BoxError>(again?)
                })
                .await;
            assert!(
                matches!(first, Err(Error::AlreadyInProgress { .. })),
                "{name}: the attempt gives its claim back while the charge may land: {first:?}"
            );
            // Past the declared 10 s and the clocks' 5 s skew, the next delivery's check finds
            // the charge.
            clock.advance(Duration::from_secs(16));
            let later = attempt(
                &idem,
                &inv,
                &provider,
                &clock,
                Some(Duration::from_secs(10)),
            )
            .await;
            assert_eq!(later.expect("taken over, checked"), "ch_1", "{name}");
            assert_eq!(
                provider.sends.load(Ordering::SeqCst),
                1,
                "{name}: charged once"
            );
        }
    }
}

/// A check that outlasts the attempt's lease: a takeover may be asking the same check and
/// running the effect, so this attempt does not start it after the check answers.
#[tokio::test]
async fn no_effect_starts_after_a_check_that_outlasted_the_lease() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let inv = invocation("slow-check", &serde_json::json!({"order": "o-slow"}));
        // A charge that never lands within the test.
        let provider = Arc::new(Provider::landing_after(Duration::from_secs(24 * 3600)));
        let timeout = Some(Duration::from_secs(10));
        let first = attempt(&idem, &inv, &provider, &clock, timeout).await;
        assert!(first.is_err(), "{name}: the first attempt gave up");
        clock.advance(Duration::from_secs(16));

        let (sender, checked, check_clock) =
            (Arc::clone(&provider), Arc::clone(&provider), clock.clone());
        let second = idem
            .execute(&inv, |ctx: ExecutionContext| async move {
                let charged = ctx
                    .step("charge")
                    .checked_by(move |_key: String| async move {
                        // The provider's search is slow: past this attempt's lease.
                        check_clock.advance(LEASE + Duration::from_secs(1));
                        Ok::<_, BoxError>(match checked.landed(&check_clock) {
                            0 => Checked::NotApplied,
                            _ => Checked::Applied(String::from("ch_1")),
                        })
                    })
                    .run(|_key| async move {
                        sender.sends.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(String::from("ch_2"))
                    })
                    .await?;
                Ok::<_, BoxError>(charged)
            })
            .await;
        assert!(
            matches!(second, Err(Error::LeaseLost { .. })),
            "{name}: the lease ran out during the check: {second:?}"
        );
        assert_eq!(
            provider.sends.load(Ordering::SeqCst),
            1,
            "{name}: not charged by an attempt whose lease ran out"
        );
    }
}

/// The same, when the step cut off is an earlier attempt's uncertain step that a takeover
/// checked (not applied) and ran: the intent names the earlier attempt, yet the effect in
/// flight is this attempt's.
#[tokio::test]
async fn a_taken_over_step_cut_off_mid_effect_is_not_checked_in_the_same_attempt() {
    for after in [AfterCutOff::RetriesIt, AfterCutOff::GoesOn] {
        for backend in both().await {
            let name = format!("{} ({after:?})", backend.name);
            let clock = backend.clock.clone();
            let idem = Idempotency::new(backend.store)
                .with_clock(backend.clock)
                .with_recovery(Recovery::Steps);
            let inv = invocation("taken-cut-off", &serde_json::json!({"order": "o-taken"}));
            let provider = Arc::new(Provider::default());
            // Attempt 1 records the intent; its call fails before anything is sent.
            let first = idem
                .execute(&inv, |ctx: ExecutionContext| async move {
                    let charged = ctx
                        .step("charge")
                        .effect_timeout(Duration::from_secs(10))
                        .run(|_key| async {
                            Err::<String, BoxError>("the connection dropped".into())
                        })
                        .await?;
                    Ok::<_, BoxError>(charged)
                })
                .await;
            assert!(first.is_err(), "{name}");
            clock.advance(Duration::from_secs(16));

            // Attempt 2: the check finds nothing, the charge is sent and cut off.
            let (sender, sent_at) = (Arc::clone(&provider), clock.clone());
            let (checked, check_clock) = (Arc::clone(&provider), clock.clone());
            let (checked_again, check_clock_again) = (Arc::clone(&provider), clock.clone());
            let second = idem
                .execute(&inv, |ctx: ExecutionContext| async move {
                    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
                    let check = move |_key: String| async move {
                        Ok::<_, BoxError>(match checked.landed(&check_clock) {
                            0 => Checked::NotApplied,
                            _ => Checked::Applied(String::from("ch_1")),
                        })
                    };
                    let charging = ctx
                        .step("charge")
                        .effect_timeout(Duration::from_secs(10))
                        .checked_by(check)
                        .run(|_key| async move {
                            sender.sends.fetch_add(1, Ordering::SeqCst);
                            let lands = sent_at.now() + Duration::from_secs(4);
                            sender.sent.lock().expect("charges").push(lands);
                            let _ = sent_tx.send(());
                            std::future::pending::<Result<String, BoxError>>().await
                        });
                    tokio::select! {
                        charged = charging => panic!("the charge never answers: {charged:?}"),
                        sent = sent_rx => sent.expect("the charge was sent"),
                    }
                    let again = match after {
                        AfterCutOff::RetriesIt => {
                            ctx.step("charge")
                                .checked_by(move |_key: String| async move {
                                    Ok::<_, BoxError>(
                                        match checked_again.landed(&check_clock_again) {
                                            0 => Checked::NotApplied,
                                            _ => Checked::Applied(String::from("ch_1")),
                                        },
                                    )
                                })
                                .run(|_key| async {
                                    Ok::<_, BoxError>(String::from("charged again"))
                                })
                                .await
                        }
                        AfterCutOff::GoesOn => {
                            ctx.step("receipt")
                                .run(|_key| async { Ok::<_, BoxError>(String::from("sent")) })
                                .await
                        }
                    };
                    Ok::<_, BoxError>(again?)
                })
                .await;
            assert!(
                matches!(second, Err(Error::AlreadyInProgress { .. })),
                "{name}: given back while the charge may land: {second:?}"
            );
            clock.advance(Duration::from_secs(16));
            let later = attempt(
                &idem,
                &inv,
                &provider,
                &clock,
                Some(Duration::from_secs(10)),
            )
            .await;
            assert_eq!(later.expect("taken over, checked"), "ch_1", "{name}");
            assert_eq!(
                provider.sends.load(Ordering::SeqCst),
                1,
                "{name}: charged once"
            );
        }
    }
}
