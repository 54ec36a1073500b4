//! The outbox relay end to end, from real parts: a transactional step commits outbox items on
//! the embedded DynamoDB server; its DynamoDB Stream is read as an event source mapping reads
//! it (DescribeStream, GetShardIterator, GetRecords); the relay publishes through the AWS SDK
//! to moto's EventBridge, SNS and SQS on loopback; consumers read the messages back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::SqsMessage;
use lambda_idempotency::clock::{Clock, ManualClock};
use lambda_idempotency::effects::{
    Destination, Outbox, OutboxEvent, OutboxMarks, Transaction, event_id,
};
use lambda_idempotency::lambda::relay::{self, Publisher, Relay, relay, relay_record};
use lambda_idempotency::lambda::sources;
use lambda_idempotency::reconcile::Recovery;
use lambda_idempotency::store::StoreExt;
use lambda_idempotency::testing::conformance::invocation;
use lambda_idempotency::testing::dynamo::{self, Dynamo};
use lambda_idempotency::testing::interceptor::{self, FaultInterceptor};
use lambda_idempotency::testing::local::unique_table_name;
use lambda_idempotency::testing::moto::{self, Moto};
use lambda_idempotency::{BoxError, ExecutionContext, Idempotency, OperationScope};
use lambda_runtime::tower::{Service, ServiceExt};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};

/// The writer's tables and the destinations on moto, with a queue behind each.
pub(crate) struct Rig {
    pub(crate) db: Dynamo,
    pub(crate) outbox: Outbox,
    moto: Moto,
    pub(crate) sqs: aws_sdk_sqs::Client,
    /// The queue the SQS destination sends to.
    pub(crate) orders_queue: String,
    /// The queue subscribed (raw) to the SNS topic.
    pub(crate) topic_queue: String,
    pub(crate) topic_arn: String,
    /// The queue an EventBridge rule on the bus targets.
    pub(crate) bus_queue: String,
    pub(crate) clock: ManualClock,
}

impl Rig {
    pub(crate) async fn open() -> Self {
        let clock = ManualClock::new(SystemTime::now());
        let db = dynamo::start_with_clock(clock.clone()).await;
        let outbox = unique_table_name("outbox");
        lambda_idempotency::testing::local::create_outbox_table(&db.client, &outbox)
            .await
            .expect("create the outbox table");
        let moto = moto::start().await.expect("moto's server");
        let config = moto.sdk_config();
        let sqs = aws_sdk_sqs::Client::new(&config);
        let (orders_queue, _) = new_queue(&sqs, unique_table_name("orders")).await;
        let (topic_queue, topic_queue_arn) = new_queue(&sqs, unique_table_name("topic-feed")).await;
        let (bus_queue, bus_queue_arn) = new_queue(&sqs, unique_table_name("bus-feed")).await;
        let sns = aws_sdk_sns::Client::new(&config);
        let topic_arn = sns
            .create_topic()
            .name(unique_table_name("orders"))
            .send()
            .await
            .expect("topic")
            .topic_arn()
            .expect("arn")
            .to_owned();
        sns.subscribe()
            .topic_arn(&topic_arn)
            .protocol("sqs")
            .endpoint(topic_queue_arn)
            .attributes("RawMessageDelivery", "true")
            .send()
            .await
            .expect("subscribe");
        let events = aws_sdk_eventbridge::Client::new(&config);
        events
            .create_event_bus()
            .name("shop")
            .send()
            .await
            .expect("bus");
        let rule = unique_table_name("rule");
        events
            .put_rule()
            .name(&rule)
            .event_bus_name("shop")
            .event_pattern(json!({"source": ["shop.orders"]}).to_string())
            .send()
            .await
            .expect("rule");
        events
            .put_targets()
            .rule(&rule)
            .event_bus_name("shop")
            .targets(
                aws_sdk_eventbridge::types::Target::builder()
                    .id("feed")
                    .arn(bus_queue_arn)
                    .build()
                    .expect("target"),
            )
            .send()
            .await
            .expect("targets");
        Self {
            db,
            outbox: Outbox::new(outbox),
            moto,
            sqs,
            orders_queue,
            topic_queue,
            topic_arn,
            bus_queue,
            clock,
        }
    }

    /// moto's endpoint (EventBridge, SNS and SQS).
    pub(crate) fn moto_endpoint(&self) -> &str {
        &self.moto.endpoint
    }

