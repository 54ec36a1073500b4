//! Conformance cases on the store's own primitives, without the engine: what a store of your
//! own must answer to each conditional write ([`Store`]'s contract), so that a defect shows as
//! the primitive that broke it rather than as an engine case that fails further on. Cases that
//! need a capability a store may lack ([`Capabilities`](super::conformance::Capabilities)) are
//! reported ignored on a set-up that declares the lack (`conformance_tests!(.., without [..])`).

use std::time::{Duration, SystemTime};

use crate::clock::Clock;
use crate::key::{Fingerprint, OperationKey, OperationScope};
use crate::record::{Lease, Record, Settlement, Status, retention_expiry};
use crate::store::{Claim, Fence, Guard, Store, StoreExt, Target};
use crate::testing::conformance::{Capability, Fixture, invocation};
use crate::testing::outcomes::incompressible;

/// The lease of the claims below.
const LEASE: Duration = Duration::from_secs(30);
/// The retention of the claims and settlements below.
const RETENTION: Duration = Duration::from_secs(3600);

fn key(material: &str) -> OperationKey {
    let scope = OperationScope::new("store-test", "primitive").expect("scope");
    OperationKey::derive(&scope, None, material).expect("key")
}

/// An IN_PROGRESS claim of `key` under `token`, from `now`.
fn claim_of(key: &OperationKey, token: &str, now: SystemTime, identity: Option<String>) -> Record {
    let lease_expires_at = now + LEASE;
    Record {
        key: key.clone(),
        status: Status::InProgress,
        fingerprint: Fingerprint::of(&"intent").expect("fingerprint"),
        lease: Lease {
            token: token.to_owned(),
            attempt: 1,
            expires_at: lease_expires_at,
        },
        expires_at: retention_expiry(lease_expires_at, RETENTION),
        outcome: None,
        created_at: now,
        completed_at: None,
        request_id: None,
        identity,
        audit: None,
        steps: Vec::new(),
        steps_version: 0,
    }
}

fn under<'a>(key: &'a OperationKey, token: &'a str, identity: Option<&'a str>) -> Target<'a> {
    Target {
        key,
        identity,
        guard: Guard::Lease(token),
    }
}

fn completed(outcome: &[u8], now: SystemTime) -> Settlement {
    Settlement::completed(outcome.to_vec(), None, now, RETENTION)
}

async fn stored<S: Store>(store: &S, key: &OperationKey) -> Record {
    store
        .get(key)
        .await
        .expect("get")
        .expect("the record stands")
}

/// Case: a claim writes IN_PROGRESS once; a second claim of the key writes nothing and answers
/// the record as it stands, read in the same request.
pub async fn store_claims_a_key_once_and_answers_the_standing_record<S: Store>(fx: Fixture<S>) {
    let now = fx.clock.now();
    let key = key("p-1");
    let first = claim_of(&key, "token-a", now, None);
    assert_eq!(
        fx.store.claim(&first, now).await.expect("claim"),
        Claim::Acquired
    );
    let second = claim_of(&key, "token-b", now, None);
    match fx.store.claim(&second, now).await.expect("claim") {
        Claim::Existing(standing) => {
            assert_eq!(standing.status, Status::InProgress);
            assert_eq!(standing.lease.token, "token-a", "the first claim's record");
        }
        other => panic!("a second claim must answer the standing record, got {other:?}"),
    }
    let record = stored(&fx.store, &key).await;
    assert_eq!(record.lease.token, "token-a");
    assert_eq!(record.lease.attempt, 1);
    assert_eq!(record.fingerprint, first.fingerprint);
}

/// Case: only a settled record whose retention ran out counts as absent; an IN_PROGRESS or
/// INDETERMINATE record never does, however old.
pub async fn store_counts_only_a_settled_expired_record_as_absent<S: Store>(fx: Fixture<S>) {
    let now = fx.clock.now();
    let (held, settled, waiting) = (key("p-2a"), key("p-2b"), key("p-2c"));
    for key in [&held, &settled, &waiting] {
        let claim = claim_of(key, "token-a", now, None);
        assert_eq!(
            fx.store.claim(&claim, now).await.expect("claim"),
            Claim::Acquired
        );
    }
    let fence = fx
        .store
        .settle(
            under(&settled, "token-a", None),
            &completed(b"\"done\"", now),
        )
        .await
        .expect("settle");
    assert_eq!(fence, Fence::Held);
    let indeterminate = Settlement::indeterminate(now, RETENTION);
    let fence = fx
        .store
        .settle(under(&waiting, "token-a", None), &indeterminate)
        .await
        .expect("settle");
    assert_eq!(fence, Fence::Held);

    let later = now + LEASE + RETENTION + Duration::from_secs(10);
    fx.clock.set(later);
    match fx
        .store
        .claim(&claim_of(&held, "token-b", later, None), later)
        .await
        .expect("claim")
    {
        Claim::Existing(standing) => assert_eq!(standing.status, Status::InProgress),
        other => panic!("an IN_PROGRESS record never expires into a claim, got {other:?}"),
    }
    match fx
        .store
        .claim(&claim_of(&waiting, "token-b", later, None), later)
        .await
        .expect("claim")
    {
        Claim::Existing(standing) => assert_eq!(standing.status, Status::Indeterminate),
        other => panic!("an INDETERMINATE record waits for an operator, got {other:?}"),
    }
    assert_eq!(
        fx.store
            .claim(&claim_of(&settled, "token-b", later, None), later)
            .await
            .expect("claim"),
        Claim::Acquired,
        "a settled record past its retention counts as absent"
    );
}

