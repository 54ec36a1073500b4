//! The execution context, readable from inside a wrapped handler.

use crate::execution::ExecutionContext;

tokio::task_local! {
    static CURRENT: ExecutionContext;
}

/// The running operation's context (key, attempt, downstream keys), inside a handler wrapped
/// by a door ([`IdempotencyService`](super::IdempotencyService), a batch, the HTTP layer); `None` elsewhere, including tasks the handler spawns.
pub fn current() -> Option<ExecutionContext> {
    CURRENT.try_with(ExecutionContext::clone).ok()
}

/// Runs `future` with `context` as [`current`].
pub(crate) async fn scope<F: Future>(context: ExecutionContext, future: F) -> F::Output {
    CURRENT.scope(context, future).await
}
