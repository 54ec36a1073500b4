//! Whether a result can be replayed: checked before it is stored, since a stored result that
//! cannot be read back would fail every duplicate instead of answering it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::error::decode_failure;

/// The nesting depth serde_json refuses to read (its recursion limit): a result that deep is
/// written but could never be replayed, so it is refused before it is written.
const MAX_READABLE_DEPTH: usize = 128;

/// `value` as JSON, once it is known to replay: it serializes, nests less than JSON readers
/// allow, and reads back as its own type (a NaN serializes as `null`, which no float reads; a
/// field skipped when written may be required when read). Else why `what` (the handler's
/// result, a step's) could never be replayed. JSON over `limit` bytes is given back unread:
/// the caller refuses it as too large, without a second copy of the value in memory.
pub(crate) fn replayable<T: Serialize + DeserializeOwned>(
    what: &str,
    value: &T,
    limit: usize,
) -> Result<Box<RawValue>, String> {
    let raw = serde_json::value::to_raw_value(value)
        .map_err(|err| format!("{what} does not serialize to JSON: {err}"))?;
    if raw.get().len() > limit {
        return Ok(raw);
    }
    if nesting_depth(raw.get()) >= MAX_READABLE_DEPTH {
        return Err(format!(
            "{what} nests {MAX_READABLE_DEPTH} levels or deeper, which JSON readers refuse: it could never be replayed"
        ));
    }
    match serde_json::from_str::<T>(raw.get()) {
        Ok(_) => Ok(raw),
        Err(err) => Err(format!(
            "{what} does not read back as its own type ({}): it could never be replayed; make its Serialize and Deserialize agree (no NaN or infinite float, a serde default for each field skipped when serialized)",
            decode_failure(&err)
        )),
    }
}

/// How deep arrays and objects nest in the JSON text `json`.
fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0_usize, 0, false, false);
    for byte in json.bytes() {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            (false, _, _) => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::{MAX_READABLE_DEPTH, nesting_depth, replayable};

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_depth_refused_is_the_depth_serde_json_cannot_read() {
        assert_eq!(nesting_depth(r#"{"a":["[{\"",{"b":1}]}"#), 3);
        assert_eq!(nesting_depth("1"), 0);
        let readable = nested(MAX_READABLE_DEPTH - 1);
        assert_eq!(nesting_depth(&readable), MAX_READABLE_DEPTH - 1);
        assert!(serde_json::from_str::<serde_json::Value>(&readable).is_ok());
        let unreadable = nested(MAX_READABLE_DEPTH);
        assert_eq!(nesting_depth(&unreadable), MAX_READABLE_DEPTH);
        assert!(serde_json::from_str::<serde_json::Value>(&unreadable).is_err());
    }

    #[derive(Serialize, Deserialize)]
    struct Skipping {
        #[serde(skip_serializing_if = "String::is_empty")]
        note: String,
    }

    const LIMIT: usize = 1024;

    /// A result whose JSON its own type cannot read is refused; one that reads back is kept
    /// as it serialized; one past the limit is given back unread, for the caller to refuse.
    #[test]
    fn a_result_that_does_not_read_back_as_its_type_is_refused() {
        let skipped = Skipping {
            note: String::new(),
        };
        assert!(replayable("r", &f64::NAN, LIMIT).is_err());
        assert!(replayable("r", &f64::INFINITY, LIMIT).is_err());
        assert!(replayable("r", &skipped, LIMIT).is_err());
        let kept = Skipping { note: "n".into() };
        let kept = replayable("r", &kept, LIMIT).map(|raw| raw.get().to_owned());
        assert_eq!(kept.as_deref(), Ok(r#"{"note":"n"}"#));
        let unread = replayable("r", &f64::NAN, 3).map(|raw| raw.get().to_owned());
        assert_eq!(
            unread.as_deref(),
            Ok("null"),
            "4 bytes: past the limit, not read"
        );
    }
}
