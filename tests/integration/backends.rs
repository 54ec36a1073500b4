//! The two stores every production-input test runs on: the in-memory store and the DynamoDB
//! store on the embedded server, each with the clock its backend reads.

use lambda_idempotency::store::AnyStore;
use lambda_idempotency::testing::conformance::{Fixture, Sweeper, memory_fixture, start_time};
use lambda_idempotency::testing::dynamo;

/// One store under test.
pub struct Backend {
    /// `memory` or `dynamodb`, for assertion messages.
    pub name: &'static str,
    /// The store, empty.
    pub store: AnyStore,
    /// The clock its backend reads (give it to the engine).
    pub clock: lambda_idempotency::clock::ManualClock,
    /// TTL's deletion of what has expired.
    pub sweep: Sweeper,
}

fn backend<S: lambda_idempotency::store::Store>(name: &'static str, fx: Fixture<S>) -> Backend {
    Backend {
        name,
        store: AnyStore::new(fx.store),
        clock: fx.clock,
        sweep: fx.sweep,
    }
}

/// A fresh in-memory store and a fresh DynamoDB store (tables of their own).
pub async fn both() -> [Backend; 2] {
    [
        backend("memory", memory_fixture(start_time())),
        backend("dynamodb", dynamo::fixture(start_time()).await),
    ]
}
