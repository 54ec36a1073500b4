//! Each deployable function binary under the Lambda Runtime API protocol, as a fresh process,
//! fed the sample events in `events/` (the files `cargo lambda invoke --data-file` sends), its
//! tables on the embedded DynamoDB-compatible server (or `DYNAMODB_ENDPOINT`).

// Shared with the cold-start benchmark, which also reads when a process is ready and its pid.
#[allow(dead_code)]
mod support;

use std::time::{Duration, SystemTime};

use lambda_idempotency::clock::ManualClock;
use lambda_idempotency::key::IdentityScope;
use lambda_idempotency::record::Status;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::crash_after_claim;
use lambda_idempotency::{Idempotency, KeyPolicy, Operation, OperationKey, OperationScope};
use serde_json::{Value, json};

use support::function::{Function, Tables, sample_event};

#[path = "end_to_end/outbox.rs"]
mod outbox;

fn failures(answer: &Value) -> Vec<&str> {
    answer["batchItemFailures"]
        .as_array()
        .expect("a partial-batch response")
        .iter()
        .filter_map(|failure| failure["itemIdentifier"].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_replays_the_first_answer() {
    let tables = Tables::create("e2e-quickstart")
        .await
        .recorded("e2e-quickstart");
    let function =
        Function::spawn_capturing(env!("CARGO_BIN_EXE_quickstart"), "quickstart", &tables, &[])
            .await;
    let event = sample_event("direct");

    let first = function.api.invoke(event.clone()).await.expect("answered");
    let (settled, _, _) = tables.store.scan_page(None).await.expect("scan");
    let second = function.api.invoke(event).await.expect("answered");
    let output = function.stop_capturing().await;

    // One EMF document per invocation: the first execution, then the replay.
    let documents: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|line: &serde_json::Value| line.get("_aws").is_some())
        .collect();
    assert_eq!(documents.len(), 2, "one metrics document per invocation");
    assert_eq!(documents[0]["idempotency.first_execution"], 1);
    assert_eq!(documents[1]["idempotency.replay"], 1);
    for document in &documents {
        assert_eq!(document["function"], "quickstart");
        assert_eq!(document["operation"], "charge");
        assert_eq!(
            document["level"], "WARN",
            "the function's log level (AWS_LAMBDA_LOG_LEVEL): filtering at WARN keeps it"
        );
        assert_eq!(
            document["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            lambda_idempotency_functions::metrics::NAMESPACE
        );
    }

    assert_eq!(first["charged"], "o-1");
    assert_eq!(second, first, "the duplicate gets the stored answer");
    let (records, _, _) = tables.store.scan_page(None).await.expect("scan");
    assert_eq!(records.len(), 1, "one operation");
    assert_eq!(records[0].status, Status::Completed);
    assert_eq!(records[0].lease.attempt, 1);
    // The charge's answer is the same however often it runs: only the record tells a replay
    // from a re-run, which would have claimed again (another lease token, other times).
    assert_eq!(
        records, settled,
        "the duplicate was answered from the record the first invocation left, untouched"
    );
}

/// Lambda's tenant isolation mode, through the Runtime API header it sends: two tenants with
/// the same order are two operations, each keyed under its tenant; a tenant's repeat replays
/// its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_keys_each_tenant_apart() {
    let tables = Tables::create("e2e-tenants").await;
    let function = Function::spawn(env!("CARGO_BIN_EXE_quickstart"), "quickstart", &tables).await;
    let event = sample_event("direct");

    let acme = function
        .api
        .invoke_as_tenant("acme", event.clone())
        .await
        .expect("answered");
    let globex = function
        .api
        .invoke_as_tenant("globex", event.clone())
        .await
        .expect("answered");
    let acme_again = function
        .api
        .invoke_as_tenant("acme", event)
        .await
        .expect("answered");

    assert_eq!(acme_again, acme, "acme's repeat replays acme's answer");
    assert_ne!(
        acme["provider_key"], globex["provider_key"],
        "globex's order is its own operation"
    );
    let (records, _, _) = tables.store.scan_page(None).await.expect("scan");
    let mut tenants: Vec<_> = records
        .iter()
        .map(|record| record.key.tenant().map(str::to_owned))
        .collect();
    tenants.sort();
    assert_eq!(
        tenants,
        [Some("acme".to_owned()), Some("globex".to_owned())],
        "one record per tenant, keyed under it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_orders_acknowledges_a_redelivered_batch() {
    let tables = Tables::create("e2e-orders").await.recorded("e2e-orders");
    let function = Function::spawn(env!("CARGO_BIN_EXE_sqs_orders"), "sqs-orders", &tables).await;
    let batch = sample_event("sqs");
    let mut republished = batch.clone();
    republished["Records"][0]["messageId"] = json!("republished-1");
    let mut conflict = batch.clone();
    conflict["Records"][1]["body"] = json!(r#"{"order_id":"o-2","amount":999}"#);
    let conflicting_id = conflict["Records"][1]["messageId"].clone();

    let first = function.api.invoke(batch.clone()).await.expect("answered");
    let second = function.api.invoke(batch).await.expect("answered");
    let third = function.api.invoke(republished).await.expect("answered");
    let fourth = function.api.invoke(conflict).await.expect("answered");
    function.stop().await;

    assert_eq!(failures(&first), Vec::<&str>::new());
    assert_eq!(
        failures(&second),
        Vec::<&str>::new(),
        "redelivery acknowledged"
    );
    assert_eq!(
        failures(&third),
        Vec::<&str>::new(),
        "republication acknowledged"
    );
    assert_eq!(
        failures(&fourth),
        [conflicting_id.as_str().expect("an id")],
        "the conflicting payload comes back"
    );
    for order in ["order#o-1", "order#o-2"] {
        assert_eq!(
            tables.ledger.count(order).await.expect("ledger"),
            1,
            "{order} placed once over 4 deliveries"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_payments_replays_a_retried_request() {
    let tables = Tables::create("e2e-payments")
        .await
        .recorded("e2e-payments");
    let function = Function::spawn(env!("CARGO_BIN_EXE_api_payments"), "payments", &tables).await;
    // Signed by an IAM principal, as the template's API (AWS_IAM) passes every request on.
    let request = sample_event("http_api");
    assert!(request["requestContext"]["authorizer"]["iam"]["userArn"].is_string());
    let mut changed = request.clone();
    changed["body"] = json!(r#"{"amount":9999,"currency":"EUR"}"#);
    // The same key from another principal: its own operation, never the first caller's replay.
    let mut other_caller = request.clone();
    other_caller["requestContext"]["authorizer"]["iam"]["userArn"] =
        json!("arn:aws:sts::123456789012:assumed-role/payments-client/another-service");
    // A payment of nothing, under a key of its own: refused, nothing charged.
    let mut nothing = request.clone();
    nothing["headers"]["idempotency-key"] = json!("payment-of-nothing");
    nothing["body"] = json!(r#"{"amount":0}"#);
    // A route deployed without the authorizer: nobody to scope the key to.
    let mut anonymous = request.clone();
    anonymous["requestContext"]
        .as_object_mut()
        .expect("a request context")
        .remove("authorizer");

    let first = function
        .api
        .invoke(request.clone())
        .await
        .expect("answered");
    let retry = function.api.invoke(request).await.expect("answered");
    let conflict = function.api.invoke(changed).await.expect("answered");
    let other = function.api.invoke(other_caller).await.expect("answered");
    let refused = function.api.invoke(anonymous).await.expect("answered");
    let zero = function.api.invoke(nothing).await.expect("answered");
    function.stop().await;

    assert_eq!(first["statusCode"], 201);
    assert_eq!(retry["statusCode"], 201);
    assert_eq!(
        retry["body"], first["body"],
        "the same payment, byte for byte"
    );
    assert_eq!(retry["headers"]["idempotent-replayed"], "true");
    assert_eq!(conflict["statusCode"], 422);
    assert_eq!(other["statusCode"], 201);
    assert!(
        other["headers"].get("idempotent-replayed").is_none(),
        "not the first caller's replay"
    );
    assert_ne!(other["body"], first["body"], "another payment");
    assert_eq!(refused["statusCode"], 401);
    let refusal: Value =
        serde_json::from_str(refused["body"].as_str().expect("a body")).expect("JSON");
    assert_eq!(refusal["error"], "caller_unidentified");
    assert_eq!(zero["statusCode"], 400, "{zero}");
    let zero: Value = serde_json::from_str(zero["body"].as_str().expect("a body")).expect("JSON");
    assert_eq!(zero["error"], "invalid_amount");
    let body: Value = serde_json::from_str(first["body"].as_str().expect("a body")).expect("JSON");
    let payment = format!("payment#{}", body["payment_id"].as_str().expect("an id"));
    assert_eq!(tables.ledger.count(&payment).await.expect("ledger"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventbridge_handler_keeps_permanent_evidence() {
    let tables = Tables::create("e2e-shipments")
        .await
        .recorded("e2e-shipments");
    let function = Function::spawn_with(
        env!("CARGO_BIN_EXE_eventbridge_handler"),
        "shipments",
        &tables,
        &[tables.uniqueness_env()],
    )
    .await;
    let event = sample_event("eventbridge");
    let mut republished = event.clone();
    republished["id"] = json!("a-new-event-id");

    let first = function.api.invoke(event.clone()).await.expect("answered");
    let (settled, _, _) = tables.store.scan_page(None).await.expect("scan");
    let again = function.api.invoke(event).await.expect("answered");
    let other = function.api.invoke(republished).await.expect("answered");
    // An order id holding `#`: the claim also looks where a global identity holding `#` is
    // kept (`#g#shipment-notice:…`, for a deploy that changed the identity's scope), which the
    // function's policy allows.
    let mut hashed = sample_event("eventbridge");
    hashed["id"] = json!("a-third-event-id");
    hashed["detail"]["order_id"] = json!("o#2");
    let hashed = function.api.invoke(hashed).await.expect("answered");
    function.stop().await;

    assert_eq!(hashed["notified"], true, "{hashed}");

    assert_eq!(first["notified"], true);
    assert_eq!(
        (first["attempt"].as_u64(), first["sent"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(again, first);
    assert_eq!(other, first, "a re-published event is the same notice");
    assert_eq!(
        tables
            .ledger
            .count("shipment-notice#o-1")
            .await
            .expect("ledger"),
        1
    );
    let (mut records, _, _) = tables.store.scan_page(None).await.expect("scan");
    assert_eq!(records.len(), 2, "one operation per order");
    records.retain(|record| record.key == settled[0].key);
    assert_eq!(
        (records[0].status, records[0].lease.attempt),
        (Status::Completed, 1)
    );
    assert_eq!(
        records, settled,
        "replayed from the first record, untouched"
    );
    // The evidence is kept under the function's namespace (its name, as Lambda sets it).
    let scope = OperationScope::new("shipments", "notify-shipped").expect("scope");
    let key = OperationKey::derive(&scope, None, "o-1").expect("key");
    let evidence_key = IdentityScope::default().evidence_key("shipment-notice:o-1", &key);
    assert_eq!(evidence_key, "shipments#id=shipment-notice:o-1");
    let evidence = tables
        .store
        .evidence(&evidence_key)
        .await
        .expect("read evidence")
        .expect("the business identity left permanent evidence");
    assert_eq!(evidence.status, Status::Completed);
    assert_eq!(evidence.result_ref.as_deref(), Some("o-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_places_the_order_with_its_event_and_mails_once() {
    let tables = Tables::create("e2e-checkout")
        .await
        .recorded("e2e-checkout");
    // An outbox table (a `pk` table, as the ledger's); the relay is not run here.
    let outbox = lambda_idempotency_functions::ledger::Ledger::new(
        tables.ledger.client().clone(),
        lambda_idempotency::testing::local::unique_table_name("e2e-checkout-outbox"),
    );
    outbox.create().await.expect("outbox table");
    let function = Function::spawn_with(
        env!("CARGO_BIN_EXE_checkout"),
        "checkout",
        &tables,
        &[
            ("OUTBOX_TABLE", outbox.table()),
            (
                "ORDER_EVENTS_QUEUE_URL",
                "http://127.0.0.1/000000000000/order-events",
            ),
            (
                "OUTBOX_DESTINATIONS",
                "http://127.0.0.1/000000000000/order-events",
            ),
        ],
    )
    .await;
    let event = sample_event("checkout");
    let first = function.api.invoke(event.clone()).await.expect("answered");
    let second = function.api.invoke(event).await.expect("answered");
    function.stop().await;

    assert_eq!(first["order"], "order#c-1");
    assert_eq!(second, first, "the duplicate gets the stored answer");
    assert_eq!(
        tables.ledger.count("email#c-1").await.expect("read"),
        1,
        "mailed once"
    );
    let (records, _, _) = tables.store.scan_page(None).await.expect("scan");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Completed);
    let steps: Vec<&str> = records[0]
        .steps
        .iter()
        .map(|step| step.name.as_str())
        .collect();
    assert_eq!(steps, ["place-order", "email"]);
    let events = tables
        .ledger
        .client()
        .scan()
        .table_name(outbox.table())
        .send()
        .await
        .expect("scan the outbox");
    assert_eq!(events.items().len(), 1, "one order-placed event");
}

/// A message the handler fails on (an `order_id` that is no string) comes back in
/// `batchItemFailures`, its claim released (deleted) so that the queue's retry runs afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_orders_releases_a_failed_message_for_its_retry() {
    let tables = Tables::create("e2e-release").await.recorded("e2e-release");
    let function = Function::spawn(env!("CARGO_BIN_EXE_sqs_orders"), "sqs-orders", &tables).await;
    let mut batch = sample_event("sqs");
    batch["Records"][0]["body"] = json!(r#"{"order_id":42,"amount":100}"#);
    let failed_id = batch["Records"][0]["messageId"].clone();

    let answer = function.api.invoke(batch).await.expect("answered");
    function.stop().await;

    assert_eq!(failures(&answer), [failed_id.as_str().expect("an id")]);
    let (records, _, _) = tables.store.scan_page(None).await.expect("scan");
    assert!(
        records
            .iter()
            .all(|record| record.status == Status::Completed),
        "the failed message's claim was released, the others completed: {records:?}"
    );
    assert_eq!(records.len(), 1, "only the other message's record is kept");
}

/// A claim whose attempt crashed an hour ago: the binary takes it over (a conditional update
/// fenced on the crashed lease) and, declared `Recovery::Rerun` (its charge carries the same
/// provider key on every attempt), runs it again as attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_takes_over_a_crashed_claim() {
    let tables = Tables::create("e2e-takeover")
        .await
        .recorded("e2e-takeover");
    let event = sample_event("direct");
    let hour_ago = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let idem = Idempotency::new(tables.store.clone()).with_clock(hour_ago);
    let charge = Operation::new(
        idem.clone(),
        OperationScope::new("quickstart", "charge").expect("scope"),
        KeyPolicy::pointer("/order_id").expect("pointer"),
    );
    let invocation = charge
        .invocation(&event, &lambda_runtime::Context::default())
        .expect("the binary's invocation");
    crash_after_claim(&idem, &invocation).await;

    let function = Function::spawn(env!("CARGO_BIN_EXE_quickstart"), "quickstart", &tables).await;
    let answer = function.api.invoke(event).await;
    function.stop().await;

    let answer = answer.expect("run again");
    assert_eq!(answer["charged"], "o-1");
    let record = tables
        .store
        .get(invocation.key())
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.lease.attempt, 2, "taken over by the binary");
}

/// The scheduled stuck check, as its schedule invokes it: it counts a claim crashed an hour
/// ago, and an orphaned evidence (its record gone), reading only the records' summaries (no
/// outcome: the requests are recorded for the IAM check, whose policy allows no more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stuck_check_counts_a_crashed_claim_and_an_orphan() {
    let tables = Tables::create("e2e-stuck").await.recorded("e2e-stuck");
    let hour_ago = ManualClock::new(SystemTime::now() - Duration::from_secs(3600));
    let idem = Idempotency::new(tables.store.clone()).with_clock(hour_ago);
    let scope = || OperationScope::new("shipments", "notice").expect("scope");
    let crashed = Operation::new(
        idem.clone(),
        scope(),
        KeyPolicy::pointer("/order_id").expect("pointer"),
    );
    let invocation = crashed
        .invocation(
            &json!({"order_id": "o-1"}),
            &lambda_runtime::Context::default(),
        )
        .expect("invocation");
    crash_after_claim(&idem, &invocation).await;
    let orphaned = Operation::new(
        idem.clone(),
        scope(),
        KeyPolicy::pointer("/order_id")
            .expect("pointer")
            .with_identity(|event: &serde_json::Value| {
                Some(format!("notice:{}", event["order_id"]))
            }),
    )
    .invocation(
        &json!({"order_id": "o-2"}),
        &lambda_runtime::Context::default(),
    )
    .expect("invocation");
    crash_after_claim(&idem, &orphaned).await;
    // TTL deleted the orphan's record; its evidence stays IN_PROGRESS.
    tables
        .store
        .client()
        .delete_item()
        .table_name(tables.store.table())
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(orphaned.key().as_str().into()),
        )
        .send()
        .await
        .expect("delete the record");

    let function = Function::spawn_with(
        env!("CARGO_BIN_EXE_stuck_check"),
        "stuck-check",
        &tables,
        &[tables.uniqueness_env()],
    )
    .await;
    let document = function.api.invoke(json!({})).await.expect("answered");
    function.stop().await;

    assert_eq!(document["StuckInProgress"], 1, "{document}");
    assert_eq!(document["OrphanedEvidence"], 1, "{document}");
    assert_eq!(document["StuckCheckIncomplete"], 0);
}

/// The checkout's event through the outbox to its queue: the checkout commits it to the
/// outbox table; the relay, invoked with that item as the table's stream delivers it, publishes
/// it to moto's SQS once, however often the stream delivers the batch. Both binaries' DynamoDB
/// and SQS requests are recorded for the IAM check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_relay_publishes_the_checkouts_event_once() {
    let tables = Tables::create("e2e-relay").await.recorded("e2e-relay");
    let outbox = lambda_idempotency_functions::ledger::Ledger::new(
        tables.ledger.client().clone(),
        lambda_idempotency::testing::local::unique_table_name("e2e-relay-outbox"),
    );
    outbox.create().await.expect("outbox table");
    let moto = lambda_idempotency::testing::moto::start()
        .await
        .expect("moto's server");
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config());
    let queue = sqs
        .create_queue()
        .queue_name("order-events")
        .send()
        .await
        .expect("a queue")
        .queue_url()
        .expect("its URL")
        .to_owned();
    // A server given by MOTO_ENDPOINT may hold an earlier run's messages.
    sqs.purge_queue()
        .queue_url(&queue)
        .send()
        .await
        .expect("purge");

    let checkout = Function::spawn_with(
        env!("CARGO_BIN_EXE_checkout"),
        "checkout",
        &tables,
        &[
            ("OUTBOX_TABLE", outbox.table()),
            ("ORDER_EVENTS_QUEUE_URL", queue.as_str()),
            ("OUTBOX_DESTINATIONS", queue.as_str()),
        ],
    )
    .await;
    checkout
        .api
        .invoke(sample_event("checkout"))
        .await
        .expect("ordered");
    checkout.stop().await;
    let batch = stream_batch_of(&tables, outbox.table()).await;

    let relay = Function::spawn_with(
        env!("CARGO_BIN_EXE_outbox_relay"),
        "outbox-relay",
        &tables,
        &[
            ("AWS_ENDPOINT_URL_SQS", moto.endpoint.as_str()),
            ("OUTBOX_TABLE", outbox.table()),
            ("OUTBOX_DESTINATIONS", queue.as_str()),
        ],
    )
    .await;
    let first = relay.api.invoke(batch.clone()).await.expect("answered");
    let again = relay.api.invoke(batch).await.expect("answered");
    relay.stop().await;

    assert_eq!(failures(&first), Vec::<&str>::new());
    assert_eq!(failures(&again), Vec::<&str>::new());
    let received = sqs
        .receive_message()
        .queue_url(&queue)
        .max_number_of_messages(10)
        .send()
        .await
        .expect("receive");
    assert_eq!(
        received.messages().len(),
        1,
        "published once over two deliveries"
    );
    let marked = tables
        .ledger
        .client()
        .scan()
        .table_name(outbox.table())
        .send()
        .await
        .expect("scan the outbox");
    let [item] = marked.items() else {
        panic!("one outbox event: {:?}", marked.items());
    };
    assert_eq!(
        item.get("published_by")
            .and_then(|by| by.as_s().ok())
            .map(String::as_str),
        Some("relay"),
        "marked published: {item:?}"
    );
    assert!(!item.contains_key("pending"), "out of the pending index");
    let recorded =
        std::fs::read_to_string(support::recorder::recordings_dir().join("e2e-relay.jsonl"))
            .expect("the recording");
    assert_eq!(
        recorded
            .lines()
            .filter(|line| line.contains("AmazonSQS.SendMessage"))
            .count(),
        1,
        "the publish went through the recording proxy"
    );
}

/// The outbox's one item as its stream's INSERT record, in the sample stream event.
async fn stream_batch_of(tables: &Tables, outbox: &str) -> serde_json::Value {
    use aws_sdk_dynamodb::types::AttributeValue;
    let scanned = tables
        .ledger
        .client()
        .scan()
        .table_name(outbox)
        .send()
        .await
        .expect("scan the outbox");
    let [item] = scanned.items() else {
        panic!("one outbox event: {:?}", scanned.items());
    };
    let image: serde_json::Map<String, serde_json::Value> = item
        .iter()
        .map(|(name, value)| {
            let value = match value {
                AttributeValue::S(text) => json!({ "S": text }),
                AttributeValue::N(number) => json!({ "N": number }),
                other => panic!("an outbox item holds strings and numbers: {other:?}"),
            };
            (name.clone(), value)
        })
        .collect();
    let mut batch = sample_event("dynamodb_stream");
    let record = &mut batch["Records"][0]["dynamodb"];
    record["Keys"] = json!({ "pk": image["pk"] });
    record["NewImage"] = serde_json::Value::Object(image);
    batch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_fails_the_init() {
    let tables = Tables::create("e2e-missing").await.recorded("e2e-missing");
    let function = Function::spawn_capturing(
        env!("CARGO_BIN_EXE_quickstart"),
        "quickstart",
        &tables,
        &[("IDEMPOTENCY_TABLE", "no-such-table")],
    )
    .await;

    let output = function.output().await;

    assert!(
        !output.status.success(),
        "priming found the table missing during init"
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        said.lines().any(|line| line.starts_with("Error:")
            && line.contains("no-such-table")
            && line.contains("deploy it")),
        "the init error names the missing table and what to do: {said}"
    );
}
