//! The conformance suite against the in-memory store.

use lambda_idempotency::store::MemoryStore;

crate::support::conformance::conformance!(async { MemoryStore::new() });
