//! A DynamoDB Stream read as an event source mapping reads it (ListStreams, DescribeStream,
//! GetShardIterator from the trim horizon, GetRecords to the end), its records shaped as the
//! Lambda event delivers them. Shared by the relay's tests, the effects bench and the demo.

use std::collections::HashMap;

use aws_sdk_dynamodbstreams::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodbstreams::types::{AttributeValue, ShardIteratorType};
use serde_json::{Value, json};

/// Every record `table`'s stream holds on `endpoint`, as Lambda event records.
///
/// # Errors
/// When the stream cannot be read, or holds an attribute the outbox does not write.
pub async fn stream_records(
    endpoint: &str,
    table: &str,
) -> Result<Vec<Value>, lambda_idempotency::BoxError> {
    let streams = aws_sdk_dynamodbstreams::Client::from_conf(
        aws_sdk_dynamodbstreams::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "static"))
            .build(),
    );
    let listed = streams.list_streams().table_name(table).send().await?;
    let arn = listed
        .streams()
        .first()
        .and_then(|stream| stream.stream_arn())
        .ok_or("the table has no stream")?
        .to_owned();
    let described = streams.describe_stream().stream_arn(&arn).send().await?;
    let mut records = Vec::new();
    for shard in described
        .stream_description()
        .map(|description| description.shards())
        .unwrap_or_default()
    {
        let Some(shard_id) = shard.shard_id() else {
            continue;
        };
        let mut iterator = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await?
            .shard_iterator()
            .map(str::to_owned);
        while let Some(current) = iterator {
            let page = streams.get_records().shard_iterator(current).send().await?;
            if page.records().is_empty() {
                break;
            }
            for record in page.records() {
                let change = record.dynamodb().ok_or("a record without its change")?;
                records.push(json!({
                    "eventID": record.event_id(),
                    "eventName": record.event_name().map(|name| name.as_str()),
                    "eventSource": "aws:dynamodb",
                    "eventVersion": "1.1",
                    "awsRegion": "us-east-1",
                    "eventSourceARN": arn,
                    "dynamodb": {
                        "Keys": image(change.keys())?,
                        "NewImage": image(change.new_image())?,
                        "SequenceNumber": change.sequence_number(),
                        "SizeBytes": change.size_bytes(),
                        "StreamViewType": "NEW_IMAGE",
                    },
                }));
            }
            iterator = page.next_shard_iterator().map(str::to_owned);
        }
    }
    Ok(records)
}

/// A stream image as the Lambda event's DynamoDB JSON.
fn image(
    image: Option<&HashMap<String, AttributeValue>>,
) -> Result<Value, lambda_idempotency::BoxError> {
    let mut fields = serde_json::Map::new();
    for (name, value) in image.into_iter().flatten() {
        fields.insert(name.clone(), attribute(value)?);
    }
    Ok(Value::Object(fields))
}

fn attribute(value: &AttributeValue) -> Result<Value, lambda_idempotency::BoxError> {
    Ok(match value {
        AttributeValue::S(text) => json!({"S": text}),
        AttributeValue::N(number) => json!({"N": number}),
        AttributeValue::Bool(flag) => json!({"BOOL": flag}),
        AttributeValue::Null(_) => json!({"NULL": true}),
        AttributeValue::M(fields) => json!({"M": image(Some(fields))?}),
        AttributeValue::L(values) => {
            let values: Result<Vec<_>, _> = values.iter().map(attribute).collect();
            json!({"L": values?})
        }
        other => return Err(format!("an attribute the outbox does not write: {other:?}").into()),
    })
}
