//! # lambda-idempotency
//!
//! Make AWS Lambda handlers idempotent: one business operation, one business effect, however
//! often the event is delivered, retried, replayed or raced.
//!
//! ## A handler in a few lines
//!
//! Build the operation from the engine, and the door from the operation: a duplicate gets the
//! stored result back and the handler does not run again.
//!
//! ```no_run
//! use lambda_idempotency::{Idempotency, KeyPolicy};
//! use lambda_runtime::tower::ServiceBuilder;
//! use lambda_runtime::{LambdaEvent, service_fn};
//! use serde_json::{Value, json};
//!
//! async fn charge(event: LambdaEvent<Value>) -> Result<Value, lambda_runtime::Error> {
//!     Ok(json!({"charged": event.payload["order_id"]}))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::from_env().await?; // DynamoDB, the tables the environment names
//!     let charge_once = idem.operation("charge", KeyPolicy::pointer("/order_id")?)?.layer();
//!     lambda_runtime::run(ServiceBuilder::new().layer(charge_once).service(service_fn(charge))).await
//! }
//! ```
//!
//! ## Which door for which trigger
//!
//! Every door is built from one [`Operation`] (engine, scope, key policy, lease policy, result
//! reference), made by [`Idempotency::operation`] or [`Operation::new`]:
//!
//! | trigger | door | key policy |
//! |---|---|---|
//! | direct or async invocation, EventBridge (one event per invocation) | [`Operation::layer`] ([`IdempotencyLayer`]) | [`KeyPolicy`], or [`lambda::sources`]`::eventbridge()` |
//! | SQS, Kinesis, DynamoDB Streams (batches, partial failures) | [`Operation::batch`] ([`BatchProcessor`], a service with `.service(handler)`) | [`lambda::sources`]`::sqs(..)`, `kinesis()`, `dynamodb_stream()` |
//! | SNS, S3 (events holding records; no partial-batch response: a record to deliver again fails the invocation) | [`Operation::batch`] | [`lambda::sources`]`::sns()`, `sns_by_key_attribute()`, `s3()` |
//! | API Gateway REST / HTTP, Function URLs, ALB, with axum or any tower service | [`Operation::http_layer`] ([`HttpIdempotencyLayer`]) | [`lambda::sources`]`::http()`: the `Idempotency-Key` header, scoped to the caller ([`CallerScope`]) |
//! | any async code inside a handler | [`Idempotency::execute`] | [`OperationKey`] and [`Fingerprint`] of your own |
//!
//! The store is erased once, in the engine: [`Idempotency::new`] takes a [`DynamoDbStore`], a
//! [`MemoryStore`] or a store of your own, and no type a door names carries it.
//!
//! An SQS consumer:
//!
//! ```no_run
//! use aws_lambda_events::event::sqs::SqsMessage;
//! use lambda_idempotency::lambda::sources;
//! use lambda_idempotency::{ExecutionContext, Idempotency};
//!
//! async fn place_order(message: SqsMessage, ctx: ExecutionContext) -> Result<String, lambda_runtime::Error> {
//!     Ok(format!("placed (attempt {})", ctx.attempt()))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idem = Idempotency::from_env().await?;
//!     let orders = idem.operation("orders", sources::sqs(Some("/order_id"))?)?.batch();
//!     lambda_runtime::run(orders.service(place_order)).await
//! }
//! ```
//!
//! ## The engine
//!
//! - An [`OperationKey`] names the operation (scope + SHA-256 of the canonical JSON of the key
//!   material: RFC 8785 with every integer exact); a [`Fingerprint`] names its intent. The same key with another intent is
//!   a [`Error::PayloadConflict`], never a replay of an unrelated result.
//! - The [`Idempotency`] engine claims the key with one conditional write, runs the handler
//!   once, stores the exact result bytes and replays them to every duplicate. A concurrent
//!   duplicate gets [`Error::AlreadyInProgress`]; it never runs in parallel.
//! - Completion is fenced by a lease token: a worker whose expired lease was taken over cannot
//!   overwrite the new owner's result ([`Error::LeaseLost`]).
//! - Records live in a [`store::Store`]: [`DynamoDbStore`] in production, [`MemoryStore`] for
//!   tests and demos, with the same semantics.
//!
//! ## Further reading
//!
//! The [`guide`]: the [doors](guide::doors) (batches, HTTP, event sources), the
//! [protocol](guide::protocol) (requests, conditions, the edges, the tables),
//! [retention, evidence and failures](guide::retention_and_failures) (sizing retention,
//! failure classes, reconciliation, errors) and [operating it](guide::operations) (metrics,
//! logs, the `idemctl` CLI, the in-process cache).
//!
//! ## The engine on its own
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lambda_idempotency::{Idempotency, Invocation, KeyPolicy, OperationScope};
//! use lambda_idempotency::store::MemoryStore; // Idempotency::from_env().await? in Lambda
//! use serde_json::json;
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let scope = OperationScope::new("shop", "create-order")?;
//! let policy = KeyPolicy::pointer("/order_id")?;
//!
//! let event = json!({"order_id": "o-418", "amount": 1200});
//! let (key, fingerprint) = policy.derive(&scope, &event)?;
//! let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
//!
//! let created = idem
//!     .execute(&invocation, |ctx| async move {
//!         // ctx.downstream_key("charge") is stable across attempts: pass it to the payment API.
//!         Ok::<_, std::io::Error>(json!({"order": "o-418", "attempt": ctx.attempt()}))
//!     })
//!     .await?;
//! assert!(!created.is_replay());
//!
//! // A redelivery gets the stored result; the handler does not run.
//! let replay = idem.execute(&invocation, |_| async { Ok::<_, std::io::Error>(json!(null)) }).await?;
//! assert!(replay.is_replay());
//! assert_eq!(replay.raw_json().get(), created.raw_json().get());
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod config;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod defects;
#[cfg(not(feature = "testing"))]
// The switches are public with `testing`, constants here (some used only by other features).
#[allow(unreachable_pub, dead_code)]
mod defects;
pub mod effects;
pub mod engine;
pub mod error;
pub mod execution;
pub mod failure;
pub mod guide;
pub mod key;
pub mod lambda;
#[cfg(all(test, feature = "testing"))]
mod model;
pub mod observe;
mod policy;
pub mod reconcile;
pub mod record;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

// Lets code shared with the examples and tests (`testing`) name this crate as they do.
extern crate self as lambda_idempotency;

/// The README's examples, compiled as doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use config::Config;
pub use engine::{Idempotency, Operator, Resolution};
pub use error::{BoxError, ConfigError, Error, ErrorKind, StoreError};
pub use execution::{Execution, ExecutionContext, Invocation, Origin};
pub use key::{Fingerprint, KeyPolicy, OperationKey, OperationScope};
pub use lambda::batch::{BatchProcessor, PoisonPolicy};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use lambda::http::{CallerScope, HttpIdempotencyLayer, HttpKeys};
pub use lambda::{IdempotencyError, IdempotencyLayer, LeasePolicy, Operation};
pub use store::{AnyStore, DynamoDbStore, MemoryStore};
