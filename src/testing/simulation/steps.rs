//! Playing a step: a delivery of an operation to a worker (its invocation, a new life when
//! nothing remembers the operation, the handler run on a task, parked when it crashes or
//! suspends), a resumption of a suspended handler, a clock jump, a TTL sweep, an operator's
//! resolution of what is INDETERMINATE, a step list rewritten as another build encodes it, a
//! delivery with a neighbouring amount; and what each caller was answered, noted and judged:
//! every answer by invariants.rs's judge, and, for the paths the decision table names, against the
//! table (a knowing give-back after a done step replays, a refused completion without steps is
//! held under the default, a re-encoded step list is taken over).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::actors::{AfterTimeout, Behaviour, MAX_SKEW, Run, Skewed, handler, lock};
use super::invariants::{Before, Judged};
use super::ledger::Profile;
use super::world::{Absence, Action, Deploy, LEASE, Planned, World, error_name};
use crate::clock::Clock;
use crate::engine::{Operator, Resolution};
use crate::error::{BoxError, Error};
use crate::execution::{Execution, Invocation, Origin};
use crate::key::JsonPointer;
use crate::reconcile::Recovery;
use crate::record::{Status, StepRecord, epoch_secs};
use crate::store::{Store, StoreExt};
use crate::testing::faults::{FaultKind, Primitive};

/// How long before its lease runs out a worker's invocation is killed (the lease policy's skew).
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// A handler stopped at a point of its choosing.
pub(super) struct Parked {
    pub(super) task: JoinHandle<Delivered>,
    resume: Option<oneshot::Sender<()>>,
    deadline: SystemTime,
    op: usize,
    /// The evidence key of the identity its invocation declared.
    identity: Option<String>,
    /// The run's figures as its delivery began: what happens to it when resumed is judged
    /// from there.
    before: Before,
}

/// How a delivery ended for its caller.
pub(super) enum Delivered {
    Answered(Result<Execution<Value>, Error>),
    Cancelled,
}

/// What a delivery is watched for, from the record as the last check saw it.
#[derive(Debug, Clone, Copy, Default)]
struct Watch {
    /// It is the first to meet an attempt that gave its claim back knowingly after a done
    /// step (that attempt's number).
    given_back: Option<u32>,
    /// It meets an attempt whose step list another build encoded, with its lease run out on
    /// every worker's clock.
    re_encoded: bool,
}

/// What a delivery's judgement needs besides its answer.
struct Delivery {
    op: usize,
    behaviour: Behaviour,
    profile: Profile,
    watch: Watch,
    /// No fault fired and no outage began: every write it made was answered.
    clean: bool,
}

impl<S: Store + Clone> World<S> {
    /// Plays one step.
    pub(super) async fn play(&mut self, action: Action) {
        self.trace.push(format!("{action:?}"));
        self.stats.steps += 1;
        self.touched.iter_mut().for_each(|touched| *touched = false);
        match action {
            Action::Deliver {
                op,
                worker,
                behaviour,
                fault,
                outage,
                deploy,
                answer,
            } => {
                lock(&self.shared).answer = answer;
                if let Some((primitive, fault)) = fault {
                    self.store.inject(primitive, fault);
                }
                *self.stats.deploys.entry(format!("{deploy:?}")).or_default() += 1;
                self.deliver(op, worker, behaviour, outage, deploy).await;
                self.store.clear();
                // A step's effect may be in flight: its operation again at once, and again
                // 7 s later (past a cancellation's 5 s grace, inside a 10 s declared timeout,
                // before the latest effects land).
                if let Behaviour::LateEffect { .. } = behaviour {
                    self.planned = [
                        Planned::Deliver(op),
                        Planned::Advance(Duration::from_secs(7)),
                        Planned::Deliver(op),
                    ]
                    .into();
                }
            }
            Action::Resume(index) => self.resume(index).await,
            Action::Advance(by) => self.clock.advance(by),
            Action::Sweep => self.sweep().await,
            Action::Resolve => self.resolve_indeterminate().await,
            Action::ReEncode(encoding) => self.re_encode(encoding).await,
            Action::ChangedAmount(op) => self.changed_amount(op).await,
            #[cfg(feature = "relay")]
            Action::Relay(_) | Action::StreamGivesUp | Action::SweepOutbox(_) => {
                self.play_outbox(action).await;
            }
        }
    }

