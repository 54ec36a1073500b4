//! The sizes the model is checked at, and the historical defects it can put back.

/// One worker: the operation it is delivered, how far ahead its clock runs, whether its
/// deployment declares a business identity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) op: usize,
    pub(crate) skew: u64,
    pub(crate) identity: bool,
}

/// How large a world the checker explores.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    pub(crate) workers: Vec<Spec>,
    /// True time runs from tick 0 to this.
    pub(crate) max_time: u64,
    /// An invocation's lease and deadline, in ticks.
    pub(crate) lease: u64,
    /// A settled record's retention, in ticks.
    pub(crate) retention: u64,
    /// Whether the handler keeps its effect in one step (intent, effect, result merged into
    /// the settlement), as `ExecutionContext::step` runs it.
    pub(crate) stepped: bool,
    /// How many outages, answers lost after commit, and crashes may happen.
    pub(crate) outages: u8,
    pub(crate) losses: u8,
    pub(crate) crashes: u8,
}

impl Spec {
    /// A worker of operation `op`, its clock `skew` ticks ahead, declaring an identity or not.
    pub(crate) const fn of(op: usize, skew: u64, identity: bool) -> Self {
        Self { op, skew, identity }
    }
}

impl Bounds {
    /// How many operations the workers are delivered.
    pub(crate) fn ops(&self) -> usize {
        self.workers
            .iter()
            .map(|spec| spec.op + 1)
            .max()
            .unwrap_or(0)
    }

    /// The largest clock skew of any worker.
    pub(crate) fn max_skew(&self) -> u64 {
        self.workers.iter().map(|spec| spec.skew).max().unwrap_or(0)
    }

    /// The same, with the handler's effect in a step.
    pub(crate) fn stepped() -> Self {
        Self {
            stepped: true,
            ..Self::small()
        }
    }

    /// Two deliveries of one operation, one clock a tick ahead, one deployment declaring a
    /// business identity and one not (a deploy that adds it): what CI checks.
    pub(crate) fn small() -> Self {
        Self {
            workers: vec![Spec::of(0, 0, false), Spec::of(0, 1, true)],
            stepped: false,
            max_time: 9,
            lease: 3,
            retention: 2,
            outages: 1,
            losses: 1,
            crashes: 1,
        }
    }

    /// Three deliveries of one operation, one of them from a deployment that declares a
    /// business identity; more time, and two of each fault.
    pub(crate) fn large() -> Self {
        Self {
            workers: vec![
                Spec::of(0, 0, false),
                Spec::of(0, 1, true),
                Spec::of(0, 0, true),
            ],
            stepped: false,
            max_time: 12,
            lease: 3,
            retention: 2,
            outages: 1,
            losses: 2,
            crashes: 2,
        }
    }
}

/// A historical defect's decision, put back in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revert {
    /// A takeover kept the crashed attempt's retention expiry instead of one that outlives
    /// its new lease: TTL could delete a record under a live lease.
    TakeoverKeepsRetention,
    /// A claim counted any record past its retention as absent, IN_PROGRESS included: a
    /// crashed attempt's record expired into a blind re-run.
    InProgressExpires,
    /// A claim whose answer was lost did not recognise itself on the retry.
    OwnClaimUnrecognised,
    /// A settlement whose answer was lost did not recognise itself on the retry: `LeaseLost`.
    OwnSettlementUnrecognised,
    /// A settlement gave up after a fixed number of tries with its deadline still ahead.
    SettleGivesUpEarly,
    /// An attempt settled the identity its deployment declares instead of the one its
    /// operation recorded when it was claimed.
    IdentityFromDeployment,
    /// A takeover ran a recorded uncertain step (intent, no result) again without a check.
    UncertainStepRerun,
}
