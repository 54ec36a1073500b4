//! Shared test support: the DynamoDB-compatible endpoint and the conformance suite.

pub mod conformance;
pub mod dynamo;
