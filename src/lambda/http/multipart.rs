//! The intent of a `multipart/*` body without its boundary: a client that sends the same form
//! again (a retry after a timeout) builds the request anew, and every common client (browsers'
//! `FormData`, Python's `requests`, axios) picks a new random boundary each time, which
//! changes the `Content-Type` value and every delimiter in the body, not the form.
//!
//! The body is read as RFC 2046 frames it: the preamble before the first delimiter and the
//! epilogue after the last are not part of the message, nor is the transport padding after a
//! delimiter; each part is its exact bytes (header lines and content). A body that does not
//! parse so (no closing delimiter, a boundary longer than RFC 2046's 70 bytes) has no such
//! intent: the caller keeps its exact bytes.

use memchr::memmem;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The longest boundary RFC 2046 allows: a longer one is no multipart body's.
const MAX_BOUNDARY_BYTES: usize = 70;

/// The media type of a `Content-Type` value, lowercased, and its boundary parameter, when the
/// type is `multipart/*` and names one (quoted or not).
pub(super) fn boundary_of(content_type: &str) -> Option<(String, String)> {
    let mut params = content_type.split(';');
    let media_type = params.next()?.trim().to_ascii_lowercase();
    if !media_type.starts_with("multipart/") {
        return None;
    }
    let boundary = params.find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_owned())
    })?;
    (!boundary.is_empty() && boundary.len() <= MAX_BOUNDARY_BYTES).then_some((media_type, boundary))
}

/// The `Content-Type` value without its boundary parameter: the media type, lowercased, and
/// the other parameters as sent, in their order.
pub(super) fn without_boundary(content_type: &str) -> String {
    let mut params = content_type.split(';');
    let mut kept = vec![
        params
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase(),
    ];
    kept.extend(
        params
            .filter(|param| {
                !param
                    .split_once('=')
                    .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("boundary"))
            })
            .map(|param| param.trim().to_owned()),
    );
    kept.join("; ")
}

/// The parts of `body` delimited by `boundary`, each as the SHA-256 of its exact bytes (its
/// header lines and content: only the delimiters change from one request to the next); `None`
/// when the body is not a complete multipart body.
pub(super) fn parts(body: &[u8], boundary: &str) -> Option<Value> {
    let delimiter = [b"--", boundary.as_bytes()].concat();
    // The first delimiter starts the body or a line.
    let first = memmem::find(body, &delimiter)?;
    if first != 0 && !body[..first].ends_with(b"\r\n") {
        return None;
    }
    let mut rest = &body[first + delimiter.len()..];
    let next_delimiter =
        memmem::Finder::new(&[b"\r\n--", boundary.as_bytes()].concat()).into_owned();
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            // The close delimiter: what follows is the epilogue.
            return Some(Value::Array(parts));
        }
        // Transport padding (spaces and tabs), then the line break that ends the delimiter.
        let line_end = memmem::find(rest, b"\r\n")?;
        if !rest[..line_end]
            .iter()
            .all(|byte| matches!(byte, b' ' | b'\t'))
        {
            return None;
        }
        rest = &rest[line_end + 2..];
        let end = next_delimiter.find(rest)?;
        parts.push(Value::String(hex::encode(Sha256::digest(&rest[..end]))));
        rest = &rest[end + next_delimiter.needle().len()..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(boundary: &str, file: &str) -> Vec<u8> {
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nQ3 report\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"q3.csv\"\r\nContent-Type: text/csv\r\n\r\n{file}\r\n--{boundary}--\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn the_same_form_under_two_boundaries_has_one_intent() {
        let a = parts(&form("----a1b2", "1,2\r\n3,4"), "----a1b2");
        let b = parts(&form("XyZ-9", "1,2\r\n3,4"), "XyZ-9");
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_eq!(a.as_ref().and_then(Value::as_array).map(Vec::len), Some(2));
    }

    #[test]
    fn another_file_or_field_is_another_intent() {
        let a = parts(&form("b", "1,2\r\n3,4"), "b");
        let b = parts(&form("b", "1,2\r\n3,5"), "b");
        assert_ne!(a, b);
        let renamed = String::from_utf8(form("b", "1,2")).unwrap_or_default();
        let renamed = renamed.replace("q3.csv", "q4.csv");
        assert_ne!(
            parts(renamed.as_bytes(), "b"),
            parts(&form("b", "1,2"), "b")
        );
    }

    #[test]
    fn a_body_that_is_not_complete_multipart_has_no_parts() {
        let cut = form("b", "1,2");
        assert_eq!(parts(&cut[..cut.len() - 8], "b"), None);
        assert_eq!(parts(b"not a form", "b"), None);
        assert_eq!(parts(b"--b junk\r\npart\r\n--b--", "b"), None);
    }

    /// Parts are their exact bytes: a blank line or a trailing space in a part's content, or a
    /// header's byte that is not UTF-8, is another intent.
    #[test]
    fn parts_differing_in_any_byte_are_another_intent() {
        let with = |content: &[u8]| {
            let mut body = b"--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\n".to_vec();
            body.extend_from_slice(content);
            body.extend_from_slice(b"\r\n--b--");
            parts(&body, "b")
        };
        assert!(with(b"a\r\n\r\nb").is_some());
        assert_ne!(with(b"a\r\n\r\nb"), with(b"a\r\nb"));
        assert_ne!(with(b"a "), with(b"a"));
        assert_ne!(with(b"\xe9"), with(b"\xe8"));
    }

    #[test]
    fn a_boundary_longer_than_rfc_2046_allows_is_no_multipart_body() {
        let long = "-".repeat(71);
        assert_eq!(
            boundary_of(&format!("multipart/form-data; boundary={long}")),
            None
        );
        assert!(
            boundary_of(&format!("multipart/form-data; boundary={}", "-".repeat(70))).is_some()
        );
    }

    #[test]
    fn the_boundary_is_read_and_left_out_of_the_content_type() {
        let sent = "Multipart/Form-Data; boundary=\"----a1b2\"; charset=utf-8";
        assert_eq!(
            boundary_of(sent),
            Some(("multipart/form-data".into(), "----a1b2".into()))
        );
        assert_eq!(without_boundary(sent), "multipart/form-data; charset=utf-8");
        assert_eq!(boundary_of("application/json"), None);
        assert_eq!(boundary_of("multipart/form-data"), None);
    }
}
