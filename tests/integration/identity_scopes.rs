//! Where a business identity's evidence lives: a global identity spelled like a scoped key
//! squats nothing, on both stores, and the evidence 0.2 to 0.4 kept bare for a global identity
//! holding `#` still refuses a second run on DynamoDB; an identity whose scope a deploy
//! changed (narrowed from global, widened; given a tenant under the namespace scope) still
//! meets the evidence it recorded, on both stores.

use std::time::{Duration, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_idempotency::key::{Fingerprint, IdentityScope, OperationKey};
use lambda_idempotency::record::Status;
use lambda_idempotency::testing::conformance::start_time;
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{BoxError, Error, Idempotency, Invocation, OperationScope};
use serde_json::json;

use crate::backends::both;

fn invocation(
    namespace: &str,
    tenant: Option<&str>,
    key: &str,
    identity: &str,
    scope: IdentityScope,
) -> Invocation {
    let operation = OperationScope::new(namespace, "issue").expect("scope");
    let key = OperationKey::derive(&operation, tenant, &json!(key)).expect("key");
    let fingerprint = Fingerprint::of(&json!({"key": key.as_str()})).expect("fingerprint");
    Invocation::new(key, fingerprint, Duration::from_secs(60))
        .with_identity(identity)
        .expect("identity")
        .with_identity_scope(scope)
}

async fn run(idem: &Idempotency, invocation: &Invocation) -> Result<bool, Error> {
    idem.execute(invocation, |_| async { Ok::<_, BoxError>(json!("done")) })
        .await
        .map(|execution| !execution.is_replay())
}

#[tokio::test]
async fn a_global_identity_spelled_like_a_scoped_key_squats_nothing() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let acme = |key| {
            invocation(
                "billing",
                Some("acme"),
                key,
                "invoice:o-1",
                IdentityScope::Tenant,
            )
        };
        let spelled = acme("k-0").evidence_key().expect("an identity");
        assert_eq!(spelled, "billing#t=acme#id=invoice:o-1");
        let squatter = |key| invocation("other", None, key, &spelled, IdentityScope::Global);

        assert_eq!(
            run(&idem, &squatter("s-1")).await.ok(),
            Some(true),
            "{name}"
        );
        assert_eq!(
            run(&idem, &acme("k-1")).await.ok(),
            Some(true),
            "{name}: the global identity did not take acme's evidence"
        );
        assert!(
            matches!(
                run(&idem, &acme("k-2")).await,
                Err(Error::KeyExpiredConflict { .. })
            ),
            "{name}: acme's evidence is acme's success"
        );
        assert!(
            matches!(
                run(&idem, &squatter("s-2")).await,
                Err(Error::KeyExpiredConflict { .. })
            ),
            "{name}: the global identity is held by its own success"
        );
    }
}

/// 0.4 kept a global identity with `#` under the identity itself; 0.5 keeps it under
/// `#g#{identity}`. Evidence 0.4 settled there still refuses the operation's second run.
#[tokio::test]
async fn evidence_0_4_kept_bare_for_a_global_identity_still_refuses() {
    let db = dynamo::start().await;
    let idem = Idempotency::new(db.store());
    let global = |key| invocation("billing", None, key, "invoice#o-1", IdentityScope::Global);
    let first = global("k-1");
    assert_eq!(first.evidence_key().as_deref(), Some("#g#invoice#o-1"));
    let created = start_time()
        .duration_since(UNIX_EPOCH)
        .expect("after epoch");
    let millis = AttributeValue::N(created.as_millis().to_string());
    db.client
        .put_item()
        .table_name(&db.uniqueness_table)
        .item("pk", AttributeValue::S("invoice#o-1".into()))
        .item(
            "operation_key",
            AttributeValue::S(first.key().as_str().into()),
        )
        .item(
            "fingerprint",
            AttributeValue::S(first.fingerprint().as_str().into()),
        )
        .item("status", AttributeValue::S("COMPLETED".into()))
        .item("created_at", millis.clone())
        .item("completed_at", millis)
        .send()
        .await
        .expect("0.4's evidence");

    for key in ["k-1", "k-2"] {
        let answer = run(&idem, &global(key)).await;
        assert!(
            matches!(&answer, Err(Error::KeyExpiredConflict { evidence, .. }) if evidence.status == Status::Completed),
            "{key}: {answer:?}"
        );
    }

    // The scoped evidence a global identity spells is another operation's: it refuses nothing.
    let scoped = invocation("billing", None, "k-3", "invoice:o-2", IdentityScope::Tenant);
    assert_eq!(run(&idem, &scoped).await.ok(), Some(true));
    let spelled = scoped.evidence_key().expect("an identity");
    let squatter = invocation("other", None, "s-1", &spelled, IdentityScope::Global);
    assert_eq!(run(&idem, &squatter).await.ok(), Some(true));
}

