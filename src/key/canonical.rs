//! Canonical JSON: RFC 8785, except that every integer is written exactly.
//!
//! RFC 8785 reads every number as an IEEE-754 double, so two integers that differ above 2^53
//! (snowflake ids, `u64` sequence numbers, DynamoDB `N` values) would be written alike and
//! derive one operation key. Here an integer that `serde_json` holds as an `i64` or a `u64`
//! is written as its exact decimal digits; everything else (strings, literals, fractions,
//! exponents, integers beyond `u64`, which `serde_json` holds as doubles) is written as
//! RFC 8785 writes it, and object members are sorted by their UTF-16 code units as it says.
//! For a document whose integers all lie within ±2^53 (or are doubles exactly) the output is
//! RFC 8785's, byte for byte.

use serde_json::{Number, Value};

use super::invalid_event;
use crate::error::Error;

/// A document's canonical form, and whether RFC 8785 alone would have written it otherwise
/// (it holds an integer past ±2^53 whose digits RFC 8785 does not keep).
pub(super) struct Canonical {
    /// The canonical bytes.
    pub(super) bytes: Vec<u8>,
    /// Whether an integer was written whose digits RFC 8785 would have changed.
    pub(super) differs_from_rfc8785: bool,
}

/// The canonical form of `value`.
pub(super) fn canonicalize(value: &Value) -> Result<Canonical, Error> {
    let mut canonical = Canonical {
        bytes: Vec::with_capacity(128),
        differs_from_rfc8785: false,
    };
    write(value, &mut canonical)?;
    Ok(canonical)
}

/// RFC 8785 alone, as versions before 0.2 wrote every document (integers read as doubles).
pub(super) fn rfc8785(value: &Value) -> Result<Vec<u8>, Error> {
    serde_json_canonicalizer::to_vec(value).map_err(invalid_event)
}

fn write(value: &Value, out: &mut Canonical) -> Result<(), Error> {
    match value {
        Value::Number(number) if number.is_i64() || number.is_u64() => {
            // Written from the integer, not from `Number`'s text: with serde_json's
            // `arbitrary_precision` a number keeps the digits it was read with (`-0`), and one
            // build's canonical form must be every build's.
            let exact = match (number.as_u64(), number.as_i64()) {
                (Some(unsigned), _) => unsigned.to_string(),
                (None, Some(signed)) => signed.to_string(),
                (None, None) => number.to_string(),
            };
            if !within_doubles_integers(number) {
                out.differs_from_rfc8785 |= rfc8785(value)? != exact.as_bytes();
            }
            out.bytes.extend_from_slice(exact.as_bytes());
        }
        Value::Array(items) => {
            out.bytes.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.bytes.push(b',');
                }
                write(item, out)?;
            }
            out.bytes.push(b']');
        }
        Value::Object(fields) => {
            let mut members: Vec<(&String, &Value)> = fields.iter().collect();
            members.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.bytes.push(b'{');
            for (index, (name, member)) in members.into_iter().enumerate() {
                if index > 0 {
                    out.bytes.push(b',');
                }
                write_leaf(&Value::String(name.clone()), out)?;
                out.bytes.push(b':');
                write(member, out)?;
            }
            out.bytes.push(b'}');
        }
        leaf => write_leaf(leaf, out)?,
    }
    Ok(())
}

/// A string, a literal or a double, exactly as RFC 8785 writes it.
fn write_leaf(leaf: &Value, out: &mut Canonical) -> Result<(), Error> {
    out.bytes.extend_from_slice(&rfc8785(leaf)?);
    Ok(())
}

/// Whether the integer `number` lies within ±2^53, where every integer is a double and
/// RFC 8785 writes its exact digits. Past it RFC 8785 writes the shortest digits that name
/// the nearest double (2^60 + 1 becomes `1152921504606847000`).
fn within_doubles_integers(number: &Number) -> bool {
    const LIMIT: u64 = 1 << 53;
    match (number.as_u64(), number.as_i64()) {
        (Some(unsigned), _) => unsigned <= LIMIT,
        (None, Some(signed)) => signed.unsigned_abs() <= LIMIT,
        (None, None) => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{canonicalize, rfc8785};

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).expect("test JSON parses")
    }

    #[test]
    fn documents_within_two_to_the_53_are_written_as_rfc8785_writes_them() {
        for text in [
            r#"{"b":[1,2.5,-3,1e30,0.000001],"a":{"\u20ac":"x","\r":null,"1":true}}"#,
            r#"[9007199254740992,-9007199254740992,0,-0,1.0,18446744073709551616]"#,
            r#"{"\ud83d\ude00":"emoji","\ufb33":"dalet","z":[{"y":false}]}"#,
            r#""a \"quoted\" \u000f string""#,
        ] {
            let value = parse(text);
            let canonical = canonicalize(&value).expect("canonical");
            assert_eq!(canonical.bytes, rfc8785(&value).expect("rfc8785"), "{text}");
            assert!(!canonical.differs_from_rfc8785, "{text}");
        }
    }

    #[test]
    fn integers_past_two_to_the_53_are_written_exactly() {
        for (value, written) in [
            (json!(9_007_199_254_740_993_u64), "9007199254740993"),
            (json!(1_u64 << 60), "1152921504606846976"),
            (json!(u64::MAX), "18446744073709551615"),
            (json!(i64::MIN + 1), "-9223372036854775807"),
            (json!(i64::MAX), "9223372036854775807"),
        ] {
            let canonical = canonicalize(&value).expect("canonical");
            assert_eq!(String::from_utf8(canonical.bytes).expect("UTF-8"), written);
            assert!(canonical.differs_from_rfc8785, "{written}");
        }
    }

    /// The same text gives the same bytes whether or not the user's build enables serde_json's
    /// `arbitrary_precision` (which keeps a number's text as read): CI runs this test both ways.
    #[test]
    fn every_build_writes_the_same_bytes() {
        for (text, written) in [
            ("[-0,0,-0.0]", "[0,0,0]"),
            (
                "[9007199254740992,9007199254740993]",
                "[9007199254740992,9007199254740993]",
            ),
            (
                "[-9007199254740993,1152921504606847001]",
                "[-9007199254740993,1152921504606847001]",
            ),
            (
                "[18446744073709551615,-9223372036854775808]",
                "[18446744073709551615,-9223372036854775808]",
            ),
            ("[1.0,1e2,1E-7,2.50]", "[1,100,1e-7,2.5]"),
            ("[18446744073709551616]", "[18446744073709552000]"),
        ] {
            let canonical = canonicalize(&parse(text)).expect("canonical");
            assert_eq!(
                String::from_utf8(canonical.bytes).expect("UTF-8"),
                written,
                "{text}"
            );
        }
    }
}
