//! Time, injected.
//!
//! Every decision the engine takes about leases and retention reads the time from a [`Clock`],
//! never from a hidden `SystemTime::now()`. Production code uses [`SystemClock`]; tests use a
//! [`ManualClock`] and move it forward instead of sleeping (its sleepers each wait for their
//! own end, and the first due moves it there).
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use lambda_idempotency::clock::{Clock, ManualClock};
//!
//! let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
//! let before = clock.now();
//! clock.advance(Duration::from_secs(30));
//! assert_eq!(clock.now().duration_since(before).unwrap(), Duration::from_secs(30));
//! ```

mod manual;

use std::fmt;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use crate::reconcile::BoxFuture;

pub use self::manual::ManualClock;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;

    /// Waits `duration` (the engine's pause between retries of a failed write). The default
    /// sleeps on Tokio's timer; a [`ManualClock`] waits for its own time to reach the end, and
    /// moves it there itself when it is the first sleeper due, so that tests never sleep.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }

    /// Ends after `duration`: the deadline of a wait in flight (a store write cut at the
    /// invocation's deadline, a caller's wait for its key's turn under single flight). The
    /// default waits on Tokio's timer, in real time for every clock: a [`ManualClock`] moves
    /// only when told or when a sleeper is due, and a test's request is never cut by it. A clock that drives a scheduler
    /// of its own (a model checker's) ends it on that scheduler.
    fn deadline(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }

    /// A pause drawn between zero and `ceiling` (full jitter, so that workers retrying after
    /// one outage spread out). The default draws at random; a [`ManualClock`] takes the whole
    /// ceiling, so that tests are deterministic.
    fn jitter(&self, ceiling: Duration) -> Duration {
        ceiling.mul_f64(fastrand::f64())
    }
}

/// `future`'s output, or `None` once `limit` passed on `clock`'s [`Clock::deadline`] before
/// it ended, counted from this call (as `tokio::time::timeout` counts). The deadline is made
/// only if the future does not end at its first poll (an uncontended turn, a quick write pay
/// nothing for it), for what is left of `limit` after that poll.
pub(crate) async fn within<T>(
    clock: &dyn Clock,
    limit: Duration,
    future: impl Future<Output = T>,
) -> Option<T> {
    let started = clock.now();
    let mut future = std::pin::pin!(future);
    let mut deadline: Option<BoxFuture<'static, ()>> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        let deadline = deadline.get_or_insert_with(|| {
            let spent = clock.now().duration_since(started).unwrap_or_default();
            clock.deadline(limit.saturating_sub(spent))
        });
        deadline.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}