    /// The invocation a delivery of `op` makes after `deploy`, with `deadline`.
    fn invocation(&self, op: usize, deploy: Deploy, deadline: SystemTime) -> Invocation {
        let spec = &self.specs[op];
        let added = || format!("sim:{}:{op}:added", self.seed);
        let identity = match deploy {
            Deploy::AsDeclared => spec.identity.clone(),
            Deploy::AddsIdentity => Some(spec.identity.clone().unwrap_or_else(added)),
            Deploy::RemovesIdentity => None,
            Deploy::ChangesIdentity => Some(
                spec.identity
                    .as_ref()
                    .map_or_else(added, |identity| format!("{identity}:v2")),
            ),
        };
        let invocation = Invocation::new(spec.key.clone(), spec.fingerprint.clone(), LEASE)
            .with_earlier_key(spec.earlier.clone())
            .with_deadline(deadline);
        match (identity, JsonPointer::new("/op")) {
            (Some(identity), Ok(pointer)) => invocation
                .with_identity(identity)
                .expect("a valid identity")
                .with_result_ref(pointer),
            _ => invocation,
        }
    }

    /// A TTL sweep: every record expired at the world's time may go, and its absence is
    /// excused from then on (until a claim writes a record again).
    async fn sweep(&mut self) {
        self.observe_existence();
        let now = self.clock.now();
        let mut expired = Vec::new();
        for op in 0..self.specs.len() {
            let record = self.store.inner().get(&self.specs[op].key).await;
            if let Ok(Some(record)) = record
                && record.is_expired(now)
            {
                expired.push(op);
            }
        }
        let swept = (self.sweep)().await;
        for op in expired {
            self.absence[op] = Absence::Swept;
        }
        self.note(format!("swept {swept}"));
    }

    /// Before a delivery: whether nothing remembers the operation by design, so that its next
    /// run is a new life. By the contract: its record is settled (COMPLETED, FAILED) with its
    /// retention passed (second resolution, on the worker's clock), or gone where a release or
    /// a TTL sweep after its expiry removed it (or nothing claimed it yet), and no evidence
    /// stands for the identity this delivery declares. A record gone otherwise is a broken
    /// invariant, never a new life. (A forgotten record beside the evidence of an unsettled
    /// execution is no new life either: that execution is adopted, and the forgotten record's
    /// outcome no longer counts.)
    async fn is_forgotten(&mut self, op: usize, invocation: &Invocation, worker: usize) -> bool {
        self.observe_existence();
        let Ok(record) = self.store.inner().get(invocation.key()).await else {
            return false;
        };
        if record.is_none() {
            // A give-back released in a task of its own may have applied since the account
            // above was taken: take it again, after the read.
            self.observe_existence();
        }
        if record.is_none() && self.absence[op] == Absence::Stands {
            self.pending_violation.get_or_insert(format!(
                "operation {op}: its record is missing, though no release, operator or TTL sweep after its expiry removed it"
            ));
            return false;
        }
        let now = Skewed::of(&self.clock, worker).now();
        let record_forgotten = record.as_ref().is_none_or(|record| {
            matches!(record.status, Status::Completed | Status::Failed)
                && epoch_secs(record.expires_at) < epoch_secs(now)
        });
        let Some(evidence_key) = invocation.evidence_key() else {
            return record_forgotten;
        };
        match self.store.inner().evidence(&evidence_key).await {
            Ok(None) => record_forgotten,
            // The evidence of an unsettled execution of this key (an earlier one, whose record
            // TTL swept with its attempt unsettled, before a delivery that declared another
            // identity, or none, ran afresh and completed): this delivery adopts that
            // execution, which recorded no outcome. The forgotten record's outcome is no
            // longer this life's, by design.
            Ok(Some(evidence))
                if record_forgotten
                    && evidence.key == *invocation.key()
                    && !evidence.status.is_settled() =>
            {
                self.life_outcomes[op].clear();
                false
            }
            _ => false,
        }
    }

