//! An operation's steps as one list attribute of its record ([`crate::effects`]).
//!
//! | step field | meaning |
//! |---|---|
//! | `name` (S) | the step's name |
//! | `attempt` (N) | the attempt that recorded its intent |
//! | `result` (B) | the serialized result, once recorded (absent: the intent alone) |
//! | `codec` (S) | `zstd` when `result` holds compressed bytes |
//! | `length` (N) | the result's length after decompression, when compressed |
//!
//! A list is read within the bounds every writer keeps: at most [`MAX_STEPS`] steps (and the
//! engine's two marks, [`MAX_STEP_ENTRIES`] entries), their results together at most
//! [`MAX_STEP_RESULTS_BYTES`] once decompressed. A list past either bound, or a result that
//! would decompress past what is left of the budget (a compression bomb), is a corrupt record,
//! refused without the memory it would take.
//!
//! The whole list is written by each fenced step write: only the lease holder writes it, and
//! DynamoDB bills a write by the item's size, not the update's. Each write also counts itself in
//! the record's `steps_version` (N): a takeover is conditioned on that count, the list's
//! length and each pending step's attempt, never on the list's bytes (another build, another
//! zstd, a new step field would encode the same steps otherwise, and the takeover would never
//! succeed).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::item::{AttributeNames, b, corrupt, n, s};
use super::outcome::{Inflate, decompress_within};
use super::writes::Expr;
use crate::error::StoreError;
use crate::key::OperationKey;
use crate::record::{MAX_STEP_RESULTS_BYTES, MAX_STEPS, Record, StepRecord};

/// Results longer than this are compressed when that makes them shorter.
const COMPRESS_OVER: usize = 1024;
/// zstd's default level, as for outcomes.
const ZSTD_LEVEL: i32 = 3;
/// The one codec written.
const ZSTD: &str = "zstd";

/// The most entries a step list holds: [`MAX_STEPS`] steps, an adoption's mark
/// ([`StepRecord::steps_lost`]) and a give-back's ([`StepRecord::given_back`]).
pub(crate) const MAX_STEP_ENTRIES: usize = MAX_STEPS + 2;

/// Pending steps (an intent without a result) a takeover's condition names one by one, at most:
/// DynamoDB caps an expression at 4 KB, and 24 of them take about 2.4 KB of it (the rest of
/// the takeover's condition about 0.3 KB). Past it the list's write count and length still hold.
const PENDING_CHECKED: usize = 24;

/// A takeover's condition before [`steps_as_read`]'s: the expired lease of the holder it read.
pub(crate) const TAKEOVER_OF_EXPIRED: &str =
    "#status = :in_progress AND #lease_token = :previous AND #lease_expires_at < :now_ms";

/// The longest expression DynamoDB takes, in bytes.
#[cfg(test)]
const MAX_EXPRESSION_BYTES: usize = 4096;

/// The update clause that counts one more write of the step list (with [`bump_steps_version`]).
pub(crate) const STEPS_VERSION_BUMP: &str =
    "#steps_version = if_not_exists(#steps_version, :steps_version_zero) + :steps_version_one";

/// The names and values [`STEPS_VERSION_BUMP`] uses.
pub(crate) fn bump_steps_version(expr: Expr, names: &AttributeNames) -> Expr {
    expr.name("#steps_version", &names.steps_version)
        .value(":steps_version_zero", n(0))
        .value(":steps_version_one", n(1))
}

/// The condition that `previous`'s step list stands as it was read, and its names and values:
/// the same write count (none, for a list a version before 0.5 wrote), the same length, and
/// each pending step still pending under the same name and attempt (which also catches a version before
/// 0.5 recording a result during a rolling deploy, as it does not count its writes).
pub(crate) fn steps_as_read(previous: &Record, names: &AttributeNames) -> (String, Expr) {
    if crate::defects::is_reintroduced(crate::defects::TAKEOVER_ON_REENCODED_BYTES)
        && !previous.steps.is_empty()
    {
        let expr = Expr::default()
            .name("#steps", &names.steps)
            .value(":steps_as_read", steps_value(&previous.steps));
        return ("#steps = :steps_as_read".to_owned(), expr);
    }
    list_as_read(
        &previous.steps,
        previous.steps_version,
        names,
        Expr::default(),
    )
}