/// Case: a takeover needs the expired holder's token, and only once its lease ran out; it
/// gives the record the new lease.
pub async fn store_takes_over_only_an_expired_lease_from_its_holder<S: Store>(fx: Fixture<S>) {
    let now = fx.clock.now();
    let key = key("p-3");
    let first = claim_of(&key, "token-a", now, None);
    assert_eq!(
        fx.store.claim(&first, now).await.expect("claim"),
        Claim::Acquired
    );
    let next = |at: SystemTime| Lease {
        token: "token-b".into(),
        attempt: 2,
        expires_at: at + LEASE,
    };
    let live = fx
        .store
        .take_over(
            &first,
            &next(now),
            retention_expiry(now + LEASE, RETENTION),
            now,
        )
        .await
        .expect("take over");
    assert!(
        matches!(live, Fence::Lost { .. }),
        "a live lease is never taken over"
    );

    let later = now + LEASE + Duration::from_secs(1);
    fx.clock.set(later);
    let mut stranger = first.clone();
    stranger.lease.token = "token-z".into();
    let expires = retention_expiry(later + LEASE, RETENTION);
    let wrong = fx
        .store
        .take_over(&stranger, &next(later), expires, later)
        .await
        .expect("take over");
    assert!(
        matches!(wrong, Fence::Lost { .. }),
        "the holder's token is required"
    );
    let taken = fx
        .store
        .take_over(&first, &next(later), expires, later)
        .await
        .expect("take over");
    assert_eq!(taken, Fence::Held);
    let record = stored(&fx.store, &key).await;
    assert_eq!(
        (record.lease.token.as_str(), record.lease.attempt),
        ("token-b", 2)
    );
    let again = fx
        .store
        .take_over(&first, &next(later), expires, later)
        .await
        .expect("take over");
    assert!(
        matches!(again, Fence::Lost { .. }),
        "of two takers, one wins"
    );
}

/// Case: a settlement, a shortening and a release are fenced on the lease token: another
/// token's write changes nothing and is answered with the record as it stands; the holder's
/// settlement keeps the outcome's exact bytes.
pub async fn store_fences_settlements_and_releases_on_the_lease<S: Store>(fx: Fixture<S>) {
    let now = fx.clock.now();
    let key = key("p-4");
    let claim = claim_of(&key, "token-a", now, None);
    assert_eq!(
        fx.store.claim(&claim, now).await.expect("claim"),
        Claim::Acquired
    );
    let outcome = br#"{"order":"o-1","total":1999,"note":"\u00e9"}"#;

    let stranger = under(&key, "token-z", None);
    match fx
        .store
        .settle(stranger, &completed(outcome, now))
        .await
        .expect("settle")
    {
        Fence::Lost { current } => {
            if let Some(current) = current {
                assert_eq!(current.status, Status::InProgress);
            }
        }
        Fence::Held => panic!("another token's settlement must not apply"),
    }
    let shortened = fx.store.shorten(stranger, now).await.expect("shorten");
    assert!(matches!(shortened, Fence::Lost { .. }));
    let released = fx.store.release(stranger).await.expect("release");
    assert!(matches!(released, Fence::Lost { .. }));
    assert_eq!(stored(&fx.store, &key).await.status, Status::InProgress);

    let holder = under(&key, "token-a", None);
    assert_eq!(
        fx.store
            .settle(holder, &completed(outcome, now))
            .await
            .expect("settle"),
        Fence::Held
    );
    let record = stored(&fx.store, &key).await;
    assert_eq!(record.status, Status::Completed);
    assert_eq!(
        record.outcome.as_deref(),
        Some(&outcome[..]),
        "byte for byte"
    );
    let late = fx.store.release(holder).await.expect("release");
    assert!(
        matches!(late, Fence::Lost { .. }),
        "a settled record is no longer the claim's"
    );
    assert_eq!(stored(&fx.store, &key).await.status, Status::Completed);
}

