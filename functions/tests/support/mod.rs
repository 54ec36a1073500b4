//! What the end-to-end tests and the cold-start benchmark share.

pub mod function;
pub mod recorder;
pub mod runtime_api;
