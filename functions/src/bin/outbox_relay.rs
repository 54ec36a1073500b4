//! The outbox relay, deployed by template.yaml (`Binary: outbox_relay`): the outbox table's
//! stream in, every committed event published once (at least) under its event id.

use lambda_idempotency::effects::relay::{Publisher, RELAY_OPERATION, relay};
use lambda_idempotency::observe::emf::Flushed;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::{logging, metrics, primed_store};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let store = primed_store().await?;
    let publisher = Publisher::from_env().await;
    let scope = OperationScope::for_function(RELAY_OPERATION)?;
    let (collector, observer) = metrics::init()?;
    let relay = relay(
        Idempotency::new(store).with_observer(observer),
        scope,
        publisher,
    );
    lambda_runtime::run(Flushed::new(collector, relay)).await
}
