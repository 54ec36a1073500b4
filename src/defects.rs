//! Historical defects put back into the real code, each behind a switch, so that the checks
//! of the real engine (the shuttle schedules, the seeded simulation) show that they find it
//! (feature `testing`; without it every switch is off and compiled away).
//!
//! A store's switch is put in the store that the check which finds it runs on: the memory
//! store (the shuttle schedules, the simulation's memory runs), or the DynamoDB store for
//! what only its conditions can get wrong (bytes another build encoded).
//!
//! A switch holds for the thread that turned it on, while what it runs runs: a test on a
//! current-thread runtime (or under shuttle, whose tasks share one thread) turns it on for
//! everything it runs, and tests running beside it on other threads never see it.
//!
//! ```
//! use lambda_idempotency::defects::{self, OWN_CLAIM_UNRECOGNISED};
//! let on = defects::reintroduced(OWN_CLAIM_UNRECOGNISED, || {
//!     defects::is_reintroduced(OWN_CLAIM_UNRECOGNISED)
//! });
//! assert!(on);
//! assert!(!defects::is_reintroduced(OWN_CLAIM_UNRECOGNISED));
//! ```

/// A claim whose answer was lost does not recognise itself on the retry.
pub const OWN_CLAIM_UNRECOGNISED: u32 = 1;
/// A settlement whose answer was lost does not recognise itself on the retry: `LeaseLost`.
pub const OWN_SETTLEMENT_UNRECOGNISED: u32 = 1 << 1;
/// A write after the effect (a settlement, a step's result, a release after the handler)
/// gives up after two tries with its deadline still ahead.
pub const SETTLE_GIVES_UP_EARLY: u32 = 1 << 2;
/// A claim counts any record past its retention as absent, IN_PROGRESS included: a crashed
/// attempt's record expires into a blind re-run. It reaches what reads a record in the crate
/// (the memory store, the cache, the engine), not the DynamoDB store's own conditions.
pub const IN_PROGRESS_EXPIRES: u32 = 1 << 3;
/// A takeover keeps the crashed attempt's retention expiry instead of one that outlives its
/// new lease: TTL may delete a record under a live lease.
pub const TAKEOVER_KEEPS_RETENTION: u32 = 1 << 4;
/// A give-back cuts the lease to now, whatever effect is in flight and without grace.
pub const GIVE_BACK_WITHOUT_GRACE: u32 = 1 << 5;
/// A takeover runs a recorded uncertain step (intent, no result) again without its check.
pub const UNCERTAIN_STEP_RERUN: u32 = 1 << 6;
/// A claim writes its record but not its business identity's evidence: a second key for the
/// same business identity runs too (the memory store's claim).
pub const IDENTITY_NOT_CLAIMED: u32 = 1 << 7;
/// The handler's writes commit beside the settlement or the step, not inside its fence: they
/// commit whether or not the lease still holds (the memory store's transactions).
pub const UNFENCED_TRANSACTION: u32 = 1 << 8;
/// A give-back's shortening is not fenced on the cancelled attempt's token: sent late, it
/// shortens the lease of the attempt that took over since (the memory store's `shorten`).
pub const GIVE_BACK_UNFENCED: u32 = 1 << 9;
/// A takeover does not read a knowing give-back's mark: an attempt that gave its claim back
/// after its steps is held for an operator under the default recovery instead of resumed.
pub const GIVEN_BACK_HELD: u32 = 1 << 10;
/// A completion whose writes' condition failed is released under the default recovery: the
/// next delivery runs the handler, whose effects outside the completion happened, again.
pub const REFUSED_COMPLETION_RELEASED: u32 = 1 << 11;
/// An attempt settles the business identity its deployment declares, not the one its
/// operation recorded when it was claimed.
pub const IDENTITY_FROM_DEPLOYMENT: u32 = 1 << 12;
/// An outbox event's id comes from the key and step alone, not the execution: a later
/// execution's event (after the first one's retention) is taken for the first one's.
pub const EVENT_ID_WITHOUT_EXECUTION: u32 = 1 << 13;
/// 0.4's outbox: the sweeper finds nothing, so an event the stream gave up before it was
/// published is never published.
pub const NO_SWEEPER: u32 = 1 << 14;
/// A takeover's condition compares the step list's bytes with the list as this build
/// re-encodes it, not its count and pending steps: a list another build wrote in other bytes
/// (another zstd level, a field added) is never taken over (the DynamoDB store's takeover).
pub const TAKEOVER_ON_REENCODED_BYTES: u32 = 1 << 15;
/// A completion transaction the store refuses as invalid (an item over 400 KB, what only
/// DynamoDB can tell) is taken for an outcome that could not be kept after its effect:
/// retained `outcome_unstorable` and answered `OutcomeTooLarge`, though nothing committed.
pub const REFUSED_TRANSACTION_APPLIED: u32 = 1 << 16;

#[cfg(feature = "testing")]
std::thread_local! {
    static ON: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `run` with `defects` (switches above, or-ed) on for this thread, and turns them off
/// again when it returns or unwinds.
#[cfg(feature = "testing")]
pub fn reintroduced<R>(defects: u32, run: impl FnOnce() -> R) -> R {
    /// Restores the switches as they were.
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON.with(|on| on.set(self.0));
        }
    }
    let _restore = Restore(ON.with(std::cell::Cell::get));
    ON.with(|on| on.set(on.get() | defects));
    run()
}

/// Whether `defect` is on for this thread.
#[cfg(feature = "testing")]
pub fn is_reintroduced(defect: u32) -> bool {
    ON.with(|on| on.get() & defect != 0)
}

/// Whether `defect` is on: never, without the `testing` feature.
#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) const fn is_reintroduced(_defect: u32) -> bool {
    false
}
