//! The `OrderShipped` handler (`src/shipments.rs`) run locally: an embedded
//! DynamoDB-compatible server (or `DYNAMODB_ENDPOINT`) and a few deliveries through the layered
//! service: the event, its redelivery, a re-publication with a new id, another carrier.
//!
//! `cargo run -p lambda-idempotency-functions --example eventbridge_handler`; the deployable
//! binary is `src/bin/eventbridge_handler.rs`.

use lambda_idempotency::testing::local;
use lambda_idempotency::{Idempotency, OperationScope};
use lambda_idempotency_functions::ledger::Ledger;
use lambda_idempotency_functions::shipments::{ShipmentEvent, layer, notify_shipped};
use lambda_runtime::tower::{Service, ServiceBuilder, ServiceExt};
use lambda_runtime::{Context, LambdaEvent, service_fn};
use serde_json::json;

fn shipped(
    id: &str,
    order: &str,
    carrier: &str,
) -> Result<LambdaEvent<ShipmentEvent>, serde_json::Error> {
    let event = serde_json::from_value(
        json!({"version": "0", "id": id, "detail-type": "OrderShipped", "source": "shop.fulfilment",
        "account": "000000000000", "time": "2026-11-29T10:00:00Z", "region": "us-east-1", "resources": [],
        "detail": {"order_id": order, "carrier": carrier}}),
    )?;
    Ok(LambdaEvent::new(event, Context::default()))
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let store = local::local_store("shipping").await?;
    let ledger = Ledger::new(
        store.client().clone(),
        local::unique_table_name("shipping-ledger"),
    );
    ledger.create().await?;
    let mut service = ServiceBuilder::new()
        .layer(layer(
            Idempotency::new(store),
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
