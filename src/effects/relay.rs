//! The outbox relay (feature `relay`): a DynamoDB Streams consumer, on the crate's own batch
//! door, that publishes every committed outbox event at least once under its event id.
//!
//! The relay is itself idempotent: each stream record of an outbox item is one operation keyed
//! by the event id, so a redelivered batch replays instead of publishing again. Publishing is
//! safe to repeat (consumers deduplicate on the event id), so the relay's engine re-runs a
//! crashed attempt ([`Recovery::Rerun`]): an event published whose relay record was never
//! settled is published again under the same id. A record whose publish fails is reported in
//! the batch's partial response, so the stream retries it and never skips an event.
//!
//! | destination | request | the event id travels as |
//! |---|---|---|
//! | EventBridge | `PutEvents` (`Source`, `DetailType`, the bus) | `detail.event_id` |
//! | SNS | `Publish` (`MessageGroupId` and `MessageDeduplicationId` on a `.fifo` topic) | `event_id` in the body; the `idempotency-key` message attribute (an SQS subscriber sees it with raw message delivery) |
//! | SQS | `SendMessage` (the same on a `.fifo` queue) | the same |
//!
//! A consumer behind the crate's SQS door keys by the `idempotency-key` attribute by default
//! ([`sources::sqs`](crate::lambda::sources::sqs), which keys each producer apart:
//! [`sources::sqs_across_senders`](crate::lambda::sources::sqs_across_senders) when more than one
//! role publishes the events); an EventBridge consumer by
//! [`sources::eventbridge_detail`](crate::lambda::sources::eventbridge_detail)`("/event_id")`,
//! which fingerprints the envelope alone: the same event published again is a replay.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use lambda_idempotency::effects::relay::{Publisher, RELAY_OPERATION, relay};
//! use lambda_idempotency::{Idempotency, OperationScope};
//!
//! let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let scope = OperationScope::for_function(RELAY_OPERATION)?;
//! let relay = relay(Idempotency::from_env().await?, scope, Publisher::from_conf(&config));
//! lambda_runtime::run(relay).await?;
//! # Ok(()) }
//! ```

use std::fmt;

use aws_lambda_events::event::dynamodb::EventRecord as DynamoDbRecord;
use serde::{Deserialize, Serialize};
use tracing::error;

use super::outbox::{Destination, OutboxRecord};
use crate::error::BoxError;
use crate::key::KeyPolicy;
use crate::lambda::batch::BatchService;
use crate::lambda::sources::SQS_KEY_ATTRIBUTE;
use crate::reconcile::Recovery;
use crate::{ExecutionContext, Idempotency, Operation, OperationScope};

/// The relay's operation name, for its scope (`OperationScope::for_function(RELAY_OPERATION)`).
pub const RELAY_OPERATION: &str = "outbox-relay";

/// Publishes outbox events through the AWS SDK.
#[derive(Clone)]
pub struct Publisher {
    eventbridge: aws_sdk_eventbridge::Client,
    sns: aws_sdk_sns::Client,
    sqs: aws_sdk_sqs::Client,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher over these clients.
    pub fn new(
        eventbridge: aws_sdk_eventbridge::Client,
        sns: aws_sdk_sns::Client,
        sqs: aws_sdk_sqs::Client,
    ) -> Self {
        Self {
            eventbridge,
            sns,
            sqs,
        }
    }