/// An operation recorded `invoice:o-1` as a global identity; a deploy narrows its identity
/// scope to its namespace (or its tenant). The evidence kept under the bare identity, of an
/// operation in that scope, still refuses a second run on both stores; another namespace's
/// global evidence does not.
#[tokio::test]
async fn an_identity_narrowed_from_global_still_meets_what_it_recorded() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let billing = |key, tenant, scope| invocation("billing", tenant, key, "invoice:o-1", scope);

        assert_eq!(
            run(&idem, &billing("k-1", Some("acme"), IdentityScope::Global))
                .await
                .ok(),
            Some(true),
            "{name}: recorded as a global identity"
        );
        for (case, tenant, scope) in [
            ("namespace", None, IdentityScope::Namespace),
            ("tenant", Some("acme"), IdentityScope::Tenant),
        ] {
            let narrowed = billing("k-2", tenant, scope);
            assert!(
                matches!(
                    run(&idem, &narrowed).await,
                    Err(Error::KeyExpiredConflict { .. })
                ),
                "{name}: narrowed to its {case}, the identity is still held"
            );
        }
        let other_tenant = billing("k-3", Some("globex"), IdentityScope::Tenant);
        assert_eq!(
            run(&idem, &other_tenant).await.ok(),
            Some(true),
            "{name}: another tenant's identity is its own"
        );
        let elsewhere = invocation(
            "shipping",
            None,
            "k-4",
            "invoice:o-1",
            IdentityScope::Namespace,
        );
        assert_eq!(
            run(&idem, &elsewhere).await.ok(),
            Some(true),
            "{name}: another namespace's identity is its own"
        );
    }
}

/// A deploy changes an operation's identity scope: the evidence it recorded under the earlier
/// form, of an operation the new scope shares the identity with, still refuses a second run
/// on both stores; another tenant's evidence (or the platform's, without a tenant), kept
/// where the new scope does not share it, does not.
#[tokio::test]
async fn an_identity_whose_scope_a_deploy_changed_still_meets_what_it_recorded() {
    type Deploy<'a> = (Option<&'a str>, IdentityScope);
    let acme = Some("acme");
    let changes: [(&str, &str, Deploy, Deploy); 5] = [
        (
            "namespace to tenant",
            "invoice:o-1",
            (acme, IdentityScope::Namespace),
            (acme, IdentityScope::Tenant),
        ),
        (
            "tenant to namespace",
            "invoice:o-1",
            (acme, IdentityScope::Tenant),
            (acme, IdentityScope::Namespace),
        ),
        (
            "tenant to global",
            "invoice:o-1",
            (acme, IdentityScope::Tenant),
            (acme, IdentityScope::Global),
        ),
        (
            "namespace to global",
            "invoice:o-1",
            (None, IdentityScope::Namespace),
            (None, IdentityScope::Global),
        ),
        (
            "global with '#' to tenant",
            "invoice#o-1",
            (acme, IdentityScope::Global),
            (acme, IdentityScope::Tenant),
        ),
    ];
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        for (case, (change, identity, (tenant, scope), (tenant_after, scope_after))) in
            changes.iter().enumerate()
        {
            let namespace = format!("billing-{case}");
            let deploy = |key, tenant, scope| invocation(&namespace, tenant, key, identity, scope);
            assert_eq!(
                run(&idem, &deploy("k-1", *tenant, *scope)).await.ok(),
                Some(true),
                "{name}, {change}: the first run"
            );
            let after = deploy("k-2", *tenant_after, *scope_after);
            assert_ne!(
                after.evidence_key(),
                deploy("k-1", *tenant, *scope).evidence_key(),
                "{change}: the deploy moves the evidence"
            );
            let answer = run(&idem, &after).await;
            assert!(
                matches!(&answer, Err(Error::KeyExpiredConflict { evidence, .. }) if evidence.status == Status::Completed),
                "{name}, {change}: the identity is still held, not run again: {answer:?}"
            );
        }

        // Under the namespace scope acme's evidence was every tenant's; narrowed to tenants,
        // it is acme's alone: globex's identity is its own.
        let deploy =
            |key, tenant, scope| invocation("billing-0", tenant, key, "invoice:o-1", scope);
        assert_eq!(
            run(&idem, &deploy("k-3", Some("globex"), IdentityScope::Tenant))
                .await
                .ok(),
            Some(true),
            "{name}: another tenant's evidence is not globex's"
        );

        // A function serving tenants and the platform alike (an optional tenant): the
        // platform's identity is not acme's, whichever settled first.
        let shared = |key, tenant| {
            invocation(
                "billing-shared",
                tenant,
                key,
                "invoice:o-9",
                IdentityScope::Tenant,
            )
        };
        assert_eq!(
            run(&idem, &shared("k-1", None)).await.ok(),
            Some(true),
            "{name}"
        );
        assert_eq!(
            run(&idem, &shared("k-2", Some("acme"))).await.ok(),
            Some(true),
            "{name}: the platform's evidence is not acme's"
        );
        // A deploy that gives an operation a tenant keeps meeting what it recorded without one
        // under the namespace scope, whose evidence key is the same.
        let given =
            |key, tenant, scope| invocation("billing-given", tenant, key, "invoice:o-1", scope);
        assert_eq!(
            run(&idem, &given("k-1", None, IdentityScope::Tenant))
                .await
                .ok(),
            Some(true),
            "{name}"
        );
        let answer = run(&idem, &given("k-2", Some("acme"), IdentityScope::Namespace)).await;
        assert!(
            matches!(&answer, Err(Error::KeyExpiredConflict { .. })),
            "{name}: given a tenant under the namespace scope, still held: {answer:?}"
        );
    }
}
