//! What tests, examples and third-party stores share (feature `testing`): the conformance
//! suite any [`Store`](crate::store::Store) can run, a fault-injecting store decorator, a
//! fault-injecting DynamoDB client interceptor, the local DynamoDB-compatible endpoint, the
//! seeded simulation of the protocol, and the protocol's specification ([`transitions`]: the
//! store transitions and answers the model check allows).
//!
//! **Stability.** The feature follows the crate's version: a signature here changes only in a
//! release whose CHANGELOG lists it. The conformance suite grows with each release, on
//! purpose: a case added for a new rule of the contract may fail a store that passed the
//! previous suite, and then that store breaks the rule.
//!
//! A store of your own runs the whole suite with one macro (object_store's `integration`
//! module is the model):
//!
//! ```no_run
//! use std::sync::Arc;
//! use lambda_idempotency::clock::{Clock, ManualClock};
//! use lambda_idempotency::store::MemoryStore;
//! use lambda_idempotency::testing::conformance::{Fixture, Sweeper, start_time};
//!
//! async fn fixture() -> Fixture<MemoryStore> {
//!     let clock = ManualClock::new(start_time());
//!     let store = MemoryStore::new(); // your store here
//!     let sweep: Sweeper = {
//!         let (store, clock) = (store.clone(), clock.clone());
//!         Arc::new(move || {
//!             let swept = store.sweep_expired(clock.now());
//!             Box::pin(async move { swept })
//!         })
//!     };
//!     Fixture::new(store, clock, sweep)
//!     // A store that keeps no permanent evidence says so here,
//!     //   .with_capabilities(Capabilities::ALL.without(Capability::Evidence))
//!     // and below: `conformance_tests!(fixture(), without [Evidence])`, which reports the
//!     // cases that need evidence as ignored.
//! }
//!
//! lambda_idempotency::conformance_tests!(fixture());
//! # fn main() {}
//! ```

pub mod conformance;
pub mod durability;
pub mod dynamo;
pub mod edges;
pub mod faults;
pub mod identities;
pub mod interceptor;
pub mod local;
pub mod moto;
pub mod operators;
pub mod outages;
pub mod outcomes;
pub mod primitives;
pub mod recovery;
pub mod simulation;
pub mod steps;
pub mod transitions;

