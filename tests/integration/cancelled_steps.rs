//! A handler cancelled while its last step's result waits to ride on the next write (the
//! result is kept in memory until then): the result is never written by the give-back, so
//! the step comes back *uncertain*, and the next delivery asks its check, which finds the
//! effect: it is not run again. And a step still running in a task the handler spawned keeps
//! its claim from being released. On both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::effects::{Checked, StepError, Transaction};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::{Status, StepRecord};
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, ExecutionContext, Idempotency};
use serde_json::json;
use tokio::sync::oneshot;

use crate::backends::both;

#[tokio::test]
async fn a_cancelled_handlers_pending_result_comes_back_uncertain_and_its_check_decides() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let inv = invocation("cancelled-pending", &json!({"order": 30}));
        let (runs, checks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let charge = {
            let (runs, checks) = (Arc::clone(&runs), Arc::clone(&checks));
            move |ctx: ExecutionContext| {
                let (runs, checks, landed) =
                    (Arc::clone(&runs), Arc::clone(&checks), Arc::clone(&runs));
                async move {
                    ctx.step("charge")
                        .checked_by(move |_key: String| {
                            checks.fetch_add(1, Ordering::SeqCst);
                            let found = landed.load(Ordering::SeqCst) > 0;
                            async move {
                                Ok::<_, BoxError>(match found {
                                    true => Checked::Applied(String::from("ch_1")),
                                    false => Checked::NotApplied,
                                })
                            }
                        })
                        .run(|_key| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, BoxError>(String::from("ch_1"))
                        })
                        .await
                }
            }
        };

        // The first attempt: the charge runs and returns; the handler then waits (its result
        // pending for the completion) and its task is cancelled.
        let (charged_tx, charged_rx) = oneshot::channel();
        let worker = tokio::spawn({
            let (idem, inv, charge) = (idem.clone(), inv.clone(), charge.clone());
            async move {
                idem.execute(&inv, |ctx| async move {
                    let charged = charge(ctx).await?;
                    let _ = charged_tx.send(());
                    std::future::pending::<()>().await;
                    Ok::<_, BoxError>(charged)
                })
                .await
            }
        });
        charged_rx.await.expect("charged");
        worker.abort();
        let _ = worker.await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
        // The give-back runs in a task of its own: a bounded number of reads lets it on.
        let mut steps = Vec::new();
        for _ in 0..10_000 {
            let record = idem
                .store()
                .get(inv.key())
                .await
                .expect("get")
                .expect("held");
            if record.lease.expires_at <= clock.now() + Duration::from_secs(5) {
                steps = record.steps;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            steps
                .iter()
                .filter(|step| !step.is_mark())
                .cloned()
                .collect::<Vec<_>>(),
            [StepRecord::intent("charge", 1)],
            "{name}: the intent stands, its pending result was not written"
        );

        clock.advance(Duration::from_secs(3600));
        let done = idem
            .execute(&inv, |ctx| async move { charge(ctx).await })
            .await
            .expect("the check finds the charge");
        assert_eq!(done.value(), "ch_1", "{name}");
        assert_eq!(
            checks.load(Ordering::SeqCst),
            1,
            "{name}: the check was asked"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: not charged again");
    }
}

/// Applies each claim it is sent, then never answers: the claim committed and its answer is
/// in flight when the task is cancelled.
#[derive(Debug)]
struct ClaimsThenHangs {
    inner: lambda_idempotency::store::AnyStore,
    claimed: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl lambda_idempotency::store::Store for ClaimsThenHangs {
    fn call<'a>(
        &'a self,
        request: lambda_idempotency::store::Request<'a>,
    ) -> lambda_idempotency::reconcile::BoxFuture<
        'a,
        Result<lambda_idempotency::store::Answer, lambda_idempotency::StoreError>,
    > {
        Box::pin(async move {
            let answer = self.inner.call(request).await;
            if matches!(request, lambda_idempotency::store::Request::Claim { .. }) {
                if let Some(claimed) = self.claimed.lock().expect("claimed").take() {
                    let _ = claimed.send(());
                }
                std::future::pending::<()>().await;
            }
            answer
        })
    }

    fn transactional(&self) -> Option<&dyn lambda_idempotency::store::TransactionalStore> {
        self.inner.transactional()
    }
}

