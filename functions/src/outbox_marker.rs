//! The outbox marker, on the Pipe path: an EventBridge Pipe publishes each outbox event to the
//! stack's bus but cannot mark it (a Pipe has one target), so a rule on that bus sends every
//! outbox event it carried here, and this function marks it published (`published_by` =
//! `pipe`). An event the Pipe never carried stays pending and the sweeper republishes it.
//!
//! Why a function: a rule's targets cannot write to DynamoDB. It costs one invocation and one
//! write per event, what the relay spends on its mark too.

use lambda_idempotency::BoxError;
use lambda_idempotency::effects::{OutboxMarks, PublishedBy};
use serde_json::Value;

/// Marks the outbox event carried by the Pipe in `event` (an EventBridge event whose `detail`
/// is the outbox envelope) published at `now`: `true`, or `false` when it was marked already.
///
/// # Errors
/// When the event carries no `detail.event_id`, or the mark's write fails (EventBridge retries
/// the invocation).
pub async fn mark(
    marks: &OutboxMarks,
    event: &Value,
    now: std::time::SystemTime,
) -> Result<bool, BoxError> {
    let id = event["detail"]["event_id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .ok_or("the event carries no detail.event_id: is the rule's pattern the outbox's?")?;
    Ok(marks.published(id, PublishedBy::Pipe, now).await?)
}
