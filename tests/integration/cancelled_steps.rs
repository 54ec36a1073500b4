//! A handler cancelled while its last step's result waits to ride on the next write (the
//! result is kept in memory until then): the result is never written by the give-back, so
//! the step comes back *uncertain*, and the next delivery asks its check, which finds the
//! effect: it is not run again. On both stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::Clock;
use lambda_idempotency::effects::Checked;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::StepRecord;
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
