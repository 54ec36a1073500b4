//! The two stores every production-input test runs on: the in-memory store and the DynamoDB
//! store on the embedded server, each with the clock its backend reads.

use lambda_idempotency::Idempotency;
use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::store::AnyStore;
use lambda_idempotency::testing::conformance::{Fixture, memory_fixture, start_time};
use lambda_idempotency::testing::dynamo;

/// One store under test.
pub struct Backend {
    /// `memory` or `dynamodb`, for assertion messages.
    pub name: &'static str,
    /// The store, empty.
    pub store: AnyStore,
    /// The clock its backend reads (give it to the engine).
    pub clock: ManualClock,
}

impl Backend {
    /// Its name, its store, its clock and an engine on both.
    pub fn parts(self) -> (&'static str, AnyStore, ManualClock, Idempotency) {
        let idem = Idempotency::new(self.store.clone()).with_clock(self.clock.clone());
        (self.name, self.store, self.clock, idem)
    }
}

fn backend<S: lambda_idempotency::store::Store>(name: &'static str, fx: Fixture<S>) -> Backend {
    Backend {
        name,
        store: AnyStore::new(fx.store),
        clock: fx.clock,
    }
}

/// A fresh in-memory store and a fresh DynamoDB store (tables of their own).
pub async fn both() -> [Backend; 2] {
    [
        backend("memory", memory_fixture(start_time())),
        backend("dynamodb", dynamo::fixture(start_time()).await),
    ]
}

/// A Lambda context whose deadline is `deadline`.
pub fn context_with_deadline(deadline: std::time::SystemTime) -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    context.deadline = u64::try_from(
        deadline
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after epoch")
            .as_millis(),
    )
    .expect("fits");
    context
}

/// An SQS message from queue `orders` with `body`.
pub fn sqs_message(id: &str, body: serde_json::Value) -> aws_lambda_events::event::sqs::SqsMessage {
    serde_json::from_value(serde_json::json!({
        "messageId": id, "receiptHandle": format!("rh-{id}"), "body": body.to_string(),
        "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
        "eventSourceARN": "arn:aws:sqs:us-east-1:1:orders"
    }))
    .expect("message")
}
