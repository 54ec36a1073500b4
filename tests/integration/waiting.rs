//! Waiting for an in-flight result across environments ([`Invocation::with_wait_for_result`]):
//! two engines over one table (two execution environments), on both stores. A duplicate that
//! waits gets the holder's outcome, gives up at its patience or its deadline with the
//! reads it cost counted, and takes over a holder whose lease ran out.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::{Clock, SystemClock};
use lambda_idempotency::observe::Observation;
use lambda_idempotency::reconcile::{BoxFuture, Recovery};
use lambda_idempotency::store::{AnyStore, StoreExt};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::faults::{Fault, FaultKind, FaultyStore, Primitive};
use lambda_idempotency::{Error, Idempotency, Invocation, Origin, StoreError};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use super::backends::{Backend, both};

/// The system clock, telling the test each time the engine pauses (the waiting's pauses: no
/// write fails here, so no retry pauses).
#[derive(Debug, Clone)]
pub(super) struct PauseSignal(pub(super) mpsc::UnboundedSender<Duration>);

impl Clock for PauseSignal {
    fn now(&self) -> SystemTime {
        SystemClock.now()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let _ = self.0.send(duration);
        SystemClock.sleep(duration)
    }
}

/// The reads each wait reported.
fn counting_waits(engine: Idempotency) -> (Idempotency, Arc<Mutex<Vec<u32>>>) {
    let waits = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&waits);
    let engine = engine.with_observer(move |observation: &Observation<'_>| {
        if let Observation::Waited { reads, .. } = observation {
            seen.lock().expect("waits").push(*reads);
        }
    });
    (engine, waits)
}

fn reads(waits: &Mutex<Vec<u32>>) -> Vec<u32> {
    waits.lock().expect("waits").clone()
}

/// Environment A's handler: runs once, signals that it holds the claim, and finishes when
/// released.
fn holder(
    runs: &Arc<AtomicUsize>,
    holding: &Arc<Notify>,
    release: &Arc<Notify>,
) -> impl FnOnce(
    lambda_idempotency::ExecutionContext,
) -> BoxFuture<'static, Result<Value, std::io::Error>>
+ Send
+ 'static {
    let (runs, holding, release) = (Arc::clone(runs), Arc::clone(holding), Arc::clone(release));
    move |_ctx| {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            holding.notify_one();
            release.notified().await;
            Ok(json!({"charged": "by A"}))
        })
    }
}

#[tokio::test]
async fn a_duplicate_that_waits_gets_the_holders_outcome() {
    for backend in both().await {
        let name = backend.name;
        let env_a = Idempotency::new(backend.store.clone());
        let (pauses_tx, mut pauses) = mpsc::unbounded_channel();
        let (env_b, waits) =
            counting_waits(Idempotency::new(backend.store).with_clock(PauseSignal(pauses_tx)));
        let inv = invocation("order-wait", &json!({"amount": 10}));
        let runs = Arc::new(AtomicUsize::new(0));
        let (holding, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));

        let a = tokio::spawn({
            let (env_a, inv, handler) = (
                env_a.clone(),
                inv.clone(),
                holder(&runs, &holding, &release),
            );
            async move { env_a.execute::<Value, _, _, _>(&inv, handler).await }
        });
        holding.notified().await;
        let b = tokio::spawn({
            let (inv, runs) = (
                inv.with_wait_for_result(Duration::from_secs(30)),
                Arc::clone(&runs),
            );
            async move {
                env_b
                    .execute(&inv, |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(json!({"charged": "by B"}))
                    })
                    .await
            }
        });
        // B found A's live claim and is waiting (its first pause), not answering.
        pauses.recv().await.expect("B pauses to wait");
        release.notify_one();

        let first = a.await.expect("A").expect("A runs");
        let waited = b.await.expect("B").expect("B gets A's outcome");
        assert_eq!(first.origin(), Origin::Executed { attempt: 1 }, "{name}");
        assert_eq!(
            waited.origin(),
            Origin::Replayed,
            "{name}: B replays A's outcome"
        );
        assert_eq!(
            waited.raw_json().get(),
            first.raw_json().get(),
            "{name}: byte for byte"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: the handler ran once"
        );
        let reads = reads(&waits);
        assert_eq!(reads.len(), 1, "{name}: one wait reported");
        assert!(reads[0] >= 1, "{name}: the wait read the record: {reads:?}");
    }
}

