//! The handler's own table for the transactional schedules, in an in-process DynamoDB
//! (dynoxide) the memory store commits into: a payment's charges, each order's completions,
//! and the outbox events, all under `pk`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, Update};
use dynoxide::actions::create_table::CreateTableRequest;
use dynoxide::actions::get_item::GetItemRequest;
use dynoxide::actions::scan::ScanRequest;
use lambda_idempotency::effects::{Destination, Outbox, OutboxEvent};
use serde_json::json;

use super::OrderId;

/// The table's name.
const TABLE: &str = "ledger";

/// The handler's table, in a database of its own.
#[derive(Clone)]
pub(super) struct Ledger {
    pub(super) db: dynoxide::Database,
}

impl Ledger {
    /// A fresh database holding the empty table.
    pub(super) fn open() -> Self {
        let db = dynoxide::Database::memory().expect("an in-process database");
        let table: CreateTableRequest = serde_json::from_value(json!({
            "TableName": TABLE,
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
            "BillingMode": "PAY_PER_REQUEST",
        }))
        .expect("a table definition");
        db.create_table(table).expect("create the ledger");
        Self { db }
    }

    /// The payment's charge: one more on p-1.
    pub(super) fn charge() -> Update {
        counted("p-1", "charges")
    }

    /// `order_id`'s completion: one more on its completion item.
    pub(super) fn complete(order_id: OrderId) -> Update {
        counted(&format!("done#{order_id}"), "completions")
    }

    /// The event published with the charge.
    pub(super) fn charged(order_id: OrderId) -> (Outbox, OutboxEvent) {
        let sqs = Destination::Sqs {
            queue_url: "http://127.0.0.1/000000000000/charges".into(),
        };
        let event = OutboxEvent::new("charged", sqs, &json!({"order": order_id.to_string()}))
            .expect("an event");
        (Outbox::new(TABLE), event)
    }

    /// How many charges committed.
    pub(super) fn charges(&self) -> usize {
        self.count("p-1", "charges")
    }

    /// How many completions of `order_id` committed.
    pub(super) fn completions(&self, order_id: OrderId) -> usize {
        self.count(&format!("done#{order_id}"), "completions")
    }

    /// How many outbox events committed.
    pub(super) fn events(&self) -> usize {
        let scan = ScanRequest {
            table_name: TABLE.into(),
            ..ScanRequest::default()
        };
        let items = self.db.scan(scan).expect("scan the ledger").items;
        items
            .unwrap_or_default()
            .iter()
            .filter(|item| item.contains_key("event"))
            .count()
    }

    fn count(&self, pk: &str, attribute: &str) -> usize {
        let get = GetItemRequest {
            table_name: TABLE.into(),
            key: HashMap::from([("pk".to_owned(), dynoxide::AttributeValue::S(pk.into()))]),
            consistent_read: Some(true),
            ..GetItemRequest::default()
        };
        let item = self.db.get_item(get).expect("read the ledger").item;
        match item.as_ref().and_then(|item| item.get(attribute)) {
            Some(dynoxide::AttributeValue::N(n)) => n.parse().expect("a count"),
            Some(other) => panic!("{pk}.{attribute} is {other:?}, not a count"),
            None => 0,
        }
    }
}

/// `order_id`'s receipt as one item over DynamoDB's 400 KB (within a transaction's 4 MB):
/// only the server refuses it.
pub(super) fn oversized_receipt(order_id: OrderId) -> Put {
    Put::builder()
        .table_name(TABLE)
        .item("pk", AttributeValue::S(format!("receipt#{order_id}")))
        .item("lines", AttributeValue::S("x".repeat(450 * 1024)))
        .build()
        .expect("a put")
}

/// One more on `pk`'s `attribute`.
fn counted(pk: &str, attribute: &str) -> Update {
    Update::builder()
        .table_name(TABLE)
        .key("pk", AttributeValue::S(pk.into()))
        .update_expression("ADD #count :one")
        .expression_attribute_names("#count", attribute)
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .build()
        .expect("an update")
}
