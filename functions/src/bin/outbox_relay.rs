//! The outbox relay, deployed by template.yaml (`Binary: outbox_relay`): the outbox table's
//! stream in, every committed event published once (at least) under its event id, and marked
//! published in the outbox table (`OUTBOX_TABLE`).

use lambda_idempotency::effects::relay::{Publisher, RELAY_OPERATION, relay};
use lambda_idempotency::effects::{Destinations, Outbox, OutboxMarks};
use lambda_idempotency::observe::emf::Flushed;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::checkout::OUTBOX_TABLE_VAR;
use lambda_idempotency_functions::{logging, metrics, primed_store};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let store = primed_store().await?;
    let outbox = std::env::var(OUTBOX_TABLE_VAR)
        .map_err(|_| format!("set {OUTBOX_TABLE_VAR} to the outbox table's name"))?;
    let marks = OutboxMarks::new(store.client().clone(), &Outbox::new(outbox));
    let publisher = Publisher::from_env()
        .await
        .with_destinations(Destinations::from_env()?);
    let scope = OperationScope::for_function(RELAY_OPERATION)?;
    let (collector, observer) = metrics::init()?;
    let relay = relay(
        Idempotency::new(store).with_observer(observer),
        scope,
        publisher,
        marks,
    );
    lambda_runtime::run(Flushed::new(collector, relay)).await
}
