//! A deadline already past when the handler starts (an emulator's: `cargo lambda watch` gives
//! one in 1970) is no deadline on every door: the lease is the documented 60 s, not the 5 s
//! skew alone, and a batch starts its records.

use std::time::{Duration, SystemTime};

use crate::event_door::EventDoor;
use aws_lambda_events::event::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_http::{Body, Request, RequestExt};
use lambda_idempotency::HttpKeys;
use lambda_idempotency::Operation;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::lambda::batch::BatchProcessor;
use lambda_idempotency::lambda::http::CallerScope;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::record::Record;
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::faults::{Fault, FaultyStore, Primitive};
use lambda_idempotency::{
    BoxError, Error, ExecutionContext, Idempotency, KeyPolicy, LeasePolicy, OperationScope,
};
use lambda_runtime::tower::{Layer, ServiceExt, service_fn};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

use super::backends::{both, sqs_message};

/// The context `cargo lambda watch` gives: a deadline in 1970.
fn emulator_context() -> Context {
    let mut context = Context::default();
    context.deadline = 1_000;
    context
}

fn scope() -> OperationScope {
    OperationScope::new("deadlines", "op").expect("scope")
}

/// The one record the door wrote.
async fn only_record(store: &AnyStore, key: &lambda_idempotency::OperationKey) -> Record {
    store.get(key).await.expect("get").expect("a record")
}

fn lease_of(record: &Record) -> Duration {
    record
        .lease
        .expires_at
        .duration_since(record.created_at)
        .expect("the lease ends after the claim")
}

#[tokio::test]
async fn every_door_treats_a_past_deadline_as_none() {
    let without_deadline = LeasePolicy::default().without_deadline;
    assert_eq!(without_deadline, Duration::from_secs(60));
    for backend in both().await {
        let name = backend.name;
        let store = backend.store.clone();
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);

        // The tower layer.
        let policy = KeyPolicy::<Value>::pointer("/id").expect("pointer");
        let key = policy
            .derive(&scope(), &json!({"id": "layer"}))
            .expect("key")
            .0;
        let service = Operation::new(idem.clone(), scope(), policy)
            .layer()
            .layer(service_fn(|_: LambdaEvent<Value>| async {
                Ok::<_, lambda_runtime::Error>(json!("done"))
            }));
        service
            .oneshot(LambdaEvent::new(json!({"id": "layer"}), emulator_context()))
            .await
            .expect("layer");
        assert_eq!(
            lease_of(&only_record(&store, &key).await),
            without_deadline,
            "{name}: layer"
        );

        // A batch: its record starts, with the same lease.
        let policy = sources::sqs(Some("/id")).expect("policy");
        let message = sqs_message("m-1", json!({"id": "batch"}));
        let key = policy.derive(&scope(), &message).expect("key").0;
        let processor: BatchProcessor<SqsMessage> =
            Operation::new(idem.clone(), scope(), policy).batch();
        let report = processor
            .process(
                vec![message],
                &emulator_context(),
                |_, _: ExecutionContext| async { Ok::<_, std::io::Error>(String::from("placed")) },
            )
            .await;
        assert!(
            report.failed_identifiers().is_empty(),
            "{name}: the record started"
        );
        assert_eq!(
            lease_of(&only_record(&store, &key).await),
            without_deadline,
            "{name}: batch"
        );

        // The API Gateway v2 event door.
        let event = http_event("event-door");
        let door = EventDoor::new(Operation::new(
            idem.clone(),
            scope(),
            HttpKeys::new().with_callers(CallerScope::Shared).policy(),
        ));
        let key = shared_http_key("event-door");
        let answer = door
            .handle(LambdaEvent::new(event, emulator_context()), |_, _| async {
                let mut response = ApiGatewayV2httpResponse::default();
                response.status_code = 201;
                Ok::<_, std::io::Error>(response)
            })
            .await;
        assert_eq!(answer.status_code, 201, "{name}");
        assert_eq!(
            lease_of(&only_record(&store, &key).await),
            without_deadline,
            "{name}: event door"
        );

        // The tower layer over lambda_http.
        let layer = Operation::new(
            idem,
            scope(),
            HttpKeys::new().with_callers(CallerScope::Shared).policy(),
        )
        .http_layer();
        let service = layer.layer(service_fn(|_: Request| async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .body(Body::Empty)
                    .expect("response"),
            )
        }));
        let request = lambda_http::request::from_str(&http_json("http-layer").to_string())
            .expect("request")
            .with_lambda_context(emulator_context());
        let answer = service.oneshot(request).await.expect("answer");
        assert_eq!(answer.status(), 201, "{name}");
        let key = shared_http_key("http-layer");
        assert_eq!(
            lease_of(&only_record(&store, &key).await),
            without_deadline,
            "{name}: HTTP layer"
        );
    }
}

