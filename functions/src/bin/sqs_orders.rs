//! The SQS order consumer, deployed by template.yaml (`Binary: sqs_orders`).

use lambda_idempotency::observe::emf::Flushed;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::orders::orders;
use lambda_idempotency_functions::{logging, metrics, stores_from_env};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let (store, ledger) = stores_from_env().await?;
    let (collector, observer) = metrics::init()?;
    let orders = orders(
        Idempotency::new(store).with_observer(observer),
        ledger,
        OperationScope::for_function("place-order")?,
    )?;
    lambda_runtime::run(Flushed::new(collector, orders)).await
}
