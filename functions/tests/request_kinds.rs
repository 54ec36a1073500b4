//! The request kinds a function's binary sends only on paths an end-to-end run does not take
//! (a panicking handler's give-back, an outcome too large for the record), sent by the
//! function's own layer in-process through a recording client tagged as that function, so that
//! the IAM check (`scripts/iam-check.sh`) evaluates them against its policies too.

// Shared with the end-to-end tests and the cold-start benchmark.
#[allow(dead_code)]
mod support;

use lambda_idempotency::record::Status;
use lambda_idempotency::store::Store;
use lambda_idempotency::{DynamoDbStore, Idempotency, KeyPolicy, Operation, OperationScope};
use lambda_runtime::tower::{Layer, Service, ServiceExt, service_fn};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use support::function::{Tables, recorded_client};

/// The quickstart's own layer over a store whose requests are recorded as the quickstart's.
async fn quickstart_over(tables: &Tables) -> (DynamoDbStore, Operation<Value>) {
    let client = recorded_client("quickstart", "quickstart", tables, &[]).await;
    let store = DynamoDbStore::new(client, tables.store.table());
    let operation = Operation::new(
        Idempotency::new(store.clone()),
        OperationScope::new("quickstart", "charge").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("pointer"),
    );
    (store, operation)
}

fn event(order: &str) -> LambdaEvent<Value> {
    LambdaEvent::new(
        json!({"order_id": order, "amount": 100}),
        Context::default(),
    )
}

/// A panicking handler: the layer gives the claim back (an UpdateItem shortening the lease),
/// then the panic goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handlers_give_back_is_recorded() {
    let tables = Tables::create("kinds-panic").await.recorded("kinds-panic");
    let (store, operation) = quickstart_over(&tables).await;
    let layered = lambda_idempotency_functions::quickstart::layer(
        operation.engine().clone(),
        operation.scope().clone(),
    )
    .expect("layer");
    let mut service = layered.layer(service_fn(|_: LambdaEvent<Value>| async {
        panic!("a handler bug");
        #[allow(unreachable_code)]
        Ok::<Value, lambda_runtime::Error>(Value::Null)
    }));
    let invocation = operation
        .invocation(&event("o-panic").payload, &Context::default())
        .expect("invocation");
    let call = service.ready().await.expect("ready").call(event("o-panic"));
    let panicked = tokio::spawn(call).await;

    assert!(panicked.expect_err("the panic goes on").is_panic());
    let record = store
        .get(invocation.key())
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(record.status, Status::InProgress, "given back, not settled");
}

/// An outcome too large for the record: compressed and kept in part items beside it (PutItem
/// of each part, then the settlement), and read back whole by a replay (GetItem of the parts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_kept_in_parts_is_recorded() {
    let tables = Tables::create("kinds-parts").await.recorded("kinds-parts");
    let (_, operation) = quickstart_over(&tables).await;
    // 600 KB of noise over 64 symbols (xorshift): still about 450 KB once compressed, more
    // than a record holds.
    const SYMBOLS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: String = (0..600_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(SYMBOLS[(state % 64) as usize])
        })
        .collect();
    let answer = json!({"charged": "o-large", "receipt": noise});
    let mut service = operation
        .layer()
        .layer(service_fn(move |_: LambdaEvent<Value>| {
            let answer = answer.clone();
            async move { Ok::<Value, lambda_runtime::Error>(answer) }
        }));

    let first = service
        .ready()
        .await
        .expect("ready")
        .call(event("o-large"))
        .await
        .expect("charged");
    let replay = service
        .ready()
        .await
        .expect("ready")
        .call(event("o-large"))
        .await
        .expect("replayed");

    assert_eq!(replay, first, "replayed whole from its parts");
    let recorded =
        std::fs::read_to_string(support::recorder::recordings_dir().join("kinds-parts.jsonl"))
            .expect("the recording");
    let part_puts = recorded
        .lines()
        .filter(|line| line.contains("DynamoDB_20120810.PutItem") && line.contains("#outcome#"))
        .count();
    assert!(part_puts > 0, "the outcome went to part items: {part_puts}");
}
