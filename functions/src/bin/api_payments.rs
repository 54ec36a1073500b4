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
    // template.yaml's demo API has no authorizer: anonymous callers share one scope. Behind a
    // JWT or Lambda authorizer, keep the default (CallerScope::Principal).
    let app = payments(
        Idempotency::new(store).with_observer(observer),
        ledger,
        OperationScope::for_function("pay")?,
        CallerScope::PrincipalOrAnonymous,
    );
    lambda_http::run(Flushed::new(collector, app)).await
}
