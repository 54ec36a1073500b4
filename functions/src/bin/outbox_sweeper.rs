//! The scheduled outbox sweeper (an EventBridge schedule invokes it): republishes the outbox
//! events pending too long and prints the outbox's gauges as EMF, which the stack's alarms
//! watch.

use std::time::SystemTime;

use lambda_idempotency::effects::Destinations;
use lambda_idempotency::lambda::relay::Publisher;
use lambda_idempotency::store::dynamodb_config;
use lambda_idempotency_functions::logging;
use lambda_idempotency_functions::outbox_sweeper::OutboxSweeper;
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let sweeper = OutboxSweeper::from_env(
        aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&config)),
        Publisher::from_conf(&config).with_destinations(Destinations::from_env()?),
    )?;
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    lambda_runtime::run(service_fn(|_event: LambdaEvent<Value>| {
        let (sweeper, function) = (&sweeper, function.as_str());
        async move {
            let document = sweeper.run(function, SystemTime::now()).await?;
            // One log line: CloudWatch reads the gauges from it.
            println!("{document}");
            Ok::<_, lambda_runtime::Error>(document)
        }
    }))
    .await
}
