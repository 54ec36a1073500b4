//! The payment endpoint, deployed by template.yaml (`Binary: api_payments`).

use lambda_idempotency::observe::emf::Flushed;
use lambda_idempotency::{CallerScope, Idempotency, OperationScope};
use lambda_idempotency_functions::payments::payments;
use lambda_idempotency_functions::{logging, metrics, stores_from_env};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let (store, ledger) = stores_from_env().await?;
    let (collector, observer) = metrics::init()?;
    // template.yaml's API authorizes every request (AWS_IAM): each caller's keys are its own,
    // and a request that names no caller (a route deployed without the authorizer) is 401.
    let app = payments(
        Idempotency::new(store).with_observer(observer),
        ledger,
        OperationScope::for_function("pay")?,
        CallerScope::Principal,
    );
    lambda_http::run(Flushed::new(collector, app)).await
}
