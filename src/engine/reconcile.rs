//! After a takeover: the reconciler, else the recovery policy; holding an operation
//! INDETERMINATE for an operator.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use super::decide::Recover;
use super::settle::{Completion, settle_patience};
use super::{INDETERMINATE_RETENTION, Idempotency};
use crate::error::{Error, decode_failure};
use crate::execution::{Execution, Invocation, Origin};
use crate::reconcile::{Checked, Takeover};
use crate::record::{Record, Settlement, StepRecord};
use crate::store::Target;

impl Idempotency {
    /// Recovers a takeover as `recover` says ([`super::decide::recover`]): asks the reconciler, or
    /// holds the operation for an operator. `None`: run the handler.
    pub(super) async fn reconcile<T: Serialize + DeserializeOwned>(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        previous: Record,
        recover: Recover,
    ) -> Option<Result<Execution<T>, Error>> {
        let Some(reconciler) = self
            .reconciler
            .as_ref()
            .filter(|_| recover == Recover::Reconcile)
        else {
            return match recover {
                Recover::Steps | Recover::Rerun => None,
                // (`Reconcile` comes only with a reconciler; without one, hold.)
                Recover::Hold | Recover::Reconcile => {
                    warn!(
                        attempt,
                        "took over a crashed attempt with no reconciler and no step record: held as indeterminate (Recovery::Indeterminate)"
                    );
                    let held = self.hold(target, invocation, claim, attempt, None).await;
                    Some(held.and_then(|()| Err(self.indeterminate(invocation))))
                }
            };
        };
        let key = &invocation.key;
        let takeover = Takeover {
            key: key.clone(),
            attempt,
            previous,
        };
        let answer = match reconciler.reconcile(takeover).await {
            Ok(Checked::NotApplied) => return None,
            Ok(Checked::Applied(value)) => match serde_json::from_value::<T>(value) {
                Ok(value) => {
                    let origin = Origin::Reconciled { attempt };
                    self.record(
                        target,
                        invocation,
                        claim,
                        value,
                        origin,
                        Completion::default(),
                    )
                    .await
                }
                // The effect happened, and its value cannot be recorded as the handler's: held
                // for an operator, who records it typed (`idemctl resolve`), instead of left in
                // progress for the next takeover to ask again, lease after lease.
                Err(err) => {
                    let reason = decode_failure(&err);
                    warn!(
                        attempt,
                        reason = %reason,
                        "the reconciler's value does not decode as the handler's output: held as indeterminate"
                    );
                    self.hold(target, invocation, claim, attempt, None)
                        .await
                        .and_then(|()| Err(self.indeterminate(invocation)))
                }
            },
            Ok(Checked::Unknown) => {
                warn!(
                    attempt,
                    "reconciliation unknown: holding the operation as indeterminate"
                );
                self.hold(target, invocation, claim, attempt, None)
                    .await
                    .and_then(|()| Err(self.indeterminate(invocation)))
            }
            Err(source) => {
                // As after a failed step check: the claim is given back at once, so that the
                // next delivery asks again instead of waiting out a whole lease (a reconciler
                // only reads, so nothing of this attempt can still land).
                self.give_back_now(target, claim, invocation.deadline).await;
                Err(Error::ReconcileFailed {
                    key: key.clone(),
                    source,
                })
            }
        };
        Some(answer)
    }

    /// Holds the operation INDETERMINATE for an operator (with its steps, when they changed).
    pub(super) async fn hold(
        &self,
        target: Target<'_>,
        invocation: &Invocation,
        claim: &Record,
        attempt: u32,
        steps: Option<Vec<StepRecord>>,
    ) -> Result<(), Error> {
        let now = self.clock.now();
        let settlement = Settlement::indeterminate(now, INDETERMINATE_RETENTION).with_steps(steps);
        let patience = settle_patience(invocation, claim, now);
        self.settle(target, attempt, &settlement, patience).await
    }

    /// What a caller of an operation held INDETERMINATE gets.
    fn indeterminate(&self, invocation: &Invocation) -> Error {
        Error::Indeterminate {
            key: invocation.key.clone(),
        }
    }
}
