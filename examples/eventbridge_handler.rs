//! An EventBridge handler made idempotent with the tower layer: `OrderShipped` events, keyed by
//! the order in `detail` (so a re-published event with a new `id` is still a duplicate), with a
//! business identity whose evidence is permanent (an archive replay after the retention is
//! refused, not sent again).
//!
//! - Locally (`cargo run --example eventbridge_handler`): an embedded DynamoDB-compatible
//!   server (or `DYNAMODB_ENDPOINT`) and a few deliveries through the layered service.
//! - In Lambda (`cargo lambda build --release --arm64 --example eventbridge_handler`, see
//!   template.yaml): tables from `IDEMPOTENCY_TABLE` and `LEDGER_TABLE`.

#[path = "support/ledger.rs"]
mod ledger;
#[path = "../src/testing/local.rs"]
mod local_dynamodb;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_idempotency::key::JsonPointer;
use lambda_idempotency::lambda::{IdempotencyLayer, current, sources};
use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::{Config, Idempotency, Operation, OperationScope};
use lambda_runtime::tower::{Service, ServiceBuilder, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::{Value, json};

use ledger::Ledger;

/// The business operation: notify the customer that the order shipped, once.
async fn notify_shipped(
    ledger: Ledger,
    event: LambdaEvent<EventBridgeEvent<Value>>,
) -> Result<Value, lambda_runtime::Error> {
    let detail = &event.payload.detail;
    let order = detail["order_id"]
        .as_str()
        .ok_or("the event has no detail.order_id")?;
    let attempt = current().map_or(1, |ctx| ctx.attempt());
    let sent = ledger
        .apply(&format!("shipment-notice#{order}"), &detail.to_string())
        .await?;
    Ok(json!({"order_id": order, "notified": true, "attempt": attempt, "sent": sent}))
}

fn layer(
    store: DynamoDbStore,
    scope: OperationScope,
) -> Result<IdempotencyLayer<EventBridgeEvent<Value>, DynamoDbStore>, lambda_runtime::Error> {
    let idem = Idempotency::new(store, Config::default());
    // The shipment notice is irreversible: its business identity keeps permanent evidence
    // (the uniqueness table), so a replay from an EventBridge archive long after the record's
    // retention is refused (KeyExpiredConflict), never sent twice.
    let policy = sources::eventbridge_detail("/order_id")?.with_identity(
        |event: &EventBridgeEvent<Value>| {
            let order = event.detail["order_id"].as_str()?;
            Some(format!("shipment-notice:{order}"))
        },
    );
    let operation =
        Operation::new(idem, scope, policy).with_result_ref(JsonPointer::new("/order_id")?);
    Ok(IdempotencyLayer::from_operation(operation))
}

#[tokio::main]
pub async fn main() -> Result<(), lambda_runtime::Error> {
    if std::env::var("AWS_LAMBDA_RUNTIME_API").is_ok() {
        // JSON logs: each line carries the idempotency span (operation, key hash, attempt,
        // request id, message id), never a payload.
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .without_time()
            .init();
        let store = DynamoDbStore::from_env().await?;
        let ledger = Ledger::from_env(store.client().clone())?;
        let layer = layer(store, OperationScope::for_function("notify-shipped")?)?;
        let handler = service_fn(move |event| notify_shipped(ledger.clone(), event));
        return lambda_runtime::run(ServiceBuilder::new().layer(layer).service(handler)).await;
    }
    run_locally().await
}

fn shipped(
    id: &str,
    order: &str,
    carrier: &str,
) -> Result<LambdaEvent<EventBridgeEvent<Value>>, serde_json::Error> {
    let event = serde_json::from_value(
        json!({"version": "0", "id": id, "detail-type": "OrderShipped", "source": "shop.fulfilment",
        "account": "000000000000", "time": "2026-11-29T10:00:00Z", "region": "us-east-1", "resources": [],
        "detail": {"order_id": order, "carrier": carrier}}),
    )?;
    Ok(LambdaEvent::new(event, Context::default()))
}

async fn run_locally() -> Result<(), lambda_runtime::Error> {
    let store = local_dynamodb::local_store("shipping").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local_dynamodb::unique_table_name("shipping-ledger"),
    );
    ledger.create().await?;
    let mut service = ServiceBuilder::new()
        .layer(layer(
            store,
            OperationScope::new("examples", "notify-shipped")?,
        )?)
        .service(service_fn({
            let ledger = ledger.clone();
            move |event| notify_shipped(ledger.clone(), event)
        }));

    let deliveries = [
        ("o-1 shipped", shipped("evt-1", "o-1", "DHL")?),
        ("same event redelivered", shipped("evt-1", "o-1", "DHL")?),
        ("re-published, new id", shipped("evt-2", "o-1", "DHL")?),
        ("o-1 with another carrier", shipped("evt-3", "o-1", "UPS")?),
    ];
    for (label, event) in deliveries {
        match service.ready().await?.call(event).await {
            Ok(answer) => println!("{label:<26} -> {answer}"),
            Err(err) => println!("{label:<26} -> refused: {err}"),
        }
    }
    println!(
        "o-1 notices sent: {}",
        ledger.count("shipment-notice#o-1").await?
    );
    Ok(())
}
