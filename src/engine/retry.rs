//! Transient store failures retried within the invocation's deadline, on the engine's clock.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tracing::warn;

use super::{Idempotency, erased};
use crate::error::StoreError;
use crate::store::Store;

/// Tries per write, the first included.
const MAX_TRIES: u32 = 5;
/// The first pause between tries; it doubles after each.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

impl<S: Store> Idempotency<S> {
    /// Sends `write` until it answers, fails for good, or the next pause would pass `deadline`.
    /// Every try sends the same write (the same lease token), so that one which committed
    /// before its answer was lost is recognised by the next try's failed condition.
    pub(super) async fn retrying<'a, T, Fut>(
        &'a self,
        deadline: SystemTime,
        write: impl Fn() -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, StoreError>> + Send + 'a,
    {
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 1;
        loop {
            match erased(write()).await {
                Err(err)
                    if err.is_transient()
                        && tries < MAX_TRIES
                        && self.clock.now() + backoff < deadline =>
                {
                    warn!(tries, error = %err, "store write failed; retrying");
                    self.clock.sleep(backoff).await;
                    backoff *= 2;
                    tries += 1;
                }
                answer => return answer,
            }
        }
    }
}
