//! SQS: the key policies, the batch record (a FIFO message group orders its messages) and the
//! partial-batch response.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use std::sync::Arc;

use serde_json::{Value, json};

use super::body_json;
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy, is_empty_material};
use crate::lambda::batch::{BatchRecord, BatchReport};

/// The SQS message attribute that carries an explicit idempotency key.
pub const SQS_KEY_ATTRIBUTE: &str = crate::effects::ID_ATTRIBUTE;

/// SQS: the `idempotency-key` message attribute, else the body field at `body_pointer`,
/// **scoped to the producer** that sent the message: two producers that send the same key
/// are two operations, so that one cannot suppress (or read the result of) another's.
///
/// The producer is the role part of the message's `SenderId` attribute, which SQS sets from
/// the sender's credentials (a producer cannot choose it): the IAM role's unique id of an
/// assumed role (`AROA…`, without its `:session` part, so that a retry from another
/// instance or session of the same producer is the same producer), else the IAM user's
/// (`AIDA…`). A message without `SenderId` is keyed without a producer. A message sent again
/// by hand (from the console, a redrive script under another role) is another producer's:
/// keep the original's key and producer by redriving with SQS's own DLQ redrive, which
/// keeps the message's attributes, or key with [`sqs_across_senders`].
pub fn sqs(body_pointer: Option<&str>) -> Result<KeyPolicy<SqsMessage>, ConfigError> {
    let material = key_material(body_pointer)?;
    let by_0_4 = material.clone();
    Ok(KeyPolicy::from_fns(
        move |message: &SqsMessage| {
            let key = material(message)?;
            Some(match sender_role(message) {
                Some(producer) => json!({"producer": producer, "key": key}),
                None => key,
            })
        },
        |message: &SqsMessage| Some(body_json(message.body.as_deref())),
    )
    .with_key_as_0_4(move |message: &SqsMessage| by_0_4(message)))
}

/// [`sqs`] without the producer in the key: every producer's same key names one operation.
/// For queues whose producers share one key space on purpose (one business id, whoever
/// sends it), such as the outbox's events, which the relay and the sweeper publish under
/// roles of their own; any producer can then suppress another's message by sending its key
/// first, so let only those producers send to the queue.
pub fn sqs_across_senders(
    body_pointer: Option<&str>,
) -> Result<KeyPolicy<SqsMessage>, ConfigError> {
    let material = key_material(body_pointer)?;
    Ok(KeyPolicy::from_fns(
        move |message: &SqsMessage| material(message),
        |message: &SqsMessage| Some(body_json(message.body.as_deref())),
    ))
}

/// Reads a message's key material.
type Material = Arc<dyn Fn(&SqsMessage) -> Option<Value> + Send + Sync>;

/// The key material: the `idempotency-key` attribute, else the body field at `body_pointer`.
fn key_material(body_pointer: Option<&str>) -> Result<Material, ConfigError> {
    let pointer = body_pointer.map(JsonPointer::new).transpose()?;
    Ok(Arc::new(move |message: &SqsMessage| {
        // Each checked before the producer wraps it (`{"producer": …, "key": null}` is not
        // empty): a blank attribute falls back to the body, a blank body key is none.
        let attribute = message
            .message_attributes
            .get(SQS_KEY_ATTRIBUTE)
            .and_then(|attribute| attribute.string_value.clone())
            .map(Value::String)
            .filter(|key| !is_empty_material(key));
        attribute.or_else(|| {
            pointer
                .as_ref()
                .and_then(|p| p.find(&body_json(message.body.as_deref())).cloned())
                .filter(|key| !is_empty_material(key))
        })
    }))
}

/// The producer of `message`: the role part of its `SenderId` (`AROA…:session` → `AROA…`).
fn sender_role(message: &SqsMessage) -> Option<&str> {
    let sender = message.attributes.get("SenderId")?;
    let role = sender
        .split_once(':')
        .map_or(sender.as_str(), |(role, _)| role);
    (!role.trim().is_empty()).then_some(role)
}

/// SQS keyed by `messageId`: right only when producers never republish a message.
pub fn sqs_message_id() -> KeyPolicy<SqsMessage> {
    KeyPolicy::from_fns(
        |message: &SqsMessage| message.message_id.clone(),
        |message: &SqsMessage| Some(body_json(message.body.as_deref())),
    )
}

impl BatchRecord for SqsMessage {
    type Event = SqsEvent;
    type Response = SqsBatchResponse;
    type Error = std::convert::Infallible;

    fn records(event: SqsEvent) -> Vec<Self> {
        event.records
    }

    fn response(report: &BatchReport) -> SqsBatchResponse {
        report.sqs_response()
    }

    fn answer(report: &BatchReport) -> Result<SqsBatchResponse, std::convert::Infallible> {
        Ok(Self::response(report))
    }

    fn item_identifier(&self) -> Option<String> {
        self.message_id.clone()
    }

    fn ordering_group(&self) -> Option<String> {
        let fifo = self
            .event_source_arn
            .as_deref()
            .is_some_and(|arn| arn.ends_with(".fifo"));
        fifo.then(|| {
            self.attributes
                .get("MessageGroupId")
                .cloned()
                .unwrap_or_default()
        })
    }
}

impl BatchReport {
    /// The SQS partial-batch response.
    pub fn sqs_response(&self) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = self.failures(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        });
        response
    }
}
