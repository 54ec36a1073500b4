//! What the demo said, line by line: `say!` keeps each line here as it prints it.

use std::sync::{Mutex, PoisonError};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps `line` (which may hold several lines) in the transcript.
pub fn keep(line: &str) {
    let mut lines = LINES.lock().unwrap_or_else(PoisonError::into_inner);
    lines.extend(line.lines().map(str::to_owned));
}

/// Every line said so far.
#[cfg(test)]
pub fn said() -> Vec<String> {
    LINES.lock().unwrap_or_else(PoisonError::into_inner).clone()
}
