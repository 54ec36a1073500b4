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
use sha2::{Digest, Sha256};

use super::invalid_event;
use crate::error::Error;

/// A document's canonical form, and whether RFC 8785 alone would have written it otherwise
/// (it holds an integer past ±2^53 whose digits RFC 8785 does not keep).
pub(super) struct Canonical<T> {
    /// The canonical bytes, or their SHA-256.
    pub(super) written: T,
    /// Whether an integer was written whose digits RFC 8785 would have changed.
    pub(super) differs_from_rfc8785: bool,
    /// Whether a number was written that may have been rounded when it was read: a double of
    /// magnitude 2^53 or more (an integer beyond `u64`, `9007199254740993.0`), which two
    /// different numbers can have been read as.
    pub(super) holds_rounded_number: bool,
}

/// Where canonical bytes go: a buffer ([`canonicalize`]) or straight into a digest
/// ([`digest`]), so that a key is hashed while it is written, with no intermediate bytes.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// What a document is written without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strip {
    /// Nothing: the document as it is.
    Nothing,
    /// What the transport adds to an event and a redelivery changes
    /// ([`WholeEvent`](super::WholeEvent)): an EventBridge event's `replay-name`, an SQS
    /// message's `receiptHandle` and its receive count and first receive time, in the event
    /// and in each of its `Records`.
    Transport,
    /// The receive count and first receive time of an SQS message's `attributes`.
    SqsAttributes,
    /// An event's `Records`: each written without what [`Strip::Transport`] leaves out.
    Records,
}

/// The canonical form of `value`.
pub(super) fn canonicalize(value: &Value) -> Result<Canonical<Vec<u8>>, Error> {
    written_into(value, Strip::Nothing, Vec::with_capacity(128))
}

/// The SHA-256 of the canonical form of `value` without what `strip` leaves out, hashed as it
/// is written: nothing is copied.
pub(super) fn digest(value: &Value, strip: Strip) -> Result<Canonical<[u8; 32]>, Error> {
    let hashed = written_into(value, strip, Sha256::new())?;
    Ok(Canonical {
        written: hashed.written.finalize().into(),
        differs_from_rfc8785: hashed.differs_from_rfc8785,
        holds_rounded_number: hashed.holds_rounded_number,
    })
}

fn written_into<S: Sink>(value: &Value, strip: Strip, sink: S) -> Result<Canonical<S>, Error> {
    let mut canonical = Canonical {
        written: sink,
        differs_from_rfc8785: false,
        holds_rounded_number: false,
    };
    write(value, strip, &mut canonical)?;
    Ok(canonical)
}

/// RFC 8785 alone, as versions before 0.2 wrote every document (integers read as doubles).
pub(super) fn rfc8785(value: &Value) -> Result<Vec<u8>, Error> {
    serde_json_canonicalizer::to_vec(value).map_err(invalid_event)
}

fn write<S: Sink>(value: &Value, strip: Strip, out: &mut Canonical<S>) -> Result<(), Error> {
    match value {
        Value::Null => out.written.put(b"null"),
        Value::Bool(true) => out.written.put(b"true"),
        Value::Bool(false) => out.written.put(b"false"),
        Value::String(text) => write_string(text, &mut out.written),
        Value::Number(number) if number.is_i64() || number.is_u64() => {
            // Written from the integer, not from `Number`'s text: with serde_json's
            // `arbitrary_precision` a number keeps the digits it was read with (`-0`), and one
            // build's canonical form must be every build's.
            let mut digits = itoa::Buffer::new();
            let exact = match (number.as_u64(), number.as_i64()) {
                (Some(unsigned), _) => digits.format(unsigned),
                (None, Some(signed)) => digits.format(signed),
                (None, None) => return write_double(value, out),
            };
            if !within_doubles_integers(number) {
                out.differs_from_rfc8785 |= rfc8785(value)? != exact.as_bytes();
            }
            out.written.put(exact.as_bytes());
        }
        Value::Number(_) => write_double(value, out)?,
        Value::Array(items) => {
            out.written.put(b"[");
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.written.put(b",");
                }
                let strip = match strip {
                    Strip::Records => Strip::Transport,
                    _ => Strip::Nothing,
                };
                write(item, strip, out)?;
            }
            out.written.put(b"]");
        }
        Value::Object(fields) => {
            // serde_json's map already iterates in code point order (unless a build enables
            // `preserve_order`), which is RFC 8785's UTF-16 order for nearly every name: the
            // members are sorted only when they are not in order already.
            let in_order = fields
                .keys()
                .zip(fields.keys().skip(1))
                .all(|(a, b)| utf16_order(a, b).is_lt());
            let shape = Shape::of(fields, strip);
            out.written.put(b"{");
            if in_order {
                write_members(fields.iter(), shape, out)?;
            } else {
                let mut members: Vec<(&String, &Value)> = fields.iter().collect();
                members.sort_by(|(a, _), (b, _)| utf16_order(a, b));
                write_members(members.into_iter(), shape, out)?;
            }
            out.written.put(b"}");
        }
    }
    Ok(())
}

fn write_members<'a, S: Sink>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    shape: Shape,
    out: &mut Canonical<S>,
) -> Result<(), Error> {
    let mut written = 0;
    for (name, member) in members {
        let Some(strip) = shape.member(name, member) else {
            continue;
        };
        if written > 0 {
            out.written.put(b",");
        }
        written += 1;
        write_string(name, &mut out.written);
        out.written.put(b":");
        write(member, strip, out)?;
    }
    Ok(())
}