/// Generates one `#[tokio::test]` per conformance case for a store made by `$make` (an async
/// expression giving a [`conformance::Fixture`]): first the store's own primitives
/// ([`primitives`]), then the engine's cases over the store.
///
/// A store that lacks a [capability](conformance::Capability) says so:
/// `conformance_tests!(fixture(), without [Evidence])`. The cases that need it are generated
/// `#[ignore]`d with the reason, so the test runner reports them as ignored, never as passed;
/// a case that meets a lacking capability its set-up did not declare fails
/// ([`Fixture::require`](conformance::Fixture::require)), and the generated
/// `declared_capabilities_are_the_fixtures` checks the declaration against the fixture.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!($make, without []);
    };
    ($make:expr, without [$($lacks:ident),* $(,)?]) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn declared_capabilities_are_the_fixtures() {
            use $crate::testing::conformance::{Capabilities, Capability};
            let declared = Capabilities::ALL$(.without(Capability::$lacks))*;
            let fixture = $make.await;
            // The capabilities that decide which cases run (RequestTokens decides only what
            // the simulation's handlers do, and is found by probing the endpoint).
            for capability in [Capability::Evidence, Capability::LargeOutcomes] {
                assert_eq!(
                    fixture.offers(capability),
                    declared.has(capability),
                    "conformance_tests!'s `without [..]` must name {capability:?} exactly \
                     when the fixture lacks it"
                );
            }
        }
        $crate::conformance_tests!(@run $make;
            a_stuck_claim_is_resolved_by_an_operator_but_never_a_live_one,
            an_operators_release_leaves_a_trace_and_the_next_delivery_runs,
            store_claims_a_key_once_and_answers_the_standing_record,
            store_counts_only_a_settled_expired_record_as_absent,
            store_takes_over_only_an_expired_lease_from_its_holder,
            store_fences_settlements_and_releases_on_the_lease,
            store_shortens_and_releases_the_holders_claim,
            first_run_executes_and_stores,
            duplicate_replays_without_running,
            payload_conflict_is_refused,
            payload_conflict_is_checked_before_in_progress,
            changed_payload_does_not_take_over_expired_lease,
            concurrent_callers_execute_once,
            expired_record_executes_again,
            expired_lease_is_taken_over,
            zombie_completion_is_fenced,
            zombie_cannot_complete_over_a_live_takeover,
            zombie_release_is_fenced,
            failure_releases_for_retry,
            unreadable_outcome_is_a_typed_error,
            handler_error_type_decides_the_class,
            takeover_reconciled_as_not_applied_runs_the_handler,
            a_failing_reconciler_gives_the_claim_back,
            downstream_key_is_the_same_on_every_attempt,
            old_message_after_newer_state_is_replayed,
            takeover_extends_retention_past_its_lease,
            stale_in_progress_is_reconciled_not_rerun,
            indeterminate_never_expires,
            failed_completion_is_retried_then_reconciled,
            delayed_completion_keeps_duplicates_out,
            concurrent_callers_share_one_flight,
            panicking_handler_gives_the_claim_back,
            cancelled_execution_gives_the_claim_back,
            values_are_type_checked_before_they_are_stored,
            a_settlement_outlasts_an_outage_of_seconds,
            a_step_result_outlasts_an_outage_of_seconds,
            an_outage_past_the_deadline_leaves_the_claim_to_recovery,
            a_recorded_step_replays_and_a_check_settles_an_uncertain_one,
            an_uncertain_step_without_a_check_holds_the_operation,
            a_check_decides_an_uncertain_step,
            a_repeat_safe_step_runs_again_with_its_key,
            steps_in_another_order_or_a_reused_name_are_refused,
            a_retryable_failure_after_a_step_gives_the_claim_back,
            a_step_that_did_not_apply_is_withdrawn,
            a_panic_after_a_step_keeps_its_result,
            a_takeover_without_steps_is_held_unless_declared,
            a_failing_step_write_never_runs_the_effect_blind,
            a_step_recorded_after_the_takers_read_fails_the_takeover,
            a_task_cancelled_after_its_intent_leaves_the_step_to_its_check,
            the_recovery_table_holds_in_every_cell,
            a_give_backs_mark_is_the_attempts_own,
        );
        $crate::conformance_tests!(@needs $make; Evidence; [$($lacks)*];
            expired_and_swept_record_with_evidence_is_not_rerun,
            expired_record_with_evidence_is_not_rerun,
            identity_taken_by_another_key_is_refused,
            terminal_failure_is_replayed_not_rerun,
            retryable_failure_releases_evidence_and_reruns,
            takeover_reconciled_as_applied_records_without_running,
            takeover_reconciled_as_unknown_holds_for_an_operator,
            concurrent_claims_across_both_tables_have_one_winner,
            cancelled_claim_reports_which_condition_failed,
            orphaned_evidence_is_adopted_and_reconciled,
            in_progress_evidence_is_not_acknowledged,
            ambiguous_writes_are_the_callers_own,
            identities_are_scoped_by_tenant_and_namespace,
            a_shared_identity_never_reveals_another_tenants_operation,
            a_deploy_that_adds_an_identity_completes_the_operation_as_claimed,
            a_deploy_that_removes_an_identity_settles_its_evidence,
            a_deploy_that_changes_an_identity_keeps_the_recorded_one,
            orphaned_evidence_is_resolved_by_an_operator,
            indeterminate_evidence_without_its_record_is_released_by_an_operator,
            an_operator_never_settles_evidence_a_delivery_has_adopted,
            an_operators_lost_answer_is_recognised_and_a_throttled_one_retried,
            outcome_limit_is_the_configured_one,
            store_keeps_evidence_with_the_claim,
            an_adopted_orphan_is_held_even_when_its_effects_are_steps,
            an_adopted_record_stays_held_after_its_adoption_stopped,
        );
        $crate::conformance_tests!(@needs $make; LargeOutcomes; [$($lacks)*];
            outcomes_of_every_size_replay_byte_for_byte,
            a_large_outcome_lasts_its_whole_retention,
            a_zombie_cannot_change_a_large_outcome,
            default_limit_is_lambdas_response_limit,
            store_keeps_a_large_outcome_whole,
        );
    };
    (@needs $make:expr; Evidence; [Evidence $($rest:ident)*]; $($case:ident),* $(,)?) => {
        $crate::conformance_tests!(@ignore
            "needs Evidence (a uniqueness table), which this set-up declares it lacks";
            $make; $($case),*);
    };
    (@needs $make:expr; LargeOutcomes; [LargeOutcomes $($rest:ident)*]; $($case:ident),* $(,)?) => {
        $crate::conformance_tests!(@ignore
            "needs LargeOutcomes, which this set-up declares it lacks";
            $make; $($case),*);
    };
    (@needs $make:expr; $needed:ident; [$other:ident $($rest:ident)*]; $($case:ident),* $(,)?) => {
        $crate::conformance_tests!(@needs $make; $needed; [$($rest)*]; $($case),*);
    };
    (@needs $make:expr; $needed:ident; []; $($case:ident),* $(,)?) => {
        $crate::conformance_tests!(@run $make; $($case),*);
    };
    (@run $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::testing::conformance::$case($make.await).await;
            }
        )*
    };
    (@ignore $why:literal; $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $why]
            async fn $case() {
                $crate::testing::conformance::$case($make.await).await;
            }
        )*
    };
}
