//! One attempt of an execution: the context its handler holds ([`ExecutionContext`]), the
//! step builder ([`Step`]) and the ledger that records the attempt's steps, completion writes
//! and why it stopped, fenced on the attempt's lease.

mod context;
mod ledger;
mod step;

pub use self::context::ExecutionContext;
pub(crate) use self::ledger::{Halt, StepLedger};
pub use self::step::Step;
