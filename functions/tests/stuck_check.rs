//! The scheduled stuck check against the embedded server: a crashed claim past its lease, an
//! INDETERMINATE record and an orphaned evidence are counted, the oldest's wait reported, and
//! the page budget bounds the reads.

use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::testing::conformance::{crash_after_claim, invocation};
use lambda_idempotency::testing::dynamo;
use lambda_idempotency::{BoxError, Idempotency};
use lambda_idempotency_functions::metrics::NAMESPACE;
use lambda_idempotency_functions::stuck_check::{Settings, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_counts_what_waits_and_how_long_the_oldest_has() {
    let db = dynamo::start().await;
    let now = SystemTime::now();
    // Claims made an hour ago by a clock of their own: their leases ran out long since.
    let hour_ago = ManualClock::new(now - Duration::from_secs(3600));
    let idem = Idempotency::new(db.store()).with_clock(hour_ago.clone());
    crash_after_claim(&idem, &invocation("stuck-1", &serde_json::json!(1))).await;
    crash_after_claim(&idem, &invocation("stuck-2", &serde_json::json!(2))).await;
    // A takeover without a reconciler holds the second one INDETERMINATE (the default).
    hour_ago.advance(Duration::from_secs(60));
    let held = idem
        .execute(
            &invocation("stuck-2", &serde_json::json!(2)),
            |_ctx| async { Ok::<_, BoxError>(0_u32) },
        )
        .await;
    assert!(held.is_err(), "held for an operator");
    // A settled operation does not count.
    idem.execute(&invocation("done", &serde_json::json!(3)), |_ctx| async {
        Ok::<_, BoxError>(0_u32)
    })
    .await
    .expect("completed");

    let settings = Settings {
        older_than: Duration::from_secs(300),
        max_pages: 100,
    };
    let document = run(&db.store(), settings, "stuck-check", now)
        .await
        .expect("the check runs");
    assert_eq!(document["StuckInProgress"], 1);
    assert_eq!(document["Indeterminate"], 1);
    assert_eq!(document["OrphanedEvidence"], 0);
    assert_eq!(document["StuckCheckIncomplete"], 0);
    let age = document["ReconciliationAge"].as_u64().expect("seconds");
    assert!(
        (3500..3600).contains(&age),
        "the first claim's lease ran out about an hour ago: {age}"
    );
    assert_eq!(
        document["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        NAMESPACE
    );
    assert_eq!(document["Function"], "stuck-check");

    let recent = Settings {
        older_than: Duration::from_secs(7200),
        max_pages: 100,
    };
    let none = run(&db.store(), recent, "stuck-check", now)
        .await
        .expect("the check runs");
    assert_eq!(none["StuckInProgress"], 0, "not stuck for two hours yet");
    assert_eq!(none["ReconciliationAge"], 0);

    let bounded = Settings {
        older_than: Duration::from_secs(300),
        max_pages: 0,
    };
    let partial = run(&db.store(), bounded, "stuck-check", now)
        .await
        .expect("the check runs");
    assert_eq!(
        partial["StuckCheckIncomplete"], 1,
        "the page budget ran out"
    );
}
