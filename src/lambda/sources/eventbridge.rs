//! EventBridge: the key policies.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::to_json;
use crate::error::ConfigError;
use crate::key::{JsonPointer, KeyPolicy};

/// EventBridge: the event `id`; fingerprint over `detail`.
pub fn eventbridge<T: Serialize + DeserializeOwned + 'static>() -> KeyPolicy<EventBridgeEvent<T>> {
    KeyPolicy::from_fns(
        |event: &EventBridgeEvent<T>| event.id.clone(),
        |event: &EventBridgeEvent<T>| to_json(&event.detail),
    )
}

/// EventBridge: a field of `detail` (a business id that survives re-publishing); fingerprint
/// over `detail`.
pub fn eventbridge_detail<T: Serialize + DeserializeOwned + 'static>(
    detail_pointer: &str,
) -> Result<KeyPolicy<EventBridgeEvent<T>>, ConfigError> {
    let pointer = JsonPointer::new(detail_pointer)?;
    Ok(KeyPolicy::from_fns(
        move |event: &EventBridgeEvent<T>| pointer.find(&to_json(&event.detail)?).cloned(),
        |event: &EventBridgeEvent<T>| to_json(&event.detail),
    ))
}
