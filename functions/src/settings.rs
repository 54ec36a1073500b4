//! The functions' settings from their environment, read once at init and refused there when
//! they cannot be right: a blank name (a template value that did not resolve) would otherwise
//! fail every event with a ValidationException, and an out-of-range number would silently do
//! the opposite of what it asks.

/// The value of `name`, trimmed (a value pasted with a space or a newline names the same
/// table or queue).
///
/// # Errors
/// When it is not set, or blank: the message says what to set it to (`what`).
pub fn required(name: &str, what: &str) -> Result<String, String> {
    required_from(name, what, std::env::var(name).ok())
}

fn required_from(name: &str, what: &str, value: Option<String>) -> Result<String, String> {
    value
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
        .ok_or_else(|| format!("set {name} to {what}"))
}

/// The whole number `name` holds, `default` when it is not set.
///
/// # Errors
/// When it is set to anything but a whole number from 1 to `max`.
pub fn bounded(name: &str, default: u64, max: u64) -> Result<u64, String> {
    bounded_from(name, default, max, std::env::var(name).ok())
}

fn bounded_from(name: &str, default: u64, max: u64, value: Option<String>) -> Result<u64, String> {
    let Some(value) = value else {
        return Ok(default);
    };
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("{name} must be a whole number from 1 to {max}"))
}

#[cfg(test)]
mod reading {
    use super::{bounded_from, required_from};

    #[test]
    fn a_blank_name_is_refused_and_a_padded_one_trimmed() {
        let read = |value: Option<&str>| required_from("T", "a table", value.map(str::to_owned));
        assert_eq!(read(Some(" orders\n")), Ok("orders".to_owned()));
        assert_eq!(read(Some("  ")), Err("set T to a table".to_owned()));
        assert_eq!(read(None), Err("set T to a table".to_owned()));
    }

    #[test]
    fn a_number_outside_its_range_is_refused() {
        let read = |value: Option<&str>| bounded_from("N", 600, 86_400, value.map(str::to_owned));
        assert_eq!(read(None), Ok(600));
        assert_eq!(read(Some(" 900 ")), Ok(900));
        assert_eq!(read(Some("86400")), Ok(86_400));
        for wrong in ["0", "86401", "18446744073709551615", "-1", "ten", ""] {
            assert!(read(Some(wrong)).is_err(), "{wrong:?}");
        }
    }
}