#[tokio::test]
async fn a_duplicate_without_waiting_answers_in_progress_at_once() {
    for backend in both().await {
        let name = backend.name;
        let env_a = Idempotency::new(backend.store.clone());
        let (env_b, waits) = counting_waits(Idempotency::new(backend.store));
        let inv = invocation("order-nowait", &json!({"amount": 10}));
        let runs = Arc::new(AtomicUsize::new(0));
        let (holding, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let a = tokio::spawn({
            let (env_a, inv, handler) = (
                env_a.clone(),
                inv.clone(),
                holder(&runs, &holding, &release),
            );
            async move { env_a.execute::<Value, _, _, _>(&inv, handler).await }
        });
        holding.notified().await;

        let answer = env_b
            .execute(&inv, |_ctx| async { Ok::<_, std::io::Error>(json!(0)) })
            .await;
        assert!(
            matches!(answer, Err(Error::AlreadyInProgress { .. })),
            "{name}: {answer:?}"
        );
        assert!(reads(&waits).is_empty(), "{name}: no read spent waiting");
        release.notify_one();
        a.await.expect("A").expect("A runs");
    }
}

/// A holder that never settles (its handler never returns while the test runs).
async fn hold_forever(env: &Idempotency, inv: &Invocation) -> tokio::task::JoinHandle<()> {
    let holding = Arc::new(Notify::new());
    let task = tokio::spawn({
        let (env, inv, holding) = (env.clone(), inv.clone(), Arc::clone(&holding));
        async move {
            let _ = env
                .execute(&inv, |_ctx| async move {
                    holding.notify_one();
                    std::future::pending::<Result<Value, std::io::Error>>().await
                })
                .await;
        }
    });
    holding.notified().await;
    task
}

#[tokio::test]
async fn a_wait_gives_up_at_its_patience_and_counts_its_reads() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let env_a = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let (env_b, waits) =
            counting_waits(Idempotency::new(backend.store).with_clock(clock.clone()));
        let inv = invocation("order-patience", &json!({"amount": 10}));
        let holder = hold_forever(&env_a, &inv).await;
        let started = clock.now();

        let answer = env_b
            .execute(
                &inv.with_wait_for_result(Duration::from_secs(5)),
                |_ctx| async { Ok::<_, std::io::Error>(json!(0)) },
            )
            .await;
        assert!(
            matches!(answer, Err(Error::AlreadyInProgress { .. })),
            "{name}: {answer:?}"
        );
        let waited = clock.now().duration_since(started).expect("forward");
        assert_eq!(
            waited,
            Duration::from_secs(5),
            "{name}: waited its patience, no longer"
        );
        // Pauses of 50, 100, 200, 400, 800 ms, then 1 s, cut at the patience: 9 reads in 5 s.
        assert_eq!(
            reads(&waits),
            vec![9],
            "{name}: the reads a 5-second wait costs"
        );
        let Err(Error::AlreadyInProgress { retry_after, .. }) = answer else {
            unreachable!("matched above")
        };
        assert_eq!(
            retry_after,
            Duration::from_secs(25),
            "{name}: retry after what is left of the holder's 30-second lease, not what was left when the wait began"
        );
        holder.abort();
    }
}

#[tokio::test]
async fn a_wait_never_outlasts_the_callers_deadline() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let env_a = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let (env_b, waits) =
            counting_waits(Idempotency::new(backend.store).with_clock(clock.clone()));
        let inv = invocation("order-deadline", &json!({"amount": 10}));
        let holder = hold_forever(&env_a, &inv).await;
        let started = clock.now();
        let deadline = started + Duration::from_secs(3);

        let answer = env_b
            .execute(
                &inv.with_deadline(deadline)
                    .with_wait_for_result(Duration::from_secs(60)),
                |_ctx| async { Ok::<_, std::io::Error>(json!(0)) },
            )
            .await;
        assert!(
            matches!(answer, Err(Error::AlreadyInProgress { .. })),
            "{name}: {answer:?}"
        );
        let waited = clock.now().duration_since(started).expect("forward");
        assert_eq!(
            waited,
            Duration::from_secs(2),
            "{name}: stops a second before the deadline, to answer in time"
        );
        assert!(!reads(&waits).is_empty(), "{name}");
        holder.abort();
    }
}

