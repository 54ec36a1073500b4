//! SQS producers, on both stores: the key is scoped to the producer SQS names in `SenderId`
//! (its role part), so that one producer can neither suppress nor read another's message,
//! while a producer's retry from another session is the same operation; and a redelivery
//! that 0.4 keyed without the producer is not run again once the cut-over rule names it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::config::Config;
use lambda_idempotency::key::Fingerprint;
use lambda_idempotency::lambda::batch::RecordOutcome;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{BoxError, Idempotency, Invocation, Operation, OperationScope};
use lambda_runtime::Context;
use serde_json::json;

use crate::backends::{both, sqs_message};

fn from(sender: &str, id: &str) -> SqsMessage {
    let mut message = sqs_message(id, json!({"order_id": "o-1", "amount": 5}));
    message
        .attributes
        .insert("SenderId".into(), sender.to_owned());
    message
}

fn scope() -> OperationScope {
    OperationScope::new("producers", "orders").expect("scope")
}

#[tokio::test]
async fn one_producer_neither_suppresses_nor_reads_another() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let batch =
            Operation::new(idem, scope(), sources::sqs(Some("/order_id")).expect("sqs")).batch();
        let runs = Arc::new(AtomicUsize::new(0));
        let place = |message: SqsMessage, _| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(message.attributes.get("SenderId").cloned())
            }
        };
        let context = Context::default();
        let process = |message| batch.process(vec![message], &context, place);

        let a = process(from("AROAPRODUCERA:i-0aaa", "m-1")).await;
        let b = process(from("AROAPRODUCERB:i-0bbb", "m-2")).await;
        let a_retry = process(from("AROAPRODUCERA:i-0ccc", "m-3")).await;
        let user = process(from("AIDAOPERATOR", "m-4")).await;

        assert!(matches!(a.records[0].1, RecordOutcome::Executed), "{name}");
        assert!(
            matches!(b.records[0].1, RecordOutcome::Executed),
            "{name}: producer B's order is its own"
        );
        assert!(
            matches!(a_retry.records[0].1, RecordOutcome::Replayed),
            "{name}: A's retry from another instance is A's"
        );
        assert!(
            matches!(user.records[0].1, RecordOutcome::Executed),
            "{name}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3, "{name}");
    }
}

#[tokio::test]
async fn producers_share_one_key_space_only_when_asked() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let policy = sources::sqs_across_senders(Some("/order_id")).expect("sqs");
        let batch = Operation::new(idem, scope(), policy).batch();
        let runs = AtomicUsize::new(0);
        let place = |_: SqsMessage, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(()) }
        };
        for (sender, id) in [("AROAPRODUCERA:s", "m-1"), ("AROAPRODUCERB:s", "m-2")] {
            batch
                .process(vec![from(sender, id)], &Context::default(), place)
                .await;
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}");
    }
}

#[tokio::test]
async fn a_redelivery_0_4_keyed_without_its_producer_is_not_run_again() {
    for backend in both().await {
        let name = backend.name;
        let clock = backend.clock.clone();
        let cutover = clock.now() + Duration::from_secs(60);
        let config = Config::builder()
            .keyed_by_0_4_before(cutover)
            .build()
            .expect("config");
        let store = backend.store;
        // 0.4 keyed the message as `sqs_across_senders` does, and named no key rule.
        let v0_4 = Idempotency::new(store.clone()).with_clock(clock.clone());
        let across = Operation::new(
            v0_4.clone(),
            scope(),
            sources::sqs_across_senders(Some("/order_id")).expect("sqs"),
        );
        let v0_5 = Operation::new(
            Idempotency::new(store)
                .with_clock(clock.clone())
                .with_config(config),
            scope(),
            sources::sqs(Some("/order_id")).expect("sqs"),
        )
        .batch();
        let runs = AtomicUsize::new(0);
        let place = |_: SqsMessage, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(()) }
        };
        let message = || vec![from("AROAPRODUCERA:i-1", "m-1")];

        let today = across
            .invocation(&message()[0], &Context::default())
            .expect("invocation");
        let recorded_by_0_4 = Invocation::new(
            today.key().clone(),
            Fingerprint::from_stored(today.fingerprint().as_str()),
            Duration::from_secs(60),
        );
        v0_4.execute(&recorded_by_0_4, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(())
        })
        .await
        .expect("0.4's run");
        clock.advance(Duration::from_secs(120));
        let again = v0_5.process(message(), &Context::default(), place).await;

        assert!(
            !again.records[0].1.is_failure()
                && !matches!(again.records[0].1, RecordOutcome::Executed),
            "{name}: {:?}",
            again.records[0].1
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{name}: not run again");
    }
}

/// A blank key is no key, whoever sent it: the producer's part of the key material must not
/// make `{"producer": …, "key": null}` look like one (every such message would be one
/// operation, the later ones acknowledged as replays and lost).
#[tokio::test]
async fn a_message_whose_key_is_blank_is_refused_whatever_its_producer() {
    for backend in both().await {
        let name = backend.name;
        let idem = Idempotency::new(backend.store).with_clock(backend.clock);
        let batch =
            Operation::new(idem, scope(), sources::sqs(Some("/order_id")).expect("sqs")).batch();
        let runs = Arc::new(AtomicUsize::new(0));
        let place = |_message: SqsMessage, _| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            }
        };
        let context = Context::default();
        for (n, blank) in [json!(null), json!(""), json!("  ")]
            .into_iter()
            .enumerate()
        {
            let mut message = from("AROAPRODUCERA:i-0aaa", &format!("m-{n}"));
            message.body = Some(json!({"order_id": blank, "amount": 5}).to_string());
            let report = batch.process(vec![message], &context, place).await;
            assert!(
                matches!(
                    &report.records[0].1,
                    RecordOutcome::Failed(lambda_idempotency::Error::MissingKey { .. })
                        | RecordOutcome::Poison(lambda_idempotency::Error::MissingKey { .. })
                ),
                "{name}: order_id {blank} names no operation: {:?}",
                report.records[0].1
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: nothing ran");
    }
}

/// A blank `idempotency-key` attribute names nothing: the body's key is the message's.
#[tokio::test]
async fn a_blank_key_attribute_falls_back_to_the_bodys_key() {
    let scope = scope();
    let policy = sources::sqs(Some("/order_id")).expect("sqs");
    let mut blank = from("AROAPRODUCERA:i-0aaa", "m-1");
    blank.message_attributes.insert(
        "idempotency-key".into(),
        serde_json::from_value(json!({"stringValue": "  ", "dataType": "String"}))
            .expect("an attribute"),
    );
    let plain = from("AROAPRODUCERA:i-0aaa", "m-2");
    let (with_blank, _) = policy.derive(&scope, &blank).expect("keyed by the body");
    let (by_body, _) = policy.derive(&scope, &plain).expect("keyed by the body");
    assert_eq!(with_blank, by_body);
}