    pub(crate) fn publisher(&self) -> Publisher {
        Publisher::from_conf(&self.moto.sdk_config())
    }

    /// The outbox table's marks.
    pub(crate) fn marks(&self) -> OutboxMarks {
        OutboxMarks::new(self.db.client.clone(), &self.outbox)
    }

    /// The relay's service, on the rig's clock.
    pub(crate) fn relay(&self) -> Relay {
        self.relay_publishing(self.publisher())
    }

    /// The relay's service publishing with `publisher`, on the rig's clock.
    pub(crate) fn relay_publishing(&self, publisher: Publisher) -> Relay {
        relay(publisher, self.marks()).with_clock(self.clock.clone())
    }

    /// A new FIFO queue on moto named after `prefix`: its URL.
    pub(crate) async fn fifo_queue(&self, prefix: &str) -> String {
        self.sqs
            .create_queue()
            .queue_name(format!("{}.fifo", unique_table_name(prefix)))
            .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .expect("a FIFO queue")
            .queue_url()
            .expect("url")
            .to_owned()
    }

    /// The outbox's marks through a client whose next `failures` `UpdateItem`s are refused
    /// before they apply (`AccessDeniedException`, not retried): a relay that dies between its
    /// publish and its mark leaves what this one does.
    pub(crate) fn failing_marks(&self, failures: usize) -> (FaultInterceptor, OutboxMarks) {
        let faults = FaultInterceptor::new();
        faults.inject_times(
            interceptor::SdkOperation::UpdateItem,
            interceptor::SdkFault::Error {
                status: 400,
                code: "AccessDeniedException",
            },
            failures,
        );
        let marks = OutboxMarks::new(
            interceptor::client_with(self.db.endpoint.clone(), &faults),
            &self.outbox,
        );
        (faults, marks)
    }

    /// The SDK's configuration for moto (EventBridge, SNS and SQS).
    pub(crate) fn moto_config(&self) -> aws_config::SdkConfig {
        self.moto.sdk_config()
    }

    /// Commits operation `order`'s step with one event to each destination.
    pub(crate) async fn place(&self, order: &str) {
        let idem = Idempotency::new(self.db.store())
            .with_clock(self.clock.clone())
            .with_recovery(Recovery::Steps);
        let inv = invocation(&format!("relay-{order}"), &json!({"order": order}));
        let destinations = [
            Destination::Sqs {
                queue_url: self.orders_queue.clone(),
            },
            Destination::Sns {
                topic_arn: self.topic_arn.clone(),
            },
            Destination::EventBridge {
                bus: "shop".into(),
                source: "shop.orders".into(),
                detail_type: "OrderPlaced".into(),
            },
        ];
        idem.execute(&inv, |ctx: ExecutionContext| async move {
            ctx.step("place")
                .transact(|_key| async move {
                    let mut placed = Transaction::new(order.to_owned());
                    for (n, destination) in destinations.into_iter().enumerate() {
                        let event = OutboxEvent::new(
                            format!("placed-{n}"),
                            destination,
                            &json!({"order": order}),
                        )?;
                        placed = placed.publish(&self.outbox, event);
                    }
                    Ok::<_, BoxError>(placed)
                })
                .await
        })
        .await
        .expect("placed");
        let record = idem
            .store()
            .get(inv.key())
            .await
            .expect("get")
            .expect("record");
        let expected = event_id(inv.key(), record.created_at, "place", "placed-0");
        let (namespace, digest) = expected.split_once('#').expect("a namespaced id");
        assert_eq!(
            namespace,
            inv.key().namespace(),
            "the producer's namespace first"
        );
        assert_eq!(digest.len(), 64);
    }

    /// Every record the outbox table's stream holds, as a Lambda event (what an event source
    /// mapping delivers).
    pub(crate) async fn stream_batch(&self) -> DynamoDbEvent {
        let records = crate::streams::stream_records(&self.db.endpoint, self.outbox.table())
            .await
            .expect("the outbox's stream");
        serde_json::from_value(json!({"Records": records})).expect("a DynamoDB Streams event")
    }

