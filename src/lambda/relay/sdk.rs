//! The transport through the AWS SDK: `PutEvents` for EventBridge, `PublishBatch` for an SNS
//! topic, `SendMessageBatch` for an SQS queue, each entry's failure told apart (a refusal by
//! the sender's fault parks the event; anything else is retried: by the stream on the relay's
//! path, and by the sweeper at longer and longer waits, which parks it after its last try).

use futures_util::future::BoxFuture;

use aws_sdk_sqs::error::ProvideErrorMetadata;

use super::transport::{Answers, Channel, Message, PublishError, Transport};
use crate::effects::destinations::Destination;
use crate::effects::outbox::ID_ATTRIBUTE;

/// Error codes that refuse the event itself (its size, its content): the same request would be
/// refused again, so the event is parked instead of retried.
const REFUSALS: [&str; 7] = [
    "InvalidParameterValue",
    "InvalidParameter",
    "InvalidMessageContents",
    "InvalidAttributeValue",
    "ValidationException",
    "ValidationError",
    "InvalidArgument",
];

/// Refused when the SDK error's code is one of [`REFUSALS`], failed otherwise (the SDKs share
/// one `SdkError` type).
fn sdk_failure<E>(err: aws_sdk_sqs::error::SdkError<E>) -> PublishError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match err.code() {
        Some(code) if REFUSALS.contains(&code) => PublishError::Refused {
            reason: code.to_owned(),
        },
        _ => PublishError::failed(err),
    }
}

/// An EventBridge entry's failure: a malformed or invalid entry refuses the event; anything
/// else (throttling, an internal error, access denied, a code this build does not know) is
/// retried, not parked at once: a grant or a bus policy can be fixed (the sweeper parks it
/// only after its last try).
fn entry_failure(code: &str) -> PublishError {
    if code == "MalformedDetail" || REFUSALS.contains(&code) {
        PublishError::Refused {
            reason: format!("EventBridge refused the entry: {code}"),
        }
    } else {
        PublishError::failed(format!("EventBridge failed the entry: {code}"))
    }
}

/// The three SDK clients the relay publishes with.
#[derive(Clone)]
pub(super) struct SdkTransport {
    pub(super) eventbridge: aws_sdk_eventbridge::Client,
    pub(super) sns: aws_sdk_sns::Client,
    pub(super) sqs: aws_sdk_sqs::Client,
}

impl Transport for SdkTransport {
    fn send<'a>(
        &'a self,
        channel: &'a Channel,
        messages: &'a [Message<'a>],
    ) -> BoxFuture<'a, Answers> {
        Box::pin(async move {
            match channel {
                Channel::EventBridge => self.put_events(messages).await,
                Channel::Topic(topic_arn) => self.publish_to_topic(topic_arn, messages).await,
                Channel::Queue(queue_url) => self.send_to_queue(queue_url, messages).await,
            }
        })
    }
}

/// One batch's entries for SNS or SQS, named `0`, `1`, …: each message's envelope as the
/// `body`, its event id as the [`ID_ATTRIBUTE`] message attribute and, to a FIFO destination,
/// its group and deduplication id. The two SDKs spell the same entry with types of their own
/// and no shared trait, so it is written once here for both.
macro_rules! entries {
    ($sdk:ident, $entry:ident, $body:ident, $messages:expr, $fifo:expr) => {{
        let mut requested = Vec::with_capacity($messages.len());
        for (n, message) in $messages.iter().enumerate() {
            let attribute = $sdk::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(&message.event.id)
                .build()
                .map_err(PublishError::failed)?;
            let mut built = $sdk::types::$entry::builder()
                .id(n.to_string())
                .$body(message.envelope)
                .message_attributes(ID_ATTRIBUTE, attribute);
            if $fifo {
                built = built
                    .message_group_id(message.event.message_group())
                    .message_deduplication_id(message.event.deduplication_id());
            }
            requested.push(built.build().map_err(PublishError::failed)?);
        }
        requested
    }};
}

