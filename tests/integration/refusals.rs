//! `ExecutionContext::refuse` on both stores: a refusal that took no effect is replayed under
//! its key and deletes its identity's evidence; one that recorded a step settles it as usual.

use std::time::Duration;

use lambda_idempotency::key::{Fingerprint, OperationKey};
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, OperationScope};
use serde_json::{Value, json};

use crate::backends::both;

fn invocation(key: &str, identity: &str) -> Invocation {
    let scope = OperationScope::new("refusals", "orders").expect("scope");
    let key = OperationKey::derive(&scope, None, &json!(key)).expect("key");
    let fingerprint = Fingerprint::of(&json!({"order": identity})).expect("fingerprint");
    Invocation::new(key, fingerprint, Duration::from_secs(60))
        .with_identity(identity)
        .expect("identity")
}

#[tokio::test]
async fn a_refusal_without_effect_replays_and_releases_its_identity() {
    for backend in both().await {
        let name = backend.name;
        let store = backend.store.clone();
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let refused = invocation("k-1", "order:o-1");

        let first = idem
            .execute(&refused, |ctx| async move {
                ctx.refuse();
                Ok::<_, BoxError>(json!({"refused": "amount"}))
            })
            .await
            .expect("the refusal is stored");
        let evidence_key = refused.evidence_key().expect("an identity");
        assert_eq!(
            store.evidence(&evidence_key).await.expect("read"),
            None,
            "{name}: the refusal settled no evidence"
        );
        let replay = idem
            .execute(&refused, |_| async {
                Ok::<Value, BoxError>(json!("must not run"))
            })
            .await
            .expect("replayed");
        assert!(replay.is_replay(), "{name}");
        assert_eq!(replay.value(), first.value(), "{name}");

        let corrected = idem
            .execute(&invocation("k-2", "order:o-1"), |_| async {
                Ok::<_, BoxError>(json!({"invoice": "i-1"}))
            })
            .await
            .expect("the identity is free");
        assert!(!corrected.is_replay(), "{name}");
        let evidence = store.evidence(&evidence_key).await.expect("read");
        assert_eq!(
            evidence.map(|evidence| evidence.status),
            Some(Status::Completed),
            "{name}: the success holds the identity"
        );
    }
}

#[tokio::test]
async fn a_refusal_after_a_recorded_step_keeps_its_identity() {
    for backend in both().await {
        let name = backend.name;
        let store = backend.store.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_recovery(Recovery::Steps);
        let refused = invocation("k-1", "order:o-2");

        idem.execute(&refused, |ctx| async move {
            ctx.step("reserve")
                .run(|_key| async { Ok::<_, BoxError>(json!("reserved")) })
                .await?;
            ctx.refuse();
            Ok::<_, BoxError>(json!({"refused": "after reserving"}))
        })
        .await
        .expect("stored");
        let evidence_key = refused.evidence_key().expect("an identity");
        let evidence = store.evidence(&evidence_key).await.expect("read");
        assert_eq!(
            evidence.map(|evidence| evidence.status),
            Some(Status::Completed),
            "{name}: a step may have taken effect: the identity is held"
        );
        let other = idem
            .execute(&invocation("k-2", "order:o-2"), |_| async {
                Ok::<Value, BoxError>(json!("must not run"))
            })
            .await;
        assert!(
            matches!(other, Err(Error::KeyExpiredConflict { .. })),
            "{name}: {other:?}"
        );
    }
}

/// A refusal whose result is too large to keep is retained FAILED for its key, as any result
/// that cannot be kept, but it still holds no identity: the corrected request runs.
#[tokio::test]
async fn a_refusal_too_large_to_keep_still_releases_its_identity() {
    for backend in both().await {
        let name = backend.name;
        let store = backend.store.clone();
        let config = lambda_idempotency::Config::builder()
            .max_outcome_bytes(64)
            .build()
            .expect("config");
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_config(config);
        let refused = invocation("k-1", "order:o-3");

        let first = idem
            .execute(&refused, |ctx| async move {
                ctx.refuse();
                Ok::<_, BoxError>(json!({"refused": "x".repeat(200)}))
            })
            .await;
        assert!(
            matches!(first, Err(Error::OutcomeTooLarge { .. })),
            "{name}: {first:?}"
        );
        let evidence_key = refused.evidence_key().expect("an identity");
        assert_eq!(
            store.evidence(&evidence_key).await.expect("read"),
            None,
            "{name}: the refusal settled no evidence"
        );
        let corrected = idem
            .execute(&invocation("k-2", "order:o-3"), |_| async {
                Ok::<_, BoxError>(json!({"invoice": "i-3"}))
            })
            .await;
        assert!(corrected.is_ok(), "{name}: {corrected:?}");
    }
}

/// Classifies every error as terminal: only a `Release` escapes it.
struct EverythingTerminal;

impl lambda_idempotency::failure::Classifier for EverythingTerminal {
    fn classify(
        &self,
        _: &(dyn std::error::Error + 'static),
    ) -> lambda_idempotency::failure::FailureClass {
        lambda_idempotency::failure::FailureClass::terminal("declined")
    }
}

/// A handler outside the HTTP door that returns `failure::Release` has its claim released,
/// whatever the classifier says: the next delivery runs it.
#[tokio::test]
async fn a_release_from_any_handler_is_released_whatever_the_classifier() {
    for backend in both().await {
        let name = backend.name;
        let store = backend.store.clone();
        let idem = Idempotency::new(backend.store)
            .with_clock(backend.clock)
            .with_classifier(EverythingTerminal);
        let inv = invocation("k-release", "order:o-9");
        let released = idem
            .execute(&inv, |_| async {
                Err::<Value, BoxError>(Box::new(lambda_idempotency::failure::Release::new(
                    std::io::Error::other("the ledger is busy"),
                )))
            })
            .await;
        assert!(
            matches!(released, Err(Error::Handler { .. })),
            "{name}: {released:?}"
        );
        assert_eq!(
            store.get(inv.key()).await.expect("read"),
            None,
            "{name}: released, not retained"
        );
        let retried = idem
            .execute(&inv, |_| async { Ok::<_, BoxError>(json!("ran")) })
            .await
            .expect("runs");
        assert!(!retried.is_replay(), "{name}");

        // Any other error takes the classifier's answer: retained.
        let declined = invocation("k-terminal", "order:o-10");
        let terminal = idem
            .execute(&declined, |_| async {
                Err::<Value, BoxError>("declined".into())
            })
            .await;
        assert!(terminal.is_err(), "{name}");
        let record = store.get(declined.key()).await.expect("read");
        assert_eq!(
            record.map(|record| record.status),
            Some(lambda_idempotency::record::Status::Failed),
            "{name}: the classifier's own answer stands otherwise"
        );
    }
}