#[tokio::test]
async fn a_holder_whose_lease_runs_out_is_taken_over_by_the_waiter() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let env_a = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let (env_b, waits) = counting_waits(
            Idempotency::new(AnyStore::clone(&backend.store))
                .with_clock(clock.clone())
                .with_recovery(Recovery::Rerun),
        );
        // A's lease: 30 s (the suite's); B may run for 2 minutes, and waits as long.
        let inv = invocation("order-crashed", &json!({"amount": 10}));
        let patient = Invocation::new(
            inv.key().clone(),
            inv.fingerprint().clone(),
            Duration::from_secs(120),
        );
        let holder = hold_forever(&env_a, &inv).await;
        let started = clock.now();
        let runs = AtomicU32::new(0);

        let answer = env_b
            .execute(
                &patient.with_wait_for_result(Duration::from_secs(120)),
                |ctx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async move { Ok::<_, std::io::Error>(json!({"attempt": ctx.attempt()})) }
                },
            )
            .await
            .expect("B takes over");
        assert_eq!(answer.origin(), Origin::Executed { attempt: 2 }, "{name}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
        let waited = clock.now().duration_since(started).expect("forward");
        // The manual clock's jitter draws its whole range: the wake after the lease's end
        // comes half a pause (of 1 s) past it, each waiter by its own draw.
        assert_eq!(
            waited,
            Duration::from_millis(30_501),
            "{name}: waited the holder's lease out, and half a pause past it at most"
        );
        // Pauses of 50 ms doubling to 1 s, the last cut to soon after the lease's end: 34
        // reads, never a busy loop.
        assert_eq!(reads(&waits), vec![34], "{name}");
        holder.abort();
    }
}

/// Two environments on the backend's clock: A, which holds; B, which re-runs what it takes
/// over ([`Recovery::Rerun`]).
fn holder_and_taker(backend: &Backend) -> (Idempotency, Idempotency) {
    let env_a = Idempotency::new(backend.store.clone()).with_clock(backend.clock.clone());
    let env_b = Idempotency::new(backend.store.clone())
        .with_clock(backend.clock.clone())
        .with_recovery(Recovery::Rerun);
    (env_a, env_b)
}

#[tokio::test]
async fn a_waiter_that_takes_over_holds_the_lease_it_was_given() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let (env_a, env_b) = holder_and_taker(&backend);
        let inv = invocation("order-capped", &json!({"amount": 10}));
        let holder = hold_forever(&env_a, &inv).await;
        // B: a lease capped at 10 s (a lease policy's `max`) on a 15-minute invocation.
        let deadline = clock.now() + Duration::from_secs(15 * 60);
        let capped = Invocation::new(
            inv.key().clone(),
            inv.fingerprint().clone(),
            Duration::from_secs(10),
        )
        .with_deadline(deadline)
        .with_wait_for_result(Duration::from_secs(60));
        let store = backend.store.clone();
        let key = inv.key().clone();

        let lease_left = env_b
            .execute(&capped, |_ctx| {
                let (store, clock, key) = (store.clone(), clock.clone(), key.clone());
                async move {
                    let record = store.get(&key).await.expect("get").expect("the claim");
                    let left = record
                        .lease
                        .expires_at
                        .duration_since(clock.now())
                        .expect("ahead");
                    Ok::<_, std::io::Error>(left.as_millis() as u64)
                }
            })
            .await
            .expect("B takes over");
        assert_eq!(
            *lease_left.value(),
            10_000,
            "{name}: the takeover holds its 10 s, not what the 30 s of waiting left of them"
        );
        holder.abort();
    }
}

#[tokio::test]
async fn a_waiter_too_close_to_its_deadline_does_not_take_over() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let (env_a, env_b) = holder_and_taker(&backend);
        let inv = invocation("order-late", &json!({"amount": 10}));
        let holder = hold_forever(&env_a, &inv).await;
        // A's lease runs out at 30 s; B must answer by 32 s: under 2 s would be left to run.
        let deadline = clock.now() + Duration::from_secs(32);
        let runs = AtomicUsize::new(0);

        let answer = env_b
            .execute(
                &inv.with_deadline(deadline)
                    .with_wait_for_result(Duration::from_secs(60)),
                |_ctx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, std::io::Error>(json!(0)) }
                },
            )
            .await;
        assert!(
            matches!(answer, Err(Error::AlreadyInProgress { .. })),
            "{name}: {answer:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "{name}: no effect started to be cut off"
        );
        holder.abort();
    }
}