    /// A publisher configured from the environment (the SDK's default chain: in Lambda, the
    /// function's region and role).
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_conf(&config)
    }

    /// A publisher whose three clients share `config` (region, credentials, endpoint).
    pub fn from_conf(config: &aws_config::SdkConfig) -> Self {
        Self::new(
            aws_sdk_eventbridge::Client::new(config),
            aws_sdk_sns::Client::new(config),
            aws_sdk_sqs::Client::new(config),
        )
    }

    /// Publishes `event` to its destination once (the caller retries).
    ///
    /// # Errors
    /// The SDK's error, or EventBridge's failed entry.
    pub async fn publish(&self, event: &OutboxRecord) -> Result<(), BoxError> {
        let envelope = event.envelope()?;
        match &event.destination {
            Destination::EventBridge {
                bus,
                source,
                detail_type,
            } => {
                let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                    .event_bus_name(bus)
                    .source(source)
                    .detail_type(detail_type)
                    .detail(envelope)
                    .build();
                let put = self.eventbridge.put_events().entries(entry).send().await?;
                if put.failed_entry_count() > 0 {
                    let code = put
                        .entries()
                        .iter()
                        .find_map(|entry| entry.error_code())
                        .unwrap_or("unknown");
                    return Err(format!("EventBridge refused the event: {code}").into());
                }
            }
            Destination::Sns { topic_arn } => {
                let attribute = aws_sdk_sns::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(&event.id)
                    .build()?;
                let mut publish = self
                    .sns
                    .publish()
                    .topic_arn(topic_arn)
                    .message(envelope)
                    .message_attributes(SQS_KEY_ATTRIBUTE, attribute);
                if topic_arn.ends_with(".fifo") {
                    publish = publish
                        .message_group_id(&event.name)
                        .message_deduplication_id(&event.id);
                }
                publish.send().await?;
            }
            Destination::Sqs { queue_url } => {
                let attribute = aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(&event.id)
                    .build()?;
                let mut send = self
                    .sqs
                    .send_message()
                    .queue_url(queue_url)
                    .message_body(envelope)
                    .message_attributes(SQS_KEY_ATTRIBUTE, attribute);
                if queue_url.ends_with(".fifo") {
                    send = send
                        .message_group_id(&event.name)
                        .message_deduplication_id(&event.id);
                }
                send.send().await?;
            }
        }
        Ok(())
    }
}

/// What the relay did with one stream record (an inserted item that is no outbox event is an
/// error, never skipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "relayed", rename_all = "snake_case")]
pub enum Relayed {
    /// The outbox event with this id was published.
    Published {
        /// The event id.
        event_id: String,
    },
    /// The record is no insertion (a TTL deletion, a modification): nothing to publish.
    Skipped,
}

/// The relay's key policy: a stream record that inserts an outbox item is keyed (and
/// fingerprinted) by its event id; any other record by the stream's own `eventID`.
pub fn outbox_stream() -> KeyPolicy<DynamoDbRecord> {
    fn key(record: &DynamoDbRecord) -> Option<serde_json::Value> {
        let inserted = inserted(record).map(|event| event.id);
        let id = inserted.or_else(|| Some(record.event_id.clone()).filter(|id| !id.is_empty()))?;
        Some(serde_json::Value::String(id))
    }
    KeyPolicy::from_fns(key, key)
}

/// The outbox event a stream record inserts, if it inserts one.
pub fn inserted(record: &DynamoDbRecord) -> Option<OutboxRecord> {
    if record.event_name != "INSERT" {
        return None;
    }
    let image = serde_json::to_value(&record.change.new_image).ok()?;
    OutboxRecord::from_image(&image)
}

/// Relays one stream record: publishes the outbox event it inserts.
///
/// # Errors
/// The publisher's error: the record is reported failed and the stream retries it.
pub async fn relay_record(
    publisher: &Publisher,
    record: &DynamoDbRecord,
) -> Result<Relayed, BoxError> {
    let Some(event) = inserted(record) else {
        if record.event_name == "INSERT" {
            // Never acknowledged unpublished: it is reported, retried, and (in the example
            // stack) sent to the dead-letter queue after its retries.
            error!(
                "a stream record inserts an item that is not an outbox event (or a stream without new images): not published"
            );
            return Err("an inserted outbox item could not be read: check the table's stream (NEW_IMAGE) and the item".into());
        }
        return Ok(Relayed::Skipped);
    };
    publisher.publish(&event).await?;
    Ok(Relayed::Published { event_id: event.id })
}

/// The relay function's service: `idem` (declared safe to re-run: publishing repeats under
/// the same event id) over the outbox table's stream, one operation of `scope` per event,
/// answering the stream's partial-batch response. Run it with `lambda_runtime::run`.
pub fn relay(
    idem: Idempotency,
    scope: OperationScope,
    publisher: Publisher,
) -> BatchService<
    DynamoDbRecord,
    impl Fn(
        DynamoDbRecord,
        ExecutionContext,
    ) -> futures_util::future::BoxFuture<'static, Result<Relayed, BoxError>>
    + Clone
    + Send
    + Sync
    + 'static,
> {
    let operation = Operation::new(idem.with_recovery(Recovery::Rerun), scope, outbox_stream());
    operation.batch().service(move |record: DynamoDbRecord, _| {
        let publisher = publisher.clone();
        let relayed: futures_util::future::BoxFuture<'static, _> =
            Box::pin(async move { relay_record(&publisher, &record).await });
        relayed
    })
}
