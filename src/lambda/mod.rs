//! Wrapping Lambda handlers: a tower [`Layer`](lambda_runtime::tower::Layer) for
//! `lambda_runtime`, event-source key policies, batch processing and the HTTP contract.
//!
//! ```no_run
//! use lambda_idempotency::{Idempotency, KeyPolicy};
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
//!     let idem = Idempotency::from_env().await?;
//!     let charge_once = idem.operation("charge", KeyPolicy::pointer("/order_id")?)?.layer();
//!     lambda_runtime::run(ServiceBuilder::new().layer(charge_once).service(service_fn(charge))).await
//! }
//! ```

pub mod batch;
mod context;
mod diagnostic;
#[cfg(feature = "durable")]
#[cfg_attr(docsrs, doc(cfg(feature = "durable")))]
pub mod durable;
mod error;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod layer;
mod operation;
#[cfg(feature = "relay")]
#[cfg_attr(docsrs, doc(cfg(feature = "relay")))]
pub mod relay;
mod service;
pub mod sources;

pub use context::current;
pub use error::IdempotencyError;
pub use layer::IdempotencyLayer;
pub use operation::{LeasePolicy, Operation};
pub use service::IdempotencyService;