#[tokio::test]
async fn duplicates_waiting_under_single_flight_take_turns_and_all_replay() {
    for backend in both().await {
        let name = backend.name;
        let env_a = Idempotency::new(backend.store.clone());
        let (pauses_tx, mut pauses) = mpsc::unbounded_channel();
        let (env_b, waits) = counting_waits(
            Idempotency::new(backend.store)
                .with_clock(PauseSignal(pauses_tx))
                .with_single_flight(),
        );
        let inv = invocation("order-turns", &json!({"amount": 10}));
        let runs = Arc::new(AtomicUsize::new(0));
        let (holding, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let a = tokio::spawn({
            let (env_a, inv, handler) = (
                env_a.clone(),
                inv.clone(),
                holder(&runs, &holding, &release),
            );
            async move { env_a.execute::<Value, _, _, _>(&inv, handler).await }
        });
        holding.notified().await;
        let duplicate = || {
            let (env_b, inv, runs) = (
                env_b.clone(),
                inv.clone().with_wait_for_result(Duration::from_secs(30)),
                Arc::clone(&runs),
            );
            tokio::spawn(async move {
                env_b
                    .execute(&inv, |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(json!({"charged": "by B"}))
                    })
                    .await
            })
        };
        let (b1, b2) = (duplicate(), duplicate());
        // One of B's duplicates waits on A's claim; the other waits for its turn.
        pauses.recv().await.expect("a duplicate pauses to wait");
        release.notify_one();

        let first = a.await.expect("A").expect("A runs");
        for b in [b1, b2] {
            let replayed = b.await.expect("B").expect("B gets A's outcome");
            assert_eq!(replayed.origin(), Origin::Replayed, "{name}");
            assert_eq!(replayed.raw_json().get(), first.raw_json().get(), "{name}");
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: the handler ran once"
        );
        assert_eq!(
            reads(&waits).len(),
            1,
            "{name}: only the duplicate whose turn came first read the record"
        );
    }
}

#[tokio::test]
async fn a_read_failing_for_now_is_read_again_and_one_refused_for_good_ends_the_wait() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let env_a = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let faulty = FaultyStore::new(backend.store.clone());
        // The wait's first two reads are throttled past the SDK's retries, the third finds the
        // record corrupt (an operator's case, not a reason to keep reading).
        faulty.inject(Primitive::Get, Fault::FailBefore(FaultKind::Throttled));
        faulty.inject(Primitive::Get, Fault::FailBefore(FaultKind::Unavailable));
        faulty.inject(Primitive::Get, Fault::FailBefore(FaultKind::Corrupt));
        let (env_b, waits) =
            counting_waits(Idempotency::new(faulty.clone()).with_clock(clock.clone()));
        let inv = invocation("order-faulty-read", &json!({"amount": 10}));
        let holder = hold_forever(&env_a, &inv).await;

        let answer = env_b
            .execute(
                &inv.with_wait_for_result(Duration::from_secs(60)),
                |_ctx| async { Ok::<_, std::io::Error>(json!(0)) },
            )
            .await;

        assert!(
            matches!(answer, Err(Error::Store(StoreError::CorruptRecord { .. }))),
            "{name}: {answer:?}"
        );
        assert_eq!(
            reads(&waits),
            vec![3],
            "{name}: two reads again, then the refusal"
        );
        assert_eq!(faulty.calls().get(&Primitive::Get), Some(&3), "{name}");
        holder.abort();
    }
}

/// The store's clock for the time, with a signal for each deadline of a wait in flight (a
/// write's cut, a caller's wait for its single-flight turn), which never ends: a caller waiting
/// for its turn gets it only when the turn before ends.
#[derive(Debug, Clone)]
struct SignalledTurns {
    time: lambda_idempotency::clock::ManualClock,
    deadlines: mpsc::UnboundedSender<Duration>,
}

impl Clock for SignalledTurns {
    fn now(&self) -> SystemTime {
        self.time.now()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.time.sleep(duration)
    }

