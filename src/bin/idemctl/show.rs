//! What idemctl prints from a table is text someone else wrote: every character that a
//! terminal would act on instead of showing (C0 and C1 controls, DEL, so ANSI escapes and
//! `\r`), or that would make a line look other than it is (bidirectional overrides and
//! isolates, zero-width and other invisible format characters, line and paragraph
//! separators) is shown escaped, as `\u{…}`. In text, a backslash is shown as `\\`, so that an
//! escape can never be forged; in JSON, the escapes are JSON's own (`\u001b`), so that the
//! output parses back to exactly the stored strings.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;

/// Whether `c` is shown escaped.
pub(crate) fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'                       // soft hyphen (invisible)
            | '\u{034F}'                     // combining grapheme joiner
            | '\u{061C}'                     // Arabic letter mark (bidi)
            | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers (blank)
            | '\u{17B4}' | '\u{17B5}'        // Khmer invisible vowels
            | '\u{180B}'..='\u{180F}'        // Mongolian selectors and vowel separator
            | '\u{200B}'..='\u{200F}'        // zero width, LRM, RLM
            | '\u{2028}'..='\u{202E}'        // separators, bidi embeddings and overrides
            | '\u{2060}'..='\u{206F}'        // word joiner, invisible operators, bidi isolates
            | '\u{FE00}'..='\u{FE0F}'        // variation selectors
            | '\u{FEFF}'                     // byte order mark
            | '\u{FFF9}'..='\u{FFFB}'        // interlinear annotation
            | '\u{E0000}'..='\u{E0FFF}'      // tags, variation selectors supplement
        )
}

/// `text` as it is shown: unsafe characters (and backslashes) escaped.
pub(crate) fn text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c == '\\' || is_unsafe(c)) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => shown.push_str("\\\\"),
            c if is_unsafe(c) => {
                let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
            }
            c => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// `value` as compact JSON, unsafe characters escaped as JSON escapes (lossless).
pub(crate) fn json(value: &Value) -> String {
    escape_json(value.to_string())
}

/// `value` as indented JSON, unsafe characters escaped as JSON escapes (lossless).
pub(crate) fn json_pretty(value: &Value) -> String {
    escape_json(serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()))
}

/// Serialized JSON with every unsafe character serde_json leaves as it is (DEL, C1 controls,
/// format characters: all inside strings) written as `\uXXXX` (a surrogate pair past the
/// Basic Multilingual Plane). A raw newline is the indentation's own (serde_json escapes one
/// inside a string).
fn escape_json(serialized: String) -> String {
    let escapes = |c: char| c != '\n' && is_unsafe(c);
    if !serialized.chars().any(escapes) {
        return serialized;
    }
    let mut escaped = String::with_capacity(serialized.len() + 16);
    for c in serialized.chars() {
        if escapes(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(escaped, "\\u{unit:04x}");
            }
        } else {
            escaped.push(c);
        }
    }
    escaped
}

/// Refuses text an operator typed that the table would keep and every later reader would
/// have to escape: `what` names the option.
pub(crate) fn typed(what: &str, text: &str) -> Result<(), String> {
    match text.chars().find(|c| is_unsafe(*c)) {
        Some(c) => Err(format!(
            "{what} holds the character \\u{{{:x}}} (a control or invisible character): \
             type it without",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOSTILE: &str = "a\u{1b}[2J\rb\u{202e}c\u{9b}d\u{7f}e\u{e0041}f\\g\u{2066}";

    #[test]
    fn text_escapes_what_a_terminal_would_act_on() {
        let shown = text(HOSTILE);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        assert_eq!(
            shown,
            "a\\u{1b}[2J\\u{d}b\\u{202e}c\\u{9b}d\\u{7f}e\\u{e0041}f\\\\g\\u{2066}"
        );
        assert!(matches!(text("orders#place#v1#ab12"), Cow::Borrowed(_)));
        assert_eq!(text("café ✓ 注文"), "café ✓ 注文");
    }

    #[test]
    fn json_escapes_and_parses_back_to_the_same_strings() -> Result<(), serde_json::Error> {
        let value = json!({"key": HOSTILE, "nested": [HOSTILE, "line\nbreak"]});
        for shown in [json(&value), json_pretty(&value)] {
            assert!(!shown.chars().any(|c| c != '\n' && is_unsafe(c)), "{shown}");
            assert_eq!(serde_json::from_str::<Value>(&shown)?, value);
        }
        Ok(())
    }

    #[test]
    fn typed_text_with_controls_is_refused() {
        assert!(typed("--reason", "checked the ledger").is_ok());
        assert!(typed("--reason", "ok\u{1b}[1A").is_err());
        assert!(typed("--operator", "alice\u{202e}").is_err());
    }
}
