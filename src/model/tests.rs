//! The bounded check CI runs, the larger one (`MODEL_BOUNDS=large`), and each historical
//! defect found again when its decision is put back.

use std::time::Instant;

use stateright::{Checker, Model};

use super::properties::{LIVE_LEASE, ONE_EFFECT, TRUTHFUL};
use super::{Bounds, Protocol, Revert, Spec};
use crate::reconcile::Recovery;

/// Explores every state `protocol` reaches (breadth first, so a counterexample is shortest)
/// and reports its size.
fn explore(protocol: Protocol) -> impl Checker<Protocol> {
    let label = format!("{:?}, {:?}", protocol.recovery, protocol.revert);
    let started = Instant::now();
    let checker = protocol.checker().threads(2).spawn_bfs().join();
    eprintln!(
        "model ({label}): {} states, {} unique, depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker
}

#[test]
fn the_protocol_keeps_every_invariant_in_every_reachable_state() {
    let bounds = match std::env::var("MODEL_BOUNDS").as_deref() {
        Ok("large") => Bounds::large(),
        _ => Bounds::small(),
    };
    for recovery in [Recovery::Indeterminate, Recovery::Rerun] {
        let protocol = Protocol {
            bounds: bounds.clone(),
            recovery,
            revert: None,
        };
        explore(protocol).assert_properties();
    }
}

/// Puts `revert` back and expects the checker to break `property`, printing the trace; the
/// code as it is, at the same bounds, keeps it.
fn finds(revert: Revert, bounds: Bounds, recovery: Recovery, property: &'static str) {
    let fixed = explore(Protocol {
        bounds: bounds.clone(),
        recovery,
        revert: None,
    });
    if let Some(path) = fixed.discovery(property) {
        panic!(
            "the code as it is breaks \"{property}\" at these bounds: {:?}\nthen: {:?}",
            path.clone().into_actions(),
            path.last_state()
        );
    }
    let checker = explore(Protocol {
        bounds,
        recovery,
        revert: Some(revert),
    });
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
        LIVE_LEASE,
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
    finds(
        Revert::IdentityFromDeployment,
        bounds,
        Recovery::Rerun,
        ONE_EFFECT,
    );
}

#[test]
fn the_stepped_protocol_keeps_every_invariant_in_every_reachable_state() {
    let bounds = match std::env::var("MODEL_BOUNDS").as_deref() {
        Ok("large") => Bounds {
            stepped: true,
            ..Bounds::large()
        },
        _ => Bounds::stepped(),
    };
    let protocol = Protocol {
        bounds,
        recovery: Recovery::Steps,
        revert: None,
    };
    explore(protocol).assert_properties();
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