#[test]
fn a_deadline_ahead_still_bounds_the_lease() {
    let policy = LeasePolicy::default();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    assert_eq!(
        policy.lease(Some(now + Duration::from_secs(30)), now),
        Duration::from_secs(35)
    );
    assert_eq!(policy.lease(Some(now), now), policy.without_deadline);
    assert_eq!(
        policy.lease(Some(now - Duration::from_secs(1)), now),
        policy.without_deadline
    );
    assert_eq!(policy.lease(None, now), policy.without_deadline);
}

/// The operation key of an `Idempotency-Key` under `CallerScope::Shared` (no caller).
fn shared_http_key(key: &str) -> lambda_idempotency::OperationKey {
    let material = json!({"caller": null, "key": key});
    lambda_idempotency::OperationKey::derive(&scope(), None, &material).expect("key")
}

fn http_json(key: &str) -> Value {
    json!({
        "version": "2.0", "routeKey": "POST /p", "rawPath": "/p", "rawQueryString": "",
        "headers": {"content-type": "application/json", "idempotency-key": key},
        "requestContext": {"accountId": "1", "apiId": "a", "domainName": "d", "domainPrefix": "d",
            "http": {"method": "POST", "path": "/p", "protocol": "HTTP/1.1", "sourceIp": "1.2.3.4",
            "userAgent": "t"}, "requestId": "r", "routeKey": "POST /p", "stage": "$default",
            "time": "t", "timeEpoch": 0},
        "body": "{}", "isBase64Encoded": false
    })
}

fn http_event(key: &str) -> ApiGatewayV2httpRequest {
    serde_json::from_value(http_json(key)).expect("request")
}

/// A clock that reads Tokio's time (paused in a test, where it moves when every task waits),
/// as the cut of a write in flight does.
#[derive(Debug, Clone, Copy)]
struct TokioClock {
    start: SystemTime,
    origin: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.start + self.origin.elapsed()
    }
}

/// `answer`'s output, failing the test when it never comes: Tokio's paused time moves to the
/// timeout as soon as every task waits.
async fn answered_at_all<T>(answer: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), answer)
        .await
        .expect("answered, not held as long as the store holds it")
}

