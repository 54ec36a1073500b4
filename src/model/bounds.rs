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
    /// How the handler makes its effect.
    pub(crate) handler: Handler,
    /// Whether every operation declares the same business identity (two keys for one order:
    /// a client that retried under a new idempotency key), or each its own.
    pub(crate) shared_identity: bool,
    /// How many outages, answers lost after commit, and crashes may happen.
    pub(crate) outages: u8,
    pub(crate) losses: u8,
    pub(crate) crashes: u8,
    /// How many invocations may be cancelled (or their handlers panic, unwinding) while they
    /// hold their lease, and how many handler runs may fail terminally.
    pub(crate) cancels: u8,
    pub(crate) declines: u8,
    /// How many completions may be refused: the condition of the writes the handler queued
    /// with its settlement fails, after its other effects happened.
    pub(crate) refusals: u8,
    /// A stepped handler's step: whether it has a check that reads the downstream truth (its
    /// effect landed or not), and whether its effect is sent and lands later, within the
    /// step's declared effect timeout (so that the step can time out with it in flight).
    pub(crate) checked: bool,
    pub(crate) late: bool,
    /// How many times the outbox relay may publish an event again (it died after publishing,
    /// before its stream's checkpoint moved on).
    pub(crate) republishes: u8,
}

/// How the model's handler makes its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handler {
    /// It acts directly, then settles.
    Direct,
    /// It keeps its effect in one step (intent, effect, result merged into the settlement),
    /// as `ExecutionContext::step` runs it.
    Stepped,
    /// Its effect is a DynamoDB write with an outbox event, committed with the settlement in
    /// one transaction, as `ExecutionContext::complete_with` commits them; a relay publishes
    /// the event to a consumer that deduplicates on its id.
    Transactional,
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
            handler: Handler::Stepped,
            ..Self::small()
        }
    }

    /// Two operations (two keys, each delivered once, one clock a tick ahead) that declare
    /// one business identity: the uniqueness table lets one of them act.
    pub(crate) fn two_operations() -> Self {
        Self {
            workers: vec![Spec::of(0, 0, true), Spec::of(1, 1, true)],
            shared_identity: true,
            ..Self::small()
        }
    }

    /// The same without the outage, where the invocation that would crash is cancelled (or
    /// its handler panics) and gives its claim back, and a handler run may fail terminally
    /// (its failure retained).
    pub(crate) fn giving_back() -> Self {
        Self {
            outages: 0,
            crashes: 0,
            cancels: 1,
            declines: 1,
            ..Self::small()
        }
    }

    /// One operation's stepped handler whose step has a check and whose effect lands late,
    /// within the step's effect timeout; a handler may fail retryably after its step (its
    /// claim given back with its steps) or be cancelled; no outage, lost answer or crash.
    pub(crate) fn late_effects() -> Self {
        Self {
            handler: Handler::Stepped,
            checked: true,
            late: true,
            max_time: 7,
            outages: 0,
            losses: 0,
            crashes: 0,
            cancels: 1,
            ..Self::small()
        }
    }

    /// A handler that acts directly and whose completion's writes may be refused, after its
    /// effect happened; no outage, lost answer or crash.
    pub(crate) fn refused_completions() -> Self {
        Self {
            refusals: 1,
            outages: 0,
            losses: 0,
            crashes: 0,
            ..Self::small()
        }
    }

    /// The same, with the handler's effect and its outbox event committed with its settlement,
    /// and a relay that may publish an event twice.
    pub(crate) fn transactional() -> Self {
        Self {
            handler: Handler::Transactional,
            republishes: 1,
            ..Self::small()
        }
    }

    /// Two deliveries of one operation, one clock a tick ahead, one deployment declaring a
    /// business identity and one not (a deploy that adds it): what CI checks.
    pub(crate) fn small() -> Self {
        Self {
            workers: vec![Spec::of(0, 0, false), Spec::of(0, 1, true)],
            handler: Handler::Direct,
            shared_identity: false,
            max_time: 9,
            lease: 3,
            retention: 2,
            outages: 1,
            losses: 1,
            crashes: 1,
            cancels: 0,
            declines: 0,
            refusals: 0,
            checked: false,
            late: false,
            republishes: 0,
        }
    }

    /// Three deliveries of one operation, two of them from deployments that declare a
    /// business identity, with the small bounds' faults and a tick more time.
    pub(crate) fn large() -> Self {
        Self {
            workers: vec![
                Spec::of(0, 0, false),
                Spec::of(0, 1, true),
                Spec::of(0, 0, true),
            ],
            max_time: 10,
            ..Self::small()
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
    /// The handler's writes were sent beside its settlement, not in its fenced transaction:
    /// they commit whether or not the lease still holds.
    UnfencedTransaction,
    /// A claim wrote its record but not its business identity's evidence: a second key for
    /// the same order ran too.
    IdentityNotClaimed,
    /// A give-back's shortening was not fenced on the cancelled attempt's token: sent late,
    /// it shortened the lease of the attempt that had taken over since.
    GiveBackUnfenced,
    /// A give-back after a step whose effect was in flight cut the lease to now (or to the
    /// cancellation's grace) instead of keeping it until the effect can have landed: the next
    /// attempt's check heard NotApplied before the effect landed and ran it again.
    GiveBackWithoutGrace,
    /// A takeover of an attempt that gave its claim back knowingly (its handler's retryable
    /// failure after its steps) was held INDETERMINATE under the default recovery, instead of
    /// replaying the done steps and checking the uncertain ones: an operator paged for nothing.
    GivenBackHeld,
    /// A completion whose writes' condition failed was released under the default recovery:
    /// the next delivery ran the handler, whose effects outside the completion had happened,
    /// again.
    RefusedCompletionReleased,
    /// An outbox event's id came from the key and step alone, not the execution: a later
    /// execution's event (after the first one's retention) was taken for the first one's.
    EventIdWithoutExecution,
    /// 0.4's outbox: nothing republished an event the stream gave up before it was published
    /// (no pending mark, no sweeper): the event was lost.
    NoSweeper,
}
