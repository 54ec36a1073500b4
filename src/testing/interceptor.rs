//! A fault-injecting interceptor for the DynamoDB client: the store's real requests, sent by
//! the real SDK (with its own retries), meet the failures DynamoDB gives in production.
//!
//! A test queues faults for the next requests of one DynamoDB operation (matched on the
//! `x-amz-target` header), each for a number of requests:
//!
//! - [`SdkFault::DropResponse`]: the server applies the request, then the client gets an HTTP 500
//!   `InternalServerError` instead of the answer. The SDK retries the same request, whose
//!   condition now fails: the ambiguous write of the design's Protocol step 6.
//! - every other fault is *not* applied: the request's body is emptied before it leaves (the
//!   server rejects it without touching a table), and the answer is replaced by the injected
//!   error — a throttle, a transaction conflict or cancellation, a 5xx, any service error.
//!
//! Which of them the SDK retries by itself (with [`client_with`]'s retry configuration:
//! [`SDK_ATTEMPTS`] attempts) is the SDK's business: 500/502/503/504 and the throttling codes
//! (`ThrottlingException`, `ProvisionedThroughputExceededException`, `RequestLimitExceeded`,
//! ...) are retried; `TransactionCanceledException`, `TransactionConflictException`,
//! `AccessDeniedException` and `ValidationException` are not. Queue a fault
//! `SDK_ATTEMPTS` times to make it outlast the SDK's retries.
//!
//! ```
//! use lambda_idempotency::testing::interceptor::{SdkFault, FaultInterceptor, SdkOperation};
//!
//! let faults = FaultInterceptor::new();
//! // The next completion commits, and its caller sees a 500 instead of the answer.
//! faults.inject(SdkOperation::UpdateItem, SdkFault::DropResponse);
//! // The next three claims are throttled before they apply.
//! faults.inject_times(SdkOperation::PutItem, SdkFault::Throttle, 3);
//! assert_eq!(faults.pending(), 4);
//! assert_eq!(faults.fired(SdkOperation::PutItem, SdkFault::Throttle), 0);
//! // A queued fault that never fires fails the test when the interceptor's last clone is
//! // dropped; a test that no longer expects it clears it.
//! faults.clear();
//! ```
//!
//! With a client on a local endpoint (see [`client_with`]), the store's requests go through it.
//! A claim whose answer is lost is retried by the SDK, finds its own claim standing, and the
//! handler runs once:
//!
//! ```
//! # #[tokio::main] async fn main() {
//! use lambda_idempotency::store::DynamoDbStore;
//! use lambda_idempotency::testing::conformance::invocation;
//! use lambda_idempotency::testing::dynamo;
//! use lambda_idempotency::testing::interceptor::{SdkFault, FaultInterceptor, SdkOperation, client_with};
//! use lambda_idempotency::Idempotency;
//!
//! let dynamo = dynamo::start().await;
//! let faults = FaultInterceptor::new();
//! let store = DynamoDbStore::new(client_with(dynamo.endpoint.clone(), &faults), &dynamo.table)
//!     .with_uniqueness_table(&dynamo.uniqueness_table);
//! faults.inject(SdkOperation::PutItem, SdkFault::DropResponse);
//!
//! let idem = Idempotency::new(store);
//! let inv = invocation("order-1", &serde_json::json!({"amount": 10}));
//! let done = idem
//!     .execute(&inv, |ctx| async move { Ok::<_, std::io::Error>(ctx.attempt()) })
//!     .await
//!     .expect("the claim committed, its answer was lost: still ours");
//!
//! assert_eq!(faults.fired(SdkOperation::PutItem, SdkFault::DropResponse), 1);
//! assert_eq!(faults.requests(SdkOperation::PutItem), 2, "the claim, and the SDK's retry");
//! assert!(!done.is_replay());
//! assert_eq!(*done.value(), 1, "run once, as attempt 1");
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextMut,
    FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;

use super::local;

/// How many attempts the SDK makes per request on a [`client_with`] client (the first
/// included): queue a not-applied fault this many times to make it outlast the SDK's retries.
pub const SDK_ATTEMPTS: u32 = 3;

/// The error types' namespace in DynamoDB's `__type`.
const NAMESPACE: &str = "com.amazonaws.dynamodb.v20120810";

