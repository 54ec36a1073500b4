//! Waiting for another environment's live claim to settle
//! ([`Invocation::with_wait_for_result`]): backed-off, strongly consistent reads of the record,
//! bounded by the caller's patience, its deadline and the holder's lease.

use std::borrow::Cow;
use std::future::Future;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use super::decide::SETTLE_MARGIN;
use super::{Counted, Idempotency, Ran};
use crate::clock::Clock;
use crate::error::{BoxError, Error};
use crate::execution::{Execution, ExecutionContext, Invocation};
use crate::key::OperationKey;
use crate::observe::Observation;
use crate::record::Status;

/// The first pause before reading a held record again.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two reads.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// The least time a waiter must have left to run the handler itself (a takeover, or a claim
/// of a record that went): with less, it answers in progress rather than start an effect
/// Lambda would cut off (the batch door's default deadline margin).
const LEAST_TIME_TO_RUN: Duration = Duration::from_secs(2);

/// What a read of the held record says.
enum Seen {
    /// Still held by a live claim, until then.
    Held(SystemTime),
    /// Settled (completed, failed, held for an operator): the next claim answers from it
    /// without running the handler.
    Settled,
    /// Gone, or its lease ran out: the next claim runs the handler (or takes over).
    Claimable,
}

/// How a wait ended.
enum Waited {
    /// The record changed: claim again.
    Changed,
    /// The caller's time ran out while the record was held until then (if read).
    GaveUp(Option<SystemTime>),
}

