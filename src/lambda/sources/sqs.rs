//! SQS: the key policies, the batch record (a FIFO message group orders its messages) and the
//! partial-batch response.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use serde_json::Value;

use super::body_json;
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy};
use crate::lambda::batch::{BatchRecord, BatchReport};

/// The SQS message attribute that carries an explicit idempotency key.
pub const SQS_KEY_ATTRIBUTE: &str = "idempotency-key";

/// SQS: the `idempotency-key` message attribute, else the body field at `body_pointer`.
pub fn sqs(body_pointer: Option<&str>) -> Result<KeyPolicy<SqsMessage>, ConfigError> {
    let pointer = body_pointer.map(JsonPointer::new).transpose()?;
    Ok(KeyPolicy::from_fns(
        move |message: &SqsMessage| {
            let attribute = message
                .message_attributes
                .get(SQS_KEY_ATTRIBUTE)
                .and_then(|attribute| attribute.string_value.clone())
                .map(Value::String);
            attribute.or_else(|| {
                pointer
                    .as_ref()
                    .and_then(|p| p.find(&body_json(message.body.as_deref())).cloned())
            })
        },
        |message: &SqsMessage| Some(body_json(message.body.as_deref())),
    ))
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

    fn records(event: SqsEvent) -> Vec<Self> {
        event.records
    }

    fn response(report: &BatchReport) -> SqsBatchResponse {
        report.sqs_response()
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
