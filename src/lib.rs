//! # lambda-idempotency
//!
//! Make AWS Lambda handlers idempotent: one business operation, one business effect, however
//! often the event is delivered, retried, replayed or raced.
//!
//! - An [`OperationKey`] names the operation (scope + SHA-256 of the RFC 8785 canonical JSON of
//!   the key material); a [`Fingerprint`] names its intent. The same key with another intent is
//!   a [`Error::PayloadConflict`], never a replay of an unrelated result.
//! - The [`Idempotency`] engine claims the key with one conditional write, runs the handler
//!   once, stores the exact result bytes and replays them to every duplicate. A concurrent
//!   duplicate gets [`Error::AlreadyInProgress`]; it never runs in parallel.
//! - Completion is fenced by a lease token: a worker whose expired lease was taken over cannot
//!   overwrite the new owner's result ([`Error::LeaseLost`]).
//! - Records live in a [`store::Store`]: [`store::DynamoDbStore`] in production,
//!   [`store::MemoryStore`] for tests and demos, with the same semantics.
//!
//! ## Quick start
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lambda_idempotency::{Config, Idempotency, Invocation, KeyPolicy, OperationScope};
//! use lambda_idempotency::store::MemoryStore; // DynamoDbStore::from_env().await? in Lambda
//! use serde_json::json;
//!
//! let idem = Idempotency::new(MemoryStore::new(), Config::default());
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
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

pub mod clock;
pub mod config;
pub mod engine;
pub mod error;
pub mod execution;
pub mod failure;
pub mod key;
pub mod lambda;
pub mod reconcile;
pub mod record;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

// Lets code shared with the examples and tests (`testing`) name this crate as they do.
extern crate self as lambda_idempotency;

/// The README's examples, compiled as doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use config::Config;
pub use engine::{Idempotency, Resolution};
pub use error::{BoxError, ConfigError, Error, ErrorKind, StoreError};
pub use execution::{Execution, ExecutionContext, Invocation, Origin};
pub use key::{Fingerprint, KeyPolicy, OperationKey, OperationScope};
