//! The request kinds a function's binary sends only on paths an end-to-end run does not take
//! (a panicking handler's give-back, an outcome too large for the record), sent by the
//! function's own layer in-process through a recording client tagged as that function, so that
//! the IAM check (`scripts/iam-check.sh`) evaluates them against its policies too.

// Shared with the end-to-end tests and the cold-start benchmark.
#[allow(dead_code)]
mod support;

use std::time::{Duration, SystemTime};

use lambda_idempotency::lambda::IdempotencyLayer;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::{
    DynamoDbStore, Idempotency, Invocation, KeyPolicy, Operation, OperationScope,
};
use lambda_runtime::tower::{Layer, Service, ServiceExt, service_fn};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use support::function::{Tables, recorded_client};

/// The quickstart's own layer (`quickstart::layer`) over a store whose requests are recorded
/// as the quickstart's, and the invocation the layer derives for `event` (to read its record).
async fn quickstart_over(
    tables: &Tables,
    event: &LambdaEvent<Value>,
) -> (DynamoDbStore, IdempotencyLayer<Value>, Invocation) {
    let client = recorded_client("quickstart", "quickstart", tables, &[]).await;
    let store = DynamoDbStore::new(client, tables.store.table());
    let idem = Idempotency::new(store.clone());
    let scope = OperationScope::new("quickstart", "charge").expect("scope");
    let layer = lambda_idempotency_functions::quickstart::layer(idem.clone(), scope.clone())
        .expect("the quickstart's layer");
    // The quickstart keys by `/order_id` (its layer's policy): the same invocation.
    let invocation = Operation::new(
        idem,
        scope,
        KeyPolicy::pointer("/order_id").expect("pointer"),
    )
    .invocation(&event.payload, &event.context)
    .expect("invocation");
    (store, layer, invocation)
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
    let (store, layer, invocation) = quickstart_over(&tables, &event("o-panic")).await;
    let mut service = layer.layer(service_fn(|_: LambdaEvent<Value>| async {
        panic!("a handler bug");
        #[allow(unreachable_code)]
        Ok::<Value, lambda_runtime::Error>(Value::Null)
    }));
    let call = service.ready().await.expect("ready").call(event("o-panic"));
    let panicked = tokio::spawn(call).await;
    assert!(panicked.expect_err("the panic goes on").is_panic());

    // The give-back runs in a task of its own: wait (bounded) until the lease is shortened
    // below the claim's (60 s without a deadline) to the give-back's few seconds.
    let given_back = async {
        loop {
            let record = store
                .get(invocation.key())
                .await
                .expect("read")
                .expect("kept");
            let left = record
                .lease
                .expires_at
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            if left < Duration::from_secs(30) {
                return record;
            }
            tokio::task::yield_now().await;
        }
    };
    let record = tokio::time::timeout(Duration::from_secs(10), given_back)
        .await
        .expect("the claim was given back");
    assert_eq!(record.status, Status::InProgress, "given back, not settled");
}

/// An outcome too large for the record: compressed and kept in part items beside it (PutItem
/// of each part, then the settlement), and read back whole by a replay (GetItem of the parts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_kept_in_parts_is_recorded() {
    let tables = Tables::create("kinds-parts").await.recorded("kinds-parts");
    let (_, layer, _) = quickstart_over(&tables, &event("o-large")).await;
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
    let mut service = layer.layer(service_fn(move |_: LambdaEvent<Value>| {
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
