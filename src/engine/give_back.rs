//! A held claim given back when the task running it is cancelled, and what a build that
//! aborts on panic gives instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tracing::warn;

use crate::clock::Clock;
use crate::key::OperationKey;
use crate::record::StepRecord;
use crate::store::{AnyStore, Fence, Guard, StoreExt, Target};

/// Until when an effect a step started may still land downstream (its start plus its declared
/// effect timeout, else the lease's end), shared by the attempt's ledger, which moves it, and
/// every way the claim is given back (a give-back after a failure, a panic, a cancellation),
/// none of which lets a takeover in before then.
#[derive(Debug, Clone, Default)]
pub(crate) struct LandsBy(Arc<Mutex<Option<SystemTime>>>);

impl LandsBy {
    /// The instant, if an effect may still land.
    pub(crate) fn get(&self) -> Option<SystemTime> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the instant (`None`: nothing left to land).
    pub(crate) fn set(&self, lands_by: Option<SystemTime>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = lands_by;
    }
}

/// The steps a takeover that has run nothing hands on if it ends before its handler runs:
/// the attempt it took over ended in a give-back's mark, which becomes its own
/// ([`decide::handed_on`](super::decide::handed_on)). Set as the takeover is sent, taken once
/// the handler may run.
#[derive(Debug, Default)]
pub(super) struct HandedOn(Mutex<Option<Vec<StepRecord>>>);

impl HandedOn {
    /// Sets (or clears) the steps handed on.
    pub(super) fn set(&self, steps: Option<Vec<StepRecord>>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = steps;
    }

    /// The steps handed on, if any, left in place.
    pub(super) fn get(&self) -> Option<Vec<StepRecord>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes the steps handed on, if any.
    pub(super) fn take(&self) -> Option<Vec<StepRecord>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Armed while an execution may hold its lease. Dropped armed (the execution's future was
/// cancelled: a timeout, a dropped request, an aborted task), it shortens the lease to a short
/// grace from now in a task of its own, so that the next delivery takes over (after
/// reconciliation) instead of waiting out the rest of the lease; a fresh claim whose handler
/// has not started (`unstarted`) is released whole instead, as a claim whose answer was lost
/// is: nothing ran under it, and a takeover would find no sign of that (under
/// `Recovery::Indeterminate` it would hold the operation for an operator).
/// It borrows what it needs and copies it only when it gives a claim back: an execution that
/// ends by itself (every duplicate) pays nothing for it.
pub(super) struct GiveBack<'a> {
    pub(super) store: &'a AnyStore,
    pub(super) clock: &'a dyn Clock,
    pub(super) spawner: Option<&'a super::Spawner>,
    pub(super) key: &'a OperationKey,
    pub(super) token: &'a str,
    pub(super) lease_expires_at: SystemTime,
    pub(super) lands_by: &'a LandsBy,
    pub(super) armed: bool,
    /// The identity a fresh claim writes evidence for, released with it.
    pub(super) identity: Option<&'a str>,
    /// Set while the claim is a fresh one (or being made) and no handler has started; cleared
    /// before a takeover, a re-entry or an adoption is sent, and before the handler runs.
    pub(super) unstarted: &'a AtomicBool,
    /// What a takeover cancelled before its handler ran writes before it gives the claim back.
    pub(super) handed_on: &'a HandedOn,
}

impl GiveBack<'_> {
    /// The execution ended by itself: nothing to give back.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let store = self.store.clone();
        let until = super::settle::given_back_until(
            self.clock.now(),
            self.lease_expires_at,
            self.lands_by.get(),
        );
        let key = self.key.clone();
        let token = self.token.to_owned();
        let unstarted = self
            .unstarted
            .load(Ordering::SeqCst)
            .then(|| self.identity.map(str::to_owned));
        let handed_on = self.handed_on.take();
        let give_back = Box::pin(async move {
            if let Some(identity) = unstarted {
                let target = Target {
                    key: &key,
                    identity: identity.as_deref(),
                    guard: Guard::Lease(&token),
                };
                match store.release(target).await {
                    Ok(Fence::Held) => {
                        warn!(
                            key = key.short(),
                            "cancelled before the handler ran: claim released"
                        );
                    }
                    Ok(Fence::Lost { .. }) => {}
                    Err(err) => {
                        warn!(key = key.short(), error = %err, "cancelled: could not release the claim; it waits out its lease")
                    }
                }
                return;
            }
            let target = Target {
                key: &key,
                identity: None,
                guard: Guard::Lease(&token),
            };
            if let Some(steps) = handed_on {
                // Fenced on the takeover's token: written only if the takeover committed.
                let _ = store.record_steps(target, &steps).await;
            }
            match store.shorten(target, until).await {
                Ok(Fence::Held) => warn!(key = key.short(), "cancelled: claim given back"),
                Ok(Fence::Lost { .. }) => {}
                Err(err) => {
                    warn!(key = key.short(), error = %err, "cancelled: could not give the claim back; it waits out its lease")
                }
            }
        });
        match (self.spawner, tokio::runtime::Handle::try_current()) {
            (Some(spawn), _) => spawn(give_back),
            (None, Ok(runtime)) => drop(runtime.spawn(give_back)),
            (None, Err(_)) => {
                warn!("cancelled with a held claim and no runtime to give it back");
            }
        }
    }
}

/// What an engine says once, when it is built, in a build whose panics abort the process
/// (`panic = "abort"`, which `cargo lambda build` sets unless the release profile names a
/// strategy): a panicking handler then kills the process before its claim is given back, and
/// the claim holds for the rest of its lease (up to 15 minutes) before a takeover.
pub(super) fn abort_warning(panics_abort: bool) -> Option<&'static str> {
    panics_abort.then_some(
        "this build aborts on panic: a panicking handler's claim is held until its lease runs out (up to the Lambda timeout) instead of being given back; set panic = \"unwind\" in [profile.release]",
    )
}

/// Logs [`abort_warning`] for this build, once per process.
pub(super) fn warn_once_if_panics_abort() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if let Some(warning) = abort_warning(cfg!(panic = "abort")) {
        ONCE.call_once(|| warn!("{warning}"));
    }
}

#[cfg(test)]
mod tests {
    use super::abort_warning;

    #[test]
    fn only_a_build_that_aborts_on_panic_is_warned() {
        assert_eq!(
            abort_warning(cfg!(panic = "abort")).is_some(),
            cfg!(panic = "abort")
        );
        let warning = abort_warning(true).expect("a warning under abort");
        assert!(warning.contains("panic = \"unwind\""), "{warning}");
        assert!(abort_warning(false).is_none());
    }
}
