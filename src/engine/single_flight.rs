//! Single flight: concurrent callers of one operation key in this process take turns, so that a
//! copy waits for the first one's outcome (and replays it) instead of failing with
//! `AlreadyInProgress` and coming back as a redelivery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};

use crate::key::OperationKey;

/// One turn lock per key in flight; a key's entry goes when its last caller leaves.
#[derive(Debug, Default)]
pub(super) struct SingleFlight {
    turns: Mutex<HashMap<OperationKey, Arc<TurnLock<()>>>>,
}

/// A caller's turn on a key: held while it runs, released (and the entry cleaned) on drop.
pub(super) struct Turn<'a> {
    flight: &'a SingleFlight,
    key: OperationKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl SingleFlight {
    /// Waits for `key`'s turn, at most `patience` (a caller that waited that long goes on and
    /// meets the store's answer, as without single flight).
    pub(super) async fn turn(&self, key: &OperationKey, patience: Duration) -> Turn<'_> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(turns.entry(key.clone()).or_default())
        };
        let guard = tokio::time::timeout(patience, lock.lock_owned()).await.ok();
        Turn {
            flight: self,
            key: key.clone(),
            guard,
        }
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
        // Only the map holds the lock now: nobody runs or waits on this key.
        if turns
            .get(&self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            turns.remove(&self.key);
        }
    }
}
