//! The replication check at start-up (`DynamoDbStore::check_replication`, run by `prime`):
//! the embedded server has no Regions, so an interceptor rewrites its real `DescribeTable`
//! answers into those of a global table (replicas, witness, consistency mode), as DynamoDB
//! gives them; every other request goes to the server untouched.

use std::sync::atomic::{AtomicUsize, Ordering};

use aws_sdk_dynamodb::config::interceptors::FinalizerInterceptorContextMut;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use aws_sdk_dynamodb::types::{
    GlobalTableWitnessDescription, MultiRegionConsistency, ReplicaDescription,
};
use lambda_idempotency::store::{DynamoDbStore, Replication};
use lambda_idempotency::testing::conformance::{counted, invocation};
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::interceptor::{
    FaultInterceptor, SDK_ATTEMPTS, SdkFault, SdkOperation, client_with,
};
use lambda_idempotency::testing::local;
use lambda_idempotency::{Error, Idempotency, StoreError};
use serde_json::json;

/// Makes the tables named in `tables` answer `DescribeTable` as global tables.
#[derive(Debug, Clone)]
struct GlobalTable {
    tables: Vec<String>,
    consistency: Option<MultiRegionConsistency>,
    replicas: Vec<&'static str>,
    witness: Option<&'static str>,
}

impl Intercept for GlobalTable {
    fn name(&self) -> &'static str {
        "GlobalTable"
    }

    fn modify_before_attempt_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(Ok(output)) = context.output_or_error_mut() else {
            return Ok(());
        };
        let Some(described) = output.downcast_mut::<DescribeTableOutput>() else {
            return Ok(());
        };
        let Some(table) = described.table.as_mut() else {
            return Ok(());
        };
        if !table
            .table_name
            .as_ref()
            .is_some_and(|name| self.tables.contains(name))
        {
            return Ok(());
        }
        table.replicas = Some(
            self.replicas
                .iter()
                .map(|region| ReplicaDescription::builder().region_name(*region).build())
                .collect(),
        );
        table.global_table_witnesses = self.witness.map(|region| {
            vec![
                GlobalTableWitnessDescription::builder()
                    .region_name(region)
                    .build(),
            ]
        });
        table.multi_region_consistency = self.consistency.clone();
        Ok(())
    }
}

/// A store on fresh tables whose `DescribeTable` answers come through `global`, and the
/// faults (which count requests) of its client.
async fn store_with(
    dynamo: &Dynamo,
    global: Option<GlobalTable>,
    uniqueness: bool,
) -> (DynamoDbStore, FaultInterceptor) {
    let faults = FaultInterceptor::new();
    let mut config = local::config_for(dynamo.endpoint.clone()).interceptor(faults.clone());
    if let Some(global) = global {
        config = config.interceptor(global);
    }
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let store = DynamoDbStore::new(client, &dynamo.table);
    let store = if uniqueness {
        store.with_uniqueness_table(&dynamo.uniqueness_table)
    } else {
        store
    };
    (store, faults)
}

fn mrec(tables: Vec<String>) -> GlobalTable {
    GlobalTable {
        tables,
        // Unset: DynamoDB's default for a global table, eventual.
        consistency: None,
        replicas: vec!["us-east-1", "eu-west-1"],
        witness: None,
    }
}

fn mrsc(tables: Vec<String>) -> GlobalTable {
    GlobalTable {
        tables,
        consistency: Some(MultiRegionConsistency::Strong),
        replicas: vec!["us-east-1", "us-east-2"],
        witness: Some("us-west-2"),
    }
}

/// Runs one operation through `store`; the handler's runs are counted.
async fn run_once(store: DynamoDbStore, runs: &AtomicUsize) -> Result<u32, Error> {
    let idem = Idempotency::new(store);
    idem.execute(&invocation("global", &json!({"amount": 1})), |_| {
        counted(runs, 7_u32)
    })
    .await
    .map(|done| *done.value())
}

#[tokio::test]
async fn a_single_region_table_passes_and_prime_describes_it_beside_its_read() {
    let dynamo = dynamo::start().await;
    let (store, faults) = store_with(&dynamo, None, true).await;

    store.prime().await.expect("prime");

    assert_eq!(
        store.check_replication().await.expect("checked"),
        Replication::SingleRegion
    );
    assert_eq!(
        faults.requests(SdkOperation::GetItem),
        1,
        "prime reads once"
    );
    assert_eq!(
        faults.requests(SdkOperation::DescribeTable),
        2 + 2,
        "both tables, by prime and by the check"
    );
    let runs = AtomicUsize::new(0);
    assert_eq!(run_once(store, &runs).await.expect("runs"), 7);
}