    /// Delivers what each sender published to a consumer behind the crate's SQS door (keyed by
    /// the event id the relay sets, across senders), as one batch: how often its effect ran.
    /// moto gives every sender one `SenderId`; SQS gives each role its own
    /// ([`RELAY_ROLE`], [`SWEEPER_ROLE`]), so each message carries its publisher's.
    pub(crate) async fn consume(
        &self,
        published: &[(&str, &[aws_sdk_sqs::types::Message])],
    ) -> usize {
        let policy = sources::sqs_across_senders(None).expect("policy");
        self.consume_keyed("orders", policy, published).await
    }

    /// [`Self::consume`] by the consumer of `operation` keyed by `policy`.
    pub(crate) async fn consume_keyed(
        &self,
        operation: &str,
        policy: lambda_idempotency::KeyPolicy<SqsMessage>,
        published: &[(&str, &[aws_sdk_sqs::types::Message])],
    ) -> usize {
        let consumer = lambda_idempotency::Operation::new(
            Idempotency::new(self.db.store()),
            OperationScope::new("consumer", operation).expect("scope"),
            policy,
        );
        let effects = Arc::new(AtomicUsize::new(0));
        let messages: Vec<SqsMessage> = published
            .iter()
            .flat_map(|(sender, messages)| {
                messages
                    .iter()
                    .map(|message| lambda_message(message, sender))
            })
            .collect();
        let report = consumer
            .batch()
            .process(messages, &Context::default(), |_message, _ctx| {
                let effects = Arc::clone(&effects);
                async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(())
                }
            })
            .await;
        assert!(report.sqs_response().batch_item_failures.is_empty());
        effects.load(Ordering::SeqCst)
    }

    /// Receives and deletes what `queue` holds.
    pub(crate) async fn drain(&self, queue: &str) -> Vec<aws_sdk_sqs::types::Message> {
        let mut all = Vec::new();
        loop {
            let received = self
                .sqs
                .receive_message()
                .queue_url(queue)
                .max_number_of_messages(10)
                .message_attribute_names("All")
                .send()
                .await
                .expect("receive");
            let messages = received.messages().to_vec();
            if messages.is_empty() {
                return all;
            }
            for message in &messages {
                self.sqs
                    .delete_message()
                    .queue_url(queue)
                    .receipt_handle(message.receipt_handle().expect("handle"))
                    .send()
                    .await
                    .expect("delete");
            }
            all.extend(messages);
        }
    }
}

/// A new standard queue on moto named `name`: its URL and ARN.
pub(crate) async fn new_queue(sqs: &aws_sdk_sqs::Client, name: String) -> (String, String) {
    let url = sqs
        .create_queue()
        .queue_name(name)
        .send()
        .await
        .expect("queue")
        .queue_url()
        .expect("url")
        .to_owned();
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("attributes")
        .attributes()
        .and_then(|attributes| attributes.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
        .expect("arn")
        .clone();
    (url, arn)
}

/// Delivers `event` to the relay as Lambda would; its partial-batch response.
pub(crate) async fn deliver<S>(
    service: &mut S,
    event: DynamoDbEvent,
) -> aws_lambda_events::event::streams::DynamoDbEventResponse
where
    S: Service<
            LambdaEvent<DynamoDbEvent>,
            Response = aws_lambda_events::event::streams::DynamoDbEventResponse,
            Error = std::convert::Infallible,
        >,
{
    match service
        .ready()
        .await
        .expect("ready")
        .call(LambdaEvent::new(event, Context::default()))
        .await
    {
        Ok(answer) => answer,
        Err(never) => match never {},
    }
}

/// The event ids in `messages`' bodies (the envelope), for the EventBridge feed under
/// `detail`.
pub(crate) fn event_ids(
    messages: &[aws_sdk_sqs::types::Message],
    under_detail: bool,
) -> Vec<String> {
    let mut ids: Vec<String> = messages
        .iter()
        .map(|message| {
            let body: Value = serde_json::from_str(message.body().expect("body")).expect("json");
            let envelope = if under_detail { &body["detail"] } else { &body };
            assert_eq!(envelope["payload"]["order"].as_str().map(str::len), Some(3));
            envelope["event_id"].as_str().expect("event id").to_owned()
        })
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn the_relay_publishes_every_committed_event_once_to_each_destination() {
    let rig = Rig::open().await;
    rig.place("o-1").await;
    let batch = rig.stream_batch().await;
    assert_eq!(batch.records.len(), 3, "one stream record per outbox item");

    let mut service = rig.relay();
    let answer = deliver(&mut service, batch.clone()).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");

    let orders = rig.drain(&rig.orders_queue).await;
    let topic = rig.drain(&rig.topic_queue).await;
    let bus = rig.drain(&rig.bus_queue).await;
    assert_eq!((orders.len(), topic.len(), bus.len()), (1, 1, 1));
    let ids: Vec<String> = [
        event_ids(&orders, false),
        event_ids(&topic, false),
        event_ids(&bus, true),
    ]
    .concat();
    let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), 3, "one id per event");
    let attribute = orders[0]
        .message_attributes()
        .and_then(|attributes| attributes.get(sources::SQS_KEY_ATTRIBUTE))
        .and_then(|value| value.string_value());
    assert_eq!(
        attribute,
        Some(ids[0].as_str()),
        "the SQS door's key attribute"
    );

    // The stream delivers the batch again: the marks say published, nothing is republished.
    let again = deliver(&mut service, batch).await;
    assert!(again.batch_item_failures.is_empty());
    for queue in [&rig.orders_queue, &rig.topic_queue, &rig.bus_queue] {
        assert!(rig.drain(queue).await.is_empty(), "not published twice");
    }
}