/// A DynamoDB operation, as faults name it (the `x-amz-target` header's suffix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum SdkOperation {
    /// `PutItem`: a claim without a business identity.
    PutItem,
    /// `UpdateItem`: a takeover, a shortened lease, a settlement without a business identity.
    UpdateItem,
    /// `DeleteItem`: a release without a business identity.
    DeleteItem,
    /// `TransactWriteItems`: every write of an operation with a business identity (claim,
    /// adoption, settlement, release).
    TransactWriteItems,
    /// `GetItem`: a strongly consistent read of a record or of evidence.
    GetItem,
    /// `DescribeTable`: the replication check at start-up.
    DescribeTable,
    /// `BatchGetItem`: the outbox marks the relay and the sweeper read before they publish.
    BatchGetItem,
}

impl SdkOperation {
    /// Every operation.
    pub const ALL: [Self; 7] = [
        Self::PutItem,
        Self::UpdateItem,
        Self::DeleteItem,
        Self::TransactWriteItems,
        Self::GetItem,
        Self::DescribeTable,
        Self::BatchGetItem,
    ];

    /// The operation's name, as the `x-amz-target` header ends.
    pub const fn name(self) -> &'static str {
        match self {
            Self::PutItem => "PutItem",
            Self::UpdateItem => "UpdateItem",
            Self::DeleteItem => "DeleteItem",
            Self::TransactWriteItems => "TransactWriteItems",
            Self::GetItem => "GetItem",
            Self::DescribeTable => "DescribeTable",
            Self::BatchGetItem => "BatchGetItem",
        }
    }

    /// The operation an `x-amz-target` header names (e.g. `DynamoDB_20120810.PutItem`), if
    /// it is one of these.
    pub fn from_target(target: &str) -> Option<Self> {
        let name = target.rsplit('.').next().unwrap_or(target);
        Self::ALL
            .into_iter()
            .find(|operation| operation.name() == name)
    }
}

/// [`SdkOperation`]'s name before 0.5.
#[deprecated(
    since = "0.5.0",
    note = "renamed `SdkOperation`: it names a DynamoDB API operation, not the crate's `Operation`"
)]
pub type Operation = SdkOperation;

/// A fault injected into one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SdkFault {
    /// Applied: the server commits the request, the client gets a 500 `InternalServerError`
    /// instead of its answer (the SDK retries; the retry's condition then fails).
    DropResponse,
    /// Not applied: a 400 `ThrottlingException` (the SDK retries it as throttling).
    Throttle,
    /// Not applied: a 400 `ProvisionedThroughputExceededException` (retried as throttling).
    ThroughputExceeded,
    /// Not applied: on `TransactWriteItems` a 400 `TransactionCanceledException` whose first
    /// item's cancellation reason is `TransactionConflict`; on a single-item operation a 400
    /// `TransactionConflictException`. The SDK does not retry either.
    TransactionConflict,
    /// Not applied: on `TransactWriteItems` a 400 `TransactionCanceledException` whose first
    /// item's cancellation reason has this code (e.g. `ThrottlingError`, `ValidationError`,
    /// `ProvisionedThroughputExceeded`), the others `None`. On a single-item operation, the
    /// code's single-item error (`ThrottlingError` → `ThrottlingException`, `ValidationError` →
    /// `ValidationException`, ...; an unknown code → `ValidationException`).
    Cancelled(&'static str),
    /// Not applied: a 500 `InternalServerError` (the SDK retries it).
    ServerError,
    /// Not applied: a 503 `ServiceUnavailable` (the SDK retries it).
    ServiceUnavailable,
    /// Not applied: the error `code` (e.g. `AccessDeniedException`) with HTTP `status`.
    Error {
        /// The HTTP status, e.g. 400.
        status: u16,
        /// The error type, without its namespace: e.g. `AccessDeniedException`.
        code: &'static str,
    },
}

/// [`SdkFault`]'s name before 0.5.
#[deprecated(
    since = "0.5.0",
    note = "renamed `SdkFault`: a fault in an SDK request, not a store's `testing::faults::Fault`"
)]
pub type Fault = SdkFault;

impl SdkFault {
    /// Whether the server applies the request before the fault hits its answer.
    pub const fn is_applied(self) -> bool {
        matches!(self, Self::DropResponse)
    }

