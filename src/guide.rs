//! The guide: what the README leaves out, one page per concern. The pages live in
//! `docs/guide/` (readable on GitHub too) and their examples compile as doctests.

#[doc = include_str!("../docs/guide/doors.md")]
pub mod doors {}

#[doc = include_str!("../docs/guide/protocol.md")]
pub mod protocol {}

#[doc = include_str!("../docs/guide/retention_and_failures.md")]
pub mod retention_and_failures {}

#[doc = include_str!("../docs/guide/effects.md")]
pub mod effects {}

#[doc = include_str!("../docs/guide/operations.md")]
pub mod operations {}

#[doc = include_str!("../docs/guide/scale.md")]
pub mod scale {}

#[doc = include_str!("../docs/guide/troubleshooting.md")]
pub mod troubleshooting {}

#[cfg(feature = "durable")]
#[doc = include_str!("../docs/guide/durable_functions.md")]
pub mod durable_functions {}

#[doc = include_str!("../docs/guide/managed_instances.md")]
pub mod managed_instances {}

#[doc = include_str!("../docs/guide/powertools.md")]
pub mod powertools {}

#[doc = include_str!("../docs/guide/configuration.md")]
pub mod configuration {}

#[doc = include_str!("../docs/guide/deploy.md")]
pub mod deploy {}

#[doc = include_str!("../docs/guide/local_development.md")]
pub mod local_development {}