#[tokio::test]
async fn a_relay_that_published_but_never_marked_republishes_under_the_same_id_and_the_consumer_acts_once()
 {
    let rig = Rig::open().await;
    rig.place("o-2").await;
    let batch = rig.stream_batch().await;
    // The relay publishes, then its marks fail before they apply (as a relay that dies between
    // the two leaves them): every record is reported, none acknowledged.
    let (faults, unmarked) = rig.failing_marks(3);
    let mut crashed = relay(rig.publisher(), unmarked).with_clock(rig.clock.clone());
    let answer = deliver(&mut crashed, batch.clone()).await;
    assert_eq!(answer.batch_item_failures.len(), 3, "{answer:?}");
    assert_eq!(faults.pending(), 0, "each mark failed once");
    assert!(
        rig.marks()
            .oldest_pending()
            .await
            .expect("pending")
            .is_some(),
        "still pending"
    );

    // The stream retries the batch: published again under the same ids, and marked.
    let answer = deliver(&mut rig.relay(), batch).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    assert_eq!(rig.marks().oldest_pending().await.expect("pending"), None);
    let orders = rig.drain(&rig.orders_queue).await;
    assert_eq!(orders.len(), 2, "published twice: at least once");
    let ids = event_ids(&orders, false);
    assert_eq!(ids[0], ids[1], "under the same event id");

    // A consumer behind the crate's SQS door deduplicates on it: one effect.
    assert_eq!(
        rig.consume(&[(RELAY_ROLE, &orders)]).await,
        1,
        "one effect per event"
    );
}

/// A mark that applies and loses its response (the SDK retries; the retry finds the event
/// published) is a mark: the batch succeeds, nothing is published twice.
#[tokio::test]
async fn a_mark_that_applied_but_lost_its_response_counts_as_marked() {
    let rig = Rig::open().await;
    rig.place("o-4").await;
    let batch = rig.stream_batch().await;
    // One mark loses its answer (the marks run at once: one fault, whichever mark meets it,
    // so that no mark's retries all meet one).
    let faults = FaultInterceptor::new();
    faults.inject(
        interceptor::SdkOperation::UpdateItem,
        interceptor::SdkFault::DropResponse,
    );
    let marks = OutboxMarks::new(
        interceptor::client_with(rig.db.endpoint.clone(), &faults),
        &rig.outbox,
    );
    let mut service = relay(rig.publisher(), marks).with_clock(rig.clock.clone());
    let answer = deliver(&mut service, batch.clone()).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    assert_eq!(
        faults.fired(
            interceptor::SdkOperation::UpdateItem,
            interceptor::SdkFault::DropResponse
        ),
        1
    );
    assert_eq!(rig.marks().oldest_pending().await.expect("pending"), None);
    let again = deliver(&mut rig.relay(), batch).await;
    assert!(again.batch_item_failures.is_empty());
    assert_eq!(
        rig.drain(&rig.orders_queue).await.len(),
        1,
        "published once"
    );
}

