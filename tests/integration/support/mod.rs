//! Test support that only this suite uses; what any store can share lives in
//! `lambda_idempotency::testing`.

pub mod runtime_api;

#[path = "../../../examples/support/ledger.rs"]
pub mod ledger;
