//! A transactional step's commit whose answers were all lost, re-sent by the engine, and each
//! of the two mechanisms that recognise it, shown apart: DynamoDB answers the re-send from its
//! `ClientRequestToken` (never refusing it), and where it cannot (an endpoint without token
//! replay, or a re-send past DynamoDB's ten minutes; here every request gets a fresh token)
//! the refused re-send's returned record shows that the commit applied. Each test counts the
//! refusals DynamoDB answered, so that it fails when its mechanism is removed.

use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;

use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextMut, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::transact_write_items::{
    TransactWriteItemsError, TransactWriteItemsInput,
};
use lambda_idempotency::store::{DynamoDbStore, StoreExt};
use lambda_idempotency::testing::conformance::Capability;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::interceptor::{
    FaultInterceptor, SDK_ATTEMPTS, SdkFault, SdkOperation,
};
use lambda_idempotency::testing::local;
use lambda_idempotency::{ExecutionContext, Origin};

use super::transactions::Shop;

/// Gives every `TransactWriteItems` operation a token of its own, as if the endpoint kept none.
#[derive(Debug, Default)]
struct FreshTokens(AtomicUsize);

impl Intercept for FreshTokens {
    fn name(&self) -> &'static str {
        "FreshTokens"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(input) = context
            .input_mut()
            .downcast_mut::<TransactWriteItemsInput>()
        {
            let sent = self.0.fetch_add(1, Ordering::SeqCst);
            input.client_request_token = Some(format!("fresh-token-{sent}"));
        }
        Ok(())
    }
}

/// Counts the `TransactWriteItems` answers that were a `TransactionCanceledException` (a
/// condition refused the transaction).
#[derive(Debug, Default, Clone)]
struct Refusals(Arc<AtomicUsize>);

impl Refusals {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Intercept for Refusals {
    fn name(&self) -> &'static str {
        "Refusals"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let refused = matches!(context.output_or_error(), Some(Err(err))
            if err.as_operation_error()
                .and_then(|err| err.downcast_ref::<TransactWriteItemsError>())
                .is_some_and(TransactWriteItemsError::is_transaction_canceled_exception));
        if refused {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// The handler: one transactional step placing `order` against the stock's version as read.
async fn place(shop: &Shop, ctx: ExecutionContext, order: &str) -> Result<String, BoxError> {
    Ok(ctx
        .step("place")
        .transact(|_key| async {
            let seen = shop.stock_item("version").await;
            Ok::<_, BoxError>(shop.place(order, seen))
        })
        .await?)
}

/// The commit's every SDK attempt applies once and loses its answer; the engine's re-send,
/// under the same token, is answered from it: committed, never refused.
#[tokio::test]
async fn a_lost_commit_is_answered_from_its_request_token() {
    let shop = Shop::open().await;
    let faults = FaultInterceptor::new();
    let refusals = Refusals::default();
    let config = local::config_for(shop.db.endpoint.clone())
        .interceptor(faults.clone())
        .interceptor(refusals.clone());
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let idem = shop.engine(DynamoDbStore::new(client, &shop.db.table));
    let inv = invocation("tx-token", &serde_json::json!({"order": "o-41"}));
    faults.inject_times(
        SdkOperation::TransactWriteItems,
        SdkFault::DropResponse,
        SDK_ATTEMPTS as usize,
    );

    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "o-41"))
        .await
        .expect("the commit is recognised");

    assert_eq!(done.value(), "placed o-41");
    assert!(
        faults.requests(SdkOperation::TransactWriteItems) > SDK_ATTEMPTS as usize,
        "the engine re-sent the commit"
    );
    if shop.db.capabilities.has(Capability::RequestTokens) {
        assert_eq!(
            refusals.count(),
            0,
            "every re-send was answered from its token, none refused by its condition"
        );
    } else {
        // moto's server ignores the token: the re-send is refused by its condition, and the
        // commit is recognised from the record instead (the other mechanism, tested below).
        assert!(
            refusals.count() > 0,
            "a backend without tokens refuses the re-send"
        );
    }
    assert_eq!(shop.reserved().await, 1, "the stock reserved once");
}

#[tokio::test]
async fn a_lost_commit_is_recognised_from_the_record_without_token_replay() {
    let shop = Shop::open().await;
    let faults = FaultInterceptor::new();
    let refusals = Refusals::default();
    let config = local::config_for(shop.db.endpoint.clone())
        .interceptor(faults.clone())
        .interceptor(FreshTokens::default())
        .interceptor(refusals.clone());
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let idem = shop.engine(DynamoDbStore::new(client, &shop.db.table));
    let inv = invocation("tx-no-token", &serde_json::json!({"order": "o-40"}));
    // Every SDK attempt of the first commit applies once and loses its answer: the engine
    // sends it again, under a token DynamoDB has not seen.
    faults.inject_times(
        SdkOperation::TransactWriteItems,
        SdkFault::DropResponse,
        SDK_ATTEMPTS as usize,
    );

    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "o-40"))
        .await
        .expect("the commit is recognised, not refused");

    assert_eq!(done.origin(), Origin::Executed { attempt: 1 });
    assert_eq!(done.value(), "placed o-40");
    assert!(
        faults.requests(SdkOperation::TransactWriteItems) > SDK_ATTEMPTS as usize,
        "the engine re-sent the commit as a new request"
    );
    assert!(
        refusals.count() >= 1,
        "the re-send was refused by its condition and recognised from the returned record"
    );
    assert_eq!(shop.reserved().await, 1, "the stock reserved once");
    assert!(shop.has_order("o-40").await);
}

