//! Shared test support: the DynamoDB-compatible endpoint and the conformance suite.

pub mod conformance;
pub mod durability;
pub mod dynamo;
// Shared with the examples, which use the parts the tests do not (`sdk_config`).
#[allow(dead_code)]
#[path = "../../../examples/support/local_dynamodb.rs"]
pub mod local_dynamodb;
