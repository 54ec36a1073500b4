//! Faults injected into the DynamoDB client's requests (work in progress).
