//! The relay's in-process destination: the publisher's `Transport`, every request a
//! scheduling point and a fault the checker may choose, and the consumer behind it, which
//! deduplicates on the event id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::BoxFuture;
use lambda_idempotency::lambda::relay::{Answers, Channel, Message, PublishError, Transport};
use serde_json::Value;

use super::Defect;
use crate::schedules::in_process::{Applied, Fault, Lossy};

/// What the destination received and its consumer did, by event id.
#[derive(Debug, Default)]
pub(super) struct Received {
    /// Every delivery.
    pub(super) deliveries: HashMap<String, usize>,
    /// Every time the consumer acted.
    pub(super) acted: HashMap<String, usize>,
}

/// The in-process destination, as the publisher's [`Transport`]: every request a scheduling
/// point and a fault the checker may choose; behind it, the consumer.
#[derive(Clone)]
pub(super) struct Destination {
    /// What it received, shared with the check of each mark.
    pub(super) received: Arc<Mutex<Received>>,
    /// The checker's faults, shared with the marks' client.
    pub(super) faults: Arc<Lossy>,
    /// A defect put in for the harness's own check.
    pub(super) defect: Option<Defect>,
}

impl Destination {
    /// What it received so far.
    pub(super) fn received(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Delivers `envelope` to the consumer, which acts once per event id (unless the defect
    /// says otherwise).
    fn deliver(&self, envelope: &str) {
        let envelope: Value = serde_json::from_str(envelope).expect("an envelope");
        let id = envelope["event_id"]
            .as_str()
            .expect("the event id")
            .to_owned();
        let mut received = self.received();
        let seen = received.deliveries.contains_key(&id);
        *received.deliveries.entry(id.clone()).or_default() += 1;
        if !seen || self.defect == Some(Defect::ConsumerWithoutDeduplication) {
            *received.acted.entry(id).or_default() += 1;
        }
    }
}

impl Transport for Destination {
    fn send<'a>(&'a self, _: &'a Channel, messages: &'a [Message<'a>]) -> BoxFuture<'a, Answers> {
        Box::pin(async move {
            shuttle::future::yield_now().await;
            let fault = self.faults.draw();
            let acknowledges = self.defect == Some(Defect::AcknowledgesFailures);
            match fault {
                Fault::Before if !acknowledges => {
                    return Err(PublishError::failed("the checker's fault: not published"));
                }
                Fault::Before => {}
                Fault::None | Fault::AnswerLost => {
                    for message in messages {
                        self.deliver(message.envelope);
                    }
                }
            }
            shuttle::future::yield_now().await;
            match fault {
                Fault::AnswerLost => Err(PublishError::failed("the checker lost the answer")),
                Fault::None | Fault::Before => Ok(messages.iter().map(|_| Ok(())).collect()),
            }
        })
    }
}

/// The check of every mark as it applies: an event marked published was delivered first.
pub(super) fn marked(destination: &Destination) -> Applied {
    let destination = destination.clone();
    Arc::new(move |operation: &str, body: &Value| {
        let expression = body["UpdateExpression"].as_str().unwrap_or_default();
        if operation != "UpdateItem" || !expression.contains("published_at =") {
            return;
        }
        let id = body["Key"]["pk"]["S"].as_str().expect("the event id");
        assert!(
            destination.received().deliveries.contains_key(id),
            "the event {id} was marked published, and was never published"
        );
    })
}
