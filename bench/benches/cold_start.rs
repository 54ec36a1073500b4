//! Cold start, per-event latency, memory and size of a deployable function, run as Lambda runs
//! it: a fresh process per run, polling a local Runtime API, its tables on a local
//! DynamoDB-compatible server (embedded in the benchmark, or `DYNAMODB_ENDPOINT`).
//!
//! `cargo bench -p lambda-idempotency-bench [-- --runs 30 --function quickstart]`
//!
//! It first builds the functions as they ship (`cargo build --release -p
//! lambda-idempotency-functions --bins`: the release profile `cargo lambda build --release`
//! uses, for this machine's architecture), then measures those binaries. Per run: spawn → first `GET /next` (ready); the first event (a first execution: claim and
//! complete, 2 requests); the second, the same event (a duplicate: 1 request); a third, for
//! another operation (a first execution in a warm process); the process's peak RSS (`VmHWM`)
//! and what it holds after them (`RssAnon`: heap and stacks, `RssFile`: the binary's pages).
//! Medians over the runs, and the stripped size of each function binary. Each run's tables are
//! warmed up first (one operation and its duplicate), as DynamoDB's always are.

// Shared with the functions' end-to-end tests, which also use what this benchmark does not.
#[allow(dead_code)]
#[path = "../../functions/tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lambda_idempotency::{Idempotency, Invocation, KeyPolicy, OperationScope};
use serde_json::Value;
use support::function::{Function, Tables, sample_event};

struct Run {
    ready: Duration,
    first: Duration,
    duplicate: Duration,
    warm_first: Duration,
    /// `VmHWM`, `RssAnon`, `RssFile`, in KiB.
    memory: [u64; 3],
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = flag("--runs").map_or(20, |runs| runs.parse().expect("--runs N"));
    let name = flag("--function").unwrap_or_else(|| "quickstart".into());
    let functions = build_functions();
    let binary = functions.get(&name).unwrap_or_else(|| {
        panic!(
            "--function names one of {:?}",
            functions.keys().collect::<Vec<_>>()
        )
    });
    let event = sample_event(event_for(&name));
    let other = another_operation(&event);

    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs {
        // Fresh tables on an embedded server of its own (or on DYNAMODB_ENDPOINT), warmed up
        // as DynamoDB always is: what a first event costs is then the function's own cold path.
        let tables = Tables::create(&format!("cold-{run}")).await;
        warm_up(&tables).await;
        samples.push(measure(binary, &tables, [&event, &other]).await);
    }

    println!("cold start of `{name}`: {runs} fresh processes, medians (min – max)");
    report("spawn → first /next (ready)", &samples, |run| run.ready);
    report("first event (2 requests)", &samples, |run| run.first);
    report("duplicate event (1 request)", &samples, |run| run.duplicate);
    report("another operation, warm (2)", &samples, |run| {
        run.warm_first
    });
    for (index, label) in [
        "peak RSS (VmHWM)",
        "  of which heap (RssAnon)",
        "  binary pages (RssFile)",
    ]
    .into_iter()
    .enumerate()
    {
        let mut kib: Vec<u64> = samples.iter().map(|run| run.memory[index]).collect();
        kib.sort_unstable();
        println!(
            "  {label:<30} {:>8.1} MB   ({:.1} – {:.1})",
            mb(kib[kib.len() / 2] * 1024),
            mb(kib[0] * 1024),
            mb(kib[kib.len() - 1] * 1024)
        );
    }
    println!("stripped binaries ({}):", std::env::consts::ARCH);
    for (function, binary) in &functions {
        let size = std::fs::metadata(binary).expect("the binary exists").len();
        println!("  {function:<30} {:>8.1} MB", mb(size));
    }
}

