//! Which records of a batch run in order, one at a time: those that share an ordering group,
//! an operation key or a business identity.

use std::collections::HashMap;

use super::BatchRecord;
use crate::error::Error;
use crate::execution::Invocation;

/// A record with its place in the batch and its operation (or why it has none).
pub(super) struct Prepared<R> {
    pub(super) index: usize,
    /// The names of what it runs in order with ([`joins`]).
    pub(super) joins: Vec<String>,
    pub(super) record: R,
    pub(super) invocation: Result<Invocation, Error>,
}

/// The prefix of a join by business identity (which orders, and stops nothing).
pub(super) const IDENTITY: &str = "identity:";

/// What a record runs in order with: its ordering group (a FIFO message group, a shard's
/// partition key), its operation key, and its business identity's evidence (two keys of one
/// identity: the second meets the first's evidence settled, not in progress).
pub(super) fn joins<R: BatchRecord>(
    record: &R,
    invocation: &Result<Invocation, Error>,
) -> Vec<String> {
    let group = record
        .ordering_group()
        .map(|group| format!("group:{group}"));
    let Ok(invocation) = invocation else {
        return group.into_iter().collect();
    };
    let key = format!("key:{}", invocation.key());
    let identity = invocation
        .evidence_key()
        .map(|evidence| format!("{IDENTITY}{evidence}"));
    group.into_iter().chain([key]).chain(identity).collect()
}

/// Splits records into groups run one at a time, each in batch order: records that share an
/// ordering group, an operation key or a business identity are in one group (two FIFO message groups that carry one
/// key run one after the other, so that the second is a replay rather than in progress); a
/// record with neither stands alone. Groups come in order of their first record.
pub(super) fn group_in_order<R: BatchRecord>(
    records: impl Iterator<Item = Prepared<R>>,
) -> Vec<Vec<Prepared<R>>> {
    let records: Vec<Prepared<R>> = records.collect();
    // Each set's root is its first record: a union links the later root to the earlier.
    let mut parent: Vec<usize> = (0..records.len()).collect();
    let mut first_with: HashMap<&str, usize> = HashMap::new();
    for (at, prepared) in records.iter().enumerate() {
        for name in &prepared.joins {
            match first_with.get(name.as_str()) {
                Some(&first) => {
                    let (a, b) = (root(&mut parent, first), root(&mut parent, at));
                    parent[a.max(b)] = a.min(b);
                }
                None => {
                    first_with.insert(name, at);
                }
            }
        }
    }
    let roots: Vec<usize> = (0..records.len()).map(|at| root(&mut parent, at)).collect();
    let mut groups: Vec<Vec<Prepared<R>>> = Vec::new();
    let mut slot_of: HashMap<usize, usize> = HashMap::new();
    for (prepared, root) in records.into_iter().zip(roots) {
        match slot_of.get(&root) {
            Some(&slot) => groups[slot].push(prepared),
            None => {
                slot_of.insert(root, groups.len());
                groups.push(vec![prepared]);
            }
        }
    }
    groups
}

/// The first record of the set `at` is in, halving the path on the way.
fn root(parent: &mut [usize], mut at: usize) -> usize {
    while parent[at] != at {
        parent[at] = parent[parent[at]];
        at = parent[at];
    }
    at
}
