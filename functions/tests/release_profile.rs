//! The release profile the functions ship with: cargo-lambda (and so `sam build`) builds with
//! `panic = "abort"` unless the workspace's `[profile.release]` names a strategy, and with
//! abort a panicking handler would kill the process before the engine gives its claim back.

/// The workspace manifest, where the release profile is.
const MANIFEST: &str = include_str!("../../Cargo.toml");

#[test]
fn the_release_profile_keeps_panics_unwinding() {
    let release = MANIFEST
        .split("\n[")
        .find(|section| section.starts_with("profile.release]"))
        .expect("a [profile.release] section");
    let panic = release
        .lines()
        .find_map(|line| line.trim().strip_prefix("panic"))
        .map(|setting| setting.trim_start_matches([' ', '=']).trim());

    assert_eq!(
        panic,
        Some("\"unwind\""),
        "[profile.release] must say panic = \"unwind\"; cargo-lambda defaults to abort"
    );
}
