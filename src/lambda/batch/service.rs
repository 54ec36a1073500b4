//! A batch processor as a tower `Service` over its source's event, answering the source's
//! partial-batch response: `lambda_runtime::run(processor.service(handler))`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use lambda_runtime::LambdaEvent;
use lambda_runtime::tower::Service;
use serde::Serialize;

use super::{BatchProcessor, BatchRecord};
use crate::error::BoxError;
use crate::execution::ExecutionContext;
use crate::reconcile::BoxFuture;

/// A batch handler made idempotent per record ([`BatchProcessor::service`]). On a source with a
/// partial-batch response (SQS, Kinesis, DynamoDB Streams) it never fails: every record's
/// failure is in the response, so that Lambda delivers only those again. On SNS and S3, which
/// read none, a record to deliver again fails the invocation
/// ([`Error::RecordsFailed`](crate::Error::RecordsFailed)):
/// Lambda retries the whole event, and the records that succeeded replay.
pub struct BatchService<R, F> {
    processor: Arc<BatchProcessor<R>>,
    handler: F,
}

impl<R: BatchRecord> BatchProcessor<R> {
    /// The service that runs `handler` once per record's operation and answers the source's
    /// partial-batch response ([`BatchRecord::response`]).
    pub fn service<F>(self, handler: F) -> BatchService<R, F> {
        BatchService {
            processor: Arc::new(self),
            handler,
        }
    }
}

impl<R, F: Clone> Clone for BatchService<R, F> {
    fn clone(&self) -> Self {
        Self {
            processor: Arc::clone(&self.processor),
            handler: self.handler.clone(),
        }
    }
}

impl<R, F> fmt::Debug for BatchService<R, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchService")
            .field("processor", &self.processor)
            .finish_non_exhaustive()
    }
}

impl<R, F, Fut, T, E> Service<LambdaEvent<R::Event>> for BatchService<R, F>
where
    R: BatchRecord + 'static,
    R::Event: 'static,
    F: Fn(R, ExecutionContext) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send,
    T: Serialize + Send,
    E: Into<BoxError> + Send,
{
    type Response = R::Response;
    type Error = R::Error;
    type Future = BoxFuture<'static, Result<R::Response, R::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), R::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: LambdaEvent<R::Event>) -> Self::Future {
        let processor = Arc::clone(&self.processor);
        let handler = self.handler.clone();
        Box::pin(async move {
            let (batch, context) = event.into_parts();
            let report = processor
                .process(R::records(batch), &context, handler)
                .await;
            R::answer(&report)
        })
    }
}
