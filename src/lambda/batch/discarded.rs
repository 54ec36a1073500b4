//! A record's result as the batch door keeps it: stored on the first run, never decoded into
//! the handler's type again. A batch answers only which records to deliver again, so a deploy
//! that changes the handler's output type still acknowledges the records an earlier build
//! completed (decoding them into the new type would fail them, and a redrive from the
//! dead-letter queue after their retention would run them again).

use serde::de::{Deserialize, Deserializer};
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// The handler's fresh result, or one read as JSON: a stored result, or one given in the
/// handler's place (a reconciler's `Applied` value, stored as given).
pub(super) enum Discarded<T> {
    /// What the handler returned: stored as it serializes.
    Fresh(T),
    /// A result read as JSON text, kept as it is (any depth, any number).
    Read(Box<RawValue>),
}

impl<T: Serialize> Serialize for Discarded<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fresh(value) => value.serialize(serializer),
            Self::Read(value) => value.serialize(serializer),
        }
    }
}

impl<'de, T> Deserialize<'de> for Discarded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self::Read)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Discarded;

    #[test]
    fn a_fresh_result_is_stored_as_the_handler_wrote_it_and_any_read_one_as_read() {
        let fresh = serde_json::to_string(&Discarded::Fresh(vec!["a", "b"])).ok();
        assert_eq!(fresh.as_deref(), Some(r#"["a","b"]"#));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for stored in [
            r#""a string""#,
            r#"{"placed":7}"#,
            "null",
            "[1,2]",
            "1e400",
            &deep,
        ] {
            let read = serde_json::from_str::<Discarded<u64>>(stored);
            assert!(matches!(read, Ok(Discarded::Read(_))), "{stored}");
        }
        // A reconciler's value, given as JSON, is stored as given.
        let given = serde_json::from_value::<Discarded<u64>>(json!({"charge": "ch_1"}));
        let stored = given
            .ok()
            .and_then(|given| serde_json::to_string(&given).ok());
        assert_eq!(stored.as_deref(), Some(r#"{"charge":"ch_1"}"#));
    }
}
