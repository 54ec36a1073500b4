//! The error of a batch door whose source reads no partial-batch response (SNS, S3): the
//! invocation fails, so that Lambda delivers the whole event again.

use lambda_runtime::Diagnostic;

/// Why a batch service failed its invocation. Sources with a partial-batch response (SQS,
/// Kinesis, DynamoDB Streams) never fail it: their failed records are in the response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Records of an event from a source that reads no partial-batch response (SNS, S3) must
    /// be delivered again: Lambda retries the whole event (an asynchronous invocation: twice,
    /// then its on-failure destination or dead-letter queue), and the records that succeeded
    /// replay their stored outcomes instead of running again.
    #[error(
        "{failed} of the event's {records} records must be delivered again: the invocation fails so that Lambda retries the event (records that succeeded replay)"
    )]
    RecordsFailed {
        /// The records to deliver again (failed, skipped or not started).
        failed: usize,
        /// The records of the event.
        records: usize,
    },
}

impl From<BatchError> for Diagnostic {
    fn from(error: BatchError) -> Self {
        let error_type = match error {
            BatchError::RecordsFailed { .. } => "Idempotency.RecordsFailed",
        };
        Diagnostic {
            error_type: error_type.to_owned(),
            error_message: error.to_string(),
        }
    }
}
