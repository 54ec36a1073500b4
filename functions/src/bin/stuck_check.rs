//! The scheduled stuck check (an EventBridge schedule invokes it): prints the idempotency
//! tables' stuck figures as EMF gauges, which the stack's alarms watch.

use std::time::SystemTime;

use lambda_idempotency_functions::stuck_check::{Settings, run};
use lambda_idempotency_functions::{logging, primed_store};
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let store = primed_store().await?;
    let settings = Settings::from_env()?;
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    lambda_runtime::run(service_fn(|_event: LambdaEvent<Value>| {
        let (store, function) = (&store, function.as_str());
        async move {
            let document = run(store, settings, function, SystemTime::now()).await?;
            // One log line: CloudWatch reads the gauges from it.
            println!("{document}");
            Ok::<_, lambda_runtime::Error>(document)
        }
    }))
    .await
}