/// Builds the function binaries as they ship; their paths by name.
fn build_functions() -> BTreeMap<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "lambda-idempotency-functions",
            "--bins",
        ])
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build");
    assert!(
        output.status.success(),
        "cargo build --release of the functions"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|message| {
            let path = message["executable"].as_str()?.to_owned();
            Some((message["target"]["name"].as_str()?.to_owned(), path))
        })
        .collect()
}

/// One fresh process: ready, a first execution, its duplicate, another operation, memory.
async fn measure(binary: &str, tables: &Tables, [event, other]: [&Value; 2]) -> Run {
    let function = Function::spawn(binary, "cold-start", tables).await;
    let ready = function.api.ready().await - function.spawned;

    let started = Instant::now();
    let first = function.api.invoke(event.clone()).await;
    let first_took = started.elapsed();
    let started = Instant::now();
    let duplicate = function.api.invoke(event.clone()).await;
    let duplicate_took = started.elapsed();
    let started = Instant::now();
    let warm = function.api.invoke(other.clone()).await;
    let warm_took = started.elapsed();
    assert!(first.is_ok(), "the first event succeeded: {first:?}");
    assert_eq!(duplicate, first, "the duplicate was replayed");
    assert!(warm.is_ok(), "the other operation succeeded: {warm:?}");

    let memory = memory_kib(function.pid());
    function.stop().await;
    Run {
        ready,
        first: first_took,
        duplicate: duplicate_took,
        warm_first: warm_took,
        memory,
    }
}

/// One operation and its duplicate on the tables, from this process: the server's first
/// requests on a table (statements prepared, pages loaded) are not the function's.
async fn warm_up(tables: &Tables) {
    let idem = Idempotency::new(tables.store.clone());
    let scope = OperationScope::new("warm-up", "warm-up").expect("scope");
    let (key, fingerprint) = KeyPolicy::<Value>::pointer("/id")
        .expect("policy")
        .derive(&scope, &serde_json::json!({"id": "warm-up"}))
        .expect("key");
    let invocation = Invocation::new(key, fingerprint, Duration::from_secs(30));
    for _ in 0..2 {
        idem.execute(&invocation, |_| async { Ok::<_, std::io::Error>(0) })
            .await
            .expect("warm-up operation");
    }
    tables
        .ledger
        .apply("warm-up", "")
        .await
        .expect("warm-up effect");
}

/// The same event for another operation: its key changed.
fn another_operation(event: &Value) -> Value {
    let mut other = event.clone();
    if let Some(records) = other["Records"].as_array_mut() {
        for record in records {
            let body = record["body"]
                .as_str()
                .unwrap_or_default()
                .replace("\"o-", "\"other-");
            record["body"] = Value::String(body);
        }
    } else if other["headers"]["idempotency-key"].is_string() {
        other["headers"]["idempotency-key"] = Value::from("another-key");
    } else if other["detail"]["order_id"].is_string() {
        other["detail"]["order_id"] = Value::from("other-1");
    } else {
        other["order_id"] = Value::from("other-1");
    }
    other
}

/// The sample event each function is fed (the files `cargo lambda invoke --data-file` sends).
fn event_for(function: &str) -> &'static str {
    match function {
        "sqs_orders" => "sqs",
        "api_payments" => "http_api",
        "eventbridge_handler" => "eventbridge",
        _ => "direct",
    }
}

/// `VmHWM`, `RssAnon` and `RssFile` of a process, in KiB (Linux).
fn memory_kib(pid: u32) -> [u64; 3] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    ["VmHWM:", "RssAnon:", "RssFile:"].map(|field| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the field in /proc status")
    })
}

fn report(label: &str, samples: &[Run], metric: impl Fn(&Run) -> Duration) {
    let mut values: Vec<Duration> = samples.iter().map(metric).collect();
    values.sort_unstable();
    let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
    println!(
        "  {label:<30} {:>8.2} ms   ({:.2} – {:.2})",
        ms(values[values.len() / 2]),
        ms(values[0]),
        ms(values[values.len() - 1])
    );
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|arg| arg != name);
    args.next()?;
    args.next()
}
