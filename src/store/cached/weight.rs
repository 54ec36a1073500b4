//! The cache's weights and bounds: what a cached record counts, what it keeps, and which
//! claims wait for their settlement.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use quick_cache::Weighter;

use super::{ByBytes, CachedStore, RECORD_OVERHEAD};
use crate::key::{Fingerprint, OperationKey};
use crate::record::{Audit, Lease, Record, Status, StepRecord};
use crate::store::{Claim, MemoryStore, StoreExt};

/// A record's weight counts every string it holds, not only its outcome: a small outcome
/// beside a long identity, request id and operator's reason weighs what they hold.
#[test]
fn a_record_weighs_its_identity_request_id_and_audit_too() {
    let key = OperationKey::from_stored("shop#charge#v1#00");
    let at = UNIX_EPOCH + Duration::from_secs(1_000);
    let record = Record {
        key: key.clone(),
        status: Status::Completed,
        fingerprint: Fingerprint::from_stored("ab"),
        lease: Lease {
            token: "t".repeat(36),
            attempt: 1,
            expires_at: at,
        },
        expires_at: at,
        outcome: Some(vec![b'x'; 100]),
        created_at: at,
        completed_at: Some(at),
        request_id: Some("r".repeat(256)),
        identity: Some("i".repeat(1024)),
        audit: Some(Audit {
            by: "b".repeat(100),
            at,
            action: "completed from INDETERMINATE".into(),
            reason: Some("w".repeat(1024)),
        }),
        steps: Vec::new(),
        steps_version: 0,
    };
    let held = 100 + 2 * key.as_str().len() + 36 + 256 + 1024 + 100 + 28 + 1024;
    assert_eq!(
        ByBytes.weight(&key, &Arc::new(record)),
        u64::try_from(held).unwrap_or(u64::MAX) + RECORD_OVERHEAD
    );
}

fn settled_with_steps(key: &OperationKey, steps: usize) -> Record {
    let at = UNIX_EPOCH + Duration::from_secs(1_000);
    Record {
        key: key.clone(),
        status: Status::Completed,
        fingerprint: Fingerprint::from_stored("ab"),
        lease: Lease {
            token: "t".repeat(32),
            attempt: 1,
            expires_at: at,
        },
        expires_at: at + Duration::from_secs(86_400),
        outcome: Some(b"{}".to_vec()),
        created_at: at,
        completed_at: Some(at),
        request_id: None,
        identity: None,
        audit: None,
        steps: (0..steps)
            .map(|n| StepRecord {
                result: Some(vec![0; 1024]),
                ..StepRecord::intent(format!("step-{n}"), 1)
            })
            .collect(),
        steps_version: 1,
    }
}

/// A replay reads no step: a settled record is kept without them, so that a hundred
/// steps' results and allocations do not ride on every cached record.
#[test]
fn a_settled_record_is_kept_without_its_steps() {
    let cache = CachedStore::new(MemoryStore::new(), 16 * 1024 * 1024);
    let key = OperationKey::from_stored("shop#charge#v1#00");
    cache.remember(&settled_with_steps(&key, 100));
    assert!(cache.cached_bytes() < 2 * 1024, "{}", cache.cached_bytes());
    let kept = cache.settled.get(&key).expect("cached");
    assert!(kept.steps.is_empty());
    assert_eq!(kept.outcome.as_deref(), Some(&b"{}"[..]));
}

/// A claim answered by another invocation's live claim keeps no pending entry: nothing
/// settles under its token (a waiting caller claims again under another).
#[tokio::test]
async fn a_claim_meeting_a_live_claim_keeps_nothing_pending() {
    let key = OperationKey::from_stored("shop#charge#v1#00");
    let now = UNIX_EPOCH + Duration::from_secs(1_000);
    let mut live = settled_with_steps(&key, 0);
    live.status = Status::InProgress;
    live.lease.expires_at = now + Duration::from_secs(60);
    let cache = CachedStore::new(
        MemoryStore::holding(vec![live.clone()], Vec::new()),
        1 << 20,
    );
    for n in 0..3 {
        let mut claim = live.clone();
        claim.lease.token = format!("other-{n}");
        let answer = cache.claim(&claim, now).await.expect("answered");
        assert!(matches!(answer, Claim::Existing(_)));
    }
    assert_eq!(cache.pending.len(), 0);
    let mut expired = live;
    expired.lease.token = "taker".into();
    cache
        .claim(&expired, now + Duration::from_secs(61))
        .await
        .expect("answered");
    assert_eq!(
        cache.pending.len(),
        1,
        "a lease that ran out is taken over under it"
    );
}
