//! Wrapping Lambda handlers: a tower [`Layer`](lambda_runtime::tower::Layer) for
//! `lambda_runtime`, event-source key policies, batch processing and the HTTP contract.
//!
//! ```no_run
//! use lambda_idempotency::lambda::IdempotencyLayer;
//! use lambda_idempotency::store::DynamoDbStore;
//! use lambda_idempotency::{Config, Idempotency, KeyPolicy, OperationScope};
//! use lambda_runtime::tower::ServiceBuilder;
//! use lambda_runtime::{LambdaEvent, service_fn};
//! use serde_json::{Value, json};
//!
//! async fn charge(event: LambdaEvent<Value>) -> Result<Value, lambda_runtime::Error> {
//!     // lambda_idempotency::lambda::current() tells the attempt and the operation key.
//!     Ok(json!({"charged": event.payload["order_id"]}))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::new(DynamoDbStore::from_env().await?, Config::default());
//!     let layer = IdempotencyLayer::new(idem, OperationScope::for_function("charge")?, KeyPolicy::pointer("/order_id")?);
//!     lambda_runtime::run(ServiceBuilder::new().layer(layer).service(service_fn(charge))).await
//! }
//! ```

pub mod batch;
mod context;
mod diagnostic;
pub mod http;
pub mod http_layer;
mod layer;
mod operation;
mod service;
pub mod sources;

pub use context::current;
pub use layer::IdempotencyLayer;
pub use operation::{LeasePolicy, Operation};
pub use service::Idempotent;