    /// The injected answer: HTTP status and JSON body. `items` is the number of a
    /// transaction's items (one cancellation reason each).
    fn answer(self, operation: SdkOperation, items: usize) -> (u16, String) {
        let transaction = operation == SdkOperation::TransactWriteItems;
        match self {
            Self::DropResponse => error(
                500,
                "InternalServerError",
                "injected: the request was applied and its answer dropped",
            ),
            Self::Throttle => error(400, "ThrottlingException", "injected: throttled"),
            Self::ThroughputExceeded => error(
                400,
                "ProvisionedThroughputExceededException",
                "injected: provisioned throughput exceeded",
            ),
            Self::TransactionConflict if transaction => cancelled("TransactionConflict", items),
            Self::TransactionConflict => error(
                400,
                "TransactionConflictException",
                "injected: transaction is ongoing for the item",
            ),
            Self::Cancelled(code) if transaction => cancelled(code, items),
            Self::Cancelled(code) => error(400, single_item_error(code), "injected"),
            Self::ServerError => error(500, "InternalServerError", "injected: internal error"),
            Self::ServiceUnavailable => error(
                503,
                "ServiceUnavailableException",
                "injected: service unavailable",
            ),
            Self::Error { status, code } => error(status, code, "injected"),
        }
    }
}

/// The single-item error of a transaction's cancellation code.
fn single_item_error(code: &str) -> &'static str {
    match code {
        "ThrottlingError" => "ThrottlingException",
        "ProvisionedThroughputExceeded" => "ProvisionedThroughputExceededException",
        "RequestLimitExceeded" => "RequestLimitExceeded",
        "TransactionConflict" => "TransactionConflictException",
        "ItemCollectionSizeLimitExceeded" => "ItemCollectionSizeLimitExceededException",
        _ => "ValidationException",
    }
}

/// A DynamoDB error answer.
fn error(status: u16, code: &str, message: &str) -> (u16, String) {
    let body = serde_json::json!({"__type": format!("{NAMESPACE}#{code}"), "message": message});
    (status, body.to_string())
}

/// A `TransactionCanceledException` whose first item carries `code`, the others `None`.
fn cancelled(code: &str, items: usize) -> (u16, String) {
    let reasons: Vec<serde_json::Value> = (0..items.max(1))
        .map(|index| match index {
            0 => serde_json::json!({"Code": code, "Message": "injected"}),
            _ => serde_json::json!({"Code": "None"}),
        })
        .collect();
    let listed = reasons
        .iter()
        .map(|reason| reason["Code"].as_str().unwrap_or("None"))
        .collect::<Vec<_>>()
        .join(", ");
    let body = serde_json::json!({
        "__type": format!("{NAMESPACE}#TransactionCanceledException"),
        "message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{listed}]"),
        "CancellationReasons": reasons,
    });
    (400, body.to_string())
}

/// One queued entry: `fault` (or a pass when `None`) for the next `times` requests.
#[derive(Debug, Clone, Copy)]
struct Planned {
    fault: Option<SdkFault>,
    times: usize,
}

/// A fault on its way: chosen before transmission, answered before deserialization.
#[derive(Debug, Clone, Copy)]
struct Armed {
    operation: SdkOperation,
    fault: SdkFault,
    items: usize,
}

#[derive(Debug, Default)]
struct State {
    queued: HashMap<SdkOperation, VecDeque<Planned>>,
    fired: HashMap<(SdkOperation, SdkFault), usize>,
    requests: HashMap<SdkOperation, usize>,
    /// Faults between their two hooks, by the address of the request's configuration bag:
    /// the SDK keeps one bag per operation invocation, at one place while it runs.
    armed: HashMap<usize, Armed>,
}

/// A queued fault that never fired is a case that did not check what it meant to: the last
/// clone of the interceptor fails the case (unless it is failing already). A case that no
/// longer expects a fault it queued says so with [`FaultInterceptor::clear`].
impl Drop for State {
    fn drop(&mut self) {
        let unfired: Vec<_> = self
            .queued
            .iter()
            .filter(|(_, queue)| queue.iter().any(|planned| planned.fault.is_some()))
            .map(|(operation, queue)| (operation, queue.len()))
            .collect();
        if !unfired.is_empty() {
            super::faults::unfired_faults(&format!("{unfired:?}"));
        }
    }
}

impl State {
    /// The next planned entry for `operation`, consumed.
    fn next(&mut self, operation: SdkOperation) -> Option<SdkFault> {
        let queue = self.queued.get_mut(&operation)?;
        let front = queue.front_mut()?;
        let fault = front.fault;
        front.times = front.times.saturating_sub(1);
        if front.times == 0 {
            queue.pop_front();
        }
        fault
    }
}

