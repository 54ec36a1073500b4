//! The bounded check CI runs, the larger one (`MODEL_BOUNDS=large`), and each historical
//! defect found again when its decision is put back.

use std::time::Instant;

use stateright::{Checker, Expectation, Model};

use super::properties::{
    ALLOWED, CONTINUED, EVENT_ONCE, EVENT_PUBLISHED, LIVE_LEASE, ONE_EFFECT, ONE_PER_IDENTITY,
    TAKES_OVER, TRUTHFUL,
};
use super::{Bounds, Handler, Protocol, Revert, Spec};
use crate::reconcile::Recovery;

/// Explores every state `protocol` reaches, breadth first on two threads, and reports its
/// size. A counterexample is one of the traces that reach a broken invariant, ending where it
/// first broke (the model goes no further from there), not always the shortest.
fn explore(protocol: Protocol) -> impl Checker<Protocol> {
    let label = format!("{:?}, {:?}", protocol.recovery, protocol.revert);
    let started = Instant::now();
    report(
        &label,
        started,
        protocol.checker().threads(2).spawn_bfs().join(),
    )
}

/// Checks every property of `protocol`: breadth first at the quick and small bounds; depth
/// first at the larger ones (`MODEL_BOUNDS=large`), whose breadth-first frontier outgrows this
/// machine's 24 GB, while depth first keeps one path per thread and a fingerprint per state.
fn check(protocol: Protocol) {
    if scale() != Scale::Large {
        explore(protocol).assert_properties();
        return;
    }
    let label = format!(
        "{:?}, {:?}, depth first",
        protocol.recovery, protocol.revert
    );
    let started = Instant::now();
    let checker = protocol.checker().threads(2).spawn_dfs().join();
    report(&label, started, checker).assert_properties();
}

/// Prints what `checker` explored since `started`.
fn report<C: Checker<Protocol>>(label: &str, started: Instant, checker: C) -> C {
    eprintln!(
        "model ({label}): {} states, {} unique, depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker
}

/// How large a world the whole-protocol checks explore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    /// The default (`cargo test`): the small bounds with less time, a minute in all.
    Quick,
    /// `MODEL_BOUNDS=small`: CI's exhaustive step (scripts/exhaustive-checks.sh).
    Small,
    /// `MODEL_BOUNDS=large`: three workers, depth first (not finished on this machine).
    Large,
}

/// The scale `MODEL_BOUNDS` asks for.
fn scale() -> Scale {
    match std::env::var("MODEL_BOUNDS").as_deref() {
        Ok("large") => Scale::Large,
        Ok("small") => Scale::Small,
        _ => Scale::Quick,
    }
}

/// True time at the quick scale: two ticks less than the small bounds' nine, so that an
/// invocation's whole life, a takeover and the retention after it still fit.
const QUICK_TIME: u64 = 6;

/// `bounds` at the scale asked for (the larger bounds are `large`; a revert's bounds stay
/// its own there).
fn scaled(bounds: Bounds, large: Bounds) -> Bounds {
    match scale() {
        Scale::Quick => Bounds {
            max_time: QUICK_TIME,
            ..bounds
        },
        Scale::Small => bounds,
        Scale::Large => large,
    }
}

#[test]
fn the_protocol_keeps_every_invariant_in_every_reachable_state() {
    let bounds = scaled(Bounds::small(), Bounds::large());
    for recovery in [Recovery::Indeterminate, Recovery::Rerun] {
        check(Protocol::new(bounds.clone(), recovery, None));
    }
}

/// Puts `revert` back and expects the checker to break `property`, printing the trace; the
/// code as it is, at the same bounds, keeps it.
fn finds(revert: Revert, bounds: Bounds, recovery: Recovery, property: &'static str) {
    let fixed = explore(Protocol::new(bounds.clone(), recovery, None));
    if let Some(path) = fixed.discovery(property) {
        panic!(
            "the code as it is breaks \"{property}\" at these bounds: {:?}\nthen: {:?}",
            path.clone().into_actions(),
            path.last_state()
        );
    }
    let checker = explore(Protocol::new(bounds, recovery, Some(revert)));
    let Some(path) = checker.discovery(property) else {
        panic!("{revert:?} was not found: no state breaks \"{property}\"");
    };
    eprintln!("{revert:?} breaks \"{property}\":");
    let last = path.last_state().clone();
    for (step, action) in path.into_actions().iter().enumerate() {
        eprintln!("  {step}. {action:?}");
    }
    eprintln!("  then: {last:?}");
}

