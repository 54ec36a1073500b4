//! The simulated outbox's consumer: each delivered envelope keyed as the crate's SQS door keys
//! the relay's messages, its effect counted per event id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsMessage, SqsMessageAttribute};
use serde_json::{Value, json};

use crate::clock::ManualClock;
use crate::config::Config;
use crate::effects::ID_ATTRIBUTE;
use crate::engine::Idempotency;
use crate::error::{BoxError, Error};
use crate::key::{KeyPolicy, OperationScope};
use crate::lambda::sources;
use crate::store::MemoryStore;

/// The consumer: each delivered envelope keyed as the crate's SQS door keys the relay's
/// messages (by the `idempotency-key` attribute, fingerprinting the envelope), its event id
/// its business identity (evidence past its record's retention), over its own store.
pub(super) struct Consumer {
    engine: Idempotency,
    policy: KeyPolicy<SqsMessage>,
    scope: OperationScope,
    /// Runs of the consumer's effect, by event id.
    effects: Arc<Mutex<HashMap<String, u32>>>,
}

impl Consumer {
    pub(super) fn new(clock: ManualClock) -> Result<Self, BoxError> {
        let identity = |message: &SqsMessage| {
            message
                .message_attributes
                .get(ID_ATTRIBUTE)
                .and_then(|attribute| attribute.string_value.clone())
        };
        Ok(Self {
            engine: Idempotency::new(MemoryStore::new())
                .with_clock(clock)
                .with_config(
                    Config::builder()
                        .retention(Duration::from_secs(24 * 3600))
                        .build()?,
                ),
            policy: sources::sqs_across_senders(None)?.with_identity(identity),
            scope: OperationScope::new("simulation", "consumer")?,
            effects: Arc::default(),
        })
    }

    /// Consumes one delivered envelope: its effect runs at most once per event id.
    pub(super) async fn consume(&self, envelope: &str) -> Result<(), String> {
        let event_id = serde_json::from_str::<Value>(envelope)
            .ok()
            .and_then(|envelope| envelope["event_id"].as_str().map(str::to_owned))
            .ok_or("a delivered envelope without its event id")?;
        let mut message = SqsMessage::default();
        message.body = Some(envelope.to_owned());
        let mut attribute = SqsMessageAttribute::default();
        attribute.data_type = Some("String".into());
        attribute.string_value = Some(event_id.clone());
        message
            .message_attributes
            .insert(ID_ATTRIBUTE.to_owned(), attribute);
        let invocation = self
            .policy
            .invocation(&self.scope, &message, Duration::from_secs(60))
            .map_err(|err| format!("the consumer cannot key the message: {err}"))?;
        let effects = Arc::clone(&self.effects);
        let answer = self
            .engine
            .execute(&invocation, |_ctx| async move {
                *effects
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(event_id)
                    .or_default() += 1;
                Ok::<_, BoxError>(json!({"consumed": true}))
            })
            .await;
        match answer {
            Ok(_) | Err(Error::KeyExpiredConflict { .. }) => Ok(()),
            Err(err) => Err(format!("the consumer answered {err}")),
        }
    }

    pub(super) fn effects(&self) -> HashMap<String, u32> {
        self.effects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
