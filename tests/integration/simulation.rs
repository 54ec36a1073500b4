//! The seeded simulation on both stores, with CI's small budget. `SIM_SEED=n` replays one seed;
//! `SIM_SEEDS=n` runs more. The long run is `cargo bench --bench simulation --features testing`.

use lambda_idempotency::testing::dynamo;
use lambda_idempotency::testing::simulation::{
    Budget, Stats, memory_fixture, run_seed, sim_start_time,
};

/// The primitives that meet every injected fault kind on the memory store's seeds.
const EVERY_KIND_ON: [&str; 4] = ["claim", "take_over", "settle", "record_steps"];

fn seeds(default: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        return vec![seed.parse().expect("SIM_SEED is a number")];
    }
    let count =
        std::env::var("SIM_SEEDS").map_or(default, |n| n.parse().expect("SIM_SEEDS is a number"));
    (0..count).collect()
}

/// The fault kinds the simulation injects into one call.
const FAULT_KINDS: [&str; 6] = [
    "FailBefore(Throttled)",
    "FailBefore(Unavailable)",
    "FailBefore(Contention)",
    "FailAfter(Unavailable)",
    "CancelBefore",
    "CancelAfter",
];

/// That the run explored what it claims to: every handler behaviour, every fault kind (on
/// each primitive of `every_kind_on`, and injected apart from outages' failures), every
/// reconciler answer, every deploy, takeovers, declared re-runs and outages; ids at the
/// rounding anchors met under the 0.1 rule and neighbouring amounts refused; late effects
/// landed with a give-back's grace kept; knowing give-backs replayed. A simulation that checks
/// invariants on paths it never walks proves nothing.
fn assert_explored(total: &Stats, every_kind_on: &[&str]) {
    if std::env::var("SIM_SEED").is_ok() {
        return; // one seed cannot walk every path
    }
    assert!(total.checks > 0);
    for behaviour in [
        "Complete",
        "RetryableFailure",
        "TerminalFailure",
        "CrashBeforeEffect",
        "CrashAfterEffect",
        "PanicAfterEffect",
        "CancelAfterEffect",
        "SuspendBeforeEffect",
        "SuspendAfterEffect",
        "LateEffectThenFails",
        "LateEffectThenCancelled",
        "FailAfterStep",
    ] {
        assert!(
            total.behaviours.get(behaviour) > Some(&0),
            "{behaviour} never played: {total}"
        );
    }
    let kinds = total.fault_kinds();
    for kind in FAULT_KINDS {
        assert!(
            kinds.get(kind) > Some(&0),
            "fault {kind} never fired: {total}"
        );
    }
    for primitive in every_kind_on {
        let kinds = total.faults_on(primitive);
        for kind in FAULT_KINDS {
            assert!(
                kinds.get(kind) > Some(&0),
                "fault {kind} never fired on {primitive}: {total}"
            );
        }
    }
    for primitive in ["claim", "take_over", "settle", "release", "record_steps"] {
        assert!(
            !total.faults_on(primitive).is_empty(),
            "no fault injected into {primitive}: {total}"
        );
    }
    // Outages fail settlements (and releases) as throttling, counted apart from the
    // throttles injected into one call.
    assert!(
        total.outage_failures.get("settle Throttled") > Some(&0),
        "no outage failed a settlement: {total}"
    );
    for answer in ["Applied", "NotApplied", "Unknown", "Fails"] {
        assert!(
            total.reconciles.get(answer) > Some(&0),
            "reconciler never {answer}: {total}"
        );
    }
    for deploy in [
        "AsDeclared",
        "AddsIdentity",
        "RemovesIdentity",
        "ChangesIdentity",
    ] {
        assert!(
            total.deploys.get(deploy) > Some(&0),
            "deploy {deploy} never made: {total}"
        );
    }
    assert!(total.takeovers > 0, "no takeover: {total}");
    assert!(total.declared_reruns > 0, "no declared re-run: {total}");
    assert!(total.outages > 0, "no outage: {total}");
    assert!(total.compatible_seeds > 0, "the 0.1 rule never on: {total}");
    assert!(
        total.anchors > 0,
        "no anchor's record met under the 0.1 rule: {total}"
    );
    assert!(
        total.changed_amounts > 0,
        "no neighbouring amount refused: {total}"
    );
    assert!(total.late_effects > 0, "no late effect landed: {total}");
    assert!(total.graces > 0, "no give-back's grace kept: {total}");
    assert!(
        total.give_backs_replayed > 0,
        "no give-back replayed: {total}"
    );
}