/// [`steps_as_read`] of a list of `steps` written `version` times, its names and values
/// added to `expr`.
pub(crate) fn list_as_read(
    steps: &[StepRecord],
    version: u64,
    names: &AttributeNames,
    expr: Expr,
) -> (String, Expr) {
    let mut expr = expr
        .name("#steps", &names.steps)
        .name("#steps_version", &names.steps_version)
        .value(":steps_count", n(steps.len() as u64));
    let mut condition = match version {
        0 => "attribute_not_exists(#steps_version)".to_owned(),
        version => {
            expr = expr.value(":steps_version", n(version));
            "#steps_version = :steps_version".to_owned()
        }
    };
    condition.push_str(match steps.is_empty() {
        true => " AND (attribute_not_exists(#steps) OR size(#steps) = :steps_count)",
        false => " AND size(#steps) = :steps_count",
    });
    // The latest pending steps first: the ones a late write is likeliest to change.
    let pending = steps
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, step)| step.result.is_none())
        .take(PENDING_CHECKED);
    for (index, step) in pending {
        condition.push_str(&format!(
            " AND #steps[{index}].#sn = :sn{index} AND #steps[{index}].#sa = :sa{index} \
             AND attribute_not_exists(#steps[{index}].#sr)"
        ));
        expr = expr
            .value(&format!(":sn{index}"), s(&step.name))
            .value(&format!(":sa{index}"), n(u64::from(step.attempt)));
    }
    if steps.iter().any(|step| step.result.is_none()) {
        expr = expr
            .name("#sn", "name")
            .name("#sa", "attempt")
            .name("#sr", "result");
    }
    (condition, expr)
}

/// The list attribute of `steps`.
pub(crate) fn steps_value(steps: &[StepRecord]) -> AttributeValue {
    AttributeValue::L(steps.iter().map(step_value).collect())
}

fn step_value(step: &StepRecord) -> AttributeValue {
    let mut fields = HashMap::from([
        ("name".to_owned(), s(&step.name)),
        ("attempt".to_owned(), n(u64::from(step.attempt))),
    ]);
    if let Some(result) = &step.result {
        let compressed = (result.len() > COMPRESS_OVER)
            .then(|| zstd::bulk::compress(result, ZSTD_LEVEL).ok())
            .flatten()
            .filter(|compressed| compressed.len() < result.len());
        match compressed {
            Some(compressed) => {
                fields.insert("result".to_owned(), b(&compressed));
                fields.insert("codec".to_owned(), s(ZSTD));
                fields.insert("length".to_owned(), n(result.len() as u64));
            }
            None => {
                fields.insert("result".to_owned(), b(result));
            }
        }
    }
    AttributeValue::M(fields)
}

