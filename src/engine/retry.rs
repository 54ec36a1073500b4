//! Transient store failures retried on the engine's clock, with capped exponential back-off
//! and full jitter (each pause drawn from zero to the current ceiling).
//!
//! How long to keep trying depends on what a give-up costs:
//!
//! - before the handler runs (a claim, a takeover, an adoption, a give-back), a few tries: the
//!   caller's own retry (a redelivery) loses nothing;
//! - after the handler ran (a settlement; a release after a failure, or after a claim whose
//!   answer was lost), until the invocation's deadline minus a margin: giving up leaves the
//!   claim to a takeover, which re-runs the handler under [`Recovery::Rerun`](crate::reconcile::Recovery),
//!   so an outage of a few seconds would otherwise charge a customer twice.
//!
//! Each try is bounded by the SDK's operation timeout (the DynamoDB store sets one).

use std::future::Future;
use std::time::{Duration, SystemTime};

use tracing::warn;

use super::Idempotency;
use super::decide::{self, SETTLE_MARGIN};
use crate::clock::within;
use crate::defects;
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::Record;
use crate::store::StoreExt;

/// Tries of a write made before the handler runs, the first included.
const BRIEF_TRIES: u32 = 5;
/// The first back-off ceiling; it doubles after each try.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The largest back-off ceiling: an outage's end is noticed within this.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long before the invocation's deadline a try still in flight is abandoned: the
/// caller's answer (and the runtime's reply to Lambda) still has to be written, which it
/// cannot be once Lambda ends the invocation at the deadline itself.
pub(super) const ANSWER_MARGIN: Duration = Duration::from_millis(250);
/// The longest a write after the handler is retried, whatever the lease (an engine-door
/// caller's may be long): Lambda's longest invocation.
pub(super) const MAX_PATIENCE: Duration = Duration::from_secs(15 * 60);

/// How long a failing write is retried.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// A few tries ([`BRIEF_TRIES`]), none starting after `until`; with a `cut`, a try still
    /// in flight then is abandoned, as [`Patience::Until`]'s.
    Brief {
        until: SystemTime,
        cut: Option<SystemTime>,
    },
    /// Every try that can start before `until`: the effect may have happened. With a `cut`
    /// (shortly before the invocation's deadline), a try still in flight then is abandoned, so
    /// that the caller is answered before the invocation ends (an abandoned write may still
    /// commit: the next delivery finds it).
    Until {
        until: SystemTime,
        cut: Option<SystemTime>,
    },
}

impl Patience {
    /// The time no try may start at or after, and the most tries.
    pub(crate) fn limits(self) -> (SystemTime, u32) {
        match self {
            Self::Brief { until, .. } => (until, BRIEF_TRIES),
            Self::Until { until, .. }
                if defects::is_reintroduced(defects::SETTLE_GIVES_UP_EARLY) =>
            {
                (until, 2)
            }
            Self::Until { until, .. } => (until, u32::MAX),
        }
    }

    /// A few tries, none starting after the lease ends (`lease_end`) or, when the invocation
    /// has a `deadline`, after its caller's answer is due, a try in flight cut [`ANSWER_MARGIN`]
    /// before the deadline: a write that loses nothing when it fails (a give-back, whose lease
    /// then runs out; a step's intent, which the next delivery checks) never keeps its caller
    /// past the deadline, the lease's end being the deadline plus the clock skew.
    pub(crate) fn brief(lease_end: SystemTime, deadline: Option<SystemTime>) -> Self {
        Self::Brief {
            until: Self::last_start(lease_end, deadline),
            cut: cut_of(deadline),
        }
    }

    /// The patience of a write before the handler runs (a claim, a takeover, an adoption): a
    /// few tries, none starting after the lease ends or, when the invocation has a `deadline`,
    /// after its caller's answer is due ([`Patience::answer_due`]), a try in flight cut twice
    /// [`ANSWER_MARGIN`] before the deadline, leaving one for its clean-up ([`Self::last_try`]).
    /// A store that stalls then answers this caller (a batch record reported failed) instead
    /// of Lambda's timeout ending the invocation.
    pub(crate) fn before_running(lease_end: SystemTime, deadline: Option<SystemTime>) -> Self {
        Self::Brief {
            until: Self::last_start(lease_end, deadline),
            cut: deadline
                .map(|deadline| deadline.checked_sub(ANSWER_MARGIN * 2).unwrap_or(deadline)),
        }
    }

