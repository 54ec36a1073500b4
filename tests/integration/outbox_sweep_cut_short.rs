//! A sweep records each failed publish as its answer comes, not once the whole batch is
//! answered: a destination that stops answering holds its own requests until the sweeper's
//! invocation times out, and what the sweep learnt of the others (their failures, so that they
//! back off and are parked in the end) is kept. Real table and index; the transport is the
//! seam: one queue refuses at once, the other never answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use futures_util::future::BoxFuture;
use lambda_idempotency::clock::Clock;
use lambda_idempotency::lambda::relay::sweeper::Sweeper;
use lambda_idempotency::lambda::relay::{
    Answers, Channel, Message, PublishError, Publisher, Transport,
};

use crate::outbox_sweeper::write_event;
use crate::relay::Rig;

/// Fails every request to `failing` at once; never answers one to another queue.
struct OneFailsTheOtherHangs {
    failing: String,
    hanging: AtomicBool,
}

impl Transport for OneFailsTheOtherHangs {
    fn send<'a>(&'a self, channel: &'a Channel, _: &'a [Message<'a>]) -> BoxFuture<'a, Answers> {
        let fails = matches!(channel, Channel::Queue(url) if *url == self.failing);
        Box::pin(async move {
            if fails {
                return Err(PublishError::failed("the queue was deleted"));
            }
            self.hanging.store(true, Ordering::SeqCst);
            std::future::pending().await
        })
    }
}

async fn sweep_failures(rig: &Rig, id: &str) -> Option<u64> {
    let item = rig
        .db
        .client
        .get_item()
        .table_name(rig.outbox.table())
        .key("pk", AttributeValue::S(id.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("read")
        .item?;
    item.get("sweep_failures")?.as_n().ok()?.parse().ok()
}

#[tokio::test]
async fn a_sweep_held_by_a_silent_destination_keeps_the_failures_it_saw() {
    let rig = Rig::open().await;
    let failing = format!("{}-deleted", rig.orders_queue);
    let silent = format!("{}-silent", rig.orders_queue);
    let committed = rig
        .clock
        .now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_millis();
    let refused = format!("3{}", "a".repeat(63));
    write_event(&rig, &refused, &failing, committed, "{}").await;
    let held = format!("7{}", "b".repeat(63));
    write_event(&rig, &held, &silent, committed + 1, "{}").await;
    rig.clock.advance(Duration::from_secs(3600));

    let transport = std::sync::Arc::new(OneFailsTheOtherHangs {
        failing,
        hanging: AtomicBool::new(false),
    });
    let shared = std::sync::Arc::clone(&transport);
    let sweeper = Sweeper::new(Publisher::over(Shared(shared)), rig.marks());
    let now = rig.clock.now();
    let sweep = tokio::spawn(async move { sweeper.sweep(now).await });

    // The sweep never ends (its invocation would time out); what it recorded is read meanwhile.
    let mut recorded = None;
    for _ in 0..500 {
        recorded = sweep_failures(&rig, &refused).await;
        if recorded.is_some() && transport.hanging.load(Ordering::SeqCst) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        !sweep.is_finished(),
        "the silent destination holds the sweep"
    );
    sweep.abort();
    assert_eq!(
        recorded,
        Some(1),
        "the refused event's failure is recorded while the other request hangs"
    );
}

/// The transport, shared with the test that watches it.
struct Shared(std::sync::Arc<OneFailsTheOtherHangs>);

impl Transport for Shared {
    fn send<'a>(
        &'a self,
        channel: &'a Channel,
        messages: &'a [Message<'a>],
    ) -> BoxFuture<'a, Answers> {
        self.0.send(channel, messages)
    }
}
