//! Playing a step: a delivery of an operation to a worker (its invocation, a new life when
//! nothing remembers the operation, the handler run on a task, parked when it crashes or
//! suspends), a resumption of a suspended handler, a clock jump, a TTL sweep, an operator's
//! resolution of what is INDETERMINATE; and what each caller was answered, noted and judged.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::actors::{Behaviour, Run, Skewed, handler, lock};
use super::invariants::Judged;
use super::world::{Action, Deploy, LEASE, World, error_name};
use crate::clock::Clock;
use crate::engine::{Operator, Resolution};
use crate::error::Error;
use crate::execution::{Execution, Invocation};
use crate::key::JsonPointer;
use crate::record::{Status, epoch_secs};
use crate::store::Store;
use crate::testing::faults::{FaultKind, Primitive};

/// How long before its lease runs out a worker's invocation is killed (the lease policy's skew).
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// A handler stopped at a point of its choosing.
pub(super) struct Parked {
    pub(super) task: JoinHandle<Delivered>,
    resume: Option<oneshot::Sender<()>>,
    deadline: SystemTime,
    op: usize,
}

/// How a delivery ended for its caller.
pub(super) enum Delivered {
    Answered(Result<Execution<Value>, Error>),
    Cancelled,
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
            }
            Action::Resume(index) => self.resume(index).await,
            Action::Advance(by) => self.clock.advance(by),
            Action::Sweep => {
                let swept = (self.sweep)().await;
                self.note(format!("swept {swept}"));
            }
            Action::Resolve => self.resolve_indeterminate().await,
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
            .with_deadline(deadline);
        match (identity, JsonPointer::new("/op")) {
            (Some(identity), Ok(pointer)) => invocation
                .with_identity(identity)
                .expect("a valid identity")
                .with_result_ref(pointer),
            _ => invocation,
        }
    }

    /// Before a delivery: whether nothing remembers the operation by design, so that its next
    /// run is a new life. By the contract: its record is gone, or settled (COMPLETED, FAILED)
    /// with its retention passed (second resolution, on the worker's clock), and no evidence
    /// stands for the identity this delivery declares.
    async fn is_forgotten(&self, invocation: &Invocation, worker: usize) -> bool {
        let Ok(record) = self.store.inner().get(invocation.key()).await else {
            return false;
        };
        let now = Skewed::of(&self.clock, worker).now();
        let record_forgotten = record.is_none_or(|record| {
            matches!(record.status, Status::Completed | Status::Failed)
                && epoch_secs(record.expires_at) < epoch_secs(now)
        });
        let Some(evidence_key) = invocation.evidence_key() else {
            return record_forgotten;
        };
        let evidence = self.store.inner().evidence(&evidence_key).await;
        record_forgotten && matches!(evidence, Ok(None))
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
        let worker_clock = Skewed::of(&self.clock, worker);
        let deadline_on_worker = worker_clock.now() + LEASE - DEADLINE_MARGIN;
        let invocation = self.invocation(op, deploy, deadline_on_worker);
        if self.is_forgotten(&invocation, worker).await {
            lock(&self.shared).ledger.new_life(op);
        }
        self.stats.deliveries += 1;
        *self
            .stats
            .behaviours
            .entry(format!("{behaviour:?}"))
            .or_default() += 1;
        let (parked_tx, mut parked_rx) = mpsc::unbounded_channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        let spec = &self.specs[op];
        let (idem, profile) = match (spec.transactional, spec.stepped) {
            (true, _) => self.transactional[worker].clone(),
            (false, true) => self.stepped[worker].clone(),
            (false, false) => self.workers[worker].clone(),
        };
        let tables = self.tables.clone().filter(|_| spec.transactional);
        // The reconciler and the steps' checks read the ledger: it is told what the handler's
        // tables show first.
        self.observe_transactions().await;
        let outage_end = Arc::new(std::sync::Mutex::new(None));
        let after_effect: Box<dyn FnOnce() + Send> = match outage {
            Some(length) => {
                self.stats.outages += 1;
                let (store, clock, end) = (
                    self.store.clone(),
                    self.clock.clone(),
                    Arc::clone(&outage_end),
                );
                Box::new(move || {
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
        tokio::select! {
            joined = &mut task => {
                let outage_end = *outage_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let judged = Judged { op, behaviour, deadline, outage_end };
                self.answered(judged, joined).await
            }
            Some(()) = parked_rx.recv() => {
                match behaviour {
                    Behaviour::CancelAfterEffect => {
                        task.abort();
                        let _ = task.await;
                        self.note("cancelled after the effect".into());
                    }
                    Behaviour::SuspendBeforeEffect | Behaviour::SuspendAfterEffect => {
                        self.note(format!("suspended as #{}", self.suspended.len()));
                        self.suspended.push(Parked { task, resume: Some(resume_tx), deadline, op });
                    }
                    _ => {
                        self.note("crashed".into());
                        self.frozen.push(task);
                    }
                }
                None
            }
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
        let judged = Judged {
            op: parked.op,
            behaviour: Behaviour::Complete,
            deadline: parked.deadline,
            outage_end: None,
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
        if let Some(untruthful) = self.untruthful(judged, &answer).await {
            self.pending_violation.get_or_insert(untruthful);
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