    fn deadline(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let _ = self.deadlines.send(duration);
        Box::pin(std::future::pending())
    }
}

/// A copy whose single-flight turn comes with under 2 s left before its deadline (the turn
/// before failed, releasing its claim, late) does not start the handler for Lambda to cut off:
/// it answers in progress, and the redelivery runs it.
#[tokio::test]
async fn a_turn_that_comes_too_close_to_the_deadline_does_not_start_the_handler() {
    for backend in both().await {
        let name = backend.name;
        let time = backend.clock.clone();
        let (deadlines_tx, mut deadlines) = mpsc::unbounded_channel();
        let clock = SignalledTurns {
            time: time.clone(),
            deadlines: deadlines_tx,
        };
        let idem = Idempotency::new(backend.store)
            .with_clock(clock)
            .with_single_flight();
        let deadline = time.now() + Duration::from_secs(10);
        let inv = invocation("order-late-turn", &json!({"amount": 10})).with_deadline(deadline);
        let runs = Arc::new(AtomicUsize::new(0));
        let (holding, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let first = tokio::spawn({
            let (idem, inv, runs, time) =
                (idem.clone(), inv.clone(), Arc::clone(&runs), time.clone());
            let (holding, release) = (Arc::clone(&holding), Arc::clone(&release));
            async move {
                idem.execute::<Value, _, _, _>(&inv, |_ctx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    holding.notify_one();
                    release.notified().await;
                    // A slow downstream call that fails 1.5 s before the deadline.
                    time.advance(Duration::from_millis(8_500));
                    Err(std::io::Error::other("the payment service timed out"))
                })
                .await
            }
        });
        holding.notified().await;
        let copy = tokio::spawn({
            let (idem, inv, runs) = (idem.clone(), inv.clone(), Arc::clone(&runs));
            async move {
                idem.execute(&inv, |_ctx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(json!({"charged": "late"}))
                })
                .await
            }
        });
        // The copy waits for its turn at most 1 s short of the 10 s it has left (the first's
        // writes are cut 500 ms before the deadline: 9.5 s).
        while deadlines.recv().await.expect("the copy waits for its turn") != Duration::from_secs(9)
        {
        }
        release.notify_one();
        assert!(first.await.expect("first").is_err(), "{name}: it failed");

        let answer = copy.await.expect("copy");
        assert!(
            matches!(answer, Err(Error::AlreadyInProgress { .. })),
            "{name}: {answer:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "{name}: no handler started 1.5 s before the deadline"
        );
        // The redelivery, with its own time, runs it.
        let redelivered = inv.with_deadline(time.now() + Duration::from_secs(10));
        let ran = idem
            .execute(&redelivered, |_ctx| async {
                Ok::<_, std::io::Error>(json!({"charged": "redelivered"}))
            })
            .await
            .expect("the redelivery runs");
        assert!(matches!(ran.origin(), Origin::Executed { .. }), "{name}");
    }
}

/// A duplicate whose claim was throttled for a while before it met the holder's record says
/// to retry after what is left of the holder's lease when it answers, not when it began: the
/// claim's tries took their time.
#[tokio::test]
async fn retry_after_counts_the_holders_lease_from_the_answer() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let env_a = Idempotency::new(backend.store.clone()).with_clock(clock.clone());
        let faulty = FaultyStore::new(backend.store.clone());
        faulty.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Throttled));
        faulty.inject(Primitive::Claim, Fault::FailBefore(FaultKind::Throttled));
        let env_b = Idempotency::new(faulty.clone()).with_clock(clock.clone());
        let inv = invocation("order-throttled-duplicate", &json!({"amount": 10}));
        let holder = hold_forever(&env_a, &inv).await;
        let held_until = env_a
            .store()
            .get(inv.key())
            .await
            .expect("read")
            .expect("held")
            .lease
            .expires_at;

        let answer = env_b
            .execute(&inv, |_ctx| async { Ok::<_, std::io::Error>(json!(0)) })
            .await;

        let left = held_until.duration_since(clock.now()).expect("still held");
        match answer {
            Err(Error::AlreadyInProgress { retry_after, .. }) => assert!(
                retry_after <= left,
                "{name}: retry after {retry_after:?}, the lease has {left:?} left"
            ),
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(faulty.calls().get(&Primitive::Claim), Some(&3), "{name}");
        holder.abort();
    }
}
