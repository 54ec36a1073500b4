//! The outbox table's sparse index of pending events and its partitions: where an event
//! waits until something publishes it ([`super::outbox`] writes it there, the marks move it).

use super::outbox::id_digest;

/// The outbox table's sparse global secondary index of pending and parked events: partition
/// key `pending` (S), sort key `created_at` (N), all attributes projected. Only items carrying
/// `pending` are in it, so reading it costs what is pending.
pub const PENDING_INDEX: &str = "pending";

/// The `pending` value of a parked event (its destination refused it, or failed every publish
/// of the sweeper's tries).
pub const PARKED: &str = "parked";

/// The `pending` values of pending events: the event id's first hex digit after a `p`, so that
/// the index's writes spread over sixteen partitions.
pub const PENDING_SHARDS: [&str; 16] = [
    "p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "pa", "pb", "pc", "pd", "pe", "pf",
];

/// The `pending` values of pending events a sweep failed to publish (`r` and the same digit):
/// apart from [`PENDING_SHARDS`], so that events whose destination keeps failing never stand
/// before the ones no sweep has tried yet.
pub(crate) const RETRY_SHARDS: [&str; 16] = [
    "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "ra", "rb", "rc", "rd", "re", "rf",
];

/// The `pending` shard of event `id` (by its digest's first hex digit).
pub(crate) fn pending_shard(id: &str) -> &'static str {
    PENDING_SHARDS[shard_digit(id)]
}

/// The retry shard of event `id`: its [`pending_shard`]'s digit.
#[cfg(feature = "relay")]
pub(crate) fn retry_shard(id: &str) -> &'static str {
    RETRY_SHARDS[shard_digit(id)]
}

fn shard_digit(id: &str) -> usize {
    let digit = id_digest(id)
        .chars()
        .next()
        .and_then(|first| first.to_digit(16))
        .unwrap_or(0);
    digit as usize % PENDING_SHARDS.len()
}
