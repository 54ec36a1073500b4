//! Tenants, on both stores and every door: the tenant Lambda's tenant isolation mode names in
//! the invocation context scopes keys and identities; a policy that needs a tenant and finds
//! none refuses the event; control characters are refused where they enter; and a redelivery
//! that spans the upgrade from 0.4 (which never read that tenant) is neither run again nor
//! answered with another tenant's result.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use aws_lambda_events::event::sqs::SqsMessage;
use lambda_http::{Body, Request, RequestExt};
use lambda_idempotency::clock::Clock;
use lambda_idempotency::config::Config;
use lambda_idempotency::key::Fingerprint;
use lambda_idempotency::lambda::batch::RecordOutcome;
use lambda_idempotency::lambda::http::CallerScope;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::crash_after_claim;
use lambda_idempotency::{
    BoxError, Error, HttpKeys, Idempotency, Invocation, KeyPolicy, Operation, OperationScope,
};
use lambda_runtime::tower::{Layer, Service, ServiceExt, service_fn};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use crate::backends::{Backend, both, sqs_message};

fn scope() -> OperationScope {
    OperationScope::new("tenants", "orders").expect("scope")
}

/// An invocation context from Lambda's tenant isolation mode (or from a function without
/// it, for `None`).
fn context(tenant: Option<&str>) -> Context {
    let mut context = Context::default();
    context.request_id = "req-1".into();
    context.tenant_id = tenant.map(str::to_owned);
    context
}

fn orders_policy() -> KeyPolicy<Value> {
    KeyPolicy::pointer("/order_id").expect("pointer")
}

#[tokio::test]
async fn lambdas_tenant_scopes_the_event_door() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let handler = service_fn(move |event: LambdaEvent<Value>| {
            let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok::<_, lambda_runtime::Error>(json!({
                    "order": event.payload["order_id"],
                    "tenant": event.context.tenant_id,
                    "run": run,
                }))
            }
        });
        let mut service = Operation::new(idem, scope(), orders_policy())
            .layer()
            .layer(handler);
        let mut send = async |tenant: &str| {
            let event = LambdaEvent::new(json!({"order_id": "o-1"}), context(Some(tenant)));
            service
                .ready()
                .await
                .expect("ready")
                .call(event)
                .await
                .expect("answered")
        };

        let acme = send("acme").await;
        let globex = send("globex").await;
        let acme_again = send("acme").await;

        assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}: one run per tenant");
        assert_eq!(acme["tenant"], "acme", "{name}");
        assert_eq!(globex["tenant"], "globex", "{name}: not acme's result");
        assert_eq!(acme_again, acme, "{name}: acme's replay is acme's");
    }
}

#[tokio::test]
async fn lambdas_tenant_scopes_the_batch_door() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let batch =
            Operation::new(idem, scope(), sources::sqs(Some("/order_id")).expect("sqs")).batch();
        let placed = Arc::new(AtomicUsize::new(0));
        let place = |_: SqsMessage, _| {
            let placed = Arc::clone(&placed);
            async move { Ok::<_, BoxError>(placed.fetch_add(1, Ordering::SeqCst)) }
        };
        let message = || vec![sqs_message("m-1", json!({"order_id": "o-1"}))];

        let acme = batch
            .process(message(), &context(Some("acme")), place)
            .await;
        let globex = batch
            .process(message(), &context(Some("globex")), place)
            .await;
        let acme_again = batch
            .process(message(), &context(Some("acme")), place)
            .await;

        assert!(
            matches!(acme.records[0].1, RecordOutcome::Executed),
            "{name}"
        );
        assert!(
            matches!(globex.records[0].1, RecordOutcome::Executed),
            "{name}"
        );
        assert!(
            matches!(acme_again.records[0].1, RecordOutcome::Replayed),
            "{name}"
        );
        assert_eq!(
            placed.load(Ordering::SeqCst),
            2,
            "{name}: one order per tenant"
        );
    }
}

