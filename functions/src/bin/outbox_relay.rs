//! The outbox relay, deployed by template.yaml (`Binary: outbox_relay`): the outbox table's
//! stream in, every committed event published (at least once) under its event id in batches,
//! marked published in the outbox table (`OUTBOX_TABLE`), and one EMF document per batch.

use std::time::SystemTime;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use lambda_idempotency::effects::Destinations;
use lambda_idempotency::lambda::relay::Publisher;
use lambda_idempotency::store::dynamodb_config;
use lambda_idempotency_functions::{logging, outbox_relay};
use lambda_runtime::{LambdaEvent, service_fn};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let relay = outbox_relay::from_env(
        aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&config)),
        Publisher::from_conf(&config).with_destinations(Destinations::from_env()?),
    )?;
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    lambda_runtime::run(service_fn(|event: LambdaEvent<DynamoDbEvent>| {
        let (relay, function) = (&relay, function.as_str());
        async move {
            let report = relay.relay_batch(&event.payload.records).await;
            // One log line: CloudWatch reads the figures from it.
            println!(
                "{}",
                outbox_relay::emf_document(function, &report, SystemTime::now())
            );
            Ok::<_, lambda_runtime::Error>(report.response())
        }
    }))
    .await
}