/// A claim and a takeover whose writes stall in the store (a try that never answers), and
/// their clean-ups with them (the release of a claim that may have committed, the shortening
/// of a takeover's lease): abandoned before the invocation's deadline and answered as a store
/// failure while the invocation can still answer (a batch record reported failed). They were
/// tried until the lease's end, past the deadline, each try awaited for as long as the store
/// held it, so Lambda's timeout ended the invocation (a batch wholly retried). On the memory
/// store, with Tokio's time paused: the cut of a try in flight is on Tokio's timer, which then
/// moves when every task waits (the embedded server's requests would be cut by it too).
#[tokio::test(start_paused = true)]
async fn a_claim_or_takeover_that_stalls_is_answered_before_the_deadline() {
    let fixture = lambda_idempotency::testing::conformance::memory_fixture(
        lambda_idempotency::testing::conformance::start_time(),
    );
    let clock = TokioClock {
        start: fixture.clock.now(),
        origin: tokio::time::Instant::now(),
    };
    let store_clock = fixture.clock.clone();
    let faulty = FaultyStore::new(fixture.store);
    let idem = Idempotency::new(faulty.clone()).with_clock(clock);
    let scope = scope();
    let invocation = |order: &str, deadline: SystemTime| {
        let key =
            lambda_idempotency::OperationKey::derive(&scope, None, &json!(order)).expect("key");
        let fingerprint = lambda_idempotency::Fingerprint::of(&json!({})).expect("fingerprint");
        lambda_idempotency::Invocation::new(key, fingerprint, Duration::from_secs(60))
            .with_deadline(deadline)
    };
    let stalled = |cases: &[Primitive]| {
        for primitive in cases {
            for _ in 0..5 {
                faulty.inject(*primitive, Fault::Hold);
            }
        }
    };
    let answered_by =
        |deadline: SystemTime, answer: Result<lambda_idempotency::Execution<Value>, Error>| {
            assert!(
                matches!(answer, Err(Error::Store(ref err)) if err.is_transient()),
                "{answer:?}"
            );
            assert!(clock.now() < deadline, "answered before the deadline");
        };

    // A fresh claim, and the release of what it may have committed.
    let deadline = clock.now() + Duration::from_secs(3);
    stalled(&[Primitive::Claim, Primitive::Release]);
    let answer = answered_at_all(idem.execute(&invocation("fresh", deadline), |_ctx| async {
        Ok::<_, BoxError>(json!("ran"))
    }))
    .await;
    answered_by(deadline, answer);
    assert_eq!(
        faulty.calls().get(&Primitive::Claim),
        Some(&1),
        "no try after its answer is due"
    );
    // The tries left unsent (no let-go: the cut dropped the held ones).
    faulty.clear();

    // A takeover of a crashed claim, and the shortening of the lease it may hold.
    // Crashed without a deadline: nothing of it wakes once the clock moves.
    let crashed = invocation("crashed", clock.now() + Duration::from_secs(60));
    let crashed = lambda_idempotency::Invocation::new(
        crashed.key().clone(),
        crashed.fingerprint().clone(),
        Duration::from_secs(60),
    );
    lambda_idempotency::testing::conformance::crash_after_claim(&idem, &crashed).await;
    // Past its lease on the engine's clock and on the store's.
    tokio::time::advance(Duration::from_secs(120)).await;
    store_clock.set(clock.now());
    let deadline = clock.now() + Duration::from_secs(3);
    stalled(&[Primitive::TakeOver, Primitive::Shorten]);
    // Run again once its lease ran out (the default holds it for an operator, unwritten).
    let rerun = invocation("crashed", deadline)
        .with_recovery(lambda_idempotency::reconcile::Recovery::Rerun);
    let answer =
        answered_at_all(idem.execute(&rerun, |_ctx| async { Ok::<_, BoxError>(json!("ran")) }))
            .await;
    answered_by(deadline, answer);
    let calls = faulty.calls();
    assert_eq!(calls.get(&Primitive::TakeOver), Some(&1), "{calls:?}");
    assert_eq!(
        calls.get(&Primitive::Shorten),
        Some(&1),
        "its clean-up tried: {calls:?}"
    );
    // The tries left unsent.
    faulty.clear();
}

/// The same harness as above, for the reads and give-backs around a claim another holds.
struct Stalling {
    idem: Idempotency,
    faulty: FaultyStore<lambda_idempotency::MemoryStore>,
    clock: TokioClock,
    store_clock: lambda_idempotency::clock::ManualClock,
}

