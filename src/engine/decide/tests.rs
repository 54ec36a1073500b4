//! The engine's pure decisions, each pinned by what it promises.

use super::*;
use crate::key::{Fingerprint, OperationKey, OperationScope};

/// A fresh claim of order o-1 at `now`, under `token`.
fn claim_at(token: &str, now: SystemTime) -> Record {
    let scope = OperationScope::new("shop", "invoice").expect("a scope");
    let key = OperationKey::derive(&scope, None, "o-1").expect("a key");
    let fingerprint = Fingerprint::of(&1).expect("a fingerprint");
    let invocation =
        Invocation::new(key, fingerprint, Duration::from_secs(30)).with_request_id("r-1");
    claim_record(&invocation, token.into(), now, Duration::from_secs(3600))
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// An owner re-enters only its own claim still IN_PROGRESS: the same token, whatever the
/// attempt; never a settled record, never another token's.
#[test]
fn an_owner_reenters_only_its_own_claim_in_progress() {
    let claim = claim_at("owner", at(1_000));
    let mut earlier = claim_at("owner", at(900));
    earlier.lease.attempt = 3;
    assert!(reenters(&earlier, &claim));
    let settled = Record {
        status: Status::Completed,
        ..earlier.clone()
    };
    assert!(!reenters(&settled, &claim));
    let another = claim_at("someone else", at(900));
    assert!(!reenters(&another, &claim));
}

/// The record read back is this very claim only as it committed: its token and attempt, no
/// step, its creation (to the millisecond); an owner's earlier record is not.
#[test]
fn a_claim_stands_as_itself_only_as_it_committed() {
    let claim = claim_at("owner", at(1_000));
    assert!(is_this_claim(&claim, &claim));
    let earlier = claim_at("owner", at(900));
    assert!(!is_this_claim(&earlier, &claim), "another creation");
    let stepped = Record {
        steps: vec![StepRecord::steps_lost()],
        ..claim.clone()
    };
    assert!(!is_this_claim(&stepped, &claim), "steps recorded since");
    let later = Record {
        lease: Lease {
            attempt: 2,
            ..claim.lease.clone()
        },
        ..claim.clone()
    };
    assert!(!is_this_claim(&later, &claim), "a later attempt");
}

/// An owner re-entering its own claim is given a time past the lease's end (its lease is
/// taken back live); any other takeover, `now`.
#[test]
fn a_reentry_is_timed_past_the_lease() {
    let existing = claim_at("owner", at(1_000));
    let end = existing.lease.expires_at;
    assert_eq!(
        reentry_time(&existing, at(1_001), true),
        end + Duration::from_millis(1)
    );
    assert_eq!(reentry_time(&existing, at(5_000), true), at(5_000));
    assert_eq!(reentry_time(&existing, at(1_001), false), at(1_001));
}

/// A takeover's failed fence is the caller's own takeover only when the record stands
/// IN_PROGRESS under the very lease it wrote.
#[test]
fn a_lost_takeover_answer_is_recognised_only_by_its_own_lease() {
    let mine = claim_at("taker", at(1_000));
    let lost = |current: Record| Fence::Lost {
        current: Some(Box::new(current)),
    };
    assert!(matches!(
        took_over(lost(mine.clone()), &mine.lease),
        TookOver::Held
    ));
    let settled = Record {
        status: Status::Completed,
        ..mine.clone()
    };
    assert!(matches!(
        took_over(lost(settled), &mine.lease),
        TookOver::Answer(_)
    ));
    let other = claim_at("another taker", at(1_000));
    assert!(matches!(
        took_over(lost(other), &mine.lease),
        TookOver::Answer(_)
    ));
    assert!(matches!(
        took_over(Fence::Lost { current: None }, &mine.lease),
        TookOver::Gone
    ));
}

/// A settlement's failed fence shows the caller's own settlement only when the record
/// holds its status, its outcome and its completion time, under its token (the token the
/// operator read, for a resolution of an INDETERMINATE record).
#[test]
fn a_lost_settlement_answer_is_recognised_only_by_what_it_wrote() {
    let claim = claim_at("settler", at(1_000));
    let settlement =
        Settlement::completed(b"42".to_vec(), None, at(1_010), Duration::from_secs(60));
    let settled = Record {
        status: Status::Completed,
        outcome: settlement.outcome.clone(),
        completed_at: Some(settlement.completed_at),
        ..claim.clone()
    };
    let mine = Guard::Lease("settler");
    assert!(shows_settlement(&settled, mine, &settlement));
    assert!(shows_settlement(
        &settled,
        Guard::Indeterminate {
            token: "settler",
            attempt: 1
        },
        &settlement
    ));
    assert!(!shows_settlement(
        &settled,
        Guard::Indeterminate {
            token: "another",
            attempt: 1
        },
        &settlement
    ));
    assert!(!shows_settlement(
        &settled,
        Guard::Lease("another"),
        &settlement
    ));
    let other_outcome = Record {
        outcome: Some(b"7".to_vec()),
        ..settled.clone()
    };
    assert!(!shows_settlement(&other_outcome, mine, &settlement));
    let other_time = Record {
        completed_at: Some(at(2_000)),
        ..settled.clone()
    };
    assert!(!shows_settlement(&other_time, mine, &settlement));
    let other_status = Record {
        status: Status::Failed,
        ..settled
    };
    assert!(!shows_settlement(&other_status, mine, &settlement));
}

/// An owner re-entering its own claim goes on from its steps whatever the recovery
/// policy, unless they were lost with an adoption: then the policy decides.
#[test]
fn a_reentered_owner_goes_on_from_its_steps_unless_they_were_lost() {
    let kept = Inherited {
        steps: Vec::new(),
        lost: false,
        given_back: false,
    };
    let lost = Inherited {
        lost: true,
        ..kept.clone()
    };
    let hold = Recovery::Indeterminate;
    assert_eq!(recover(hold, false, true, &kept, false), Recover::Steps);
    assert_eq!(recover(hold, false, true, &lost, false), Recover::Hold);
    assert_eq!(recover(hold, true, true, &kept, false), Recover::Hold);
    assert_eq!(recover(hold, false, false, &kept, false), Recover::Hold);
}

/// A failed write is tried again only while tries remain and the next one would start
/// strictly before `until`.
#[test]
fn a_retry_starts_only_before_its_end() {
    let pause = Duration::from_secs(10);
    assert!(try_again(1, 5, at(0), pause, at(11)));
    assert!(
        !try_again(1, 5, at(0), pause, at(10)),
        "it would start at the end"
    );
    assert!(!try_again(5, 5, at(0), pause, at(100)), "out of tries");
}

/// A give-back keeps the lease for the grace from now, or until an effect in flight can
/// have landed if later, never past the lease's own end.
#[test]
fn a_give_back_keeps_the_grace_and_what_is_in_flight() {
    let grace = Duration::from_secs(5);
    let end = at(100);
    assert_eq!(given_back_until(at(10), end, grace, None), at(15));
    assert_eq!(given_back_until(at(10), end, grace, Some(at(40))), at(40));
    assert_eq!(given_back_until(at(10), end, grace, Some(at(400))), end);
    assert_eq!(given_back_until(at(98), end, grace, None), end);
}

/// An adoption re-creates the orphan's operation as attempt 2 under the caller's lease,
/// naming the orphan's identity, its steps marked lost (version 1); the reconciler sees
/// the crashed attempt as it was: attempt 1, no token, no request, created (and its lease
/// and retention ended) when the orphan was.
#[test]
fn an_adoption_and_its_orphan_are_what_the_reconciler_is_told() {
    let claim = claim_at("adopter", at(100_000));
    let orphan = Evidence {
        created_at: at(1_000),
        ..Evidence::of_claim(&claim_at("crashed", at(1_000)), "payment p-1")
    };
    let adopted = adoption(&claim, &orphan);
    assert_eq!(adopted.lease.attempt, 2);
    assert_eq!(adopted.lease.token, "adopter");
    assert_eq!(adopted.identity.as_deref(), Some("payment p-1"));
    assert_eq!(adopted.steps, vec![StepRecord::steps_lost()]);
    assert_eq!(adopted.steps_version, 1);
    // The execution's start, as the crashed attempt had it: its outbox events' ids derive
    // from it, so that a takeover of the adopted record commits them under the same ids.
    assert_eq!(adopted.created_at, orphan.created_at);

    let crashed = orphaned_record(&adopted, &orphan);
    assert_eq!(crashed.lease.attempt, 1);
    assert_eq!(crashed.lease.token, "");
    assert_eq!(crashed.lease.expires_at, orphan.created_at);
    assert_eq!(crashed.expires_at, orphan.created_at);
    assert_eq!(crashed.created_at, orphan.created_at);
    assert_eq!(crashed.request_id, None);
    assert_eq!(crashed.identity, adopted.identity);
}

#[test]
fn a_single_flight_waiter_gives_up_before_the_deadline() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    let lease = Duration::from_secs(65); // 60 s left plus the 5 s skew
    let deadline = Some(now + Duration::from_secs(60));
    assert_eq!(
        single_flight_patience(lease, deadline, now),
        Duration::from_secs(59),
        "the deadline less the margin, not the lease"
    );
    assert_eq!(single_flight_patience(lease, None, now), lease);
    let past = Some(now - Duration::from_secs(1));
    assert_eq!(single_flight_patience(lease, past, now), Duration::ZERO);
    let far = Some(now + Duration::from_secs(600));
    assert_eq!(single_flight_patience(lease, far, now), lease);
}