/// The steps in the list attribute `value` of `key`'s record: at most [`MAX_STEP_ENTRIES`]
/// entries whose results take at most [`MAX_STEP_RESULTS_BYTES`] together, decompressed within
/// what is left of that budget; anything else is a corrupt record.
pub(crate) fn read_steps(
    value: &AttributeValue,
    key: &OperationKey,
) -> Result<Vec<StepRecord>, StoreError> {
    let bad = |reason: &str| corrupt(key.short(), format!("a step record {reason}"));
    let list = value.as_l().map_err(|_| bad("list is not a list"))?;
    if list.len() > MAX_STEP_ENTRIES {
        return Err(corrupt(
            key.short(),
            format!(
                "the step list has {} entries, more than {MAX_STEP_ENTRIES}",
                list.len()
            ),
        ));
    }
    // What the results may still take, decompressed.
    let mut budget = MAX_STEP_RESULTS_BYTES;
    let mut steps = Vec::with_capacity(list.len());
    for value in list {
        let fields = value.as_m().map_err(|_| bad("is not a map"))?;
        let name = fields
            .get("name")
            .and_then(|name| name.as_s().ok())
            .ok_or_else(|| bad("has no name"))?;
        let attempt = fields
            .get("attempt")
            .and_then(|attempt| attempt.as_n().ok())
            .and_then(|attempt| attempt.parse().ok())
            .ok_or_else(|| bad("has no attempt"))?;
        let stored = fields
            .get("result")
            .map(|result| result.as_b().map(|blob| blob.as_ref()))
            .transpose()
            .map_err(|_| bad("result is not binary"))?;
        let past_budget = || bad("results take more than the steps' budget");
        let result = match (stored, fields.get("codec")) {
            (Some(stored), Some(codec)) => {
                if codec.as_s().map(String::as_str) != Ok(ZSTD) {
                    return Err(bad("names an unknown codec"));
                }
                let length = fields
                    .get("length")
                    .and_then(|length| length.as_n().ok())
                    .and_then(|length| length.parse::<usize>().ok())
                    .ok_or_else(|| bad("has no length"))?;
                if length > budget {
                    return Err(past_budget());
                }
                let restored = decompress_within(stored, length).map_err(|err| match err {
                    Inflate::OverLimit { .. } => bad("result expands past its recorded length"),
                    _ => bad("result does not decompress"),
                })?;
                if restored.len() != length {
                    return Err(bad("result has another length than recorded"));
                }
                Some(restored)
            }
            (Some(stored), None) if stored.len() > budget => return Err(past_budget()),
            (stored, None) => stored.map(<[u8]>::to_vec),
            (None, Some(_)) => return Err(bad("names a codec but has no result")),
        };
        budget -= result.as_ref().map_or(0, Vec::len);
        steps.push(StepRecord {
            name: name.clone(),
            attempt,
            result,
        });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A takeover's condition fits DynamoDB's 4 KB expressions for every list a writer keeps:
    /// all its entries pending, at its highest indexes, under the longest write count. 32
    /// pending steps named one by one took 4.6 KB, which DynamoDB refuses: no takeover.
    #[test]
    fn a_takeovers_condition_fits_an_expression_whatever_is_pending() {
        let names = AttributeNames::default();
        let takeover = format!("{TAKEOVER_OF_EXPIRED} AND ");
        for pending in [1, PENDING_CHECKED, MAX_STEP_ENTRIES] {
            let steps: Vec<StepRecord> = (0..MAX_STEP_ENTRIES)
                .map(|index| match index + pending >= MAX_STEP_ENTRIES {
                    true => StepRecord::intent(format!("step-{index}"), u32::MAX),
                    false => StepRecord {
                        name: format!("step-{index}"),
                        attempt: 1,
                        result: Some(b"{}".to_vec()),
                    },
                })
                .collect();
            let (condition, _) = list_as_read(&steps, u64::MAX, &names, Expr::default());
            let bytes = takeover.len() + condition.len();
            assert!(
                bytes <= MAX_EXPRESSION_BYTES,
                "{pending} pending: {bytes} bytes"
            );
        }
    }

    /// A step list reads back as written, a large result compressed and restored exactly.
    #[test]
    fn steps_read_back_as_written() -> Result<(), StoreError> {
        let key = OperationKey::from_stored("shop.charge#abc");
        let large = br#"{"lines":""#.repeat(400);
        let steps = vec![
            StepRecord {
                name: "charge".into(),
                attempt: 1,
                result: Some(br#"{"id":"ch_1"}"#.to_vec()),
            },
            StepRecord {
                name: "receipt".into(),
                attempt: 2,
                result: Some(large.clone()),
            },
            StepRecord::intent("email", 2),
        ];
        let value = steps_value(&steps);
        let stored = value.as_l().map_err(|_| bad_value())?;
        let receipt = stored[1].as_m().map_err(|_| bad_value())?;
        assert_eq!(receipt.get("codec"), Some(&s(ZSTD)));
        assert!(
            receipt["result"]
                .as_b()
                .map_err(|_| bad_value())?
                .as_ref()
                .len()
                < large.len()
        );
        assert_eq!(read_steps(&value, &key)?, steps);
        Ok(())
    }

    /// A list longer than any writer keeps is refused before any result is read.
    #[test]
    fn a_list_past_the_step_limit_is_corrupt() {
        let key = OperationKey::from_stored("shop.charge#abc");
        let steps: Vec<StepRecord> = (0..=MAX_STEP_ENTRIES)
            .map(|index| StepRecord::intent(format!("s{index}"), 1))
            .collect();
        let read = read_steps(&steps_value(&steps), &key);
        assert!(
            matches!(&read, Err(StoreError::CorruptRecord { reason, .. }) if reason.contains("entries")),
            "{read:?}"
        );
        let most = &steps[..MAX_STEP_ENTRIES];
        assert_eq!(
            read_steps(&steps_value(most), &key).ok().as_deref(),
            Some(most)
        );
    }

    /// Results that decompress past the steps' budget together (each within it: a bomb
    /// repeated in one list) are a corrupt record, not gigabytes.
    #[test]
    fn results_past_the_budget_together_are_corrupt() -> Result<(), StoreError> {
        let key = OperationKey::from_stored("shop.charge#abc");
        let zeros = vec![0u8; MAX_STEP_RESULTS_BYTES / 2 + 1];
        let bomb = zstd::bulk::compress(&zeros, 3).map_err(|_| bad_value())?;
        let step = |name: &str| {
            AttributeValue::M(HashMap::from([
                ("name".to_owned(), s(name)),
                ("attempt".to_owned(), n(1)),
                ("result".to_owned(), b(&bomb)),
                ("codec".to_owned(), s(ZSTD)),
                ("length".to_owned(), n(zeros.len() as u64)),
            ]))
        };
        let one = AttributeValue::L(vec![step("a")]);
        assert_eq!(
            read_steps(&one, &key)?[0].result.as_deref(),
            Some(&zeros[..])
        );
        let two = AttributeValue::L(vec![step("a"), step("b")]);
        let read = read_steps(&two, &key);
        assert!(
            matches!(&read, Err(StoreError::CorruptRecord { reason, .. }) if reason.contains("budget")),
            "{read:?}"
        );
        // A result whose recorded length understates what it expands to is refused at its
        // length, not at the budget.
        let lying = AttributeValue::L(vec![AttributeValue::M(HashMap::from([
            ("name".to_owned(), s("a")),
            ("attempt".to_owned(), n(1)),
            ("result".to_owned(), b(&bomb)),
            ("codec".to_owned(), s(ZSTD)),
            ("length".to_owned(), n(10)),
        ]))]);
        assert!(matches!(
            read_steps(&lying, &key),
            Err(StoreError::CorruptRecord { .. })
        ));
        Ok(())
    }

    fn bad_value() -> StoreError {
        corrupt("test", "not the attribute written".into())
    }
}
