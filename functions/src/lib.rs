//! The example application of `lambda-idempotency`: the Lambda functions that `template.yaml`
//! deploys, one module per function, shared by the deployable binaries (`src/bin/`), the local
//! runs (`examples/`) and the end-to-end tests.
//!
//! The binaries are Lambda-only: they read their tables from the environment
//! (`IDEMPOTENCY_TABLE`, `UNIQUENESS_TABLE`, `LEDGER_TABLE`), honour `DYNAMODB_ENDPOINT` for a
//! local server, and carry no local server or test code.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkout;
pub mod ledger;
pub mod logging;
pub mod metrics;
pub mod orders;
pub mod outbox_marker;
pub mod outbox_relay;
pub mod outbox_sweeper;
pub mod payments;
pub mod quickstart;
pub mod settings;
pub mod shipments;
pub mod stuck_check;

use lambda_idempotency::store::DynamoDbStore;

use ledger::Ledger;

/// The idempotency store and the ledger of effects, from the function's environment
/// ([`DynamoDbStore::for_lambda`]: no aws-config, so no credential chain in the binary),
/// primed during init.
///
/// # Errors
/// When a table's, the region's or the credentials' variable is not set, or priming finds the
/// table missing or forbidden.
pub async fn stores_from_env() -> Result<(DynamoDbStore, Ledger), lambda_runtime::Error> {
    let store = primed_store().await?;
    let ledger = Ledger::from_env(store.client().clone())?;
    Ok((store, ledger))
}

/// [`DynamoDbStore::for_lambda`], primed ([`DynamoDbStore::prime`]): a missing table or
/// permission fails the init; a transient error is left to the first event's retries.
///
/// # Errors
/// As [`stores_from_env`].
pub async fn primed_store() -> Result<DynamoDbStore, lambda_runtime::Error> {
    let store = DynamoDbStore::for_lambda()?;
    if let Err(err) = store.prime().await {
        if !err.is_transient() {
            // The message says what to do (deploy the table, grant the permission); a boxed
            // error would reach the log in its debug form only.
            tracing::error!(error = %err, "the store is not usable: the init fails");
            return Err(err.to_string().into());
        }
        tracing::warn!(error = %err, "priming the store failed; the first event will retry");
    }
    Ok(store)
}