/// Found by the store transitions' specification at the takeover's write itself (a record
/// retained less long than its lease), before TTL can delete it under the live lease.
#[test]
fn a_takeover_that_kept_the_old_retention_is_found() {
    let bounds = Bounds {
        crashes: 1,
        outages: 0,
        losses: 0,
        ..Bounds::small()
    };
    finds(
        Revert::TakeoverKeepsRetention,
        bounds,
        Recovery::Rerun,
        ALLOWED,
    );
}

#[test]
fn a_stale_in_progress_record_counted_as_absent_is_found() {
    let bounds = Bounds {
        outages: 0,
        losses: 0,
        ..Bounds::small()
    };
    finds(
        Revert::InProgressExpires,
        bounds,
        Recovery::Indeterminate,
        ONE_EFFECT,
    );
}

#[test]
fn a_lost_claim_answer_not_recognised_is_found() {
    let bounds = Bounds {
        outages: 0,
        crashes: 0,
        ..Bounds::small()
    };
    finds(
        Revert::OwnClaimUnrecognised,
        bounds,
        Recovery::Indeterminate,
        TRUTHFUL,
    );
}

#[test]
fn a_lost_completion_answer_not_recognised_is_found() {
    let bounds = Bounds {
        outages: 0,
        crashes: 0,
        ..Bounds::small()
    };
    finds(
        Revert::OwnSettlementUnrecognised,
        bounds,
        Recovery::Indeterminate,
        TRUTHFUL,
    );
}

#[test]
fn a_settlement_that_gave_up_with_its_deadline_ahead_is_found() {
    let bounds = Bounds {
        lease: 4,
        max_time: 7,
        losses: 0,
        crashes: 0,
        ..Bounds::small()
    };
    finds(
        Revert::SettleGivesUpEarly,
        bounds,
        Recovery::Rerun,
        ONE_EFFECT,
    );
}

#[test]
fn an_identity_taken_from_the_deployment_is_found() {
    let bounds = Bounds {
        workers: vec![
            Spec::of(0, 0, false),
            Spec::of(0, 0, true),
            Spec::of(0, 0, true),
        ],
        max_time: 9,
        outages: 0,
        losses: 0,
        crashes: 1,
        ..Bounds::small()
    };
    // Three workers need a tick more than the quick scale gives to find it.
    let bounds = match scale() {
        Scale::Quick => Bounds {
            max_time: QUICK_TIME + 1,
            ..bounds
        },
        _ => bounds,
    };
    finds(
        Revert::IdentityFromDeployment,
        bounds,
        Recovery::Rerun,
        ONE_EFFECT,
    );
}

#[test]
fn two_operations_of_one_business_identity_act_once() {
    let bounds = scaled(Bounds::two_operations(), Bounds::two_operations());
    let protocol = Protocol::new(bounds, Recovery::Rerun, None);
    let properties = protocol.properties();
    let checker = explore(protocol);
    // Each operation is delivered once: nothing takes a crashed attempt over.
    for property in properties {
        match property.expectation {
            Expectation::Sometimes if property.name == TAKES_OVER => {}
            Expectation::Sometimes => {
                checker.assert_any_discovery(property.name);
            }
            _ => checker.assert_no_discovery(property.name),
        }
    }
}

#[test]
fn a_claim_that_skipped_its_identity_is_found() {
    let bounds = Bounds {
        outages: 0,
        losses: 0,
        crashes: 0,
        ..Bounds::two_operations()
    };
    finds(
        Revert::IdentityNotClaimed,
        bounds,
        Recovery::Rerun,
        ONE_PER_IDENTITY,
    );
}

#[test]
fn the_stepped_protocol_keeps_every_invariant_in_every_reachable_state() {
    let large = Bounds {
        handler: Handler::Stepped,
        ..Bounds::large()
    };
    let bounds = scaled(Bounds::stepped(), large);
    let protocol = Protocol::new(bounds, Recovery::Steps, None);
    check(protocol);
}