/// An object as [`Strip`] sees it: which of its members are left out, and how each is written.
#[derive(Debug, Clone, Copy)]
struct Shape {
    strip: Strip,
    /// An EventBridge event (it has a `detail-type` and a `source`).
    eventbridge: bool,
    /// An SQS message (its `eventSource` is `aws:sqs`).
    sqs: bool,
}

impl Shape {
    fn of(fields: &serde_json::Map<String, Value>, strip: Strip) -> Self {
        let transport = strip == Strip::Transport;
        Self {
            strip,
            eventbridge: transport
                && fields.contains_key("detail-type")
                && fields.contains_key("source"),
            sqs: transport && fields.get("eventSource").and_then(Value::as_str) == Some("aws:sqs"),
        }
    }

    /// How the member `name` is written (`None`: left out).
    fn member(self, name: &str, member: &Value) -> Option<Strip> {
        match (self.strip, name) {
            (Strip::Nothing | Strip::Records, _) => Some(Strip::Nothing),
            (
                Strip::SqsAttributes,
                "ApproximateReceiveCount" | "ApproximateFirstReceiveTimestamp",
            ) => None,
            (Strip::SqsAttributes, _) => Some(Strip::Nothing),
            (Strip::Transport, "replay-name") if self.eventbridge => None,
            (Strip::Transport, "receiptHandle") if self.sqs => None,
            (Strip::Transport, "attributes") if self.sqs => Some(Strip::SqsAttributes),
            (Strip::Transport, "Records") if member.is_array() => Some(Strip::Records),
            (Strip::Transport, _) => Some(Strip::Nothing),
        }
    }
}

/// A double (a fraction, an exponent, an integer beyond `u64`), exactly as RFC 8785 writes it.
fn write_double<S: Sink>(number: &Value, out: &mut Canonical<S>) -> Result<(), Error> {
    const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0; // 2^53
    out.holds_rounded_number |= number
        .as_f64()
        .is_some_and(|double| double.abs() >= EXACT_INTEGERS);
    out.written.put(&rfc8785(number)?);
    Ok(())
}

/// A string as RFC 8785 writes it: `"` and `\` escaped, the control characters as `\b`,
/// `\t`, `\n`, `\f`, `\r` or `\u00xx` (lowercase), everything else as it is.
fn write_string(text: &str, out: &mut impl Sink) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put(b"\"");
    let bytes = text.as_bytes();
    let mut unwritten = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let control;
        let escaped: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => {
                control = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xf)],
                ];
                &control
            }
            _ => continue,
        };
        out.put(&bytes[unwritten..at]);
        out.put(escaped);
        unwritten = at + 1;
    }
    out.put(&bytes[unwritten..]);
    out.put(b"\"");
}

/// RFC 8785's order of member names: by their UTF-16 code units. That is the order of their
/// UTF-8 bytes except where a character past U+FFFF meets one from U+E000 to U+FFFF (UTF-8
/// lead bytes 0xEE and up), which is compared in UTF-16 itself.
fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    let first_difference = a.bytes().zip(b.bytes()).find(|(x, y)| x != y);
    match first_difference {
        None => a.len().cmp(&b.len()),
        Some((x, y)) if x < 0xee && y < 0xee => x.cmp(&y),
        Some(_) => a.encode_utf16().cmp(b.encode_utf16()),
    }
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
            assert_eq!(
                canonical.written,
                rfc8785(&value).expect("rfc8785"),
                "{text}"
            );
            assert!(!canonical.differs_from_rfc8785, "{text}");
        }
    }

    /// Every ASCII character and a few beyond, alone and in member names, as RFC 8785 writes
    /// them (the escapes are written by hand here).
    #[test]
    fn strings_are_escaped_as_rfc8785_escapes_them() {
        let mut texts: Vec<String> = (0_u8..0x80)
            .map(|byte| char::from(byte).to_string())
            .collect();
        texts.extend([
            "a\u{7f}\u{80}é€😀\u{e000}\u{ffff}".to_owned(),
            String::new(),
        ]);
        for text in texts {
            let value = serde_json::json!({ text.clone(): [text.clone()] });
            let canonical = canonicalize(&value).expect("canonical");
            assert_eq!(
                canonical.written,
                rfc8785(&value).expect("rfc8785"),
                "{text:?}"
            );
        }
    }

    /// Member names out of code point order in UTF-16 (past U+FFFF against U+E000 to U+FFFF)
    /// and names that are prefixes of others are sorted as RFC 8785 sorts them.
    #[test]
    fn members_are_sorted_by_utf16_code_units() {
        let value = parse(
            r#"{"\ue000":1,"\ud800\udc00":2,"\uffff":3,"a":4,"ab":5,"":6,"\u00e9":7,"\ud83d\ude00":8}"#,
        );
        let canonical = canonicalize(&value).expect("canonical");
        assert_eq!(canonical.written, rfc8785(&value).expect("rfc8785"));
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
            assert_eq!(
                String::from_utf8(canonical.written).expect("UTF-8"),
                written
            );
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
            // Read to the nearest double only with `float_roundtrip` (declared in Cargo.toml).
            ("[10587.436593658975]", "[10587.436593658975]"),
        ] {
            let canonical = canonicalize(&parse(text)).expect("canonical");
            assert_eq!(
                String::from_utf8(canonical.written).expect("UTF-8"),
                written,
                "{text}"
            );
        }
    }
}