#[tokio::test]
async fn a_failed_publish_is_reported_so_the_stream_retries_it() {
    let rig = Rig::open().await;
    rig.place("o-3").await;
    let batch = rig.stream_batch().await;
    let sqs_record = batch
        .records
        .iter()
        .find(|record| {
            lambda_idempotency::lambda::relay::inserted(record)
                .is_some_and(|event| matches!(event.destination, Destination::Sqs { .. }))
        })
        .expect("the SQS event")
        .clone();
    // The queue is gone: the publish fails, the record is reported.
    rig.sqs
        .delete_queue()
        .queue_url(&rig.orders_queue)
        .send()
        .await
        .expect("delete queue");
    let now = rig.clock.now();
    assert!(
        relay_record(&rig.publisher(), &rig.marks(), &sqs_record, now)
            .await
            .is_err()
    );
    let mut service = rig.relay();
    let mut event = DynamoDbEvent::default();
    event.records = vec![sqs_record.clone()];
    let answer = deliver(&mut service, event).await;
    let reported: Vec<Option<String>> = answer
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.clone())
        .collect();
    assert_eq!(
        reported,
        vec![sqs_record.change.sequence_number],
        "the failed record's sequence number: the stream retries from it"
    );

    // An inserted item that is no outbox event is reported too, never acknowledged unread.
    let foreign: DynamoDbEvent = serde_json::from_value(json!({"Records": [{
        "eventID": "foreign-1",
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "eventVersion": "1.1",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "Keys": {"pk": {"S": "not-an-event"}},
            "NewImage": {"pk": {"S": "not-an-event"}},
            "SequenceNumber": "900",
            "SizeBytes": 10,
        },
    }]}))
    .expect("an event");
    let answer = deliver(&mut service, foreign).await;
    assert_eq!(answer.batch_item_failures.len(), 1, "reported, not skipped");
}

/// The `SenderId` SQS gives what the relay's role sends (the role's unique id and a session).
pub(crate) const RELAY_ROLE: &str = "AROARELAYROLE0000001:outbox-relay";
/// The `SenderId` SQS gives what the sweeper's role sends: a role of its own.
pub(crate) const SWEEPER_ROLE: &str = "AROASWEEPERROLE00001:outbox-sweeper";

/// An SQS message as the Lambda event delivers it, sent by `sender`.
fn lambda_message(message: &aws_sdk_sqs::types::Message, sender: &str) -> SqsMessage {
    let attributes: HashMap<String, Value> = message
        .message_attributes()
        .into_iter()
        .flatten()
        .map(|(name, value)| {
            (
                name.clone(),
                json!({"stringValue": value.string_value(), "dataType": value.data_type()}),
            )
        })
        .collect();
    serde_json::from_value(json!({
        "messageId": message.message_id(),
        "body": message.body(),
        "messageAttributes": attributes,
        "attributes": {"SenderId": sender},
    }))
    .expect("an SQS message")
}

/// A FIFO queue deduplicates on the event id: the same event published twice is received once.
#[tokio::test]
async fn a_fifo_queue_deduplicates_a_republished_event_on_its_id() {
    let rig = Rig::open().await;
    let fifo = rig.fifo_queue("orders").await;
    let idem = Idempotency::new(rig.db.store()).with_recovery(Recovery::Steps);
    let inv = invocation("relay-fifo", &json!({"order": "o-fifo"}));
    let destination = Destination::Sqs {
        queue_url: fifo.clone(),
    };
    let outbox = &rig.outbox;
    idem.execute(&inv, |ctx: ExecutionContext| async move {
        ctx.step("place")
            .transact(|_key| async move {
                let event = OutboxEvent::new("placed", destination, &json!({"order": "o-fifo"}))?;
                Ok::<_, BoxError>(Transaction::new(()).publish(outbox, event))
            })
            .await
    })
    .await
    .expect("placed");
    let batch = rig.stream_batch().await;

    // The relay publishes it, and a sweeper that read the index before the mark does too.
    let answer = deliver(&mut rig.relay(), batch.clone()).await;
    assert!(answer.batch_item_failures.is_empty(), "{answer:?}");
    let events: Vec<_> = batch.records.iter().filter_map(relay::inserted).collect();
    for published in rig.publisher().publish_batch(&events).await {
        published.expect("published again");
    }

    let received = rig.drain(&fifo).await;
    assert_eq!(received.len(), 1, "published twice, received once");
}
