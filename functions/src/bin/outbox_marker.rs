//! The outbox marker on the Pipe path (a rule on the outbox bus invokes it with each event the
//! Pipe published): marks the event published in the outbox table (`OUTBOX_TABLE`).

use std::time::SystemTime;

use lambda_idempotency::effects::{Outbox, OutboxMarks};
use lambda_idempotency::store::dynamodb_config;
use lambda_idempotency_functions::checkout::OUTBOX_TABLE_VAR;
use lambda_idempotency_functions::{logging, outbox_marker};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let outbox = lambda_idempotency_functions::settings::required(
        OUTBOX_TABLE_VAR,
        "the outbox table's name",
    )?;
    let marks = OutboxMarks::new(
        aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&config)),
        &Outbox::new(outbox),
    );
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let marks = &marks;
        async move {
            outbox_marker::mark(marks, &event.payload, SystemTime::now()).await?;
            Ok::<_, lambda_runtime::Error>(Value::Null)
        }
    }))
    .await
}