/// Injects queued faults into a DynamoDB client's requests (an SDK interceptor: install it
/// with `.interceptor(faults.clone())`, or build the client with [`client_with`]). Clones share
/// the queue and the counters.
#[derive(Debug, Clone, Default)]
pub struct FaultInterceptor {
    state: Arc<Mutex<State>>,
}

impl FaultInterceptor {
    /// An interceptor with nothing queued: every request passes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `fault` for the next request of `operation` (after what is queued already).
    ///
    /// ```
    /// use lambda_idempotency::testing::interceptor::{SdkFault, FaultInterceptor, SdkOperation};
    ///
    /// let faults = FaultInterceptor::new();
    /// faults.inject(SdkOperation::TransactWriteItems, SdkFault::TransactionConflict);
    /// assert_eq!(faults.pending_for(SdkOperation::TransactWriteItems), 1);
    /// // A queued fault that never fires fails the test when the interceptor is dropped:
    /// // a test that no longer expects it clears it.
    /// faults.clear();
    /// ```
    pub fn inject(&self, operation: SdkOperation, fault: SdkFault) {
        self.inject_times(operation, fault, 1);
    }

    /// Queues `fault` for the next `times` requests of `operation` (after what is queued).
    ///
    /// ```
    /// use lambda_idempotency::testing::interceptor::{SdkFault, FaultInterceptor, SdkOperation, SDK_ATTEMPTS};
    ///
    /// let faults = FaultInterceptor::new();
    /// // Outlasts the SDK's own retries of one request: the store sees the throttle.
    /// faults.inject_times(SdkOperation::UpdateItem, SdkFault::Throttle, SDK_ATTEMPTS as usize);
    /// assert_eq!(faults.pending(), 3);
    /// # faults.clear();
    /// ```
    pub fn inject_times(&self, operation: SdkOperation, fault: SdkFault, times: usize) {
        self.plan(operation, Some(fault), times);
    }

    /// Lets the next `times` requests of `operation` pass untouched before the faults queued
    /// after this (e.g. a fault for the second transaction, not the first).
    ///
    /// ```
    /// use lambda_idempotency::testing::interceptor::{SdkFault, FaultInterceptor, SdkOperation};
    ///
    /// let faults = FaultInterceptor::new();
    /// faults.pass(SdkOperation::TransactWriteItems, 1);
    /// faults.inject(SdkOperation::TransactWriteItems, SdkFault::DropResponse);
    /// assert_eq!(faults.pending(), 1); // passes are not faults
    /// # faults.clear();
    /// ```
    pub fn pass(&self, operation: SdkOperation, times: usize) {
        self.plan(operation, None, times);
    }

    fn plan(&self, operation: SdkOperation, fault: Option<SdkFault>, times: usize) {
        if times == 0 {
            return;
        }
        self.lock()
            .queued
            .entry(operation)
            .or_default()
            .push_back(Planned { fault, times });
    }

    /// Drops every queued fault and pass (the counters stay).
    pub fn clear(&self) {
        self.lock().queued.clear();
    }

    /// How many faults are still queued, for every operation.
    pub fn pending(&self) -> usize {
        SdkOperation::ALL
            .into_iter()
            .map(|operation| self.pending_for(operation))
            .sum()
    }

    /// How many faults are still queued for `operation`.
    pub fn pending_for(&self, operation: SdkOperation) -> usize {
        self.lock().queued.get(&operation).map_or(0, |queue| {
            queue
                .iter()
                .filter(|planned| planned.fault.is_some())
                .map(|planned| planned.times)
                .sum()
        })
    }

    /// How many times `fault` hit a request of `operation`.
    pub fn fired(&self, operation: SdkOperation, fault: SdkFault) -> usize {
        self.lock()
            .fired
            .get(&(operation, fault))
            .copied()
            .unwrap_or(0)
    }

    /// How many faults hit requests of `operation`, whatever they were.
    pub fn fired_for(&self, operation: SdkOperation) -> usize {
        self.lock()
            .fired
            .iter()
            .filter(|((fired, _), _)| *fired == operation)
            .map(|(_, count)| count)
            .sum()
    }

    /// How many faults hit requests, in all.
    pub fn fired_total(&self) -> usize {
        self.lock().fired.values().sum()
    }

