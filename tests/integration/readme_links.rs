//! The README's links work where it is read: on crates.io and docs.rs (where a relative link
//! to a repository file has nothing to resolve against) as on a clone. Every link is absolute
//! or an anchor, and every link to the crate's own guide or files names one that exists.

use std::path::Path;

const GUIDE: &str = "https://docs.rs/lambda-idempotency/latest/lambda_idempotency/guide/";
const SOURCE: &str = "https://docs.rs/crate/lambda-idempotency/latest/source/";

/// Every `[text](target)` target in `markdown`.
fn link_targets(markdown: &str) -> Vec<&str> {
    markdown
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target))
        .collect()
}

#[test]
fn every_readme_link_is_absolute_and_names_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = include_str!("../../README.md");
    let guide = include_str!("../../src/guide.rs");
    let targets = link_targets(readme);
    assert!(targets.len() > 10, "the README's links were found");
    for target in targets {
        assert!(
            target.starts_with("https://") || target.starts_with('#'),
            "a relative link breaks on crates.io: {target}"
        );
        if let Some(page) = target.strip_prefix(GUIDE) {
            let name = page.trim_end_matches("/index.html");
            assert!(
                root.join("docs/guide").join(format!("{name}.md")).exists()
                    && guide.contains(&format!("pub mod {name} ")),
                "no guide page `{name}`: {target}"
            );
        }
        if let Some(file) = target.strip_prefix(SOURCE) {
            assert!(root.join(file).exists(), "no file `{file}`: {target}");
        }
    }
}
