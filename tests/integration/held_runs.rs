//! A handler run held inside its handler, so that a test can act while the claim is in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lambda_idempotency::{BoxError, Error, Execution, Idempotency, Invocation};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// An execution whose handler has started and waits for [`HeldRun::finish`].
pub struct HeldRun {
    /// How many times its handler ran (a test's sibling runs may count here too).
    pub runs: Arc<AtomicUsize>,
    release: Arc<Notify>,
    task: JoinHandle<Result<Execution<Value>, Error>>,
}

impl HeldRun {
    /// Starts `invocation` on `engine` in a task of its own; returns once the handler runs
    /// (and holds the claim). The handler returns `result` when released.
    pub async fn start(engine: Idempotency, invocation: Invocation, result: Value) -> Self {
        let (holding, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let runs = Arc::new(AtomicUsize::new(0));
        let task = {
            let (holding, release, runs) = (
                Arc::clone(&holding),
                Arc::clone(&release),
                Arc::clone(&runs),
            );
            tokio::spawn(async move {
                engine
                    .execute(&invocation, |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        holding.notify_one();
                        release.notified().await;
                        Ok::<_, BoxError>(result)
                    })
                    .await
            })
        };
        holding.notified().await;
        Self {
            runs,
            release,
            task,
        }
    }

    /// Lets the handler return: the execution's answer.
    pub async fn finish(self) -> Result<Execution<Value>, Error> {
        self.release.notify_one();
        self.task.await.expect("the held run's task joins")
    }
}