#[tokio::test]
async fn lambdas_tenant_scopes_the_http_door() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let keys = HttpKeys::new().with_callers(CallerScope::Shared);
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let app = service_fn(move |_: Request| {
            let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok::<_, BoxError>(
                    http::Response::builder()
                        .status(201)
                        .body(Body::Text(format!("run {run}")))
                        .expect("response"),
                )
            }
        });
        let mut service = Operation::new(idem, scope(), keys.policy())
            .http_layer()
            .layer(app);
        let mut send = async |tenant: &str| {
            let request = http::Request::builder()
                .method("POST")
                .uri("https://api.example/orders")
                .header("idempotency-key", "k-1")
                .body(Body::Text("{}".into()))
                .expect("request")
                .with_lambda_context(context(Some(tenant)));
            let response = service
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .expect("answered");
            String::from_utf8(response.body().to_vec()).expect("text")
        };

        let acme = send("acme").await;
        let globex = send("globex").await;
        let acme_again = send("acme").await;

        assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}");
        assert_eq!(
            (acme.as_str(), globex.as_str()),
            ("run 1", "run 2"),
            "{name}"
        );
        assert_eq!(acme_again, acme, "{name}");
    }
}

#[test]
fn a_policy_that_needs_a_tenant_refuses_an_event_without_one() {
    let scope = scope();
    let tenant = |event: &Value| event["tenant"].as_str().map(str::to_owned);
    let untenanted = json!({"order_id": "o-1"});

    let required = orders_policy().with_tenant(tenant);
    assert!(matches!(
        required.derive(&scope, &untenanted),
        Err(Error::TenantMissing { .. })
    ));
    let (tenanted, _) = required
        .derive(&scope, &json!({"order_id": "o-1", "tenant": "acme"}))
        .expect("a tenant");
    assert_eq!(tenanted.tenant(), Some("acme"));

    let optional = orders_policy().with_optional_tenant(tenant);
    let (key, _) = optional
        .derive(&scope, &untenanted)
        .expect("tenant-less is allowed");
    let (plain, _) = orders_policy().derive(&scope, &untenanted).expect("key");
    assert_eq!(key, plain, "an optional tenant left out keys as no tenant");

    // Lambda's tenant satisfies a policy that needs one, and wins over the event's.
    let operation = Operation::new(
        Idempotency::new(lambda_idempotency::MemoryStore::new()),
        scope,
        required,
    );
    let from_context = operation
        .invocation(&untenanted, &context(Some("acme")))
        .expect("Lambda's tenant");
    assert_eq!(from_context.key().tenant(), Some("acme"));
    let forged = json!({"order_id": "o-1", "tenant": "globex"});
    let invocation = operation
        .invocation(&forged, &context(Some("acme")))
        .expect("Lambda's tenant");
    assert_eq!(
        invocation.key().tenant(),
        Some("acme"),
        "the event cannot forge it"
    );
}

#[tokio::test]
async fn a_batch_record_without_its_tenant_fails_alone_as_poison() {
    let idem = Idempotency::new(lambda_idempotency::MemoryStore::new());
    let policy =
        sources::sqs(Some("/order_id"))
            .expect("sqs")
            .with_tenant(|message: &SqsMessage| {
                let body: Value = serde_json::from_str(message.body.as_deref()?).ok()?;
                body["tenant"].as_str().map(str::to_owned)
            });
    let batch = Operation::new(idem, scope(), policy).batch();
    let report = batch
        .process(
            vec![
                sqs_message("m-1", json!({"order_id": "o-1", "tenant": "acme"})),
                sqs_message("m-2", json!({"order_id": "o-1"})),
            ],
            &context(None),
            |_, _| async { Ok::<_, BoxError>(1) },
        )
        .await;
    assert!(matches!(report.records[0].1, RecordOutcome::Executed));
    let missing = &report.records[1].1;
    assert!(
        matches!(
            missing,
            RecordOutcome::Failed(Error::TenantMissing { .. })
                | RecordOutcome::Poison(Error::TenantMissing { .. })
        ),
        "{missing:?}"
    );
}

