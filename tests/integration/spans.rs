//! Correlated logs: one `tracing` span per execution with the operation, the key's short hash,
//! the attempt, the request id and the message id, and never the payload or the full key.

use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::Operation;
use lambda_idempotency::lambda::sources;
use lambda_idempotency::{BatchProcessor, Idempotency, MemoryStore, OperationScope};
use lambda_runtime::Context;
use serde_json::json;
use tracing::Dispatch;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::{Layer, Registry};

/// Installs `subscriber` as this thread's default so that callsites first reached on *other*
/// test threads still ask it.
///
/// tracing-core evaluates a newly registered callsite against the registering thread's default
/// whenever exactly one dispatcher is alive, and caches the answer for every thread. The other
/// tests of this binary run the engine on threads without a subscriber, so a span they reach
/// first while this test's subscriber is the only dispatcher is cached as `never`, and this
/// test sees no span. With a second dispatcher alive, registration asks every live dispatcher,
/// this one included.
fn set_default_for_every_callsite(
    subscriber: impl tracing::Subscriber + Send + Sync + 'static,
) -> (Dispatch, tracing::subscriber::DefaultGuard) {
    let second = Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    (second, guard)
}

/// Every field recorded on `idempotency.execute` spans, as text.
#[derive(Clone, Default)]
struct Fields(Arc<Mutex<Vec<(String, String)>>>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut fields = self.0.lock().expect("lock");
        fields.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let mut fields = self.0.lock().expect("lock");
        fields.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Fields {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: LayerContext<'_, S>) {
        if attrs.metadata().name() == "idempotency.execute" {
            attrs.record(&mut self.clone());
        }
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: LayerContext<'_, S>) {
        values.record(&mut self.clone());
    }
}

/// Ships one order through a batch processor of its own, as a function's handler would.
async fn ship(message_id: &str, request_id: &str) {
    let processor: BatchProcessor<SqsMessage> = Operation::new(
        Idempotency::new(MemoryStore::new()),
        OperationScope::new("spans-test", "ship").expect("scope"),
        sources::sqs(Some("/order_id")).expect("policy"),
    )
    .batch();
    let message: SqsMessage = serde_json::from_value(json!({
        "messageId": message_id, "body": json!({"order_id": "o-1", "card": "4111-secret"}).to_string(),
        "attributes": {}, "messageAttributes": {}
    }))
    .expect("message");
    let mut context = Context::default();
    context.request_id = request_id.into();
    processor
        .process(vec![message], &context, |_, _| async {
            Ok::<_, std::io::Error>(String::from("shipped"))
        })
        .await;
}

#[tokio::test]
async fn an_execution_span_correlates_without_the_payload() {
    let fields = Fields::default();
    let subscriber = Registry::default().with(fields.clone());
    let _default = set_default_for_every_callsite(subscriber);
    // Another thread with no subscriber reaches the span's callsite first, as the other tests
    // of this binary may: the span must still reach this thread's subscriber.
    std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(ship("msg-other", "req-other"));
    })
    .join()
    .expect("the other thread ships");

    ship("msg-77", "req-9").await;

    let fields = fields.0.lock().expect("lock").clone();
    let value = |name: &str| {
        fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.clone())
    };
    assert_eq!(value("operation").as_deref(), Some("ship"));
    assert_eq!(value("request_id").as_deref(), Some("req-9"));
    assert_eq!(value("message_id").as_deref(), Some("msg-77"));
    assert_eq!(value("attempt").as_deref(), Some("1"));
    assert_eq!(
        value("key").map(|key| key.len()),
        Some(12),
        "the short hash only"
    );
    let everything = format!("{fields:?}");
    assert!(!everything.contains("4111"), "no payload: {everything}");
    assert!(!everything.contains("o-1"), "no key material: {everything}");
}

/// The messages of WARN events.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: LayerContext<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let fields = Fields::default();
            event.record(&mut fields.clone());
            let text = format!("{:?}", fields.0.lock().expect("lock"));
            self.0.lock().expect("lock").push(text);
        }
    }
}

/// A batch whose deadline has already passed (an emulator's) runs, and says so at WARN.
#[tokio::test]
async fn a_deadline_already_past_is_ignored_with_a_warning() {
    let warnings = Warnings::default();
    let subscriber = Registry::default().with(warnings.clone());
    let _default = set_default_for_every_callsite(subscriber);
    let processor: BatchProcessor<SqsMessage> = Operation::new(
        Idempotency::new(MemoryStore::new()),
        OperationScope::new("spans-test", "late").expect("scope"),
        sources::sqs(Some("/order_id")).expect("policy"),
    )
    .batch();
    let message: SqsMessage = serde_json::from_value(json!({
        "messageId": "m-late", "body": json!({"order_id": "o-late"}).to_string(),
        "attributes": {}, "messageAttributes": {}
    }))
    .expect("message");
    let mut context = Context::default();
    context.deadline = 1_000; // 1970: long past, as `cargo lambda watch` sends it.
    let report = processor
        .process(vec![message], &context, |_, _| async {
            Ok::<_, std::io::Error>(String::from("ran"))
        })
        .await;
    assert!(report.failed_identifiers().is_empty());
    let warnings = warnings.0.lock().expect("lock").clone();
    assert!(
        warnings
            .iter()
            .any(|warning| warning.contains("deadline had passed before the batch started")),
        "{warnings:?}"
    );
}
