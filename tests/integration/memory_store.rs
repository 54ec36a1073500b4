//! The conformance suite against the in-memory store.

use lambda_idempotency::store::MemoryStore;
use lambda_idempotency::testing::conformance::{Fixture, memory_fixture, start_time};

async fn fixture() -> Fixture<MemoryStore> {
    memory_fixture(start_time())
}

lambda_idempotency::conformance_tests!(fixture());

#[tokio::test]
async fn single_flight_does_not_make_a_nested_call_wait_on_itself() {
    use std::time::Duration;

    use lambda_idempotency::{Error, Idempotency};

    let fx = memory_fixture(start_time());
    let idem = Idempotency::new(fx.store).with_single_flight();
    let inv = lambda_idempotency::testing::conformance::invocation("nested", &serde_json::json!(1));

    let outer = tokio::time::timeout(
        Duration::from_secs(10),
        idem.execute(&inv, |_| {
            let (idem, inv) = (idem.clone(), inv.clone());
            async move {
                let inner = idem
                    .execute(&inv, |_| async { Ok::<_, std::io::Error>(2_u32) })
                    .await;
                assert!(
                    matches!(inner, Err(Error::AlreadyInProgress { .. })),
                    "the nested call meets its own live claim at once: {inner:?}"
                );
                Ok::<_, std::io::Error>(1_u32)
            }
        }),
    )
    .await
    .expect("no wait on itself");

    assert_eq!(*outer.expect("outer completes").value(), 1);
}
