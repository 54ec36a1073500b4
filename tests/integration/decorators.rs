//! A store of a user's own around a built-in one sees every request the engine sends, on both
//! stores: the core's through its one forwarding point (`Store::call`), the handler's writes
//! through `TransactionalStore::commit`. Nothing reaches the wrapped store around it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use aws_sdk_dynamodb::types::TransactWriteItem;
use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::effects::Writes;
use lambda_idempotency::reconcile::BoxFuture;
use lambda_idempotency::store::{Answer, Committed, Request, Store, TransactionalStore};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::faults::{FaultyStore, Primitive};
use lambda_idempotency::{BoxError, StoreError};

use crate::transactions::Shop;

/// Notes each request it is sent, by the primitive it is, then hands it on.
#[derive(Debug)]
struct Noting<S> {
    inner: S,
    seen: Mutex<BTreeMap<Primitive, u64>>,
}

impl<S> Noting<S> {
    fn note(&self, primitive: Primitive) {
        *self
            .seen
            .lock()
            .expect("seen")
            .entry(primitive)
            .or_default() += 1;
    }
}

impl<S: Store> Store for Noting<S> {
    fn call<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Answer, StoreError>> {
        Box::pin(async move {
            self.note(Primitive::of(request));
            self.inner.call(request).await
        })
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        self.inner
            .transactional()
            .map(|_| self as &dyn TransactionalStore)
    }
}

impl<S: Store> TransactionalStore for Noting<S> {
    fn commit<'a>(
        &'a self,
        request: Request<'a>,
        writes: &'a [TransactWriteItem],
        token: &'a str,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(async move {
            self.note(match request {
                Request::RecordSteps { .. } => Primitive::CommitSteps,
                other => Primitive::of(other),
            });
            let inner = self.inner.transactional().expect("a transactional store");
            inner.commit(request, writes, token).await
        })
    }

    fn check_transactional_writes(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        match self.inner.transactional() {
            Some(inner) => inner.check_transactional_writes(),
            None => Box::pin(async { Ok(()) }),
        }
    }
}

#[tokio::test]
async fn a_decorator_sees_every_request_the_engine_sends() {
    for shop in Shop::both().await {
        let counted = FaultyStore::new(shop.store());
        let noting = Noting {
            inner: counted.clone(),
            seen: Mutex::default(),
        };
        let idem = shop.engine(noting);
        let receipt = Put::builder()
            .table_name(&shop.orders)
            .item("pk", AttributeValue::S("receipt-o-1".into()))
            .build()
            .expect("put");
        let inv = invocation("decorated", &serde_json::json!({"order": "o-1"}));
        for _ in 0..2 {
            let done = idem
                .execute(&inv, |ctx| {
                    let (shop, receipt) = (&shop, receipt.clone());
                    async move {
                        let charge: String = ctx
                            .step("charge")
                            .repeat_safe()
                            .run(|key| async move { Ok(format!("ch_{}", &key[..8])) })
                            .await?;
                        let seen = shop.stock_item("version").await;
                        let placed = ctx
                            .step("place")
                            .transact(|_key| async move { Ok(shop.place("o-1", seen)) })
                            .await?;
                        ctx.complete_with(Writes::default().put(receipt))?;
                        Ok::<_, BoxError>(format!("{charge} {placed}"))
                    }
                })
                .await
                .expect("executed, then replayed");
            assert!(done.value().ends_with("placed o-1"), "{}", done.value());
        }

        let noting = idem
            .store()
            .downcast_ref::<Noting<FaultyStore<lambda_idempotency::store::AnyStore>>>()
            .expect("the engine holds the decorator");
        let seen = noting.seen.lock().expect("seen").clone();
        assert_eq!(
            seen,
            counted.calls(),
            "every request the wrapped store got passed through the decorator ({} store)",
            if shop.in_memory() {
                "memory"
            } else {
                "DynamoDB"
            }
        );
        for primitive in [
            Primitive::Claim,
            Primitive::RecordSteps,
            Primitive::CommitSteps,
            Primitive::Settle,
        ] {
            assert!(
                seen.get(&primitive).is_some_and(|&calls| calls > 0),
                "the engine sent no {primitive:?} through the decorator: {seen:?}"
            );
        }
        assert!(shop.has_order("receipt-o-1").await);
        assert_eq!(shop.reserved().await, 1, "placed once, replayed once");
    }
}