impl Stalling {
    fn new() -> Self {
        let fixture = lambda_idempotency::testing::conformance::memory_fixture(
            lambda_idempotency::testing::conformance::start_time(),
        );
        let clock = TokioClock {
            start: fixture.clock.now(),
            origin: tokio::time::Instant::now(),
        };
        let faulty = FaultyStore::new(fixture.store);
        Self {
            idem: Idempotency::new(faulty.clone()).with_clock(clock),
            faulty,
            clock,
            store_clock: fixture.clock,
        }
    }

    /// `order`'s invocation, its deadline at `deadline` when there is one.
    fn invocation(
        &self,
        order: &str,
        deadline: Option<SystemTime>,
    ) -> lambda_idempotency::Invocation {
        let key =
            lambda_idempotency::OperationKey::derive(&scope(), None, &json!(order)).expect("key");
        let fingerprint = lambda_idempotency::Fingerprint::of(&json!({})).expect("fingerprint");
        let invocation =
            lambda_idempotency::Invocation::new(key, fingerprint, Duration::from_secs(60));
        match deadline {
            Some(deadline) => invocation.with_deadline(deadline),
            None => invocation,
        }
    }

    fn stall(&self, primitive: Primitive, times: usize) {
        for _ in 0..times {
            self.faulty.inject(primitive, Fault::Hold);
        }
    }
}

/// A duplicate that waits for the holder's outcome, its reads stalling in the store: the read
/// in flight is cut before the invocation's deadline and the caller is answered in progress.
/// The read was awaited for as long as the store held it (the SDK's 5 s, past the deadline).
#[tokio::test(start_paused = true)]
async fn a_waiting_duplicates_read_that_stalls_is_answered_before_the_deadline() {
    let rig = Stalling::new();
    let held = rig.invocation("held elsewhere", None);
    lambda_idempotency::testing::conformance::crash_after_claim(&rig.idem, &held).await;

    let deadline = rig.clock.now() + Duration::from_secs(3);
    let waiting = rig
        .invocation("held elsewhere", Some(deadline))
        .with_wait_for_result(Duration::from_secs(60));
    rig.stall(Primitive::Get, 50);
    let answer = answered_at_all(
        rig.idem
            .execute(&waiting, |_ctx| async { Ok::<_, BoxError>(json!("ran")) }),
    )
    .await;
    assert!(
        matches!(answer, Err(Error::AlreadyInProgress { .. })),
        "{answer:?}"
    );
    assert!(rig.clock.now() < deadline, "answered before the deadline");
    rig.faulty.clear();
}

/// A takeover whose reconciler fails gives the claim back at once; when that write stalls it
/// is cut before the deadline and the caller is answered. It was retried until the lease's
/// end (the deadline plus the clock skew), each try uncut.
#[tokio::test(start_paused = true)]
async fn a_give_back_that_stalls_is_answered_before_the_deadline() {
    let rig = Stalling::new();
    let crashed = rig.invocation("crashed", None);
    lambda_idempotency::testing::conformance::crash_after_claim(&rig.idem, &crashed).await;
    tokio::time::advance(Duration::from_secs(120)).await;
    rig.store_clock.set(rig.clock.now());

    let deadline = rig.clock.now() + Duration::from_secs(3);
    let retried = rig.invocation("crashed", Some(deadline));
    let asking =
        rig.idem
            .clone()
            .with_reconciler(|_: lambda_idempotency::reconcile::Takeover| async {
                Err::<lambda_idempotency::reconcile::Checked, BoxError>("the ledger is down".into())
            });
    rig.stall(Primitive::Shorten, 5);
    let answer =
        answered_at_all(asking.execute(&retried, |_ctx| async { Ok::<_, BoxError>(json!("ran")) }))
            .await;
    assert!(
        matches!(answer, Err(Error::ReconcileFailed { .. })),
        "{answer:?}"
    );
    assert!(rig.clock.now() < deadline, "answered before the deadline");
    rig.faulty.clear();
}
