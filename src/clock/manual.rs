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
    /// Each sleep polled and not ended, by its end and the order it began in, with the waker
    /// of its task while it waits.
    sleepers: BTreeMap<Slot, Option<Waker>>,
    /// How many sleeps began (the order of two with the same end).
    began: u64,
}

/// A sleep's place in line: its end, then the order it began in.
type Slot = (SystemTime, u64);

impl Timeline {
    /// The wakers of every sleeper whose end has come, and of the first one still to come: it
    /// is the one that moves the clock on (woken once the clock's lock is released).
    fn due(&mut self) -> Vec<Waker> {
        let mut due = Vec::new();
        for ((end, _), waker) in self.sleepers.iter_mut() {
            due.extend(waker.take());
            if *end > self.now {
                break;
            }
        }
        due
    }
}

/// Wakes `wakers`, outside the clock's lock.
fn wake(wakers: Vec<Waker>) {
    wakers.into_iter().for_each(Waker::wake);
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
        let due = {
            let mut timeline = self.timeline();
            timeline.now += by;
            timeline.due()
        };
        wake(due);
    }

    /// Sets the clock to `to`, which may be earlier than now (waking the sleepers whose end it
    /// reaches). A sleeper still waiting then moves it forward again, to its own end, when it
    /// is the first due.
    pub fn set(&self, to: SystemTime) {
        let due = {
            let mut timeline = self.timeline();
            timeline.now = to;
            timeline.due()
        };
        wake(due);
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

/// One task's sleep on a [`ManualClock`]: its end is counted from when it was made; it joins
/// the line of sleepers when first polled (a sleep made and not yet awaited holds up no one).
#[derive(Debug)]
struct Sleep {
    timeline: Arc<Mutex<Timeline>>,
    slot: Slot,
    /// Whether it yielded to the other ready tasks while it was the first due.
    yielded: bool,
    ended: bool,
}

impl Sleep {
    /// Leaves the line: the wakers of those now due and of the next to move the clock.
    fn leave(&mut self, timeline: &mut Timeline) -> Vec<Waker> {
        timeline.sleepers.remove(&self.slot);
        self.ended = true;
        timeline.due()
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let timeline = Arc::clone(&this.timeline);
        let mut timeline = timeline.lock().unwrap_or_else(PoisonError::into_inner);
        timeline
            .sleepers
            .insert(this.slot, Some(cx.waker().clone()));
        let (end, _) = this.slot;
        let first = timeline.sleepers.keys().next() == Some(&this.slot);
        if timeline.now < end && first && this.yielded {
            timeline.now = end;
        }
        if timeline.now >= end {
            let due = this.leave(&mut timeline);
            drop(timeline);
            wake(due);
            return Poll::Ready(());
        }
        // The first due yields to the other ready tasks before the clock moves (again, if an
        // earlier sleeper overtook it meanwhile).
        this.yielded = first;
        if first {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if !self.ended {
            let timeline = Arc::clone(&self.timeline);
            let mut timeline = timeline.lock().unwrap_or_else(PoisonError::into_inner);
            let due = self.leave(&mut timeline);
            drop(timeline);
            wake(due);
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

    #[test]
    fn a_sleep_made_and_not_awaited_holds_up_no_one() {
        use futures_util::FutureExt;
        let clock = ManualClock::new(start());
        let made = clock.sleep(Duration::from_secs(1));
        let mut awaited = clock.sleep(Duration::from_secs(5));
        assert!((&mut awaited).now_or_never().is_none(), "it yields once");
        assert!(
            (&mut awaited).now_or_never().is_some(),
            "then, first in line, it moves the clock to its end"
        );
        assert_eq!(clock.now(), start() + Duration::from_secs(5));
        assert!(made.now_or_never().is_some(), "its end has passed");
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
