//! The functions' tables on a local DynamoDB-compatible server, for `cargo lambda watch`: an
//! embedded server on 127.0.0.1:8000 (`--port` to change it) with the idempotency, uniqueness,
//! ledger and outbox tables created, serving until Ctrl-C. It prints the environment the functions
//! need.
//!
//! ```sh
//! cargo run -p lambda-idempotency-functions --example local_stack
//! ```

use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::testing::local;
use lambda_idempotency_functions::ledger::Ledger;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let port = port()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tokio::spawn(dynoxide::server::serve_on(
        listener,
        dynoxide::Database::memory()?,
    ));

    let client = aws_sdk_dynamodb::Client::from_conf(local::config_for(endpoint.clone()).build());
    let store = DynamoDbStore::new(client.clone(), "local-idempotency")
        .with_uniqueness_table("local-uniqueness");
    store.create_table().await?;
    let ledger = Ledger::new(client.clone(), "local-ledger");
    ledger.create().await?;
    // The checkout's outbox (its events are written there; nothing relays them locally).
    local::create_outbox_table(&client, "local-outbox").await?;

    println!("tables ready on {endpoint}; in the shell that runs `cargo lambda watch`:\n");
    println!("export DYNAMODB_ENDPOINT={endpoint}");
    println!(
        "export IDEMPOTENCY_TABLE=local-idempotency UNIQUENESS_TABLE=local-uniqueness LEDGER_TABLE=local-ledger"
    );
    println!(
        "export OUTBOX_TABLE=local-outbox ORDER_EVENTS_QUEUE_URL=http://127.0.0.1/000000000000/order-events"
    );
    println!("export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test");
    println!("\nserving until Ctrl-C (the tables live in memory)");
    tokio::signal::ctrl_c().await?;
    Ok(())
}

/// The port after `--port`, else 8000.
fn port() -> Result<u16, lambda_runtime::Error> {
    let mut args = std::env::args().skip_while(|arg| arg != "--port");
    Ok(match (args.next(), args.next()) {
        (Some(_), Some(port)) => port.parse()?,
        (Some(_), None) => return Err("--port needs a number".into()),
        _ => 8000,
    })
}
