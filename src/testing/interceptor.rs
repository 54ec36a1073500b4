//! A fault-injecting interceptor for the DynamoDB client (work in progress).