#[test]
fn an_uncertain_step_run_again_without_a_check_is_found() {
    let bounds = Bounds {
        outages: 0,
        losses: 0,
        ..Bounds::stepped()
    };
    finds(
        Revert::UncertainStepRerun,
        bounds,
        Recovery::Steps,
        ONE_EFFECT,
    );
}

#[test]
fn the_transactional_protocol_keeps_every_invariant_in_every_reachable_state() {
    let large = Bounds {
        handler: Handler::Transactional,
        republishes: 1,
        ..Bounds::large()
    };
    let bounds = scaled(Bounds::transactional(), large);
    // Re-running the handler is safe: its writes commit only with its settlement.
    let protocol = Protocol::new(bounds, Recovery::Rerun, None);
    check(protocol);
}

#[test]
fn writes_sent_beside_the_fenced_settlement_are_found() {
    let bounds = Bounds {
        outages: 0,
        republishes: 0,
        ..Bounds::transactional()
    };
    let bounds = scaled(bounds.clone(), bounds);
    finds(
        Revert::UnfencedTransaction,
        bounds,
        Recovery::Rerun,
        ONE_EFFECT,
    );
}

#[test]
fn an_event_id_without_its_execution_is_found() {
    let bounds = Bounds {
        workers: vec![Spec::of(0, 0, false), Spec::of(0, 0, false)],
        outages: 0,
        losses: 0,
        crashes: 0,
        republishes: 0,
        ..Bounds::transactional()
    };
    finds(
        Revert::EventIdWithoutExecution,
        bounds,
        Recovery::Rerun,
        EVENT_ONCE,
    );
}

#[test]
fn give_backs_and_retained_failures_keep_every_invariant_in_every_reachable_state() {
    let bounds = scaled(Bounds::giving_back(), Bounds::giving_back());
    for recovery in [Recovery::Indeterminate, Recovery::Rerun] {
        let protocol = Protocol::new(bounds.clone(), recovery, None);
        explore(protocol).assert_properties();
    }
}

#[test]
fn a_give_back_not_fenced_on_its_token_is_found() {
    let bounds = Bounds {
        outages: 0,
        losses: 0,
        declines: 0,
        ..Bounds::giving_back()
    };
    finds(
        Revert::GiveBackUnfenced,
        bounds,
        Recovery::Rerun,
        LIVE_LEASE,
    );
}

#[test]
fn late_step_effects_and_refused_completions_keep_every_invariant_in_every_reachable_state() {
    for recovery in [Recovery::Indeterminate, Recovery::Steps, Recovery::Rerun] {
        let protocol = Protocol::new(Bounds::late_effects(), recovery, None);
        explore(protocol).assert_properties();
    }
    for recovery in [Recovery::Indeterminate, Recovery::Rerun] {
        let protocol = Protocol::new(Bounds::refused_completions(), recovery, None);
        explore(protocol).assert_properties();
    }
}

#[test]
fn a_give_back_that_does_not_wait_for_a_late_effect_is_found() {
    let bounds = Bounds {
        cancels: 0,
        ..Bounds::late_effects()
    };
    finds(
        Revert::GiveBackWithoutGrace,
        bounds,
        Recovery::Indeterminate,
        ONE_EFFECT,
    );
}

#[test]
fn a_knowing_give_back_held_for_an_operator_is_found() {
    let bounds = Bounds {
        cancels: 0,
        ..Bounds::late_effects()
    };
    finds(
        Revert::GivenBackHeld,
        bounds,
        Recovery::Indeterminate,
        CONTINUED,
    );
}

#[test]
fn a_refused_completion_released_under_the_default_recovery_is_found() {
    finds(
        Revert::RefusedCompletionReleased,
        Bounds::refused_completions(),
        Recovery::Indeterminate,
        ONE_EFFECT,
    );
}

#[test]
fn an_outbox_without_a_sweeper_is_found() {
    let bounds = Bounds {
        workers: vec![Spec::of(0, 0, false)],
        outages: 0,
        losses: 0,
        crashes: 0,
        republishes: 1,
        ..Bounds::transactional()
    };
    finds(Revert::NoSweeper, bounds, Recovery::Rerun, EVENT_PUBLISHED);
}
