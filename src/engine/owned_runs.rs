//! The runs of owned claims in flight in this process ([`Invocation::with_owner`]): one per
//! owner and key. An owner's invocations run one at a time (a durable execution's are invoked
//! one after the other), so a second run of the same owner and key at the same time is not a
//! replay but a sibling (a durable `map` or `parallel` branch: they share the execution's
//! ARN), and is answered as any duplicate is.
//!
//! [`Invocation::with_owner`]: crate::Invocation::with_owner

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use crate::key::OperationKey;

/// The owned runs in flight: (key, the owner's lease token).
static IN_FLIGHT: Mutex<Option<HashSet<(OperationKey, String)>>> = Mutex::new(None);

/// An owned run in flight, until dropped.
#[derive(Debug)]
pub(super) struct OwnedRun {
    entry: (OperationKey, String),
}

impl OwnedRun {
    /// Starts the run of `key` for the owner whose lease token is `token`; `None` when this
    /// process already runs it.
    pub(super) fn start(key: &OperationKey, token: &str) -> Option<Self> {
        let entry = (key.clone(), token.to_owned());
        let started = IN_FLIGHT
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashSet::new)
            .insert(entry.clone());
        // Built only once started (and the lock let go): a run dropped unstarted would end the
        // one in flight.
        started.then(|| Self { entry })
    }
}

impl Drop for OwnedRun {
    fn drop(&mut self) {
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(in_flight) = in_flight.as_mut() {
            in_flight.remove(&self.entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OwnedRun;
    use crate::key::OperationKey;

    #[test]
    fn one_run_per_owner_and_key_until_it_ends() {
        let key = OperationKey::from_stored("owned-runs#test");
        let other = OperationKey::from_stored("owned-runs#other");
        let first = OwnedRun::start(&key, "owner-a").expect("the first run");
        assert!(OwnedRun::start(&key, "owner-a").is_none(), "a sibling");
        let another_key = OwnedRun::start(&other, "owner-a").expect("another key");
        let another_owner = OwnedRun::start(&key, "owner-b").expect("another owner");
        drop(first);
        assert!(OwnedRun::start(&key, "owner-a").is_some(), "after it ended");
        drop((another_key, another_owner));
    }
}
