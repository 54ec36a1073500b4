//! Kinesis: the key policy, the batch record (a partition key orders its records) and the
//! partial-batch response.

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};

use super::to_json;
use crate::key::KeyPolicy;
use crate::lambda::batch::{BatchRecord, BatchReport, PoisonPolicy};

/// Kinesis: `eventID` (shard and sequence number); fingerprint over the data.
pub fn kinesis() -> KeyPolicy<KinesisEventRecord> {
    KeyPolicy::from_fns(
        |record: &KinesisEventRecord| {
            record
                .event_id
                .clone()
                .or_else(|| Some(record.kinesis.sequence_number.clone()))
        },
        |record: &KinesisEventRecord| to_json(&record.kinesis.data),
    )
}

impl BatchRecord for KinesisEventRecord {
    type Event = KinesisEvent;
    type Response = KinesisEventResponse;
    type Error = std::convert::Infallible;

    fn records(event: KinesisEvent) -> Vec<Self> {
        event.records
    }

    fn response(report: &BatchReport) -> KinesisEventResponse {
        report.kinesis_response()
    }

    fn answer(report: &BatchReport) -> Result<KinesisEventResponse, std::convert::Infallible> {
        Ok(Self::response(report))
    }

    fn item_identifier(&self) -> Option<String> {
        Some(self.kinesis.sequence_number.clone())
    }

    fn ordering_group(&self) -> Option<String> {
        Some(self.kinesis.partition_key.clone())
    }

    fn default_poison_policy() -> PoisonPolicy {
        PoisonPolicy::Acknowledge
    }
}

impl BatchReport {
    /// The Kinesis partial-batch response.
    pub fn kinesis_response(&self) -> KinesisEventResponse {
        let mut response = KinesisEventResponse::default();
        response.batch_item_failures = self.failures(|id| {
            let mut failure = KinesisBatchItemFailure::default();
            failure.item_identifier = Some(id);
            failure
        });
        response
    }
}
