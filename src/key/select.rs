//! Selecting part of an event: key material, intent projection.

use serde::Serialize;
use serde_json::Value;

use super::invalid_event;
use crate::error::{ConfigError, Error};

/// Picks part of an event as JSON: the key material or the intent projection.
///
/// One method, like tower-http's `MakeRequestId`. Closures `Fn(&E) -> Option<T>` with
/// `T: Serialize` implement it; so do [`JsonPointer`] and [`WholeEvent`]. `Ok(None)` means the
/// part is absent.
pub trait Select<E>: Send + Sync {
    /// The selected part of `event`, or `None` when it is absent.
    fn select(&self, event: &E) -> Result<Option<Value>, Error>;
}

impl<E, F, T> Select<E> for F
where
    F: Fn(&E) -> Option<T> + Send + Sync,
    T: Serialize,
{
    fn select(&self, event: &E) -> Result<Option<Value>, Error> {
        self(event)
            .map(|part| serde_json::to_value(part).map_err(invalid_event))
            .transpose()
    }
}

/// Selects one value by RFC 6901 JSON Pointer (`/order/id`), after serializing the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer(String);

impl JsonPointer {
    /// A pointer; it must be empty (the whole document) or start with `/`.
    pub fn new(pointer: impl Into<String>) -> Result<Self, ConfigError> {
        let pointer = pointer.into();
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return Err(ConfigError::InvalidPointer { pointer });
        }
        Ok(Self(pointer))
    }
}

impl JsonPointer {
    /// The value at this pointer in `document`.
    pub fn find<'a>(&self, document: &'a Value) -> Option<&'a Value> {
        document.pointer(&self.0)
    }
}

impl<E: Serialize> Select<E> for JsonPointer {
    fn select(&self, event: &E) -> Result<Option<Value>, Error> {
        let mut document = serde_json::to_value(event).map_err(invalid_event)?;
        Ok(document.pointer_mut(&self.0).map(Value::take))
    }
}

/// Selects the whole event minus the transport fields that change when the same message is
/// delivered again: the default intent projection.
///
/// Dropped, so that a redelivery is not mistaken for another intent: an SQS message's
/// (`eventSource` `aws:sqs`) `receiptHandle` and its `ApproximateReceiveCount` and
/// `ApproximateFirstReceiveTimestamp` attributes, and an EventBridge event's (it has
/// `detail-type` and `source`) archive `replay-name`; in each of `Records`, too. Other events
/// are kept whole.
/// For other envelopes, prefer the source's own policy ([`crate::lambda::sources`]), which
/// fingerprints the business part only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WholeEvent;

impl<E: Serialize> Select<E> for WholeEvent {
    fn select(&self, event: &E) -> Result<Option<Value>, Error> {
        let mut document = serde_json::to_value(event).map_err(invalid_event)?;
        strip_transport(&mut document);
        Ok(Some(document))
    }
}

/// Removes the redelivery-specific transport fields [`WholeEvent`] documents.
pub(super) fn strip_transport(document: &mut Value) {
    if let Some(records) = document.get_mut("Records").and_then(Value::as_array_mut) {
        records.iter_mut().for_each(strip_transport);
    }
    let Some(object) = document.as_object_mut() else {
        return;
    };
    let eventbridge = object.contains_key("detail-type") && object.contains_key("source");
    if eventbridge {
        object.remove("replay-name");
    }
    let sqs = object.get("eventSource").and_then(Value::as_str) == Some("aws:sqs");
    if sqs {
        object.remove("receiptHandle");
        if let Some(attributes) = object.get_mut("attributes").and_then(Value::as_object_mut) {
            attributes.remove("ApproximateReceiveCount");
            attributes.remove("ApproximateFirstReceiveTimestamp");
        }
    }
}