    /// Delivers `op` to `worker`; the answer, when the caller got one in this step.
    pub(super) async fn deliver(
        &mut self,
        op: usize,
        worker: usize,
        behaviour: Behaviour,
        outage: Option<Duration>,
        deploy: Deploy,
    ) -> Option<Result<Execution<Value>, Error>> {
        self.touched[op] = true;
        let watch = self.watch(op);
        let before = self.before(op);
        let faults_before = before.faults;
        let worker_clock = Skewed::of(&self.clock, worker);
        let deadline_on_worker = worker_clock.now() + LEASE - DEADLINE_MARGIN;
        let invocation = self.invocation(op, deploy, deadline_on_worker);
        let identity = invocation.evidence_key();
        if self.is_forgotten(op, &invocation, worker).await {
            self.new_life(op);
        }
        self.stats.deliveries += 1;
        *self.stats.behaviours.entry(behaviour.name()).or_default() += 1;
        let (parked_tx, mut parked_rx) = mpsc::unbounded_channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        let spec = &self.specs[op];
        let (idem, profile) = match (spec.transactional, spec.stepped) {
            (true, _) => self.transactional[worker].clone(),
            (false, true) => self.stepped[worker].clone(),
            (false, false) => self.workers[worker].clone(),
        };
        let invocation = profile.declared_on(invocation, &self.shared);
        let (transactional, tables) = (spec.transactional, self.tables.clone());
        // The reconciler and the steps' checks read the ledger: it is told what the handler's
        // tables show first.
        self.observe_transactions().await;
        let outage_end = Arc::new(std::sync::Mutex::new(None));
        let after_effect: Box<dyn FnOnce() + Send> = match outage {
            Some(length) => {
                let (store, clock, end, started) = (
                    self.store.clone(),
                    self.clock.clone(),
                    Arc::clone(&outage_end),
                    Arc::clone(&self.outages_started),
                );
                Box::new(move || {
                    started.fetch_add(1, Ordering::Relaxed);
                    let until = clock.now() + length;
                    let primitives = [Primitive::Settle, Primitive::Release];
                    store.outage(&primitives, FaultKind::Throttled, until, clock);
                    *end.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(until);
                })
            }
            None => Box::new(|| {}),
        };
        let run = Run {
            shared: Arc::clone(&self.shared),
            op,
            life: lock(&self.shared).ledger.life(op),
            transactional,
            tables,
            profile,
            behaviour,
            after_effect,
            parked: parked_tx,
            resume: resume_rx,
        };
        let store = self.store.clone();
        let deadline = self.clock.now() + LEASE - DEADLINE_MARGIN;
        let mut task = tokio::spawn(async move {
            let execution = idem.execute(&invocation, move |ctx| handler(run, ctx));
            match store.cancellable(execution).await {
                Some(answer) => Delivered::Answered(answer),
                None => Delivered::Cancelled,
            }
        });
        let answer = tokio::select! {
            joined = &mut task => {
                let outage_end = *outage_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let answer_mode = lock(&self.shared).answer;
                let judged = Judged {
                    op,
                    behaviour,
                    deadline,
                    outage_end,
                    other_intent: false,
                    identity: identity.clone(),
                    answer: answer_mode,
                    before,
                };
                self.answered(judged, joined).await
            }
            Some(()) = parked_rx.recv() => {
                match behaviour {
                    Behaviour::CancelAfterEffect
                    | Behaviour::LateEffect { then: AfterTimeout::Cancelled, .. } => {
                        task.abort();
                        let _ = task.await;
                        self.note("cancelled after the effect".into());
                    }
                    Behaviour::SuspendBeforeEffect | Behaviour::SuspendAfterEffect => {
                        self.note(format!("suspended as #{}", self.suspended.len()));
                        self.suspended.push(Parked { task, resume: Some(resume_tx), deadline, op, identity, before });
                    }
                    _ => {
                        self.note("crashed".into());
                        self.frozen.push(task);
                    }
                }
                None
            }
        };
        let clean = outage.is_none() && self.faults_fired() == faults_before;
        let delivery = Delivery {
            op,
            behaviour,
            profile,
            watch,
            clean,
        };
        self.judge_delivery(delivery, answer.as_ref()).await;
        answer
    }