    /// One try, cut [`ANSWER_MARGIN`] before `deadline`: the clean-up of a write before the
    /// handler that failed (the lease a takeover may hold cut short), which must not keep the
    /// caller past its deadline.
    pub(crate) fn last_try(deadline: Option<SystemTime>, now: SystemTime) -> Self {
        Self::Brief {
            until: now,
            cut: cut_of(deadline),
        }
    }

    /// Retries until `end` (at most [`MAX_PATIENCE`] from `now`) less [`SETTLE_MARGIN`],
    /// tries cut [`ANSWER_MARGIN`] before `deadline` when there is one.
    pub(super) fn until(end: SystemTime, deadline: Option<SystemTime>, now: SystemTime) -> Self {
        let end = end.min(now + MAX_PATIENCE);
        Self::Until {
            until: end.checked_sub(SETTLE_MARGIN).unwrap_or(end),
            cut: cut_of(deadline),
        }
    }

    /// The last moment a try of a brief patience starts: the lease's end, or the caller's
    /// answer's when that comes first.
    fn last_start(lease_end: SystemTime, deadline: Option<SystemTime>) -> SystemTime {
        deadline.map_or(lease_end, |deadline| {
            lease_end.min(Self::answer_due(deadline))
        })
    }

    /// When the caller's answer is due before `deadline`: no retry starts after it.
    pub(crate) fn answer_due(deadline: SystemTime) -> SystemTime {
        deadline.checked_sub(SETTLE_MARGIN).unwrap_or(deadline)
    }

    /// The patience of a write after an effect happened (a settlement, a release after the
    /// handler, a step's result): until the invocation's `deadline` (the lease's end when
    /// there is none), less [`SETTLE_MARGIN`], each try cut [`ANSWER_MARGIN`] before the
    /// deadline. Past the lease's end too: the write is fenced on the lease token, so a try
    /// after a takeover fails its condition, and one before it stores the effect's outcome
    /// that giving up would leave to a takeover.
    pub(crate) fn settling(
        lease_end: SystemTime,
        deadline: Option<SystemTime>,
        now: SystemTime,
    ) -> Self {
        let end = deadline.unwrap_or(lease_end);
        Self::until(end, deadline, now)
    }
}

impl Idempotency {
    /// One strongly consistent read of `key`'s record, cut [`ANSWER_MARGIN`] before the
    /// invocation's `deadline` (a read that stalls fails as unavailable, while the caller can
    /// still answer, instead of Lambda's timeout ending the invocation).
    pub(super) async fn read_before(
        &self,
        key: &OperationKey,
        deadline: Option<SystemTime>,
    ) -> Result<Option<Record>, StoreError> {
        let read = self.store.get(key);
        match time_before(cut_of(deadline), self.clock.now()) {
            Some(left) => within(&*self.clock, left, read)
                .await
                .unwrap_or_else(|| Err(cut_off("read"))),
            None => read.await,
        }
    }

    /// Sends `write` until it answers, fails for good, or patience runs out. Every try sends
    /// the same write (the same lease token), so that one which committed before its answer
    /// was lost is recognised by the next try's failed condition.
    pub(crate) async fn retrying<'a, T, Fut>(
        &'a self,
        patience: Patience,
        write: impl Fn() -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        let (until, max_tries) = patience.limits();
        let (Patience::Brief { cut, .. } | Patience::Until { cut, .. }) = patience;
        let mut ceiling = FIRST_BACKOFF;
        let mut tries = 1;
        loop {
            let attempt = write();
            let answer = match time_before(cut, self.clock.now()) {
                Some(left) => within(&*self.clock, left, attempt)
                    .await
                    .unwrap_or_else(|| Err(cut_off("write"))),
                None => attempt.await,
            };
            match answer {
                Err(err) if err.is_transient() => {
                    let pause = self.clock.jitter(ceiling);
                    if !decide::try_again(tries, max_tries, self.clock.now(), pause, until) {
                        warn!(tries, error = %err, "store write failed; out of tries or time");
                        return Err(err);
                    }
                    warn!(tries, error = %err, "store write failed; retrying");
                    self.clock.sleep(pause).await;
                    ceiling = (ceiling * 2).min(MAX_BACKOFF);
                    tries += 1;
                }
                answer => return answer,
            }
        }
    }
}

