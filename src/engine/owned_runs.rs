//! The runs of owned claims in flight in this process ([`Invocation::with_owner`]): one per
//! owner and key. An owner's invocations run one at a time (a durable execution's are invoked
//! one after the other), so a second run of the same owner and key at the same time is not a
//! replay but a sibling (a durable `map` or `parallel` branch: they share the execution's
//! ARN), and is answered as any duplicate is.
//!
//! A durable branch that parks (a wait, a callback) is dropped by the durable SDK while its
//! siblings go on in the same invocation: its run stays *parked* here, under its branch, for
//! up to [`INVOCATION_LIMIT`] (the longest an invocation runs), so that another branch is
//! still a sibling, while the same branch (the execution's replay of it) takes the run back.
//! A parked run whose claim went meanwhile (given back after a failure, released) parks
//! nothing: the engine starts the next run over.
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
    /// Durable runs dropped unfinished: their branch, and when.
    parked: HashMap<Entry, (String, Instant)>,
}

static RUNS: Mutex<Option<Runs>> = Mutex::new(None);

/// Runs `f` on this process's owned runs.
fn with_runs<R>(f: impl FnOnce(&mut Runs) -> R) -> R {
    let mut runs = RUNS.lock().unwrap_or_else(PoisonError::into_inner);
    f(runs.get_or_insert_with(Runs::default))
}

/// Why a run did not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// This process runs it.
    Running,
    /// It parked in another branch within the last [`INVOCATION_LIMIT`].
    ParkedInAnotherBranch,
}

/// An owned run in flight, until finished ([`OwnedRun::finish`]) or dropped.
#[derive(Debug)]
pub(super) struct OwnedRun {
    entry: Entry,
    /// A durable run's branch: dropped unfinished, the run parks under it.
    branch: Option<String>,
    finished: bool,
}

impl OwnedRun {
    /// Starts the run of `key` for the owner whose lease token is `token` (a durable
    /// execution's, in `branch`), unless this process runs it already or it parked in another
    /// branch.
    pub(super) fn start(
        key: &OperationKey,
        token: &str,
        branch: Option<&str>,
    ) -> Result<Self, Refused> {
        Self::start_with(key, token, branch, false)
    }

    /// [`Self::start`] of a run whose parked claim went (given back, released, expired):
    /// nothing of it stays parked.
    pub(super) fn start_unparked(
        key: &OperationKey,
        token: &str,
        branch: Option<&str>,
    ) -> Result<Self, Refused> {
        Self::start_with(key, token, branch, true)
    }

    fn start_with(
        key: &OperationKey,
        token: &str,
        branch: Option<&str>,
        unpark: bool,
    ) -> Result<Self, Refused> {
        let entry = (key.clone(), token.to_owned());
        with_runs(|runs| {
            runs.parked
                .retain(|_, (_, parked_at)| parked_at.elapsed() < INVOCATION_LIMIT);
            if let Some((parked_in, _)) = runs.parked.get(&entry) {
                if !unpark && branch.is_some_and(|branch| branch != parked_in) {
                    return Err(Refused::ParkedInAnotherBranch);
                }
                runs.parked.remove(&entry);
            }
            match runs.running.insert(entry.clone()) {
                true => Ok(()),
                false => Err(Refused::Running),
            }
        })?;
        // Built only once started (and the lock let go): a run dropped unstarted would end the
        // one in flight.
        Ok(Self {
            entry,
            branch: branch.map(str::to_owned),
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
        let parks = match &self.branch {
            Some(branch) if !self.finished && !std::thread::panicking() => Some(branch.clone()),
            _ => None,
        };
        with_runs(|runs| {
            runs.running.remove(&self.entry);
            if let Some(branch) = parks {
                runs.parked
                    .insert(self.entry.clone(), (branch, Instant::now()));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{OwnedRun, Refused};
    use crate::key::OperationKey;

    #[test]
    fn one_run_per_owner_and_key_until_it_ends() {
        let key = OperationKey::from_stored("owned-runs#test");
        let other = OperationKey::from_stored("owned-runs#other");
        let first = OwnedRun::start(&key, "owner-a", None).expect("the first run");
        assert_eq!(
            OwnedRun::start(&key, "owner-a", None).err(),
            Some(Refused::Running),
            "a sibling"
        );
        let another_key = OwnedRun::start(&other, "owner-a", None).expect("another key");
        let another_owner = OwnedRun::start(&key, "owner-b", None).expect("another owner");
        drop(first);
        assert!(
            OwnedRun::start(&key, "owner-a", None).is_ok(),
            "after it ended"
        );
        drop((another_key, another_owner));
    }

    #[test]
    fn a_parked_durable_run_is_taken_back_by_its_own_branch_only() {
        let key = OperationKey::from_stored("owned-runs#parked");
        drop(OwnedRun::start(&key, "owner-p", Some("branch-a")).expect("the first run"));
        assert_eq!(
            OwnedRun::start(&key, "owner-p", Some("branch-b")).err(),
            Some(Refused::ParkedInAnotherBranch),
            "another branch, beside the parked run"
        );
        let back = OwnedRun::start(&key, "owner-p", Some("branch-a")).expect("its own branch");
        back.finish();
        assert!(
            OwnedRun::start(&key, "owner-p", Some("branch-b")).is_ok(),
            "after the run finished"
        );
    }

    #[test]
    fn a_parked_run_whose_claim_went_is_started_over() {
        let key = OperationKey::from_stored("owned-runs#went");
        drop(OwnedRun::start(&key, "owner-w", Some("branch-a")).expect("the first run"));
        let over = OwnedRun::start_unparked(&key, "owner-w", Some("branch-b")).expect("over");
        over.finish();
        assert!(
            OwnedRun::start(&key, "owner-w", Some("branch-c")).is_ok(),
            "nothing stays parked"
        );
    }
}