    /// Faults fired so far in the run (outages' failures included).
    fn faults_fired(&self) -> u64 {
        self.store.fired().values().sum()
    }

    /// The run's figures now, as a delivery of `op` begins.
    fn before(&self, op: usize) -> Before {
        let faults = self.faults_fired();
        let downstream = lock(&self.shared);
        Before {
            faults,
            decided: downstream.decisions[op],
            refusals: downstream.refusals,
            earlier_lives: downstream.applied_for_earlier_lives[op],
        }
    }

    /// What a delivery of `op` is watched for, from the record as the last check saw it (a
    /// watched attempt no longer standing is forgotten), and, under the 0.1 rule, whether it
    /// meets its anchor's record.
    fn watch(&mut self, op: usize) -> Watch {
        let now = self.clock.now();
        let standing = self.last_seen[op]
            .as_ref()
            .filter(|record| record.status == Status::InProgress);
        let meets = |token: &str| standing.is_some_and(|record| record.lease.token == token);
        let mut watch = Watch::default();
        match &self.given_back[op] {
            Some((token, attempt)) if meets(token) => watch.given_back = Some(*attempt),
            Some(_) => self.given_back[op] = None,
            None => {}
        }
        match &self.re_encoded[op] {
            Some(token) if meets(token) => {
                watch.re_encoded = standing.is_some_and(|record| {
                    record.lease.expires_at + MAX_SKEW + Duration::from_secs(1) < now
                });
            }
            Some(_) => self.re_encoded[op] = None,
            None => {}
        }
        // Under the 0.1 rule, an id whose 0.1 key is its anchor's, while the anchor's record
        // (written by today's code) stands: the path that once merged them.
        let anchor = self.specs[op].anchor;
        if self.compatible
            && anchor.is_some_and(|anchor| {
                self.last_seen[anchor]
                    .as_ref()
                    .is_some_and(|record| !record.counts_as_absent(now))
            })
        {
            self.stats.anchors += 1;
        }
        watch
    }

