//! What a destination receives of an outbox event: its envelope, and the bytes the
//! destination counts, on the relay's path and on an EventBridge Pipe's.

use serde::Serialize;
use serde_json::value::RawValue;

use super::destinations::Destination;
use super::outbox::{ID_ATTRIBUTE, OutboxRecord};
use crate::error::Error;

/// The bytes kept, on an EventBridge Pipe's path, for the `Source` and `DetailType` its target
/// sets (template.yaml's take 36): an event is checked as if they took this many.
pub(crate) const PIPE_TARGET_RESERVE: usize = 512;

/// The Pipe's envelope without its three values (template.yaml's `InputTemplate`).
const PIPE_TEMPLATE: &str = r#"{"event_id": "", "event": "", "payload": ""}"#;

/// The bytes `text` takes inside a JSON string: a quote or a backslash escaped by a backslash,
/// a control character (the whitespace a payload may hold between its tokens) as an escape of
/// six bytes at most.
fn escaped_len(text: &str) -> usize {
    text.bytes()
        .map(|byte| match byte {
            b'"' | b'\\' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

impl OutboxRecord {
    /// The bytes its `PutEvents` entry counts when an EventBridge Pipe publishes it to its bus
    /// (template.yaml's `OutboxPipe`): the Pipe's envelope, whose values are JSON strings, so
    /// that the payload is escaped inside one (each quote and backslash counts twice), and
    /// [`PIPE_TARGET_RESERVE`] for the target's `Source` and `DetailType`.
    pub(crate) fn through_pipe_bytes(&self) -> usize {
        PIPE_TEMPLATE.len()
            + escaped_len(&self.id)
            + escaped_len(&self.name)
            + escaped_len(&self.payload)
            + PIPE_TARGET_RESERVE
    }

    /// The envelope, and the bytes the destination counts once the event is published: the
    /// envelope and EventBridge's `Source` and `DetailType`, or on SNS and SQS the event id's
    /// message attribute (its name, type and value).
    ///
    /// # Errors
    /// As [`OutboxRecord::envelope`].
    pub fn published(&self) -> Result<(String, usize), Error> {
        let envelope = self.envelope()?;
        let extra = match &self.destination {
            Destination::EventBridge {
                source,
                detail_type,
                ..
            } => source.len() + detail_type.len(),
            Destination::Sns { .. } | Destination::Sqs { .. } => {
                ID_ATTRIBUTE.len() + "String".len() + self.id.len()
            }
        };
        let bytes = envelope.len() + extra;
        Ok((envelope, bytes))
    }

    /// What consumers receive: `{"event_id": …, "event": …, "payload": …}`, the payload's
    /// bytes as written, and `"ordering_key"` and `"sequence"` when the event names an
    /// [`EventOrder`](super::EventOrder).
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] when the stored payload is not JSON (an item not written by
    /// this crate).
    pub fn envelope(&self) -> Result<String, Error> {
        #[derive(Serialize)]
        struct Envelope<'a> {
            event_id: &'a str,
            event: &'a str,
            payload: &'a RawValue,
            #[serde(skip_serializing_if = "Option::is_none")]
            ordering_key: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            sequence: Option<u64>,
        }
        let invalid = |err: serde_json::Error| Error::InvalidEvent {
            reason: format!("the outbox item's payload is not JSON: {err}"),
        };
        let payload = RawValue::from_string(self.payload.clone()).map_err(invalid)?;
        serde_json::to_string(&Envelope {
            event_id: &self.id,
            event: &self.name,
            payload: &payload,
            ordering_key: self.order.as_ref().map(|order| order.key.as_str()),
            sequence: self.order.as_ref().map(|order| order.sequence),
        })
        .map_err(invalid)
    }
}

#[cfg(test)]
mod pipe_bytes {
    use super::{PIPE_TARGET_RESERVE, PIPE_TEMPLATE, escaped_len};
    use crate::effects::{Destination, OutboxRecord};

    #[test]
    fn quotes_backslashes_and_control_characters_count_as_escaped() {
        assert_eq!(escaped_len("ab"), 2);
        assert_eq!(escaped_len(r#""a\b""#), 8);
        assert_eq!(escaped_len("{\n}"), 8);
        let record = OutboxRecord {
            id: "ns#0".into(),
            name: "placed".into(),
            destination: Destination::Sqs {
                queue_url: "https://sqs/1/q".into(),
            },
            payload: r#"{"a":"b"}"#.into(),
            order: None,
            created_at: None,
            parked: None,
            redriven: None,
        };
        assert_eq!(
            record.through_pipe_bytes(),
            PIPE_TEMPLATE.len() + 4 + 6 + 9 + 4 + PIPE_TARGET_RESERVE
        );
    }
}