/// How long a request started `now` may take before `cut` ([`ANSWER_MARGIN`] before the
/// invocation's deadline): one that starts past the cut still ends by the deadline itself;
/// `None` without a cut, or past the deadline (a caller's own, or a test's clock): not cut.
pub(super) fn time_before(cut: Option<SystemTime>, now: SystemTime) -> Option<Duration> {
    cut.and_then(|cut| {
        cut.duration_since(now)
            .or_else(|_| (cut + ANSWER_MARGIN).duration_since(now))
            .ok()
    })
}

/// The cut of a request made for an invocation with `deadline`: [`ANSWER_MARGIN`] before it.
pub(super) fn cut_of(deadline: Option<SystemTime>) -> Option<SystemTime> {
    deadline.map(|deadline| deadline.checked_sub(ANSWER_MARGIN).unwrap_or(deadline))
}

/// The error of a try (a `write`, a `read`) abandoned at the invocation's deadline.
fn cut_off(operation: &'static str) -> StoreError {
    StoreError::Unavailable {
        operation,
        source: "no answer before the invocation's deadline".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settlement_stops_trying_and_abandons_its_try_before_the_deadline() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let deadline = now + Duration::from_secs(10);
        let lease_end = now + Duration::from_secs(15);
        let Patience::Until { until, cut } = Patience::settling(lease_end, Some(deadline), now)
        else {
            panic!("a settlement is patient");
        };
        assert_eq!(until, deadline - SETTLE_MARGIN, "no try starts after this");
        assert_eq!(
            cut,
            Some(deadline - ANSWER_MARGIN),
            "a try in flight is abandoned before Lambda ends the invocation"
        );
        assert!(until < deadline && cut < Some(deadline));
    }

    #[test]
    fn a_claim_stops_trying_when_its_answer_is_due_not_when_its_lease_ends() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let deadline = now + Duration::from_secs(3);
        // A Lambda claim's lease runs past the deadline by the clock skew.
        let lease_end = deadline + Duration::from_secs(5);
        let Patience::Brief { until, cut } = Patience::before_running(lease_end, Some(deadline))
        else {
            panic!("a claim is brief");
        };
        assert_eq!(until, deadline - SETTLE_MARGIN);
        assert_eq!(
            cut,
            Some(deadline - ANSWER_MARGIN * 2),
            "room left for its clean-up"
        );
        let Patience::Brief { until, cut } = Patience::before_running(lease_end, None) else {
            panic!("a claim is brief");
        };
        assert_eq!(
            (until, cut),
            (lease_end, None),
            "without a deadline: the lease"
        );
    }

    /// A lease shorter than the invocation (a `LeasePolicy` capped below the function's
    /// timeout): the settlement after the effect keeps trying to the deadline, fenced on its
    /// token, instead of leaving the effect to a takeover at the lease's end.
    #[test]
    fn a_settlement_outlasts_a_lease_shorter_than_the_invocation() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let lease_end = now + Duration::from_secs(2);
        let deadline = now + Duration::from_secs(240);
        let Patience::Until { until, cut } = Patience::settling(lease_end, Some(deadline), now)
        else {
            panic!("a settlement is patient");
        };
        assert_eq!(until, (now + MAX_PATIENCE).min(deadline) - SETTLE_MARGIN);
        assert!(until > lease_end, "past the lease's end");
        assert_eq!(cut, Some(deadline - ANSWER_MARGIN));
    }

    #[test]
    fn without_a_deadline_a_settlement_lasts_the_lease_and_is_never_cut() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let lease_end = now + Duration::from_secs(65);
        let Patience::Until { until, cut } = Patience::settling(lease_end, None, now) else {
            panic!("a settlement is patient");
        };
        assert_eq!(until, lease_end - SETTLE_MARGIN);
        assert_eq!(cut, None);
    }
}