    /// Judges a delivery by the decision table, where its path is one the table names: the
    /// first delivery to meet a knowing give-back after a done step replays its steps (never
    /// held INDETERMINATE, never handed to the reconciler); a refused completion without steps
    /// is held under the default, never released for a blind re-run; an attempt whose step
    /// list another build encoded is taken over once its lease ran out. Notes the knowing
    /// give-backs to watch, and counts the paths walked.
    async fn judge_delivery(
        &mut self,
        delivery: Delivery,
        answer: Option<&Result<Execution<Value>, Error>>,
    ) {
        let Delivery {
            op,
            behaviour,
            profile,
            watch,
            clean,
        } = delivery;
        let (failed_after_step, refused_completion, in_flight) = {
            let mut downstream = lock(&self.shared);
            (
                downstream.failed_after_step.take(),
                downstream.refused_completion.take(),
                downstream.in_flight(op),
            )
        };
        if in_flight && matches!(answer, Some(Err(Error::AlreadyInProgress { .. }))) {
            self.stats.graces += 1;
        }
        if let Some(attempt) = watch.given_back {
            // The first takeover of a transactional operation (attempt 2) has its completion
            // refused by design: held under the default, as the table says.
            let refused_by_design = self.specs[op].transactional && attempt == 1;
            let broken = match answer {
                Some(Err(Error::Indeterminate { .. })) if !refused_by_design => {
                    Some("held it INDETERMINATE")
                }
                Some(Ok(done)) if matches!(done.origin(), Origin::Reconciled { .. }) => {
                    Some("handed it to the reconciler")
                }
                Some(Ok(done)) if matches!(done.origin(), Origin::Executed { .. }) => {
                    self.stats.give_backs_replayed += 1;
                    self.given_back[op] = None;
                    None
                }
                _ => None,
            };
            if let Some(broken) = broken {
                self.pending_violation.get_or_insert(format!(
                    "operation {op}: attempt {attempt} gave its claim back after a done step (its handler's retryable failure), yet the next delivery {broken} instead of replaying its steps"
                ));
            }
        }
        if watch.re_encoded && clean {
            let key = self.specs[op].key.clone();
            let after = self.store.inner().get(&key).await.ok().flatten();
            let tracked = self.re_encoded[op].clone();
            match after {
                Some(after) if Some(&after.lease.token) != tracked.as_ref() => {
                    self.stats.re_encoded_takeovers += 1;
                    self.re_encoded[op] = None;
                }
                Some(_) if matches!(answer, Some(Err(Error::AlreadyInProgress { .. }))) => {
                    self.pending_violation.get_or_insert(format!(
                        "operation {op}: its step list, encoded as another build encodes it, is never taken over: its lease ran out on every worker's clock, yet the delivery answered AlreadyInProgress"
                    ));
                }
                _ => {}
            }
        }
        if let Some((noted, attempt)) = failed_after_step
            && noted == op
            && clean
            && matches!(answer, Some(Err(Error::Handler { .. })))
        {
            // An adopted record's steps are lost (its crashed attempt's went with TTL): the
            // table leaves its takeovers to the reconciler or an operator, given back or not.
            let key = self.specs[op].key.clone();
            let after = self.store.inner().get(&key).await.ok().flatten();
            if let Some(after) = after.filter(|after| {
                after.status == Status::InProgress
                    && after.lease.attempt == attempt
                    && !after.steps.iter().any(StepRecord::marks_steps_lost)
            }) {
                self.given_back[op] = Some((after.lease.token, attempt));
            }
        }
        if refused_completion == Some(op) && behaviour == Behaviour::RefusedCompletion {
            match answer {
                Some(Err(Error::Indeterminate { .. })) => self.stats.refused_completions += 1,
                Some(Err(Error::Handler { .. })) => {
                    self.stats.refused_completions += 1;
                    if clean && profile.recovery == Recovery::Indeterminate {
                        self.pending_violation.get_or_insert(format!(
                            "operation {op}: its completion was refused after an effect outside it, without steps, under the default recovery: released for a blind re-run instead of held"
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    /// A delivery of `op`'s key with a neighbouring amount (equal to its own above 2^53 only)
    /// while its record stands: it must be refused as a payload conflict, its handler never run.
    pub(super) async fn changed_amount(&mut self, op: usize) {
        let spec = &self.specs[op];
        let Some(fingerprint) = spec.neighbouring_amount.clone() else {
            self.note(format!("op {op} has no neighbouring amount"));
            return;
        };
        let now = self.clock.now();
        let stands = self.last_seen[op].as_ref().is_some_and(|record| {
            !record.counts_as_absent(now + MAX_SKEW + Duration::from_secs(1))
        });
        if !stands {
            self.note(format!("op {op}: no record to conflict with"));
            return;
        }
        let (idem, profile) = match (spec.transactional, spec.stepped) {
            (true, _) => self.transactional[0].clone(),
            (false, true) => self.stepped[0].clone(),
            (false, false) => self.workers[0].clone(),
        };
        let invocation = Invocation::new(spec.key.clone(), fingerprint, LEASE)
            .with_earlier_key(spec.earlier.clone())
            .with_deadline(now + LEASE - DEADLINE_MARGIN);
        let invocation = profile.declared_on(invocation, &self.shared);
        let ran = Arc::new(AtomicBool::new(false));
        let running = Arc::clone(&ran);
        let answer_mode = lock(&self.shared).answer;
        let judged = Judged {
            op,
            behaviour: Behaviour::Complete,
            deadline: now + LEASE - DEADLINE_MARGIN,
            outage_end: None,
            other_intent: true,
            identity: None,
            answer: answer_mode,
            before: self.before(op),
        };
        let answer = idem
            .execute(&invocation, move |_ctx| async move {
                running.store(true, Ordering::SeqCst);
                Ok::<_, BoxError>(json!({"op": op, "changed": true}))
            })
            .await;
        let answered = match &answer {
            Ok(done) => format!("{:?}", done.origin()),
            Err(err) => error_name(err),
        };
        self.note(format!("answered {answered}"));
        if let Some(untruthful) = self.judge(&judged, &answer).await {
            self.pending_violation.get_or_insert(untruthful);
        } else if ran.load(Ordering::SeqCst) {
            self.pending_violation.get_or_insert(format!(
                "operation {op}: a delivery of its key with a neighbouring amount (equal to its own above 2^53 only) ran its handler"
            ));
        } else {
            self.stats.changed_amounts += 1;
        }
    }

    pub(super) async fn resume(&mut self, index: usize) {
        if index >= self.suspended.len() {
            return;
        }
        let mut parked = self.suspended.remove(index);
        self.touched[parked.op] = true;
        if self.clock.now() > parked.deadline {
            self.note("past its deadline: the invocation was killed".into());
            self.frozen.push(parked.task);
            return;
        }
        if let Some(resume) = parked.resume.take() {
            let _ = resume.send(());
        }
        let joined = (&mut parked.task).await;
        let answer_mode = lock(&self.shared).answer;
        let judged = Judged {
            op: parked.op,
            behaviour: Behaviour::Complete,
            deadline: parked.deadline,
            outage_end: None,
            other_intent: false,
            identity: parked.identity.take(),
            answer: answer_mode,
            before: parked.before,
        };
        self.answered(judged, joined).await;
    }

    /// Notes what the caller was told and checks it against the downstream truth and the
    /// store; the answer, when there was one.
    async fn answered(
        &mut self,
        judged: Judged,
        joined: Result<Delivered, tokio::task::JoinError>,
    ) -> Option<Result<Execution<Value>, Error>> {
        let answer = match joined {
            Ok(Delivered::Answered(answer)) => answer,
            Ok(Delivered::Cancelled) => {
                self.note("cancelled by a store fault".into());
                return None;
            }
            Err(err) if err.is_panic() => {
                self.note("the handler panicked".into());
                return None;
            }
            Err(_) => {
                self.note("aborted".into());
                return None;
            }
        };
        let line = match &answer {
            Ok(done) => format!("answered {:?}", done.origin()),
            Err(err) => format!("answered {}", error_name(err)),
        };
        self.note(line);
        self.observe_transactions().await;
        if let Some(untruthful) = self.judge(&judged, &answer).await {
            self.pending_violation.get_or_insert(untruthful);
        }
        if let Ok(done) = &answer
            && !matches!(done.origin(), Origin::Replayed)
        {
            self.outcome_recorded(judged.op, done.raw_json().get().as_bytes());
        }
        Some(answer)
    }

    pub(super) async fn resolve_indeterminate(&mut self) {
        self.observe_transactions().await;
        for op in 0..self.specs.len() {
            let key = self.specs[op].key.clone();
            let Ok(Some(record)) = self.store.inner().get(&key).await else {
                continue;
            };
            if record.status != Status::Indeterminate {
                continue;
            }
            self.touched[op] = true;
            let applied = lock(&self.shared).ledger.effects(op) > 0;
            let resolution = match applied {
                true => Resolution::Completed(json!({"op": op, "resolved": true})),
                false => Resolution::Release,
            };
            let operator = Operator::new("simulation").expect("an operator");
            let resolved = self.workers[0]
                .0
                .resolve::<Value>(&key, resolution, &operator)
                .await;
            if !applied && matches!(resolved, Ok(true)) {
                lock(&self.shared).ledger.operator_released(op);
            }
            self.note(format!("operator resolved op {op}: {resolved:?}"));
        }
    }
}