/// Case: the holder's shortening moves its lease expiry earlier, never later (a second,
/// later shortening, a give-back after a cut, leaves it as it stands, answered held); its
/// release deletes the record.
pub async fn store_shortens_and_releases_the_holders_claim<S: Store>(fx: Fixture<S>) {
    let now = fx.clock.now();
    let key = key("p-5");
    let claim = claim_of(&key, "token-a", now, None);
    assert_eq!(
        fx.store.claim(&claim, now).await.expect("claim"),
        Claim::Acquired
    );
    let holder = under(&key, "token-a", None);
    let until = now + Duration::from_secs(5);
    assert_eq!(
        fx.store.shorten(holder, until).await.expect("shorten"),
        Fence::Held
    );
    let record = stored(&fx.store, &key).await;
    assert!(
        record.lease.expires_at <= until,
        "the lease runs out sooner"
    );
    assert!(
        record.lease.expires_at + Duration::from_secs(1) > until,
        "at the time given (to the store's resolution)"
    );
    assert_eq!(
        fx.store
            .shorten(holder, until + Duration::from_secs(3))
            .await
            .expect("a later shortening"),
        Fence::Held,
        "the holder still holds its claim"
    );
    assert_eq!(
        stored(&fx.store, &key).await.lease.expires_at,
        record.lease.expires_at,
        "a shortening never lengthens the lease"
    );
    assert_eq!(
        fx.store.release(holder).await.expect("release"),
        Fence::Held
    );
    assert_eq!(fx.store.get(&key).await.expect("get"), None);
}

/// Case (capability: evidence): a claim that declares a business identity writes its
/// evidence atomically; another key with that identity is refused with the evidence and
/// writes nothing; the settlement moves the evidence with the record, and a release of a
/// retryable failure deletes it.
pub async fn store_keeps_evidence_with_the_claim<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::Evidence);
    let now = fx.clock.now();
    let identity = invocation("p-6", &serde_json::json!(0))
        .with_identity("invoice:p-6")
        .expect("a valid identity")
        .evidence_key()
        .expect("an evidence key");
    let (first, other) = (key("p-6a"), key("p-6b"));
    let claim = claim_of(&first, "token-a", now, Some(identity.clone()));
    assert_eq!(
        fx.store.claim(&claim, now).await.expect("claim"),
        Claim::Acquired
    );
    let evidence = fx
        .store
        .evidence(&identity)
        .await
        .expect("evidence")
        .expect("written with the claim");
    assert_eq!(
        (evidence.status, &evidence.key),
        (Status::InProgress, &first)
    );

    let rival = claim_of(&other, "token-b", now, Some(identity.clone()));
    match fx.store.claim(&rival, now).await.expect("claim") {
        Claim::IdentityTaken(standing) => assert_eq!(standing.key, first),
        other => panic!("the identity is taken, got {other:?}"),
    }
    assert_eq!(
        fx.store.get(&other).await.expect("get"),
        None,
        "nothing written"
    );

    let holder = under(&first, "token-a", Some(&identity));
    assert_eq!(
        fx.store
            .settle(holder, &completed(b"1", now))
            .await
            .expect("settle"),
        Fence::Held
    );
    let settled = fx.store.evidence(&identity).await.expect("evidence");
    assert_eq!(settled.map(|e| e.status), Some(Status::Completed));

    let retried = key("p-6c");
    let identity = identity.replace("p-6", "p-6-retry");
    let claim = claim_of(&retried, "token-c", now, Some(identity.clone()));
    assert_eq!(
        fx.store.claim(&claim, now).await.expect("claim"),
        Claim::Acquired
    );
    let holder = under(&retried, "token-c", Some(&identity));
    assert_eq!(
        fx.store.release(holder).await.expect("release"),
        Fence::Held
    );
    assert_eq!(fx.store.evidence(&identity).await.expect("evidence"), None);
}

/// Case (capability: large outcomes): an outcome of 1 MiB, past DynamoDB's item limit and
/// incompressible, is kept whole and read back byte for byte.
pub async fn store_keeps_a_large_outcome_whole<S: Store>(fx: Fixture<S>) {
    fx.require(Capability::LargeOutcomes);
    let now = fx.clock.now();
    let key = key("p-7");
    let claim = claim_of(&key, "token-a", now, None);
    assert_eq!(
        fx.store.claim(&claim, now).await.expect("claim"),
        Claim::Acquired
    );
    let outcome = serde_json::to_vec(&incompressible(1024 * 1024, 7)).expect("JSON");
    assert_eq!(
        fx.store
            .settle(under(&key, "token-a", None), &completed(&outcome, now))
            .await
            .expect("settle"),
        Fence::Held
    );
    let record = stored(&fx.store, &key).await;
    assert_eq!(record.outcome.map(|bytes| bytes == outcome), Some(true));
}
