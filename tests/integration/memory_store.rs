//! The conformance suite against the in-memory store.

use lambda_idempotency::store::MemoryStore;
use lambda_idempotency::testing::conformance::{Fixture, memory_fixture, start_time};

async fn fixture() -> Fixture<MemoryStore> {
    memory_fixture(start_time())
}

lambda_idempotency::conformance_tests!(fixture());
