//! [`ManualClock`]: test time that moves only when a test moves it, or when a sleeper is due.
//!
//! Each sleeping task waits for the clock to reach its own end; the first one due moves the
//! clock there itself, once it has yielded to the other ready tasks. Two tasks that sleep at
//! the same time thus wait together, as they would on a real clock: time moves by the longer
//! pause, not by their sum (a clock that moved by each pause in turn would let two retrying
//! workers see each other's leases end early).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use super::Clock;
use crate::reconcile::BoxFuture;

/// A clock that only moves when told to, or when the first of its sleepers is due; clones
/// share the same time and the same sleepers.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use lambda_idempotency::clock::{Clock, ManualClock};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
/// let start = clock.now();
/// // Two tasks pausing at once: 2 s and 3 s later, together, not 5 s.
/// let short = clock.sleep(Duration::from_secs(2));
/// let long = clock.sleep(Duration::from_secs(3));
/// futures_util::future::join(short, long).await;
/// assert_eq!(clock.now().duration_since(start).unwrap(), Duration::from_secs(3));
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    timeline: Arc<Mutex<Timeline>>,
}

/// The clock's time and the tasks sleeping on it.
#[derive(Debug)]
struct Timeline {
    now: SystemTime,
    /// Each sleep, by its end and the order it began in, with the waker of its task once it
    /// waits.
    sleepers: BTreeMap<Slot, Option<Waker>>,
    /// How many sleeps began (the order of two with the same end).
    began: u64,
}

/// A sleep's place in line: its end, then the order it began in.
type Slot = (SystemTime, u64);

impl Timeline {
    /// Wakes every sleeper whose end has come, and the first one still to come: it is the one
    /// that moves the clock on.
    fn wake_due(&mut self) {
        for ((end, _), waker) in self.sleepers.iter_mut() {
            if let Some(waker) = waker.take() {
                waker.wake();
            }
            if *end > self.now {
                break;
            }
        }
    }
}

impl ManualClock {
    /// A clock standing still at `start`.
    pub fn new(start: SystemTime) -> Self {
        Self {
            timeline: Arc::new(Mutex::new(Timeline {
                now: start,
                sleepers: BTreeMap::new(),
                began: 0,
            })),
        }
    }

    /// Moves the clock forward by `by` (waking the sleepers whose end it reaches).
    pub fn advance(&self, by: Duration) {
        let mut timeline = self.timeline();
        timeline.now += by;
        timeline.wake_due();
    }

    /// Sets the clock to `to`, which may be earlier than now (waking the sleepers whose end it
    /// reaches).
    pub fn set(&self, to: SystemTime) {
        let mut timeline = self.timeline();
        timeline.now = to;
        timeline.wake_due();
    }

    fn timeline(&self) -> MutexGuard<'_, Timeline> {
        self.timeline.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        self.timeline().now
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let mut timeline = self.timeline();
        let slot = (timeline.now + duration, timeline.began);
        timeline.began += 1;
        timeline.sleepers.insert(slot, None);
        Box::pin(Sleep {
            timeline: Arc::clone(&self.timeline),
            slot,
            yielded: false,
            ended: false,
        })
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        ceiling
    }
}

/// One task's sleep on a [`ManualClock`].
#[derive(Debug)]
struct Sleep {
    timeline: Arc<Mutex<Timeline>>,
    slot: Slot,
    /// Whether it yielded to the other ready tasks while it was the first due.
    yielded: bool,
    ended: bool,
}

impl Sleep {
    /// Leaves the line, waking those now due and the next to move the clock.
    fn leave(&mut self, timeline: &mut Timeline) {
        timeline.sleepers.remove(&self.slot);
        timeline.wake_due();
        self.ended = true;
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let timeline = Arc::clone(&this.timeline);
        let mut timeline = timeline.lock().unwrap_or_else(PoisonError::into_inner);
        let (end, _) = this.slot;
        let first = timeline.sleepers.keys().next() == Some(&this.slot);
        if timeline.now < end && first && this.yielded {
            timeline.now = end;
        }
        if timeline.now >= end {
            this.leave(&mut timeline);
            return Poll::Ready(());
        }
        if first {
            // The first due: the other ready tasks run before the clock moves.
            this.yielded = true;
            cx.waker().wake_by_ref();
        }
        timeline
            .sleepers
            .insert(this.slot, Some(cx.waker().clone()));
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if !self.ended {
            let timeline = Arc::clone(&self.timeline);
            let mut timeline = timeline.lock().unwrap_or_else(PoisonError::into_inner);
            self.leave(&mut timeline);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::UNIX_EPOCH;

    use super::*;

    fn start() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    #[tokio::test]
    async fn one_sleep_moves_the_clock_by_its_pause() {
        let clock = ManualClock::new(start());
        clock.sleep(Duration::from_millis(250)).await;
        assert_eq!(clock.now(), start() + Duration::from_millis(250));
    }

    #[tokio::test]
    async fn sleeps_at_once_wait_together_not_in_turn() {
        let clock = ManualClock::new(start());
        let ends = futures_util::future::join3(
            async {
                clock.sleep(Duration::from_secs(3)).await;
                clock.now()
            },
            async {
                clock.sleep(Duration::from_secs(1)).await;
                clock.now()
            },
            async {
                clock.sleep(Duration::from_secs(2)).await;
                clock.now()
            },
        )
        .await;
        let secs = |at: SystemTime| at.duration_since(start()).expect("after the start");
        assert_eq!(
            (secs(ends.0), secs(ends.1), secs(ends.2)),
            (
                Duration::from_secs(3),
                Duration::from_secs(1),
                Duration::from_secs(2)
            ),
            "each sleeper ends at its own end, the clock moved by the longest pause"
        );
    }

    #[tokio::test]
    async fn advancing_wakes_a_sleeper_and_a_dropped_sleep_leaves_the_line() {
        let clock = ManualClock::new(start());
        drop(clock.sleep(Duration::from_secs(1)));
        let woke = AtomicBool::new(false);
        futures_util::future::join(
            async {
                clock.sleep(Duration::from_secs(10)).await;
                woke.store(true, Ordering::SeqCst);
            },
            async { clock.advance(Duration::from_secs(10)) },
        )
        .await;
        assert!(woke.load(Ordering::SeqCst));
        assert_eq!(
            clock.now(),
            start() + Duration::from_secs(10),
            "the advance reached the sleeper's end: it moved the clock no further, and the dropped sleep not at all"
        );
    }
}
