//! The checkout, deployed by template.yaml (`Binary: checkout`): steps, a transactional
//! effect and an outbox event in one handler.

use lambda_idempotency::observe::emf::Flushed;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::checkout::{Checkout, layer};
use lambda_idempotency_functions::{logging, metrics, stores_from_env};
use lambda_runtime::service_fn;
use lambda_runtime::tower::ServiceBuilder;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let (store, ledger) = stores_from_env().await?;
    let checkout = Checkout::from_env(ledger)?;
    let (collector, observer) = metrics::init()?;
    let layer = layer(
        Idempotency::new(store).with_observer(observer),
        OperationScope::for_function("checkout")?,
    )
    .await?;
    let handler = service_fn(move |event| checkout.clone().checkout(event));
    let service = ServiceBuilder::new().layer(layer).service(handler);
    lambda_runtime::run(Flushed::new(collector, service)).await
}
