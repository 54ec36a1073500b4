//! Waiting for another environment's live claim to settle
//! ([`Invocation::with_wait_for_result`]): backed-off, strongly consistent reads of the record,
//! bounded by the caller's patience, its deadline and the holder's lease.

use std::future::Future;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::debug;

use super::retry::SETTLE_MARGIN;
use super::{Idempotency, Ran};
use crate::error::{BoxError, Error};
use crate::execution::{Execution, ExecutionContext, Invocation};
use crate::key::OperationKey;
use crate::observe::Observation;
use crate::record::Status;
use crate::store::Store;

/// The first pause before reading a held record again.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two reads.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// What a read of the held record says.
enum Seen {
    /// Still held by a live claim, until then.
    Held(SystemTime),
    /// Settled, gone, or its lease ran out: the next claim decides.
    Changed,
}

impl Idempotency {
    /// Runs, and while another environment holds the key and the invocation waits for
    /// results, reads its record (backed off) until it changes, then runs again: the claim
    /// then answers its outcome, or takes over an expired lease.
    pub(super) async fn run_or_wait<T, E, F, Fut>(
        &self,
        invocation: &Invocation,
        handler: F,
    ) -> Result<Execution<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        E: Into<BoxError>,
        F: FnOnce(ExecutionContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let since = self.clock.now();
        let until = wait_until(invocation, since);
        let mut invocation = invocation.clone();
        let mut handler = handler;
        let mut reads = 0_u32;
        loop {
            let (back, key, busy) = match self.run(&invocation, handler).await {
                Ran::Answered(answer) => {
                    self.observe_wait(&invocation.key, reads, since);
                    return answer;
                }
                Ran::Busy { handler, key, busy } => (handler, key, busy),
            };
            handler = back;
            let paused_at = self.clock.now();
            if !self.wait_for_change(&key, until, &mut reads).await {
                debug!(reads, "gave up waiting for the holder's outcome");
                self.observe_wait(&invocation.key, reads, since);
                return Err(busy);
            }
            // The lease counts from the invocation's deadline: the time spent waiting comes
            // off it.
            invocation.lease = invocation
                .lease
                .saturating_sub(self.elapsed_since(paused_at));
        }
    }

    fn elapsed_since(&self, then: SystemTime) -> Duration {
        self.clock.now().duration_since(then).unwrap_or_default()
    }

    /// Reads `key`'s record, pausing longer each time, until it changes (`true`) or `until`
    /// comes (`false`). A pause never outlasts the holder's lease: once it runs out the claim
    /// is the caller's to take over.
    async fn wait_for_change(
        &self,
        key: &OperationKey,
        until: SystemTime,
        reads: &mut u32,
    ) -> bool {
        let mut pause = FIRST_PAUSE;
        let mut held_until: Option<SystemTime> = None;
        loop {
            let now = self.clock.now();
            let Ok(left) = until.duration_since(now) else {
                return false;
            };
            if left.is_zero() {
                return false;
            }
            let to_lease_end = held_until
                .and_then(|end| end.duration_since(now).ok())
                .map_or(pause, |left| left + Duration::from_millis(1));
            self.clock.sleep(pause.min(left).min(to_lease_end)).await;
            *reads += 1;
            match self.seen(key).await {
                Some(Seen::Changed) => return true,
                Some(Seen::Held(end)) => held_until = Some(end),
                // A failed read says nothing: the next one, later, may.
                None => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// One strongly consistent read of the held record (`None`: the read failed).
    async fn seen(&self, key: &OperationKey) -> Option<Seen> {
        let record = self.store.get(key).await.ok()?;
        let now = self.clock.now();
        Some(match record {
            Some(record)
                if record.status == Status::InProgress && !record.lease.is_expired(now) =>
            {
                Seen::Held(record.lease.expires_at)
            }
            _ => Seen::Changed,
        })
    }

    fn observe_wait(&self, key: &OperationKey, reads: u32, since: SystemTime) {
        if reads > 0 {
            self.observer.observe(&Observation::Waited {
                operation: key.operation(),
                reads,
                elapsed: self.elapsed_since(since),
            });
        }
    }
}

/// When a caller that started waiting at `since` stops: at its patience, and never past the
/// time it has left to run (its deadline, else its lease less the clock skew) less the margin
/// it needs to answer.
fn wait_until(invocation: &Invocation, since: SystemTime) -> SystemTime {
    let patience = since + invocation.wait_for_result.unwrap_or_default();
    let time_left = invocation
        .deadline
        .unwrap_or_else(|| since + invocation.lease.saturating_sub(invocation.clock_skew));
    patience.min(time_left.checked_sub(SETTLE_MARGIN).unwrap_or(since))
}