#[tokio::test]
async fn an_eventually_consistent_global_table_is_refused_at_start_up_and_so_are_claims() {
    let dynamo = dynamo::start().await;
    let (store, faults) = store_with(&dynamo, Some(mrec(vec![dynamo.table.clone()])), false).await;

    let err = store.prime().await.expect_err("refused");

    assert!(
        matches!(&err, StoreError::EventuallyConsistentReplicas { table, regions }
            if *table == dynamo.table && *regions == ["us-east-1", "eu-west-1"]),
        "got {err:?}"
    );
    assert!(!err.is_transient(), "it fails the init");
    // A caller that carries on past the init's error: its claims are refused too, and no
    // request is sent.
    let sent = |faults: &FaultInterceptor| -> usize {
        SdkOperation::ALL
            .into_iter()
            .map(|operation| faults.requests(operation))
            .sum()
    };
    let before = sent(&faults);
    let runs = AtomicUsize::new(0);
    let err = run_once(store.clone(), &runs).await.expect_err("refused");
    assert!(
        matches!(
            err,
            Error::Store(StoreError::EventuallyConsistentReplicas { .. })
        ),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        sent(&faults),
        before,
        "a refused claim sends no request, not even a release"
    );
}

/// A store never primed (as `Idempotency::from_env` and the README build it) checks on its
/// first claim: an eventually consistent global table is refused before the handler runs, where
/// every claim went on unchecked (two Regions could each claim one key and run it twice).
#[tokio::test]
async fn a_store_never_primed_refuses_an_eventually_consistent_global_table_at_its_first_claim() {
    let dynamo = dynamo::start().await;
    let (store, faults) = store_with(&dynamo, Some(mrec(vec![dynamo.table.clone()])), false).await;
    let runs = AtomicUsize::new(0);

    let err = run_once(store, &runs).await.expect_err("refused");

    assert!(
        matches!(
            err,
            Error::Store(StoreError::EventuallyConsistentReplicas { .. })
        ),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(faults.requests(SdkOperation::PutItem), 0, "nothing claimed");
}

#[tokio::test]
async fn an_eventually_consistent_uniqueness_table_is_refused_too() {
    let dynamo = dynamo::start().await;
    let global = mrec(vec![dynamo.uniqueness_table.clone()]);
    let (store, _) = store_with(&dynamo, Some(global), true).await;

    let err = store.check_replication().await.expect_err("refused");

    assert!(
        matches!(&err, StoreError::EventuallyConsistentReplicas { table, .. } if *table == dynamo.uniqueness_table),
        "got {err:?}"
    );
}

#[tokio::test]
async fn opting_in_accepts_an_eventually_consistent_global_table() {
    let dynamo = dynamo::start().await;
    let (store, _) = store_with(&dynamo, Some(mrec(vec![dynamo.table.clone()])), false).await;
    let store = store.accept_eventually_consistent_replicas();

    store.prime().await.expect("accepted");

    assert!(matches!(
        store.check_replication().await.expect("checked"),
        Replication::Eventual { regions } if regions == ["us-east-1", "eu-west-1"]
    ));
    let runs = AtomicUsize::new(0);
    assert_eq!(run_once(store, &runs).await.expect("runs"), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_strongly_consistent_global_table_is_accepted_without_a_uniqueness_table() {
    let dynamo = dynamo::start().await;
    let tables = vec![dynamo.table.clone(), dynamo.uniqueness_table.clone()];
    let (plain, _) = store_with(&dynamo, Some(mrsc(tables.clone())), false).await;

    plain.prime().await.expect("MRSC is the supported mode");
    assert!(matches!(
        plain.check_replication().await.expect("checked"),
        Replication::Strong { regions } if regions == ["us-east-1", "us-east-2", "us-west-2"]
    ));
    let runs = AtomicUsize::new(0);
    assert_eq!(run_once(plain, &runs).await.expect("runs"), 7);

    // Business identities are written in transactions, which MRSC tables do not accept.
    let (base, _) = store_with(&dynamo, Some(mrsc(tables)), false).await;
    let with_identities = base.clone().with_uniqueness_table(&dynamo.uniqueness_table);
    let err = with_identities.prime().await.expect_err("refused");
    assert!(
        matches!(&err, StoreError::TransactionsUnsupported { table } if *table == dynamo.table),
        "got {err:?}"
    );
    assert!(!err.is_transient());
    // The refusal is the configured store's: the store it was built from still claims.
    let runs = AtomicUsize::new(0);
    assert_eq!(run_once(base, &runs).await.expect("runs"), 7);
    let err = run_once(with_identities, &runs)
        .await
        .expect_err("its claims are refused");
    assert!(
        matches!(
            err,
            Error::Store(StoreError::TransactionsUnsupported { .. })
        ),
        "got {err:?}"
    );
}

#[tokio::test]
async fn a_role_without_describe_table_fails_the_init_and_a_throttled_check_does_not() {
    let dynamo = dynamo::start().await;
    let faults = FaultInterceptor::new();
    let store = DynamoDbStore::new(client_with(dynamo.endpoint.clone(), &faults), &dynamo.table);

    faults.inject(
        SdkOperation::DescribeTable,
        SdkFault::Error {
            status: 400,
            code: "AccessDeniedException",
        },
    );
    let err = store.prime().await.expect_err("no permission");
    assert!(
        matches!(
            &err,
            StoreError::AccessDenied {
                operation: "describe_table",
                ..
            }
        ),
        "got {err:?}"
    );

    faults.inject_times(
        SdkOperation::DescribeTable,
        SdkFault::Throttle,
        SDK_ATTEMPTS as usize,
    );
    let err = store.prime().await.expect_err("throttled");
    assert!(err.is_transient(), "left to the next cold start: {err:?}");
    store
        .prime()
        .await
        .expect("checked once the throttling ends");
}

/// A table with multi-Region strong consistency refuses `TransactWriteItems`: an operation
/// declared to write in transactions is refused at init (by its `prime`, which reuses the
/// store's check); the store and undeclared operations are accepted, and each transactional
/// write is refused before it is sent (a transactional step answers `StepError::Rejected`, a
/// completion's writes are retained `completion_rejected`), while plain operations run.
#[tokio::test]
async fn transactional_writes_on_a_strongly_consistent_table_are_refused_before_any_effect() {
    use aws_sdk_dynamodb::types::{AttributeValue, Put};
    use lambda_idempotency::effects::{StepError, Transaction};
    use lambda_idempotency::key::{KeyPolicy, OperationScope};
    use lambda_idempotency::lambda::Operation as Declared;

    let dynamo = dynamo::start().await;
    let (undeclared, faults) =
        store_with(&dynamo, Some(mrsc(vec![dynamo.table.clone()])), false).await;
    undeclared
        .prime()
        .await
        .expect("accepted: plain operations run");
    let idem = Idempotency::new(undeclared.clone());
    let scope = OperationScope::new("shop", "checkout").expect("scope");
    let policy = KeyPolicy::<serde_json::Value>::pointer("/order").expect("pointer");
    let declared = Declared::new(idem.clone(), scope.clone(), policy.clone());
    declared
        .prime()
        .await
        .expect("an operation that declares nothing asks nothing");
    let err = declared
        .with_transactional_writes()
        .prime()
        .await
        .expect_err("refused at init");
    assert!(
        matches!(&err, StoreError::TransactionalWritesUnsupported { table } if *table == dynamo.table),
        "got {err:?}"
    );
    assert!(!err.is_transient(), "a lasting error: it fails the init");
    assert_eq!(
        faults.requests(SdkOperation::DescribeTable),
        1,
        "the operation's check reused the store's: no second round trip at init"
    );

    // On a single-Region table, the declared operation starts, checking the table itself when
    // the store was not primed.
    let (single, faults) = store_with(&dynamo, None, false).await;
    Declared::new(Idempotency::new(single), scope, policy)
        .with_transactional_writes()
        .prime()
        .await
        .expect("a single-Region table accepts transactions");
    assert_eq!(faults.requests(SdkOperation::DescribeTable), 1);

    let put = || {
        Put::builder()
            .table_name(&dynamo.table)
            .item("pk", AttributeValue::S("order-mrsc".into()))
            .build()
            .expect("put")
    };
    let stepped = idem
        .execute(
            &invocation("mrsc-step", &json!({"order": 1})),
            |ctx| async move {
                let refused = ctx
                    .step("place")
                    .transact(|_| async { Ok(Transaction::new(1).put(put())) })
                    .await;
                assert!(
                    matches!(refused, Err(StepError::Rejected { .. })),
                    "{refused:?}"
                );
                Ok::<_, std::io::Error>(0_u32)
            },
        )
        .await
        .expect("the handler went on without the refused step");
    assert_eq!(*stepped.value(), 0);

    let inv = invocation("mrsc-completion", &json!({"order": 2}));
    let err = idem
        .execute(&inv, |ctx| async move {
            ctx.complete_with(Transaction::new(()).put(put()))?;
            Ok::<_, lambda_idempotency::BoxError>(1_u32)
        })
        .await
        .expect_err("the completion's writes are refused");
    assert!(matches!(err, Error::Handler { .. }), "got {err:?}");
    let replay = idem
        .execute(&inv, |_| async { Ok::<_, std::io::Error>(2_u32) })
        .await
        .expect_err("retained");
    let Error::Failed { failure, .. } = replay else {
        panic!("got {replay:?}");
    };
    assert_eq!(failure.kind.as_str(), "completion_rejected");
    assert_eq!(
        faults.requests(SdkOperation::TransactWriteItems),
        0,
        "nothing was sent in a transaction"
    );
    let runs = AtomicUsize::new(0);
    assert_eq!(
        run_once(undeclared, &runs)
            .await
            .expect("a plain operation runs"),
        7
    );
}

/// `prime`'s check throttled (a burst of cold starts) is owed, not dropped: the next claim runs
/// it again and, on an eventually consistent global table, is refused before it claims, where
/// the environment would have claimed unchecked for its whole life. One claim at a time runs
/// it (the others wait for it); while it fails for now, claims go on as before and one tries
/// again a few seconds later.
#[tokio::test]
async fn a_check_prime_could_not_finish_is_run_by_the_next_claim() {
    let dynamo = dynamo::start().await;
    let (store, faults) = store_with(&dynamo, Some(mrec(vec![dynamo.table.clone()])), false).await;
    faults.inject_times(
        SdkOperation::DescribeTable,
        SdkFault::Throttle,
        SDK_ATTEMPTS as usize,
    );
    let err = store.prime().await.expect_err("throttled");
    assert!(err.is_transient(), "{err:?}");

    let runs = AtomicUsize::new(0);
    let err = run_once(store.clone(), &runs).await.expect_err("refused");
    assert!(
        matches!(
            err,
            Error::Store(StoreError::EventuallyConsistentReplicas { .. })
        ),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "never claimed unchecked");
    assert_eq!(
        faults.requests(SdkOperation::PutItem),
        0,
        "no claim was sent"
    );

    // On a single-Region table, once a claim completed the owed check, it is not tried again.
    let dynamo = dynamo::start().await;
    let (store, faults) = store_with(&dynamo, None, false).await;
    faults.inject_times(
        SdkOperation::DescribeTable,
        SdkFault::Throttle,
        SDK_ATTEMPTS as usize,
    );
    store.prime().await.expect_err("throttled");
    let runs = AtomicUsize::new(0);
    assert_eq!(run_once(store.clone(), &runs).await.expect("runs"), 7);
    let described = faults.requests(SdkOperation::DescribeTable);
    assert_eq!(run_once(store.clone(), &runs).await.expect("replays"), 7);
    assert_eq!(
        faults.requests(SdkOperation::DescribeTable),
        described,
        "completed by the first claim, not tried again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A clone whose builder changes what the check accepts owes its own check: accepting
    // eventually consistent replicas does not let the strict store claim unchecked.
    let dynamo = dynamo::start().await;
    let (store, faults) = store_with(&dynamo, Some(mrec(vec![dynamo.table.clone()])), false).await;
    faults.inject_times(
        SdkOperation::DescribeTable,
        SdkFault::Throttle,
        SDK_ATTEMPTS as usize,
    );
    store.prime().await.expect_err("throttled");
    let lenient = store.clone().accept_eventually_consistent_replicas();
    let runs = AtomicUsize::new(0);
    assert_eq!(run_once(lenient, &runs).await.expect("accepted"), 7);
    let err = run_once(store, &runs).await.expect_err("refused");
    assert!(
        matches!(
            err,
            Error::Store(StoreError::EventuallyConsistentReplicas { .. })
        ),
        "got {err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