/// A task cancelled while its fresh claim's answer is in flight ran no handler: the claim is
/// released whole, and the next delivery runs, even under the default recovery (a shortened
/// lease would have looked like a crash there, and held the operation for an operator).
#[tokio::test]
async fn a_task_cancelled_before_its_handler_started_releases_its_claim() {
    for backend in both().await {
        let name = backend.name;
        let (claimed_tx, claimed_rx) = oneshot::channel();
        let hanging = ClaimsThenHangs {
            inner: backend.store.clone(),
            claimed: std::sync::Mutex::new(Some(claimed_tx)),
        };
        let given_back = Arc::new(std::sync::Mutex::new(Vec::new()));
        let idem = Idempotency::new(hanging)
            .with_clock(backend.clock.clone())
            .with_spawner({
                let given_back = Arc::clone(&given_back);
                move |task| given_back.lock().expect("tasks").push(task)
            });
        let inv = invocation("cancelled-claiming", &json!({"order": 31}));
        let runs = Arc::new(AtomicUsize::new(0));
        let worker = tokio::spawn({
            let (idem, inv, runs) = (idem.clone(), inv.clone(), Arc::clone(&runs));
            async move {
                idem.execute(&inv, |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(1)
                })
                .await
            }
        });
        claimed_rx.await.expect("claimed");
        worker.abort();
        let _ = worker.await;
        let tasks: Vec<_> = std::mem::take(&mut *given_back.lock().expect("tasks"));
        assert_eq!(tasks.len(), 1, "{name}: one give-back");
        for task in tasks {
            task.await;
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: nothing ran");

        let redelivery = Idempotency::new(backend.store).with_clock(backend.clock.clone());
        let done = redelivery
            .execute(&inv, |_| async { Ok::<_, BoxError>(2) })
            .await
            .unwrap_or_else(|err| panic!("{name}: the redelivery runs: {err}"));
        assert!(!done.is_replay(), "{name}");
        assert_eq!(*done.value(), 2, "{name}");
    }
}

/// A handler that spawned a transactional step and returned a retryable failure while the
/// step was still building its writes (nothing of it recorded yet): the claim is given back,
/// never released, since the step's commit may yet land; a release would delete the record
/// its result commits to, and the redelivery would run the step afresh, its writes twice.
/// Built after the handler returned, the step commits nothing.
#[tokio::test]
async fn a_step_still_running_in_a_spawned_task_keeps_the_claim_from_release() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let inv = invocation("spawned-step", &json!({"order": 40}));
        let (started_tx, started_rx) = oneshot::channel();
        let (finish_tx, finish_rx) = oneshot::channel::<()>();
        let spawned = Arc::new(std::sync::Mutex::new(None));

        let answer = idem
            .execute(&inv, {
                let spawned = Arc::clone(&spawned);
                |ctx: ExecutionContext| async move {
                    let step = tokio::spawn(async move {
                        ctx.step("reserve")
                            .transact(|_key| async move {
                                let _ = started_tx.send(());
                                let _ = finish_rx.await;
                                Ok::<_, BoxError>(Transaction::new(1_u32))
                            })
                            .await
                    });
                    started_rx.await.expect("the step runs");
                    *spawned.lock().expect("task") = Some(step);
                    Err::<u32, BoxError>(
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream timed out")
                            .into(),
                    )
                }
            })
            .await;

        assert!(answer.is_err(), "{name}: {answer:?}");
        let record = idem.store().get(inv.key()).await.expect("get");
        assert!(
            record.is_some_and(|record| record.status == Status::InProgress),
            "{name}: given back, not released"
        );
        // Built after the handler returned: nothing commits, a takeover decides the step.
        let _ = finish_tx.send(());
        let step = spawned.lock().expect("task").take().expect("spawned");
        let built_late = step.await.expect("the step's task");
        assert!(
            matches!(built_late, Err(StepError::Invalid { .. })),
            "{name}: {built_late:?}"
        );
        let record = idem
            .store()
            .get(inv.key())
            .await
            .expect("get")
            .expect("held");
        assert!(
            record.steps.iter().all(|step| step.name != "reserve"),
            "{name}"
        );
    }
}