    /// How many requests of `operation` the client sent (each SDK attempt counts, faulted or
    /// not).
    pub fn requests(&self, operation: SdkOperation) -> usize {
        self.lock().requests.get(&operation).copied().unwrap_or(0)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The key of one invocation's armed fault: where its configuration bag lives.
fn slot(cfg: &ConfigBag) -> usize {
    std::ptr::from_ref(cfg).addr()
}

/// How many items a `TransactWriteItems` request body carries (1 if it cannot tell).
fn transaction_items(body: Option<&[u8]>) -> usize {
    body.and_then(|bytes| serde_json::from_slice::<serde_json::Value>(bytes).ok())
        .and_then(|json| {
            json.get("TransactItems")
                .map(|items| items.as_array().map_or(1, Vec::len))
        })
        .unwrap_or(1)
}

impl Intercept for FaultInterceptor {
    fn name(&self) -> &'static str {
        "FaultInterceptor"
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let slot = slot(cfg);
        let operation = context
            .request()
            .headers()
            .get("x-amz-target")
            .and_then(SdkOperation::from_target);
        let mut state = self.lock();
        let Some(operation) = operation else {
            state.armed.remove(&slot);
            return Ok(());
        };
        *state.requests.entry(operation).or_default() += 1;
        let Some(fault) = state.next(operation) else {
            state.armed.remove(&slot);
            return Ok(());
        };
        *state.fired.entry((operation, fault)).or_default() += 1;
        let request = context.request_mut();
        let items = match operation {
            SdkOperation::TransactWriteItems => transaction_items(request.body().bytes()),
            _ => 1,
        };
        if !fault.is_applied() {
            // The server rejects an empty request without touching any table.
            *request.body_mut() = "{}".into();
            request.headers_mut().insert("content-length", "2");
        }
        state.armed.insert(
            slot,
            Armed {
                operation,
                fault,
                items,
            },
        );
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(armed) = self.lock().armed.remove(&slot(cfg)) else {
            return Ok(());
        };
        let (status, body) = armed.fault.answer(armed.operation, armed.items);
        let status = http::StatusCode::from_u16(status)?;
        let response = context.response_mut();
        *response.status_mut() = status.into();
        let headers = response.headers_mut();
        headers.remove("x-amz-crc32");
        // The SDK reads an error's type from this header before the body's `__type`: the
        // server's own (moto sends it; `ConditionalCheckFailedException` for a retry that met
        // the committed write) would turn the injected answer back into the server's error.
        headers.remove("x-amzn-errortype");
        headers.insert("content-type", "application/x-amz-json-1.0");
        headers.insert("content-length", body.len().to_string());
        *response.body_mut() = body.into();
        Ok(())
    }

    fn read_after_attempt(
        &self,
        _: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // An attempt that never got an answer (a dispatch failure) leaves nothing armed.
        self.lock().armed.remove(&slot(cfg));
        Ok(())
    }
}

/// A client on `endpoint` (see [`local::config_for`]) with `faults` installed and fast retries:
/// the SDK's standard mode, [`SDK_ATTEMPTS`] attempts, a 1 ms initial backoff, and a retry
/// partition of its own (so that other clients' throttles do not drain its retry quota).
///
/// ```no_run
/// # #[tokio::main] async fn main() {
/// use lambda_idempotency::testing::dynamo;
/// use lambda_idempotency::testing::interceptor::{FaultInterceptor, client_with};
///
/// let dynamo = dynamo::start().await;
/// let faults = FaultInterceptor::new();
/// let client = client_with(dynamo.endpoint.clone(), &faults);
/// client.describe_table().table_name(&dynamo.table).send().await.expect("table");
/// # }
/// ```
pub fn client_with(endpoint: String, faults: &FaultInterceptor) -> Client {
    static PARTITION: AtomicU64 = AtomicU64::new(0);
    let partition = format!(
        "lambda-idempotency-faults-{}",
        PARTITION.fetch_add(1, Ordering::Relaxed)
    );
    Client::from_conf(
        local::config_for(endpoint)
            .interceptor(faults.clone())
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(SDK_ATTEMPTS)
                    .with_initial_backoff(Duration::from_millis(1)),
            )
            .retry_partition(RetryPartition::new(partition))
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::{FaultInterceptor, SdkFault, SdkOperation};

    #[test]
    #[should_panic(expected = "injected faults that never fired")]
    fn a_fault_that_never_fires_fails_the_case() {
        let faults = FaultInterceptor::new();
        faults.inject(SdkOperation::UpdateItem, SdkFault::Throttle);
    }

    #[test]
    fn passes_are_not_faults() {
        let faults = FaultInterceptor::new();
        faults.pass(SdkOperation::UpdateItem, 2);
    }
}
