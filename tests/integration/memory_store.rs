//! The conformance suite against the in-memory store.

use std::sync::Arc;

use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::store::MemoryStore;

use lambda_idempotency::testing::conformance::{Fixture, Sweeper, start_time};

async fn fixture() -> Fixture<MemoryStore> {
    let clock = ManualClock::new(start_time());
    let store = MemoryStore::new();
    let sweep: Sweeper = {
        let (store, clock) = (store.clone(), clock.clone());
        Arc::new(move || {
            let swept = store.sweep_expired(clock.now());
            Box::pin(async move { swept })
        })
    };
    Fixture {
        store,
        clock,
        sweep,
    }
}

lambda_idempotency::conformance_tests!(fixture());
