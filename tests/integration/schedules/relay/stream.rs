//! The outbox's table with its stream, and the event source mapping that hands its records
//! to the relay as Lambda does.

use std::collections::HashMap;

use aws_lambda_events::event::dynamodb::EventRecord;
use lambda_idempotency::effects::Outbox;
use lambda_idempotency::lambda::relay::Relay;
use serde_json::json;

use crate::schedules::OrderId;
use crate::schedules::in_process;
use crate::schedules::ledger::Ledger;

/// The mapping's polls of the stream, and the most of them that invoke the relay (a poll
/// that finds nothing new invokes nothing).
pub(super) const POLLS: usize = 4;
/// See [`POLLS`].
pub(super) const INVOCATIONS: usize = 2;
/// The ledger's table, as an outbox table is made (template.yaml's `OutboxTable`): a stream
/// of new images, and the sparse pending index.
pub(super) fn streamed_ledger() -> Ledger {
    let db = dynoxide::Database::memory().expect("an in-process database");
    let key = |name: &str, kind: &str| json!({"AttributeName": name, "KeyType": kind});
    let attribute = |name: &str, kind: &str| json!({"AttributeName": name, "AttributeType": kind});
    let table = serde_json::from_value(json!({
        "TableName": outbox().table(),
        "KeySchema": [key("pk", "HASH")],
        "AttributeDefinitions": [
            attribute("pk", "S"), attribute("pending", "S"), attribute("created_at", "N"),
        ],
        "BillingMode": "PAY_PER_REQUEST",
        "GlobalSecondaryIndexes": [{
            "IndexName": lambda_idempotency::effects::PENDING_INDEX,
            "KeySchema": [key("pending", "HASH"), key("created_at", "RANGE")],
            "Projection": {"ProjectionType": "ALL"},
        }],
        "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_IMAGE"},
    }))
    .expect("a table definition");
    db.create_table(table).expect("create the ledger");
    Ledger { db }
}

/// The outbox the deliveries publish to: the ledger's own table.
pub(super) fn outbox() -> Outbox {
    Ledger::charged(OrderId(1)).0
}

/// Whether the event source mapping passes `record` to the relay: an insertion that is an
/// outbox event. The template's outbox has a table of its own and filters on `INSERT`; here
/// the handler's table is the outbox, and the filter asks for `pending` in the new image too
/// (`{"dynamodb": {"NewImage": {"pending": {"S": [{"exists": true}]}}}}`).
pub(super) fn filtered(record: &EventRecord) -> bool {
    let image = serde_json::to_value(&record.change.new_image).expect("an image");
    record.event_name == "INSERT" && image.get("pending").is_some()
}

/// The event source mapping: polls the stream [`POLLS`] times, invoking the relay with the
/// records past its checkpoint (at most [`INVOCATIONS`] times), and moves the checkpoint as
/// Lambda does with `ReportBatchItemFailures`: to the first record reported failed. Then it
/// gives up. Returns how many events the relay published.
pub(super) async fn mapping(relay: Relay, db: dynoxide::Database) -> u64 {
    let table = outbox().table().to_owned();
    let mut checkpoint = String::new();
    let (mut invoked, mut published) = (0, 0);
    for _ in 0..POLLS {
        shuttle::future::yield_now().await;
        let sequence =
            |record: &EventRecord| record.change.sequence_number.clone().unwrap_or_default();
        let read: Vec<EventRecord> = in_process::stream_records(&db, &table)
            .into_iter()
            .filter(|record| sequence(record) > checkpoint)
            .collect();
        let Some(last) = read.last().map(sequence) else {
            continue;
        };
        let batch: Vec<EventRecord> = read
            .iter()
            .filter(|record| filtered(record))
            .cloned()
            .collect();
        if batch.is_empty() {
            checkpoint = last;
            continue;
        }
        if invoked == INVOCATIONS {
            break;
        }
        invoked += 1;
        let report = relay.relay_batch(&batch).await;
        published += report.published;
        // What the relay does not report failed, Lambda never delivers again: it is settled.
        for record in batch
            .iter()
            .filter(|record| !report.failed.contains(&sequence(record)))
        {
            let keys = serde_json::to_value(&record.change.keys).expect("the record's keys");
            let id = keys["pk"]["S"].as_str().expect("the event id");
            assert!(
                settled(&db, id),
                "the relay acknowledged the record of {id}, whose event is not marked: {report:?}"
            );
        }
        let first_failed = report.failed.iter().min();
        checkpoint = match first_failed {
            None => last,
            Some(failed) => read
                .iter()
                .map(sequence)
                .take_while(|at| at < failed)
                .last()
                .unwrap_or(checkpoint),
        };
    }
    published
}

/// Whether the outbox event `pk` is marked published or parked.
pub(super) fn settled(db: &dynoxide::Database, pk: &str) -> bool {
    let get = dynoxide::actions::get_item::GetItemRequest {
        table_name: outbox().table().to_owned(),
        key: HashMap::from([("pk".to_owned(), dynoxide::AttributeValue::S(pk.to_owned()))]),
        consistent_read: Some(true),
        ..Default::default()
    };
    let item = db
        .get_item(get)
        .expect("read the outbox")
        .item
        .unwrap_or_default();
    let parked =
        matches!(item.get("pending"), Some(dynoxide::AttributeValue::S(p)) if p == "parked");
    item.contains_key("published_at") || parked
}
