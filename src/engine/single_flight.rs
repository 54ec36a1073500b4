//! Single flight: concurrent callers of one operation key in this process take turns, so that a
//! copy waits for the first one's outcome (and replays it) instead of failing with
//! `AlreadyInProgress` and coming back as a redelivery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};

use crate::clock::{Clock, within};
use crate::key::OperationKey;

tokio::task_local! {
    /// The keys whose turns the running task holds, outermost first: a nested call for any of
    /// them (A inside A, or A inside B inside A) must not wait on itself.
    static HOLDING: Vec<OperationKey>;
}

/// One turn lock per key in flight, with the number of callers running or waiting on it; a
/// key's entry goes when its last caller leaves (also when a waiter is cancelled).
#[derive(Debug, Default)]
pub(super) struct SingleFlight {
    turns: Mutex<HashMap<OperationKey, InFlight>>,
}

/// A key's turn lock and how many callers run or wait on it.
type InFlight = (Arc<TurnLock<()>>, usize);

/// A caller's place on a key: released, and the entry cleaned, on drop.
pub(super) struct Turn<'a> {
    flight: &'a SingleFlight,
    key: OperationKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl SingleFlight {
    /// Runs `run` in `key`'s turn, after waiting at most `patience` for it (a caller that waited
    /// that long goes on and meets the store's answer, as without single flight), telling it
    /// whether it waited (another caller's turn came first). A call made from inside the turn
    /// of the same key runs at once.
    pub(super) async fn in_turn<T, Fut: Future<Output = T>>(
        &self,
        key: &OperationKey,
        clock: &dyn Clock,
        patience: Duration,
        run: impl FnOnce(bool) -> Fut,
    ) -> T {
        let mut held = HOLDING.try_with(Clone::clone).unwrap_or_default();
        if held.contains(key) {
            return run(false).await;
        }
        let mut turn = self.join(key);
        let lock = turn.lock();
        let waited = match Arc::clone(&lock).try_lock_owned() {
            Ok(guard) => {
                turn.guard = Some(guard);
                false
            }
            Err(_) => {
                turn.guard = within(clock, patience, lock.lock_owned()).await;
                true
            }
        };
        held.push(key.clone());
        HOLDING.scope(held, run(waited)).await
    }

    fn join(&self, key: &OperationKey) -> Turn<'_> {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns.entry(key.clone()).or_default().1 += 1;
        Turn {
            flight: self,
            key: key.clone(),
            guard: None,
        }
    }
}

impl Turn<'_> {
    fn lock(&self) -> Arc<TurnLock<()>> {
        let turns = self
            .flight
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        turns
            .get(&self.key)
            .map(|(lock, _)| Arc::clone(lock))
            .unwrap_or_default()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self
            .flight
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, callers)) = turns.get_mut(&self.key) {
            *callers = callers.saturating_sub(1);
            if *callers == 0 {
                turns.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(material: &str) -> OperationKey {
        let scope = crate::key::OperationScope::new("flight", "op").expect("scope");
        OperationKey::derive(&scope, None, material).expect("key")
    }

    /// A patience no test waits out: a call that waits on its own turn hangs the test.
    const FOREVER: Duration = Duration::from_secs(24 * 3600);

    #[tokio::test]
    async fn a_call_nested_under_its_own_turn_runs_at_once_however_deep() {
        let flight = SingleFlight::default();
        let (a, b) = (key("a"), key("b"));
        let clock = crate::clock::SystemClock;
        let nested = flight.in_turn(&a, &clock, FOREVER, |_| async {
            flight
                .in_turn(&b, &clock, FOREVER, |_| async {
                    flight
                        .in_turn(&a, &clock, FOREVER, |waited| async move {
                            assert!(!waited, "never waits on its own turn");
                            "A inside B inside A"
                        })
                        .await
                })
                .await
        });
        // A guard against a hang, not a timing: the nested call never waits.
        let ran = tokio::time::timeout(Duration::from_secs(30), nested)
            .await
            .expect("A inside B inside A waited on its own turn");
        assert_eq!(ran, "A inside B inside A");
        assert!(
            flight.turns.lock().expect("turns").is_empty(),
            "every turn left"
        );
    }
}
