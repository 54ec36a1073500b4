//! Shared test support: the DynamoDB-compatible endpoint and the conformance suite.

pub mod conformance;
pub mod durability;
pub mod dynamo;
#[path = "../../../examples/support/local_dynamodb.rs"]
pub mod local_dynamodb;
pub mod runtime_api;

#[path = "../../../examples/support/ledger.rs"]
pub mod ledger;
