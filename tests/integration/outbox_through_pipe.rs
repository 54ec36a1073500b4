//! On an EventBridge Pipe's path the outbox checks each event at commit against the Pipe's
//! envelope, which carries the payload as an escaped JSON string: an event that the relay
//! could publish but whose escaped payload passes the bus's 256 KiB is refused with nothing
//! written, instead of being committed, refused by the bus, redriven and parked. On both
//! stores.

use lambda_idempotency::effects::{
    Destination, MAX_EVENT_BYTES, Outbox, OutboxEvent, StepError, Transaction,
};
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::{BoxError, Error, ErrorKind};
use serde_json::{Value, json};

use crate::transactions::Shop;

/// Commits, under operation `name`, one event holding `payload` through `outbox`.
async fn commit(shop: &Shop, outbox: &Outbox, name: &str, payload: &Value) -> Result<(), Error> {
    let idem = shop.engine(shop.store());
    let inv = invocation(name, &json!({"name": name}));
    idem.execute(&inv, |ctx| async move {
        ctx.step("place")
            .transact(|_key| async move {
                let queue = Destination::Sqs {
                    queue_url: "http://127.0.0.1/000000000000/orders".into(),
                };
                let event = OutboxEvent::new("placed", queue, payload)?;
                Ok::<_, BoxError>(Transaction::new(()).publish(outbox, event))
            })
            .await
    })
    .await
    .map(|_| ())
}

async fn outbox_items(shop: &Shop) -> usize {
    shop.db
        .client
        .scan()
        .table_name(&shop.outbox)
        .send()
        .await
        .expect("scan the outbox")
        .items()
        .len()
}

#[tokio::test]
async fn an_event_too_large_once_escaped_is_refused_at_commit_on_the_pipes_path() {
    // Strings of quotes: about 1.8 times their size once escaped inside a JSON string.
    let quoted = json!({"notes": vec!["\"q\""; 25_000]});
    let written = quoted.to_string().len();
    assert!(
        written < MAX_EVENT_BYTES && written * 3 / 2 > MAX_EVENT_BYTES,
        "{written}"
    );
    for shop in Shop::both().await {
        let name = if shop.in_memory() {
            "memory"
        } else {
            "dynamodb"
        };
        let through_the_pipe = Outbox::new(&shop.outbox).through_pipe();

        let err = commit(&shop, &through_the_pipe, "escaped-too-large", &quoted)
            .await
            .expect_err("refused at commit");
        assert_eq!(err.kind(), ErrorKind::Handler, "{name}: {err:?}");
        let Error::Handler { source } = &err else {
            unreachable!()
        };
        assert!(
            matches!(
                source.downcast_ref::<StepError>(),
                Some(StepError::Rejected { .. })
            ),
            "{name}: the step's writes are refused before they are sent: {source:?}"
        );
        assert_eq!(outbox_items(&shop).await, 0, "{name}: nothing written");

        commit(&shop, &through_the_pipe, "small", &json!({"order": "o-1"}))
            .await
            .unwrap_or_else(|err| panic!("{name}: a small event commits: {err}"));
        let by_the_relay = Outbox::new(&shop.outbox);
        commit(&shop, &by_the_relay, "escaped-too-large-relayed", &quoted)
            .await
            .unwrap_or_else(|err| panic!("{name}: the relay publishes it as written: {err}"));
        assert_eq!(outbox_items(&shop).await, 2, "{name}");
    }
}
