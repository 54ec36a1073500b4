//! The SQS order consumer, deployed by template.yaml (`Binary: sqs_orders`).

use lambda_idempotency::OperationScope;
use lambda_idempotency_functions::orders::Orders;
use lambda_idempotency_functions::{logging, stores_from_env};
use lambda_runtime::service_fn;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let (store, ledger) = stores_from_env().await?;
    let orders = Orders::new(store, ledger, OperationScope::for_function("place-order")?)?;
    lambda_runtime::run(service_fn(|event| orders.handle(event))).await
}
