//! DynamoDB Streams: the key policy, the batch record (changes of one item, named by its keys'
//! canonical JSON, run in order) and the partial-batch response.

use aws_lambda_events::event::dynamodb::{Event as DynamoDbEvent, EventRecord as DynamoDbRecord};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};

use super::{object, to_json};
use crate::key::{KeyPolicy, canonical_json};
use crate::lambda::batch::{BatchRecord, BatchReport, PoisonPolicy};

/// DynamoDB Streams: `eventID`; fingerprint over the keys and the new image.
pub fn dynamodb_stream() -> KeyPolicy<DynamoDbRecord> {
    KeyPolicy::from_fns(
        |record: &DynamoDbRecord| Some(record.event_id.clone()).filter(|id| !id.is_empty()),
        |record: &DynamoDbRecord| {
            Some(object([
                ("keys", to_json(&record.change.keys)?),
                ("new_image", to_json(&record.change.new_image)?),
            ]))
        },
    )
}

impl BatchRecord for DynamoDbRecord {
    type Event = DynamoDbEvent;
    type Response = DynamoDbEventResponse;
    type Error = std::convert::Infallible;

    fn records(event: DynamoDbEvent) -> Vec<Self> {
        event.records
    }

    fn response(report: &BatchReport) -> DynamoDbEventResponse {
        report.dynamodb_response()
    }

    fn answer(report: &BatchReport) -> Result<DynamoDbEventResponse, std::convert::Infallible> {
        Ok(Self::response(report))
    }

    fn item_identifier(&self) -> Option<String> {
        self.change.sequence_number.clone()
    }

    /// The item's keys as canonical JSON ([`canonical_json`]): the same name for every change of one
    /// item, whatever order the keys map iterates in.
    fn ordering_group(&self) -> Option<String> {
        let keys = serde_json::to_value(&self.change.keys).ok()?;
        String::from_utf8(canonical_json(&keys).ok()?).ok()
    }

    fn default_poison_policy() -> PoisonPolicy {
        PoisonPolicy::Acknowledge
    }
}

impl BatchReport {
    /// The DynamoDB Streams partial-batch response.
    pub fn dynamodb_response(&self) -> DynamoDbEventResponse {
        let mut response = DynamoDbEventResponse::default();
        response.batch_item_failures = self.failures(|id| {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = Some(id);
            failure
        });
        response
    }
}