#[tokio::test]
async fn control_characters_are_refused_where_they_enter() {
    let operation = Operation::new(
        Idempotency::new(lambda_idempotency::MemoryStore::new()),
        scope(),
        orders_policy()
            .with_tenant(|event: &Value| event["tenant"].as_str().map(str::to_owned))
            .with_identity(|event: &Value| event["identity"].as_str().map(str::to_owned)),
    );
    let refused = |result: Result<lambda_idempotency::Invocation, Error>| {
        matches!(result, Err(Error::InvalidEvent { .. }))
    };
    let event = |tenant: &str, identity: &str| json!({"order_id": "o-1", "tenant": tenant, "identity": identity});
    assert!(refused(operation.invocation(
        &event("acme", "order:o-1"),
        &context(Some("ac\u{1b}[2Jme"))
    )));
    assert!(refused(
        operation.invocation(&event("ac\nme", "order:o-1"), &context(None))
    ));
    assert!(refused(
        operation.invocation(&event("acme", "order:\u{7}o-1"), &context(None))
    ));
    assert!(refused(operation.invocation(
        &event("acme", "order:o-1\u{202e}\u{0}"),
        &context(None)
    )));
    assert!(
        operation
            .invocation(&event("acme", "order:o-1"), &context(None))
            .is_ok()
    );

    // A caller principal read by the application is refused the same way: 400, nothing run.
    let keys = HttpKeys::new().with_principal(|request: &Request| {
        let caller = request.headers().get("x-caller")?;
        caller.to_str().ok().map(str::to_owned)
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = service_fn(move |_: Request| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(http::Response::new(Body::Empty)) }
    });
    let mut service = Operation::new(
        Idempotency::new(lambda_idempotency::MemoryStore::new()),
        scope(),
        keys.policy(),
    )
    .http_layer()
    .layer(app);
    let request = http::Request::builder()
        .method("POST")
        .uri("https://api.example/orders")
        .header("idempotency-key", "k-1")
        .header("x-caller", "alice\tadmin")
        .body(Body::Empty)
        .expect("request");
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("answered");
    assert_eq!(response.status(), 400);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The invocation as 0.4 made it for the same event: the key the policy alone derives
/// (0.4 never read Lambda's tenant) and a fingerprint that names no key rule, as 0.4 stored it.
fn as_0_4(operation: &Operation<Value>, payload: &Value, lease: Duration) -> Invocation {
    let today = operation
        .invocation(payload, &context(None))
        .expect("invocation");
    let fingerprint = Fingerprint::from_stored(today.fingerprint().as_str());
    let old = Invocation::new(today.key().clone(), fingerprint, lease);
    match today.identity() {
        Some(identity) => old.with_identity(identity).expect("identity"),
        None => old,
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// The engine with the 0.4 key rule on (cut-over `cutover`), and one without it.
fn engines(backend: &Backend, cutover: SystemTime) -> (Idempotency, Idempotency) {
    let config = Config::builder()
        .keyed_by_0_4_before(cutover)
        .build()
        .expect("config");
    let plain = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
    (plain.clone().with_config(config), plain)
}

async fn charge(
    idem: &Idempotency,
    invocation: &Invocation,
    runs: &AtomicUsize,
) -> Result<Value, Error> {
    idem.execute(invocation, |_| async move {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, BoxError>(json!({"charged": run}))
    })
    .await
    .map(|execution| execution.value().clone())
}

/// A function in tenant isolation mode upgraded from 0.4: what 0.4 recorded for an event
/// answers the redelivery by its state when the rule names the cut-over, and only then; never
/// with its result. Only what 0.4 wrote counts.
#[tokio::test]
async fn a_redelivery_across_the_upgrade_is_neither_run_again_nor_misread() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let (upgraded, rule_off) = engines(&backend, clock.now() + Duration::from_secs(3600));
        let operation = |idem: &Idempotency| Operation::new(idem.clone(), scope(), orders_policy());
        let tenanted = |payload: &Value, tenant| {
            operation(&upgraded)
                .invocation(payload, &context(Some(tenant)))
                .expect("invocation")
        };
        let runs = AtomicUsize::new(0);
        let o1 = json!({"order_id": "o-1", "amount": 5});

        charge(
            &rule_off,
            &as_0_4(&operation(&rule_off), &o1, MINUTE),
            &runs,
        )
        .await
        .expect("0.4's run");
        let o3 = json!({"order_id": "o-3"});
        let three_hours = Duration::from_secs(3 * 3600);
        crash_after_claim(&rule_off, &as_0_4(&operation(&rule_off), &o3, three_hours)).await;
        clock.advance(Duration::from_secs(2 * 3600));

        let redelivered = charge(&upgraded, &tenanted(&o1, "acme"), &runs).await;
        match &redelivered {
            Err(Error::KeyExpiredConflict { evidence, .. }) => {
                assert_eq!(evidence.status, Status::Completed, "{name}");
                assert_eq!(evidence.result_ref, None, "{name}: no result travels");
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: not run again");

        // Another intent under the same id is another operation: it runs.
        let changed = json!({"order_id": "o-1", "amount": 7});
        let other = charge(&upgraded, &tenanted(&changed, "globex"), &runs).await;
        assert!(other.is_ok(), "{name}: {other:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}");

        // A record 0.5 wrote under the old key (untenanted) is not 0.4's.
        let o2 = json!({"order_id": "o-2"});
        let untenanted = operation(&rule_off)
            .invocation(&o2, &context(None))
            .expect("invocation");
        charge(&rule_off, &untenanted, &runs)
            .await
            .expect("0.5, untenanted");
        assert!(
            charge(&upgraded, &tenanted(&o2, "acme"), &runs)
                .await
                .is_ok(),
            "{name}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 4, "{name}");

        // A 0.4 attempt (claimed before the cut-over, with a 3-hour lease) still running is
        // waited for; once its lease ran out (it crashed), it is held for an operator, never
        // re-run blind under the new key.
        let running = charge(&upgraded, &tenanted(&o3, "acme"), &runs).await;
        assert!(
            matches!(running, Err(Error::AlreadyInProgress { .. })),
            "{name}: {running:?}"
        );
        clock.advance(Duration::from_secs(2 * 3600));
        let crashed = charge(&upgraded, &tenanted(&o3, "acme"), &runs).await;
        // The key the error names is the one the stuck record is under, for the operator's
        // `idemctl resolve --key`: 0.4's, not today's (where nothing is stored).
        let under_0_4 = as_0_4(&operation(&rule_off), &o3, three_hours);
        match &crashed {
            Err(Error::Indeterminate { key }) => {
                assert_eq!(key, under_0_4.key(), "{name}");
                let stored = StoreExt::get(&backend.store, key).await.expect("read");
                assert!(stored.is_some(), "{name}: the record is there");
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 4, "{name}");

        // Without the rule, the redelivery runs again: the rule is what prevents it.
        let unprotected = charge(&rule_off, &tenanted(&o1, "acme"), &runs).await;
        assert!(unprotected.is_ok(), "{name}: {unprotected:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 5, "{name}");
    }
}

/// 0.4 keyed an event under the tenant its policy read from the event. When the event names
/// another tenant than Lambda's context, that key is the other tenant's: the rule never reads
/// it (neither its record nor its identity's evidence), so the caller learns nothing of the
/// other tenant's operation, and what its own tenant recorded still answers.
#[tokio::test]
async fn the_0_4_rule_never_reads_the_key_of_a_tenant_the_event_names_against_lambdas() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let (upgraded, rule_off) = engines(&backend, clock.now() + Duration::from_secs(3600));
        let policy = orders_policy()
            .with_tenant(|event: &Value| event["tenant"].as_str().map(str::to_owned))
            .with_identity(|event: &Value| {
                event["invoice"].as_str().map(|id| format!("invoice:{id}"))
            });
        let operation = |idem: &Idempotency| Operation::new(idem.clone(), scope(), policy.clone());
        let runs = AtomicUsize::new(0);
        let order = json!({"tenant": "globex", "order_id": "o-9", "invoice": "i-9"});

        // 0.4 recorded two of globex's orders under globex's key, and their invoices' evidence.
        let kept = json!({"tenant": "globex", "order_id": "o-10", "invoice": "i-10"});
        for payload in [&order, &kept] {
            charge(
                &rule_off,
                &as_0_4(&operation(&rule_off), payload, MINUTE),
                &runs,
            )
            .await
            .expect("0.4's run");
        }
        clock.advance(Duration::from_secs(2 * 3600));

        // Tenant acme sends an event naming globex: acme's own operation, which runs.
        let from_acme = |payload: &Value| {
            operation(&upgraded)
                .invocation(payload, &context(Some("acme")))
                .expect("invocation")
        };
        let answer = charge(&upgraded, &from_acme(&order), &runs).await;
        assert!(
            answer.is_ok(),
            "{name}: answered from globex's record: {answer:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3, "{name}");

        // Past the records' retention, only globex's evidence stands: not read for acme either.
        clock.advance(Config::DEFAULT_RETENTION);
        let same_invoice = json!({"tenant": "globex", "order_id": "o-11", "invoice": "i-10"});
        let answer = charge(&upgraded, &from_acme(&same_invoice), &runs).await;
        assert!(
            answer.is_ok(),
            "{name}: answered from globex's evidence: {answer:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 4, "{name}");
    }
}

/// The evidence 0.4 kept for an identity (without Lambda's tenant) keeps protecting it under
/// the rule, after its record expired: the same event is answered as applied, and another
/// event with the identity learns only that it is held.
#[tokio::test]
async fn an_identity_0_4_settled_is_not_run_again_after_the_upgrade() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let (upgraded, rule_off) = engines(&backend, clock.now() + Duration::from_secs(3600));
        let policy = orders_policy().with_identity(|event: &Value| {
            event["invoice"].as_str().map(|id| format!("invoice:{id}"))
        });
        let operation = |idem: &Idempotency| Operation::new(idem.clone(), scope(), policy.clone());
        let runs = AtomicUsize::new(0);
        let first = json!({"order_id": "o-1", "invoice": "i-1"});

        charge(
            &rule_off,
            &as_0_4(&operation(&rule_off), &first, MINUTE),
            &runs,
        )
        .await
        .expect("0.4's run");
        clock.advance(Duration::from_secs(2 * 3600) + Config::DEFAULT_RETENTION);

        let tenanted = |payload: &Value| {
            operation(&upgraded)
                .invocation(payload, &context(Some("acme")))
                .expect("invocation")
        };
        let same = charge(&upgraded, &tenanted(&first), &runs).await;
        assert!(
            matches!(&same, Err(Error::KeyExpiredConflict { evidence, key })
                if evidence.status == Status::Completed && evidence.key == *key),
            "{name}: {same:?}"
        );
        let another = json!({"order_id": "o-2", "invoice": "i-1"});
        let held = charge(&upgraded, &tenanted(&another), &runs).await;
        assert!(
            matches!(&held, Err(Error::KeyExpiredConflict { evidence, key })
                if evidence.status == Status::Completed && evidence.key != *key && evidence.result_ref.is_none()),
            "{name}: {held:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

/// A key policy used below the doors (`KeyPolicy::invocation_in_context`, for a function that
/// calls the engine itself) keys by Lambda's tenant as the doors do: two tenants' events of one
/// order are two operations, each replayed to its own tenant, never one tenant's result to
/// the other.
#[tokio::test]
async fn lambdas_tenant_scopes_an_invocation_a_key_policy_builds() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let policy = KeyPolicy::<Value>::pointer("/order_id").expect("policy");
        let event = json!({"order_id": "o-1"});
        let runs = AtomicUsize::new(0);
        let run = |tenant: &'static str| {
            let invocation = policy
                .invocation_in_context(
                    &scope(),
                    &event,
                    Duration::from_secs(60),
                    &context(Some(tenant)),
                )
                .expect("invocation");
            let (idem, runs) = (&idem, &runs);
            async move {
                idem.execute(&invocation, |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(json!(format!("for {tenant}")))
                })
                .await
                .expect("answered")
                .value()
                .clone()
            }
        };

        assert_eq!(run("tenant-a").await, json!("for tenant-a"), "{name}");
        assert_eq!(
            run("tenant-b").await,
            json!("for tenant-b"),
            "{name}: its own run"
        );
        assert_eq!(
            run("tenant-a").await,
            json!("for tenant-a"),
            "{name}: a replay"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{name}");
    }
}
