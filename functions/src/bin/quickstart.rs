//! The README's first function: `IDEMPOTENCY_TABLE` names the table; `DYNAMODB_ENDPOINT`,
//! when set, points at a local server.

use lambda_idempotency::observe::emf::Flushed;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::quickstart::{charge, layer};
use lambda_idempotency_functions::{logging, metrics, primed_store};
use lambda_runtime::service_fn;
use lambda_runtime::tower::ServiceBuilder;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let store = primed_store().await?;
    let (collector, observer) = metrics::init()?;
    // The namespace is AWS_LAMBDA_FUNCTION_NAME.
    let layer = layer(
        Idempotency::new(store).with_observer(observer),
        OperationScope::for_function("charge")?,
    )?;
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(charge));
    lambda_runtime::run(Flushed::new(collector, service)).await
}
