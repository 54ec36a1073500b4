//! What each panic strategy gives a claim whose handler panics. With `panic = "unwind"` (the
//! release profile this crate asks for) the engine catches the panic and gives the claim back:
//! its lease ends 5 s later (`panicking_handler_gives_the_claim_back` in the conformance suite).
//! With `panic = "abort"` (what `cargo lambda build` sets unless the profile names a strategy)
//! the process dies on the spot: nothing is given back, and the claim holds for its whole
//! lease. A test binary cannot be built both ways, so this one shows the second by aborting a
//! child process (this test binary, run again) in the middle of a handler, against the same
//! embedded DynamoDB server, and reading what it left.

use std::process::Command;
use std::time::Duration;

use lambda_idempotency::record::Status;
use lambda_idempotency::store::{DynamoDbStore, StoreExt};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::local::config_for;
use lambda_idempotency::{Fingerprint, Idempotency, Invocation, OperationKey, OperationScope};

/// The lease the aborting handler's claim asks for.
const LEASE: Duration = Duration::from_secs(120);

fn invocation() -> Invocation {
    let scope = OperationScope::new("panic-strategy", "charge").expect("scope");
    let key = OperationKey::derive(&scope, None, "o-1").expect("key");
    Invocation::new(key, Fingerprint::of(&1).expect("fingerprint"), LEASE)
}

/// The child: claims the operation, then dies as a `panic = "abort"` build does when its
/// handler panics. Run only by the test below (it needs the parent's server).
#[tokio::test]
#[ignore = "the child process of a_handler_that_aborts_the_process_holds_its_claim_for_its_whole_lease"]
async fn aborting_child() {
    let endpoint = std::env::var("PANIC_STRATEGY_ENDPOINT").expect("run by its parent");
    let table = std::env::var("PANIC_STRATEGY_TABLE").expect("run by its parent");
    let client = aws_sdk_dynamodb::Client::from_conf(config_for(endpoint).build());
    let idem = Idempotency::new(DynamoDbStore::new(client, table));
    let _ = idem
        .execute(&invocation(), |_| async {
            std::process::abort();
            #[allow(unreachable_code)]
            Ok::<u32, std::io::Error>(0)
        })
        .await;
    unreachable!("the process aborted inside the handler");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_aborts_the_process_holds_its_claim_for_its_whole_lease() {
    let db = dynamo::start().await;
    let child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "panic_strategy::aborting_child",
            "--ignored",
            "--nocapture",
        ])
        .env("PANIC_STRATEGY_ENDPOINT", &db.endpoint)
        .env("PANIC_STRATEGY_TABLE", &db.table)
        .output()
        .expect("the child runs");
    assert!(!child.status.success(), "the child aborted");

    let record = db
        .store()
        .get(invocation().key())
        .await
        .expect("get")
        .expect("the claim the aborted process left");
    assert_eq!(record.status, Status::InProgress);
    let held = record
        .lease
        .expires_at
        .duration_since(record.created_at)
        .expect("a lease after the claim");
    assert_eq!(
        held, LEASE,
        "nothing gave the claim back: it holds for the whole lease"
    );
}
