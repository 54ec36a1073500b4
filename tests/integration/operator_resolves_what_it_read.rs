//! An operator resolves the INDETERMINATE attempt it read, never another: when, between the
//! operator's read and its write, the record is released, claimed again by a redelivery and
//! held INDETERMINATE again (under a new lease token), the resolution changes nothing; the
//! operator's result would otherwise settle an execution nobody inspected. On both stores.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::engine::Resolution;
use lambda_idempotency::reconcile::{BoxFuture, Checked, Takeover};
use lambda_idempotency::record::{Record, RetainedFailure, Status};
use lambda_idempotency::store::{
    Answer, AnyStore, Guard, Request, Store, StoreExt, TransactionalStore,
};
use lambda_idempotency::testing::conformance::{
    LEASE, crash_after_claim, invocation, operator, stalled_worker,
};
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, StoreError};
use serde_json::{Value, json};

use super::backends::both;

/// An engine that holds a crashed attempt INDETERMINATE (its reconciler cannot tell).
fn holding(store: AnyStore, clock: ManualClock) -> Idempotency {
    Idempotency::new(store)
        .with_clock(clock)
        .with_reconciler(|_: Takeover| std::future::ready(Ok::<_, BoxError>(Checked::Unknown)))
}

/// Holds `inv` INDETERMINATE: a claim whose worker crashed, taken over past its lease by a
/// delivery whose reconciler cannot tell whether it acted. Returns the held record's token.
async fn held_indeterminate(idem: &Idempotency, clock: &ManualClock, inv: &Invocation) -> String {
    crash_after_claim(idem, inv).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let err = idem
        .execute(inv, |_| async { Ok::<_, std::io::Error>(1_u32) })
        .await
        .expect_err("held");
    assert!(matches!(err, Error::Indeterminate { .. }), "got {err:?}");
    let record = idem
        .store()
        .get(inv.key())
        .await
        .expect("read")
        .expect("held");
    assert_eq!(record.status, Status::Indeterminate);
    record.lease.token
}

/// Before the operator's write reaches the store: another operator releases the record, and a
/// redelivery claims it and is held INDETERMINATE again.
struct HeldAgainMeanwhile {
    inner: AnyStore,
    clock: ManualClock,
    inv: Invocation,
    done: AtomicBool,
}

impl std::fmt::Debug for HeldAgainMeanwhile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldAgainMeanwhile").finish_non_exhaustive()
    }
}

impl Store for HeldAgainMeanwhile {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            let resolving = matches!(
                &request,
                Request::Settle { target, .. } if matches!(target.guard, Guard::Indeterminate { .. })
            );
            if resolving && !self.done.swap(true, Ordering::SeqCst) {
                let idem = holding(self.inner.clone(), self.clock.clone());
                let released = idem
                    .resolve::<Value>(self.inv.key(), Resolution::Release, &operator())
                    .await
                    .expect("released");
                assert!(released, "the other operator's release");
                held_indeterminate(&idem, &self.clock, &self.inv).await;
            }
            self.inner.call(request).await
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner.transactional()
    }
}

#[tokio::test]
async fn a_resolution_never_settles_an_attempt_held_again_after_the_operator_read() {
    let resolutions = [
        ("completed", Resolution::Completed(json!({"charged": true}))),
        (
            "failed",
            Resolution::Failed(RetainedFailure {
                kind: "refunded_by_hand".into(),
                message: "refunded".into(),
            }),
        ),
    ];
    for (what, resolution) in resolutions {
        for backend in both().await {
            let name = format!("{} {what}", backend.name);
            let clock = backend.clock.clone();
            let inv = invocation(&format!("held-again-{what}"), &json!({"order": "o-7"}));
            let first =
                held_indeterminate(&holding(backend.store.clone(), clock.clone()), &clock, &inv)
                    .await;

            let racing = HeldAgainMeanwhile {
                inner: backend.store.clone(),
                clock: clock.clone(),
                inv: inv.clone(),
                done: AtomicBool::new(false),
            };
            let operator_engine = Idempotency::new(racing).with_clock(clock.clone());
            let resolved = operator_engine
                .resolve::<Value>(inv.key(), resolution.clone(), &operator())
                .await
                .unwrap_or_else(|err| panic!("{name}: {err}"));

            assert!(
                !resolved,
                "{name}: the attempt the operator read is gone; another is held"
            );
            let record = backend.store.get(inv.key()).await.expect("read");
            let record = record.unwrap_or_else(|| panic!("{name}: the record stands"));
            assert_eq!(record.status, Status::Indeterminate, "{name}");
            assert_ne!(record.lease.token, first, "{name}: the new attempt is held");
            assert!(
                record.outcome.is_none(),
                "{name}: no result of the operator's"
            );
        }
    }
}

/// The record an operator was shown is what the engine resolves (`resolve_as_read`, which
/// idemctl calls with the record it showed): when, after the operator looked and before the
/// engine reads, the attempt was released and another held in its place, nothing is resolved.
#[tokio::test]
async fn a_resolution_as_read_never_resolves_an_attempt_held_after_the_operator_looked() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let inv = invocation("shown-then-held-again", &json!({"order": "o-8"}));
        let idem = holding(backend.store.clone(), clock.clone());
        held_indeterminate(&idem, &clock, &inv).await;
        let shown = idem
            .store()
            .get(inv.key())
            .await
            .expect("read")
            .expect("held");

        // While the operator decides: released by another, claimed again and held again.
        let released = idem
            .resolve::<Value>(inv.key(), Resolution::Release, &operator())
            .await
            .expect("released");
        assert!(released, "{name}: the other operator's release");
        let held_again = held_indeterminate(&idem, &clock, &inv).await;

        let resolved = Idempotency::new(backend.store.clone())
            .with_clock(clock.clone())
            .resolve_as_read::<Value>(
                &shown,
                Resolution::Completed(json!({"charged": true})),
                &operator(),
            )
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));

        assert!(!resolved, "{name}: the attempt shown is gone");
        let record = backend
            .store
            .get(inv.key())
            .await
            .expect("read")
            .expect("the record stands");
        assert_eq!(record.status, Status::Indeterminate, "{name}");
        assert_eq!(
            record.lease.token, held_again,
            "{name}: the new attempt is held"
        );
        assert!(
            record.outcome.is_none(),
            "{name}: no result of the operator's"
        );
    }
}