impl Idempotency {
    /// Runs, and while another environment holds the key and the invocation waits for
    /// results, reads its record (backed off) until it changes, then runs again: the claim
    /// then answers its outcome, or takes over an expired lease; with how the answer is counted.
    pub(super) async fn run_or_wait<T, E, F, Fut>(
        &self,
        invocation: &Invocation,
        handler: F,
    ) -> (Result<Execution<T>, Error>, Counted)
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let since = self.clock.now();
        let until = wait_until(invocation, since);
        // Copied only when a wait changes its lease.
        let mut current = Cow::Borrowed(invocation);
        let mut handler = handler;
        let mut reads = 0_u32;
        loop {
            let (back, key, busy) = match self.run(&current, handler).await {
                Ran::Answered(answer) => {
                    self.observe_wait(&current.key, reads, since);
                    return (answer, Counted::ByAnswer);
                }
                Ran::Executed { answer, counted } => {
                    self.observe_wait(&current.key, reads, since);
                    return (answer, Counted::AsRun(counted));
                }
                Ran::Busy { handler, key, busy } => (handler, key, busy),
            };
            let busy_at = self.clock.now();
            handler = back;
            let waited = self
                .wait_for_change(
                    &key,
                    until,
                    time_to_run(invocation, since),
                    invocation.deadline,
                    &mut reads,
                )
                .await;
            let held_until = match waited {
                Ok(Waited::Changed) => None,
                Ok(Waited::GaveUp(held_until)) => Some(held_until),
                Err(err) => {
                    self.observe_wait(&current.key, reads, since);
                    return (Err(err), Counted::ByAnswer);
                }
            };
            if let Some(held_until) = held_until {
                debug!(reads, "gave up waiting for the holder's outcome");
                self.observe_wait(&current.key, reads, since);
                let busy = self.still_busy(busy, busy_at, held_until);
                return (Err(busy), Counted::ByAnswer);
            }
            current.to_mut().lease = self.lease_left(invocation, since);
        }
    }

    /// Whether `invocation` has less than [`LEAST_TIME_TO_RUN`] left before its deadline: a
    /// caller whose single-flight turn came that late answers from the record as it stands
    /// (in progress when the turn before it released its claim) rather than start an effect
    /// Lambda would cut off; checked once its key is resolved (a record under an earlier
    /// key, 0.4's) so that it answers as any duplicate. An owned invocation's time is its
    /// owner's, not one invocation's.
    pub(super) fn too_late_to_run(&self, invocation: &Invocation) -> bool {
        invocation.owner.is_none()
            && invocation.deadline.is_some_and(|deadline| {
                deadline
                    .duration_since(self.clock.now())
                    .unwrap_or_default()
                    < LEAST_TIME_TO_RUN
            })
    }

    /// The lease of a claim made now by `invocation`, which arrived at `since`: what it was
    /// given, and never past its deadline plus the clock skew (the lease's own meaning), or
    /// without a deadline, less the time spent since. An owned claim's lease covers its
    /// owner's pauses, not one invocation ([`Invocation::with_owner`]): it counts from the
    /// claim.
    fn lease_left(&self, invocation: &Invocation, since: SystemTime) -> Duration {
        let now = self.clock.now();
        if invocation.owner.is_some() {
            return invocation.lease;
        }
        match invocation.deadline {
            Some(deadline) => invocation.lease.min(
                deadline
                    .duration_since(now)
                    .unwrap_or_default()
                    .saturating_add(invocation.clock_skew),
            ),
            None => invocation
                .lease
                .saturating_sub(now.duration_since(since).unwrap_or_default()),
        }
    }

    /// The answer of a wait that gave up: in progress, retry after what is left of the lease
    /// the holder was last seen holding, or (no read saw it) of the lease `busy` named at
    /// `busy_at`.
    fn still_busy(
        &self,
        busy: Error,
        busy_at: SystemTime,
        held_until: Option<SystemTime>,
    ) -> Error {
        let now = self.clock.now();
        match busy {
            Error::AlreadyInProgress {
                key,
                attempt,
                retry_after,
            } => Error::AlreadyInProgress {
                key,
                attempt,
                retry_after: match held_until {
                    Some(until) => until.duration_since(now).unwrap_or_default(),
                    None => {
                        retry_after.saturating_sub(now.duration_since(busy_at).unwrap_or_default())
                    }
                },
            },
            busy => busy,
        }
    }

    /// Reads `key`'s record, pausing longer each time, until it changes or `until` comes. A
    /// pause never outlasts the holder's lease: once it runs out the claim is the caller's to
    /// take over, when the caller still has `time_to_run` (the end of its time) far enough away.
    /// A read refused for good (access denied, a missing table) ends the wait with its error;
    /// one that stalls is cut before the invocation's `deadline`, as a failed read.
    async fn wait_for_change(
        &self,
        key: &OperationKey,
        until: SystemTime,
        time_to_run: SystemTime,
        deadline: Option<SystemTime>,
        reads: &mut u32,
    ) -> Result<Waited, Error> {
        let mut pause = FIRST_PAUSE;
        let mut held_until: Option<SystemTime> = None;
        loop {
            let now = self.clock.now();
            let left = until.duration_since(now).unwrap_or_default();
            if left.is_zero() {
                return Ok(Waited::GaveUp(held_until));
            }
            let held_left = held_until.and_then(|end| end.duration_since(now).ok());
            self.clock
                .sleep(next_sleep(&*self.clock, pause, left, held_left))
                .await;
            *reads += 1;
            match self.seen(key, deadline).await? {
                Some(Seen::Settled) => return Ok(Waited::Changed),
                Some(Seen::Claimable) => {
                    let runway = time_to_run
                        .duration_since(self.clock.now())
                        .unwrap_or_default();
                    if runway < LEAST_TIME_TO_RUN {
                        debug!("the holder's claim went, too late to run the handler here");
                        return Ok(Waited::GaveUp(Some(self.clock.now())));
                    }
                    return Ok(Waited::Changed);
                }
                Some(Seen::Held(end)) => held_until = Some(end),
                // A read failed for now: the next one, later, may not.
                None => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// One strongly consistent read of the held record; `Ok(None)`: the read failed for now
    /// (or stalled until the invocation's `deadline` was near).
    async fn seen(
        &self,
        key: &OperationKey,
        deadline: Option<SystemTime>,
    ) -> Result<Option<Seen>, Error> {
        let record = match self.read_before(key, deadline).await {
            Ok(record) => record,
            Err(err) if err.is_transient() => {
                warn!(
                    kind = err.kind_name(),
                    "a read while waiting for the holder failed; reading again later"
                );
                return Ok(None);
            }
            Err(err) => return Err(err.into()),
        };
        let now = self.clock.now();
        Ok(Some(match record {
            Some(record) if record.status == Status::InProgress => {
                match record.lease.is_expired(now) {
                    false => Seen::Held(record.lease.expires_at),
                    true => Seen::Claimable,
                }
            }
            Some(record) if !record.counts_as_absent(now) => Seen::Settled,
            _ => Seen::Claimable,
        }))
    }

    fn observe_wait(&self, key: &OperationKey, reads: u32, since: SystemTime) {
        if reads > 0 {
            self.observer.observe(&Observation::Waited {
                operation: key.operation(),
                reads,
                elapsed: self.clock.now().duration_since(since).unwrap_or_default(),
            });
        }
    }
}

/// When a caller that arrived at `since` must have ended: its deadline, else the end of its
/// lease less the clock skew (a lease is the time left plus the skew).
fn time_to_run(invocation: &Invocation, since: SystemTime) -> SystemTime {
    invocation
        .deadline
        .unwrap_or_else(|| since + invocation.lease.saturating_sub(invocation.clock_skew))
}

/// When a caller that started waiting at `since` stops: at its patience, and never past the
/// end of its time less the margin it needs to answer.
fn wait_until(invocation: &Invocation, since: SystemTime) -> SystemTime {
    let end = time_to_run(invocation, since);
    // A patience past what a clock can count is no patience limit: the end bounds it.
    let patience = since
        .checked_add(invocation.wait_for_result.unwrap_or_default())
        .unwrap_or(end);
    patience.min(end.checked_sub(SETTLE_MARGIN).unwrap_or(since))
}

/// How long a waiter sleeps: `pause` spread, within the `left` of its patience, and ending
/// soon after the lease it saw held (`held_left`) runs out: by a random share of half the
/// pause, so that the duplicates waiting on one lease do not all read, then claim, at its end.
fn next_sleep(
    clock: &dyn Clock,
    pause: Duration,
    left: Duration,
    held_left: Option<Duration>,
) -> Duration {
    let to_lease_end = held_left.map_or(pause, |held| {
        held + Duration::from_millis(1) + clock.jitter(pause / 2)
    });
    spread(clock, pause).min(left).min(to_lease_end)
}

/// Half of `pause`, and a random share of the other half: duplicates that arrived together (a
/// fan-out, a client's retry storm) do not read the record in lockstep.
fn spread(clock: &dyn Clock, pause: Duration) -> Duration {
    pause / 2 + clock.jitter(pause - pause / 2)
}

#[cfg(test)]
mod pauses {
    use std::time::{Duration, SystemTime};

    use super::{next_sleep, spread};
    use crate::clock::Clock;

    /// A clock whose jitter draws nothing.
    #[derive(Debug)]
    struct NoJitter;

    impl Clock for NoJitter {
        fn now(&self) -> SystemTime {
            SystemTime::UNIX_EPOCH
        }
        fn jitter(&self, _: Duration) -> Duration {
            Duration::ZERO
        }
    }

    #[test]
    fn a_pause_is_at_least_half_and_at_most_whole() {
        let pause = Duration::from_millis(800);
        assert_eq!(spread(&NoJitter, pause), Duration::from_millis(400));
        let whole = crate::clock::ManualClock::new(SystemTime::UNIX_EPOCH);
        assert_eq!(spread(&whole, pause), pause);
    }

    /// Waiters that saw one lease held wake soon after its end, each by its own draw: not
    /// all at its end's millisecond, to read and then claim in one burst.
    #[test]
    fn waiters_on_one_lease_wake_apart_after_its_end() {
        let (pause, patience) = (Duration::from_secs(1), Duration::from_secs(30));
        let held = Some(Duration::from_millis(100));
        let whole = crate::clock::ManualClock::new(SystemTime::UNIX_EPOCH);
        let earliest = next_sleep(&NoJitter, pause, patience, held);
        let latest = next_sleep(&whole, pause, patience, held);
        assert_eq!(earliest, Duration::from_millis(101));
        assert_eq!(latest, Duration::from_millis(601));
        assert_eq!(
            next_sleep(&whole, pause, Duration::from_millis(50), held),
            Duration::from_millis(50)
        );
    }
}