/// What only a store that keeps DynamoDB items explores: step lists another build encoded,
/// taken over; completions refused by their condition (the handler's own tables).
fn assert_explored_on_dynamodb(total: &Stats, transactional: bool) {
    if std::env::var("SIM_SEED").is_ok() {
        return;
    }
    assert!(total.re_encoded > 0, "no step list re-encoded: {total}");
    assert!(
        total.re_encoded_takeovers > 0,
        "no re-encoded step list taken over: {total}"
    );
    if transactional {
        assert!(
            total.behaviours.get("RefusedCompletion") > Some(&0) && total.refused_completions > 0,
            "no completion refused: {total}"
        );
    }
}

#[tokio::test]
async fn simulation_keeps_the_invariants_on_the_memory_store() {
    let mut total = Stats::default();
    for seed in seeds(300) {
        match run_seed(memory_fixture(), seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("memory store: {total}");
    assert_explored(&total, &EVERY_KIND_ON);
}

#[tokio::test]
async fn simulation_keeps_the_invariants_on_the_dynamodb_store() {
    let mut total = Stats::default();
    // Without the handler's own tables (an endpoint that ignores request tokens) there are
    // no transactional handlers to count.
    let mut transactional = true;
    for seed in seeds(40) {
        let fixture = dynamo::fixture(sim_start_time()).await;
        transactional &= fixture.effect_tables.is_some();
        match run_seed(fixture, seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("DynamoDB store: {total}");
    assert_explored(&total, &["claim"]);
    assert_explored_on_dynamodb(&total, transactional);
    if transactional {
        assert_explored_transactions(&total);
    }
}

/// The memory store with its transactional capability: the handler's writes, steps and
/// outbox committed into an embedded server's tables under the store's lock, and the
/// outbox's relay and sweeper reading them.
#[tokio::test]
async fn simulation_keeps_the_invariants_on_the_transactional_memory_store() {
    let mut total = Stats::default();
    for seed in seeds(40) {
        let fixture = dynamo::memory_fixture_with_tables(sim_start_time()).await;
        match run_seed(fixture, seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("memory store with its tables: {total}");
    assert_explored(&total, &["claim"]);
    assert_explored_transactions(&total);
}

/// What a store with the handler's own tables explores: transactional reservations, events
/// and completions, and every fault of the outbox's far side, each of its paths publishing.
fn assert_explored_transactions(total: &Stats) {
    if std::env::var("SIM_SEED").is_err() {
        for committed in ["reservations", "events", "completions"] {
            assert!(
                total.transactions.get(committed) > Some(&0),
                "no transactional {committed}: {total}"
            );
        }
        // The outbox's far side met each of its faults, and each path published.
        for happened in [
            "relay published",
            "relay parked",
            "relay crashed after publishing",
            "sweeper republished",
            "stream records given up",
            "consumer effects",
        ] {
            assert!(
                total.outbox.get(happened) > Some(&0),
                "the outbox's {happened} never happened: {total}"
            );
        }
    }
}

#[tokio::test]
async fn simulation_keeps_the_invariants_through_the_in_process_cache() {
    let mut total = Stats::default();
    for seed in seeds(200) {
        let fixture = memory_fixture();
        let cached =
            fixture.map_store(|store| lambda_idempotency::store::CachedStore::new(store, 1 << 20));
        match run_seed(cached, seed, Budget::default()).await {
            Ok(stats) => total.absorb(stats),
            Err(violation) => panic!("{violation}"),
        }
    }
    eprintln!("memory store through the in-process cache: {total}");
    assert_explored(&total, &EVERY_KIND_ON);
}