/// The operator's release applies and its answer is lost; before the retry a delivery claims
/// what it released and completes. The retry's condition fails, and the record no longer shows
/// the release: the answer is an error that says it may have applied, never "not resolved,
/// nothing changed" (which the old engine answered, while the delivery it let in ran).
#[derive(Debug)]
struct ClaimedAfterALostRelease {
    inner: AnyStore,
    clock: ManualClock,
    inv: Invocation,
    releases: std::sync::atomic::AtomicUsize,
}

impl Store for ClaimedAfterALostRelease {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            if !matches!(request, Request::ReleaseByOperator { .. }) {
                return self.inner.call(request).await;
            }
            match self.releases.fetch_add(1, Ordering::SeqCst) {
                0 => {
                    self.inner.call(request).await?;
                    Err(StoreError::Unavailable {
                        operation: "release_by_operator",
                        source: "the answer was lost".into(),
                    })
                }
                _ => {
                    Idempotency::new(self.inner.clone())
                        .with_clock(self.clock.clone())
                        .execute(&self.inv, |_| async { Ok::<_, std::io::Error>(2_u32) })
                        .await
                        .expect("the next delivery runs");
                    self.inner.call(request).await
                }
            }
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner.transactional()
    }
}

#[tokio::test]
async fn a_release_whose_answer_was_lost_is_never_reported_as_nothing_changed() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let inv = invocation("lost-release", &json!({"order": "o-9"}));
        held_indeterminate(&holding(backend.store.clone(), clock.clone()), &clock, &inv).await;
        let racing = ClaimedAfterALostRelease {
            inner: backend.store.clone(),
            clock: clock.clone(),
            inv: inv.clone(),
            releases: std::sync::atomic::AtomicUsize::new(0),
        };

        let answer = Idempotency::new(racing)
            .with_clock(clock.clone())
            .resolve::<Value>(inv.key(), Resolution::Release, &operator())
            .await;

        assert!(
            matches!(answer, Err(Error::Store(StoreError::Unavailable { .. }))),
            "{name}: may have applied, not `false`: {answer:?}"
        );
        let record = backend
            .store
            .get(inv.key())
            .await
            .expect("read")
            .expect("the record stands");
        assert_eq!(record.status, Status::Completed, "{name}: the delivery ran");
    }
}

/// An owner's run on `inv` whose handler started and was dropped (a durable execution's
/// suspension): its claim is kept for the owner's return. Returns the record it left.
async fn paused(idem: &Idempotency, inv: &Invocation) -> Record {
    let run = stalled_worker(idem, inv).await;
    run.abort();
    let _ = run.await;
    let record = idem.store().get(inv.key()).await.expect("read");
    record.expect("the owner's claim is kept")
}

/// A durable execution's attempts share one lease token (its owner's): when, after the
/// operator looked at an attempt whose lease had run out, the owner re-entered its claim as the
/// next attempt and paused past that lease too, with no step recorded, every other part of the
/// record is as the operator saw it. The attempt tells them apart: neither a resolution nor a
/// release settles the attempt nobody inspected.
#[tokio::test]
async fn a_resolution_never_settles_an_owners_attempt_begun_after_the_operator_looked() {
    let resolutions = [
        ("completed", Resolution::Completed(json!({"charged": true}))),
        ("released", Resolution::Release),
    ];
    for (what, resolution) in resolutions {
        for backend in both().await {
            let name = format!("{} {what}", backend.name);
            let clock = backend.clock.clone();
            let idem = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
            let inv = invocation(
                &format!("owner-re-entered-{what}"),
                &json!({"order": "o-10"}),
            )
            .with_owner("arn:aws:lambda:eu-west-1:111122223333:function:fulfil:durable/exec-1");
            paused(&idem, &inv).await;
            clock.advance(LEASE + Duration::from_secs(1));
            let shown = idem
                .store()
                .get(inv.key())
                .await
                .expect("read")
                .expect("stuck");

            // While the operator decides: the owner's replay re-enters and pauses again.
            let re_entered = paused(&idem, &inv).await;
            assert_eq!(
                re_entered.lease.token, shown.lease.token,
                "{name}: one token"
            );
            assert_eq!(re_entered.lease.attempt, shown.lease.attempt + 1, "{name}");
            clock.advance(LEASE + Duration::from_secs(1));

            let resolved = idem
                .resolve_as_read::<Value>(&shown, resolution.clone(), &operator())
                .await
                .unwrap_or_else(|err| panic!("{name}: {err}"));

            assert!(
                !resolved,
                "{name}: the attempt shown is not the one standing"
            );
            let record = backend
                .store
                .get(inv.key())
                .await
                .expect("read")
                .expect("the record stands");
            assert_eq!(record.status, Status::InProgress, "{name}");
            assert_eq!(record.lease.attempt, re_entered.lease.attempt, "{name}");
            assert!(
                record.outcome.is_none(),
                "{name}: no result of the operator's"
            );
        }
    }
}
