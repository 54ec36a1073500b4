//! A record's result as the batch door keeps it: stored on the first run, never read back. A
//! batch answers only which records to deliver again, so a replay decodes nothing, and a
//! deploy that changes the handler's output type still acknowledges the records an earlier
//! build completed (decoding them into the new type would fail them, and a redrive from the
//! dead-letter queue after their retention would run them again).

use serde::de::{Deserialize, Deserializer, IgnoredAny};
use serde::{Serialize, Serializer};

/// The handler's fresh result, or a stored one left undecoded.
pub(super) enum Discarded<T> {
    /// What the handler returned: stored as it serializes.
    Fresh(T),
    /// A stored result, not decoded.
    Stored,
}

impl<T: Serialize> Serialize for Discarded<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fresh(value) => value.serialize(serializer),
            // Never stored: the engine stores only what a handler returned.
            Self::Stored => serializer.serialize_unit(),
        }
    }
}

impl<'de, T> Deserialize<'de> for Discarded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer).map(|_| Self::Stored)
    }
}

#[cfg(test)]
mod tests {
    use super::Discarded;

    #[test]
    fn a_fresh_result_is_stored_as_the_handler_wrote_it_and_any_stored_one_reads() {
        let fresh = serde_json::to_string(&Discarded::Fresh(vec!["a", "b"])).ok();
        assert_eq!(fresh.as_deref(), Some(r#"["a","b"]"#));
        for stored in [r#""a string""#, r#"{"placed":7}"#, "null", "[1,2]"] {
            let read = serde_json::from_str::<Discarded<u64>>(stored);
            assert!(matches!(read, Ok(Discarded::Stored)), "{stored}");
        }
    }
}
