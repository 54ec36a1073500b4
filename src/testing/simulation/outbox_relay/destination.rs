//! The in-process destination the simulated relay and sweeper publish to: an SQS queue as a
//! [`Transport`], refusing poison events and firing the step's fault.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;

use crate::lambda::relay::{Answers, Channel, Message, PublishError, Transport};

/// A fault of the destination, fired by the first request of a relay or sweeper step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishFault {
    /// The request fails before anything is delivered.
    FailBefore,
    /// The events are delivered, and the answer is lost: the publisher sees a failure.
    LoseAnswer,
    /// The events are delivered, and the relay (or sweeper) crashes before it hears so: its
    /// marks are never written, and the stream delivers the batch again.
    CrashAfterPublish,
}

/// What the in-process destination holds, and the fault it fires next.
#[derive(Default)]
pub(super) struct DestinationState {
    /// Envelopes delivered, not yet consumed.
    pub(super) delivered: Vec<String>,
    pub(super) fault: Option<PublishFault>,
    pub(super) crash: Option<tokio::sync::oneshot::Sender<()>>,
}

/// An SQS queue in this process, as a [`Transport`]: it refuses poison events
/// ([`is_poison`]) the way SQS refuses a malformed message, and fires the step's fault.
#[derive(Clone, Default)]
pub(super) struct InProcess(Arc<Mutex<DestinationState>>);

impl InProcess {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, DestinationState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Transport for InProcess {
    fn send<'a>(
        &'a self,
        _channel: &'a Channel,
        messages: &'a [Message<'a>],
    ) -> BoxFuture<'a, Answers> {
        Box::pin(async move {
            let (fault, crash) = {
                let mut state = self.state();
                let fault = state.fault.take();
                if fault == Some(PublishFault::FailBefore) {
                    return Err(PublishError::failed("the queue is unavailable"));
                }
                let answers = messages
                    .iter()
                    .map(|message| match is_poison(&message.event.id) {
                        true => Err(PublishError::Refused {
                            reason: "InvalidMessageContents".into(),
                        }),
                        false => {
                            state.delivered.push(message.envelope.to_owned());
                            Ok(())
                        }
                    })
                    .collect::<Vec<_>>();
                match fault {
                    None => return Ok(answers),
                    Some(fault) => (fault, state.crash.take()),
                }
            };
            if fault == PublishFault::CrashAfterPublish
                && let Some(crash) = crash
            {
                let _ = crash.send(());
                std::future::pending::<()>().await;
            }
            Err(PublishError::failed("the answer was lost"))
        })
    }
}

/// Whether the destination refuses event `id` whatever is tried (one event in eight).
pub(super) fn is_poison(id: &str) -> bool {
    id.bytes()
        .fold(0u32, |sum, byte| sum.wrapping_add(u32::from(byte)))
        % 8
        == 0
}
