//! The README's quoted demo output is what the demo says: every line it quotes is said, except
//! that which copy of the race (deliveries 6 to 9) executes depends on the scheduler, so those
//! lines are checked as a set. The demo runs in this test binary (`cargo test` builds the
//! example as a test, `test = true`), not as a second build.

use super::{run, transcript};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_says_what_the_readme_quotes() {
    let readme = include_str!("../../README.md");
    let block = readme
        .split("```text\n")
        .find(|block| block.contains("one charge per order: OK"))
        .and_then(|block| block.split("```").next())
        .expect("the README quotes the demo's output");
    let quoted: Vec<&str> = block.lines().filter(|line| !line.is_empty()).collect();
    assert!(quoted.contains(&"one charge per order: OK"));

    run().await.expect("the demo runs to its check");
    let said = transcript::said();
    let printed: Vec<&str> = said.iter().map(String::as_str).collect();

    let race = "o-3 concurrent copy";
    for line in quoted.iter().filter(|line| !line.contains(race)) {
        assert!(
            printed.contains(line),
            "the README quotes a line the demo does not say: {line}\n{}",
            printed.join("\n")
        );
    }
    let racers: Vec<&str> = printed
        .iter()
        .copied()
        .filter(|line| line.contains(race))
        .collect();
    assert_eq!(racers.len(), 4, "four copies of o-3");
    assert_eq!(
        racers
            .iter()
            .filter(|line| line.contains("-> EXECUTED"))
            .count(),
        1,
        "one copy of o-3 executed: {racers:?}"
    );
    for line in quoted.iter().filter(|line| line.contains(race)) {
        let (delivery, _) = line.split_once(" -> ").expect("an answer");
        assert!(
            racers.iter().any(|racer| racer.starts_with(delivery)),
            "{line}"
        );
    }
    assert_eq!(
        printed.last(),
        Some(&"one charge per order: OK"),
        "the demo ends with its check"
    );
    let summary = printed[printed.len() - 2];
    assert!(summary.starts_with("22 deliveries, 7 charges"), "{summary}");
}
