//! The runs of owned claims in flight in this process ([`Invocation::with_owner`]): one per
//! owner and key. An owner's invocations run one at a time (a durable execution's are invoked
//! one after the other), so a second run of the same owner and key at the same time is not a
//! replay but a sibling (a durable `map` or `parallel` branch: they share the execution's
//! ARN), and is answered as any duplicate is.
//!
//! A durable branch that parks (a wait, a callback) is dropped by the durable SDK while its
//! siblings go on in the same invocation: its run stays *parked* here for the rest of the
//! invocation (at most [`INVOCATION_LIMIT`]), so that a branch that never ran before is still
//! a sibling, while the execution's replay (its durable context replaying what the parked run
//! checkpointed) takes the run back.
//!
//! [`Invocation::with_owner`]: crate::Invocation::with_owner

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::key::OperationKey;

/// The longest a Lambda invocation runs: a run parked longer ago belongs to an invocation
/// that has ended.
const INVOCATION_LIMIT: Duration = Duration::from_secs(15 * 60);

/// An owned run: its key and its owner's lease token.
type Entry = (OperationKey, String);

/// The owned runs of this process.
#[derive(Default)]
struct Runs {
    /// In flight.
    running: HashSet<Entry>,
    /// Durable runs dropped unfinished, and when.
    parked: HashMap<Entry, Instant>,
}

static RUNS: Mutex<Option<Runs>> = Mutex::new(None);

/// Runs `f` on this process's owned runs.
fn with_runs<R>(f: impl FnOnce(&mut Runs) -> R) -> R {
    let mut runs = RUNS.lock().unwrap_or_else(PoisonError::into_inner);
    f(runs.get_or_insert_with(Runs::default))
}

/// An owned run in flight, until finished ([`OwnedRun::finish`]) or dropped.
#[derive(Debug)]
pub(super) struct OwnedRun {
    entry: Entry,
    /// A durable run (`replaying` known): dropped unfinished, it parks.
    durable: bool,
    finished: bool,
}

impl OwnedRun {
    /// Starts the run of `key` for the owner whose lease token is `token` (a durable
    /// execution's, its context `replaying` or not); `None` when this process runs it already,
    /// or when it parked in this invocation and this is a branch that never ran before.
    pub(super) fn start(key: &OperationKey, token: &str, replaying: Option<bool>) -> Option<Self> {
        let entry = (key.clone(), token.to_owned());
        let started = with_runs(|runs| {
            runs.parked
                .retain(|_, parked_at| parked_at.elapsed() < INVOCATION_LIMIT);
            if runs.parked.contains_key(&entry) {
                if replaying == Some(false) {
                    return false;
                }
                runs.parked.remove(&entry);
            }
            runs.running.insert(entry.clone())
        });
        // Built only once started (and the lock let go): a run dropped unstarted would end the
        // one in flight.
        started.then(|| Self {
            entry,
            durable: replaying.is_some(),
            finished: false,
        })
    }

    /// The run came to its answer: nothing of it stays parked.
    pub(super) fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for OwnedRun {
    fn drop(&mut self) {
        // A panic is no park: the engine gave the claim back for a reconciled takeover.
        let parks = self.durable && !self.finished && !std::thread::panicking();
        with_runs(|runs| {
            runs.running.remove(&self.entry);
            if parks {
                runs.parked.insert(self.entry.clone(), Instant::now());
            }
        });
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
        let first = OwnedRun::start(&key, "owner-a", None).expect("the first run");
        assert!(
            OwnedRun::start(&key, "owner-a", None).is_none(),
            "a sibling"
        );
        let another_key = OwnedRun::start(&other, "owner-a", None).expect("another key");
        let another_owner = OwnedRun::start(&key, "owner-b", None).expect("another owner");
        drop(first);
        assert!(
            OwnedRun::start(&key, "owner-a", None).is_some(),
            "after it ended"
        );
        drop((another_key, another_owner));
    }

    #[test]
    fn a_parked_durable_run_is_taken_back_by_a_replay_only() {
        let key = OperationKey::from_stored("owned-runs#parked");
        drop(OwnedRun::start(&key, "owner-p", Some(false)).expect("the first run"));
        assert!(
            OwnedRun::start(&key, "owner-p", Some(false)).is_none(),
            "a branch that never ran, beside the parked run"
        );
        let replay = OwnedRun::start(&key, "owner-p", Some(true)).expect("the replay");
        replay.finish();
        assert!(
            OwnedRun::start(&key, "owner-p", Some(false)).is_some(),
            "after the run finished"
        );
    }
}