/// An `IdempotentParameterMismatch` answer to a commit is an unknown outcome, never "not
/// applied" nor a refusal: the attempt stops without a retained failure, its claim given back,
/// and the next delivery decides from the record (here nothing applied: it runs the step once).
#[tokio::test]
async fn an_idempotent_parameter_mismatch_is_an_unknown_outcome() {
    let shop = Shop::open().await;
    let faults = FaultInterceptor::new();
    let config = local::config_for(shop.db.endpoint.clone()).interceptor(faults.clone());
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let idem = shop.engine(DynamoDbStore::new(client, &shop.db.table));
    let inv = invocation("tx-mismatch", &serde_json::json!({"order": "o-42"}));
    faults.inject_times(
        SdkOperation::TransactWriteItems,
        SdkFault::Error {
            status: 400,
            code: "IdempotentParameterMismatchException",
        },
        1000,
    );

    let stopped = idem.execute(&inv, |ctx| place(&shop, ctx, "o-42")).await;
    assert!(
        matches!(stopped, Err(lambda_idempotency::Error::Store(_))),
        "an unknown outcome stops the attempt: {stopped:?}"
    );
    assert!(faults.fired_for(SdkOperation::TransactWriteItems) >= 1);
    faults.clear();
    let record = idem
        .store()
        .get(inv.key())
        .await
        .expect("get")
        .expect("the claim stays");
    assert_eq!(
        record.status,
        lambda_idempotency::record::Status::InProgress,
        "not retained as a failure"
    );

    shop.clock.advance(std::time::Duration::from_secs(3600));
    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "o-42"))
        .await
        .expect("the next delivery runs it");
    assert_eq!(done.value(), "placed o-42");
    assert_eq!(shop.reserved().await, 1, "the stock reserved once");
}

/// A commit refused before anything applied (no permission) stops the attempt the same way,
/// with nothing retained: the next delivery, with the permission back, runs the step once.
#[tokio::test]
async fn a_commit_refused_before_it_applied_stops_the_attempt_and_the_next_runs_it() {
    let shop = Shop::open().await;
    let faults = FaultInterceptor::new();
    let config = local::config_for(shop.db.endpoint.clone()).interceptor(faults.clone());
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let idem = shop.engine(DynamoDbStore::new(client, &shop.db.table));
    let inv = invocation("tx-denied", &serde_json::json!({"order": "o-43"}));
    faults.inject(
        SdkOperation::TransactWriteItems,
        SdkFault::Error {
            status: 400,
            code: "AccessDeniedException",
        },
    );

    let stopped = idem.execute(&inv, |ctx| place(&shop, ctx, "o-43")).await;
    assert!(
        matches!(
            &stopped,
            Err(lambda_idempotency::Error::Store(err)) if matches!(err, lambda_idempotency::StoreError::AccessDenied { .. })
        ),
        "{stopped:?}"
    );
    assert!(!shop.has_order("o-43").await, "nothing applied");
    let record = idem.store().get(inv.key()).await.expect("get");
    assert!(
        record.is_none_or(|record| record.status == lambda_idempotency::record::Status::InProgress),
        "not retained as a failure"
    );

    shop.clock.advance(std::time::Duration::from_secs(3600));
    let done = idem
        .execute(&inv, |ctx| place(&shop, ctx, "o-43"))
        .await
        .expect("the next delivery runs it");
    assert_eq!(done.value(), "placed o-43");
    assert_eq!(shop.reserved().await, 1, "the stock reserved once");
}
