//! The payment endpoint, deployed by template.yaml (`Binary: api_payments`).

use lambda_idempotency::OperationScope;
use lambda_idempotency::lambda::http_layer::CallerScope;
use lambda_idempotency_functions::payments::Payments;
use lambda_idempotency_functions::{logging, stores_from_env};
use lambda_runtime::service_fn;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    logging::init();
    let (store, ledger) = stores_from_env().await?;
    // template.yaml's demo API has no authorizer: anonymous callers share one scope. Behind a
    // JWT or Lambda authorizer, keep the default (CallerScope::Principal).
    let payments = Payments::new(
        store,
        ledger,
        OperationScope::for_function("pay")?,
        CallerScope::PrincipalOrAnonymous,
    );
    lambda_runtime::run(service_fn(|event| payments.handle(event))).await
}