impl SdkTransport {
    async fn put_events(&self, messages: &[Message<'_>]) -> Answers {
        let requested = messages.iter().map(|message| {
            let mut built = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                .detail(message.envelope);
            if let Destination::EventBridge {
                bus,
                source,
                detail_type,
            } = &message.event.destination
            {
                built = built
                    .event_bus_name(bus)
                    .source(source)
                    .detail_type(detail_type);
            }
            built.build()
        });
        let put = self
            .eventbridge
            .put_events()
            .set_entries(Some(requested.collect()))
            .send()
            .await
            .map_err(sdk_failure)?;
        // The answer's entries are in the request's order.
        let mut answered = put.entries().iter();
        Ok(messages
            .iter()
            .map(|_| match answered.next() {
                None => Err(PublishError::failed("PutEvents answered fewer entries")),
                Some(entry) => match entry.error_code() {
                    Some(code) => Err(entry_failure(code)),
                    None if entry.event_id().is_some() => Ok(()),
                    None => Err(entry_failure("no error code")),
                },
            })
            .collect())
    }

    async fn publish_to_topic(&self, topic_arn: &str, messages: &[Message<'_>]) -> Answers {
        let fifo = topic_arn.ends_with(".fifo");
        let requested = entries!(
            aws_sdk_sns,
            PublishBatchRequestEntry,
            message,
            messages,
            fifo
        );
        let published = self
            .sns
            .publish_batch()
            .topic_arn(topic_arn)
            .set_publish_batch_request_entries(Some(requested))
            .send()
            .await
            .map_err(sdk_failure)?;
        let accepted = published.successful().iter().filter_map(|ok| ok.id());
        let failed = published
            .failed()
            .iter()
            .map(|failed| (failed.id(), failed.code(), failed.sender_fault()));
        Ok(per_entry(messages.len(), accepted, failed))
    }

    async fn send_to_queue(&self, queue_url: &str, messages: &[Message<'_>]) -> Answers {
        let fifo = queue_url.ends_with(".fifo");
        let requested = entries!(
            aws_sdk_sqs,
            SendMessageBatchRequestEntry,
            message_body,
            messages,
            fifo
        );
        let sent = self
            .sqs
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(requested))
            .send()
            .await
            .map_err(sdk_failure)?;
        let accepted = sent.successful().iter().map(|ok| ok.id());
        let failed = sent
            .failed()
            .iter()
            .map(|failed| (failed.id(), failed.code(), failed.sender_fault()));
        Ok(per_entry(messages.len(), accepted, failed))
    }
}

/// The answers of a batch whose entries were named `0`, `1`, …: the `accepted` ids, the
/// `failed` ones with their code and whether the sender is at fault (a refusal only then);
/// an entry named in neither failed.
fn per_entry<'a>(
    count: usize,
    accepted: impl Iterator<Item = &'a str>,
    failed: impl Iterator<Item = (&'a str, &'a str, bool)>,
) -> Vec<Result<(), PublishError>> {
    let mut answers: Vec<Option<Result<(), PublishError>>> = (0..count).map(|_| None).collect();
    let mut answer = |id: &str, result: Result<(), PublishError>| {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|n| answers.get_mut(n)) {
            *slot = Some(result);
        }
    };
    for id in accepted {
        answer(id, Ok(()));
    }
    for (id, code, sender_fault) in failed {
        let result = if sender_fault && REFUSALS.contains(&code) {
            PublishError::Refused {
                reason: format!("the destination refused the entry: {code}"),
            }
        } else {
            PublishError::failed(format!("the destination failed the entry: {code}"))
        };
        answer(id, Err(result));
    }
    answers
        .into_iter()
        .map(|answer| {
            answer
                .unwrap_or_else(|| Err(PublishError::failed("the batch did not answer the entry")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{PublishError, entry_failure, per_entry};

    #[test]
    fn each_entry_is_answered_and_only_a_sender_refusal_parks() {
        let answers = per_entry(
            4,
            ["0"].into_iter(),
            [
                ("1", "InvalidParameterValue", true),
                ("2", "InternalError", false),
            ]
            .into_iter(),
        );
        assert!(answers[0].is_ok());
        assert!(matches!(answers[1], Err(PublishError::Refused { .. })));
        assert!(matches!(answers[2], Err(PublishError::Failed { .. })));
        assert!(
            matches!(answers[3], Err(PublishError::Failed { .. })),
            "an entry in neither list is published again"
        );
    }

    #[test]
    fn only_a_malformed_entry_is_refused_and_everything_else_retried() {
        for retried in [
            "ThrottlingException",
            "InternalFailure",
            "AccessDeniedException",
            "NotAuthorizedForSourceException",
            "InvalidAccountIdException",
            "no error code",
        ] {
            assert!(
                matches!(entry_failure(retried), PublishError::Failed { .. }),
                "{retried}"
            );
        }
        for refused in ["MalformedDetail", "ValidationException", "InvalidArgument"] {
            assert!(
                matches!(entry_failure(refused), PublishError::Refused { .. }),
                "{refused}"
            );
        }
    }
}
