//! `idemctl`: the operator's tool for lambda-idempotency tables (feature `cli`).
//!
//! Works against AWS (the default credential chain) or a local endpoint (`DYNAMODB_ENDPOINT`);
//! the tables come from `IDEMPOTENCY_TABLE` / `UNIQUENESS_TABLE` or `--table` /
//! `--uniqueness-table`.
//!
//! ```text
//! idemctl tables create
//! idemctl get --key 'orders#place#v1#…'        idemctl get --identity invoice:o-418:rev-2
//! idemctl stuck --older-than 10m [--json]
//! idemctl resolve --key … --retention 24h (--completed result.json | --failed KIND --message TEXT | --release) [--yes]
//! idemctl stats [--json]
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use lambda_idempotency::record::{Record, RetainedFailure, Status, epoch_millis};
use lambda_idempotency::store::{
    DynamoDbStore, ENDPOINT_VAR, ScanCursor, Store, TABLE_VAR, UNIQUENESS_TABLE_VAR,
};
use lambda_idempotency::{BoxError, Config, Idempotency, OperationKey, Resolution};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "idemctl",
    version,
    about = "Inspect and resolve lambda-idempotency records"
)]
struct Cli {
    #[command(flatten)]
    tables: Tables,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Tables {
    /// The idempotency table (default: $IDEMPOTENCY_TABLE).
    #[arg(long, global = true, env = TABLE_VAR)]
    table: Option<String>,
    /// The uniqueness table (default: $UNIQUENESS_TABLE).
    #[arg(long, global = true, env = UNIQUENESS_TABLE_VAR)]
    uniqueness_table: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Table management.
    #[command(subcommand)]
    Tables(TablesCommand),
    /// Show one record (by operation key) or one evidence (by business identity).
    Get {
        /// The operation key.
        #[arg(
            long,
            conflicts_with = "identity",
            required_unless_present = "identity"
        )]
        key: Option<String>,
        /// The business identity.
        #[arg(long)]
        identity: Option<String>,
    },
    /// List IN_PROGRESS records past their lease and INDETERMINATE ones, older than a duration.
    Stuck {
        /// How long past its lease (or since its claim, for INDETERMINATE), e.g. 10m, 2h, 1d.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Resolve an INDETERMINATE operation (a conditional write: nothing else is touched).
    Resolve {
        /// The operation key.
        #[arg(long)]
        key: String,
        /// The effect exists: record the JSON result in this file.
        #[arg(long, group = "decision")]
        completed: Option<std::path::PathBuf>,
        /// The operation failed for good: record a failure of this kind.
        #[arg(long, group = "decision", requires = "message")]
        failed: Option<String>,
        /// The failure's message (with --failed).
        #[arg(long)]
        message: Option<String>,
        /// The effect does not exist: delete the record so that the next delivery runs.
        #[arg(long, group = "decision")]
        release: bool,
        /// The deployment's retention (e.g. 24h, 5d): how long the resolved outcome is kept.
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Duration,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Count records by status and operation.
    Stats {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TablesCommand {
    /// Create the idempotency table (TTL on expires_at) and the uniqueness table, as
    /// template.yaml deploys them: for local work.
    Create,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("idemctl: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    let store = store(&cli.tables).await?;
    match cli.command {
        Command::Tables(TablesCommand::Create) => {
            store.create_table().await?;
            println!("created {}", store.table());
        }
        Command::Get { key, identity } => get(&store, key, identity).await?,
        Command::Stuck { older_than, json } => stuck(&store, older_than, json).await?,
        Command::Resolve {
            key,
            completed,
            failed,
            message,
            release,
            retention,
            yes,
        } => {
            let resolution = if let Some(path) = completed {
                Resolution::Completed(serde_json::from_slice(&std::fs::read(path)?)?)
            } else if let Some(kind) = failed {
                Resolution::Failed(RetainedFailure {
                    kind,
                    message: message.unwrap_or_default(),
                })
            } else if release {
                Resolution::Release
            } else {
                return Err(
                    "say --completed FILE, --failed KIND --message TEXT or --release".into(),
                );
            };
            let config = Config::builder().retention(retention).build()?;
            resolve(store, config, key, resolution, yes).await?;
        }
        Command::Stats { json } => stats(&store, json).await?,
    }
    Ok(())
}

async fn store(tables: &Tables) -> Result<DynamoDbStore, BoxError> {
    let table = tables
        .table
        .clone()
        .ok_or("no table: pass --table or set IDEMPOTENCY_TABLE")?;
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Ok(endpoint) = std::env::var(ENDPOINT_VAR) {
        loader = loader.endpoint_url(endpoint);
    }
    let client = aws_sdk_dynamodb::Client::new(&loader.load().await);
    let store = DynamoDbStore::new(client, table);
    Ok(match &tables.uniqueness_table {
        Some(uniqueness) => store.with_uniqueness_table(uniqueness),
        None => store,
    })
}

async fn get(
    store: &DynamoDbStore,
    key: Option<String>,
    identity: Option<String>,
) -> Result<(), BoxError> {
    let shown = match (key, identity) {
        (Some(key), _) => store
            .get(&OperationKey::from_stored(key))
            .await?
            .map(|record| record_json(&record)),
        (None, Some(identity)) => store.evidence(&identity).await?.map(|evidence| {
            json!({
                "identity": evidence.identity,
                "operation_key": evidence.key.as_str(),
                "status": evidence.status.as_str(),
                "result_ref": evidence.result_ref,
                "created_at_ms": epoch_millis(evidence.created_at),
                "completed_at_ms": evidence.completed_at.map(epoch_millis),
            })
        }),
        (None, None) => return Err("pass --key or --identity".into()),
    };
    match shown {
        Some(shown) => println!("{}", serde_json::to_string_pretty(&shown)?),
        None => return Err("not found".into()),
    }
    Ok(())
}

/// A record as an operator sees it: no outcome bytes, only their size.
fn record_json(record: &Record) -> Value {
    json!({
        "key": record.key.as_str(),
        "operation": record.key.operation(),
        "status": record.status.as_str(),
        "attempt": record.lease.attempt,
        "lease_expires_at_ms": epoch_millis(record.lease.expires_at),
        "expires_at_ms": epoch_millis(record.expires_at),
        "created_at_ms": epoch_millis(record.created_at),
        "completed_at_ms": record.completed_at.map(epoch_millis),
        "outcome_bytes": record.outcome.as_ref().map(Vec::len),
        "request_id": record.request_id,
        "identity": record.identity,
    })
}

/// Every record of the table, page by page, with progress on stderr for long scans.
async fn scan_all(store: &DynamoDbStore) -> Result<Vec<Record>, BoxError> {
    let mut all = Vec::new();
    let mut cursor: Option<ScanCursor> = None;
    let mut pages = 0;
    loop {
        let (records, skipped, next) = store.scan_page(cursor.take()).await?;
        pages += 1;
        all.extend(records);
        if skipped > 0 {
            eprintln!("skipped {skipped} items that are not idempotency records");
        }
        if !next.has_more() {
            break;
        }
        if pages % 10 == 0 {
            eprintln!("scanned {pages} pages, {} records…", all.len());
        }
        cursor = Some(next);
    }
    Ok(all)
}

async fn stuck(store: &DynamoDbStore, older_than: Duration, json: bool) -> Result<(), BoxError> {
    let now = SystemTime::now();
    let stuck: Vec<Record> = scan_all(store)
        .await?
        .into_iter()
        .filter(|record| {
            since(record)
                .and_then(|since| since.checked_add(older_than))
                .is_some_and(|limit| limit < now)
        })
        .collect();
    if json {
        for record in &stuck {
            println!("{}", record_json(record));
        }
        return Ok(());
    }
    println!(
        "{:<14} {:<24} {:>7}  {:<13}  KEY",
        "STATUS", "OPERATION", "ATTEMPT", "STUCK FOR"
    );
    for record in &stuck {
        let stuck_for = since(record)
            .and_then(|since| now.duration_since(since).ok())
            .unwrap_or_default();
        println!(
            "{:<14} {:<24} {:>7}  {:<13}  {}",
            record.status.as_str(),
            record.key.operation(),
            record.lease.attempt,
            humantime::format_duration(Duration::from_secs(stuck_for.as_secs())).to_string(),
            record.key.as_str()
        );
    }
    println!("{} stuck", stuck.len());
    Ok(())
}

/// Since when a record is stuck: an IN_PROGRESS one since its lease ran out, an INDETERMINATE
/// one since it became so; `None` for the others.
fn since(record: &Record) -> Option<SystemTime> {
    match record.status {
        Status::InProgress => Some(record.lease.expires_at),
        Status::Indeterminate => Some(record.completed_at.unwrap_or(record.created_at)),
        _ => None,
    }
}

async fn resolve(
    store: DynamoDbStore,
    config: Config,
    key: String,
    resolution: Resolution,
    yes: bool,
) -> Result<(), BoxError> {
    let key = OperationKey::from_stored(key);
    if !yes {
        eprint!(
            "resolve {} as {}? [y/N] ",
            key.as_str(),
            match &resolution {
                Resolution::Completed(_) => "COMPLETED",
                Resolution::Failed(_) => "FAILED",
                Resolution::Release => "released (the next delivery runs)",
            }
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err("not confirmed: nothing changed".into());
        }
    }
    let idem = Idempotency::new(store, config);
    if idem.resolve::<Value>(&key, resolution).await? {
        println!("resolved {}", key.as_str());
        Ok(())
    } else {
        Err("not resolved: the record is not INDETERMINATE (or is gone); nothing changed".into())
    }
}

async fn stats(store: &DynamoDbStore, json: bool) -> Result<(), BoxError> {
    let mut counts: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    for record in scan_all(store).await? {
        *counts
            .entry((record.key.operation().to_owned(), record.status.as_str()))
            .or_default() += 1;
    }
    if json {
        let rows: Vec<Value> = counts
            .iter()
            .map(|((operation, status), count)| {
                json!({"operation": operation, "status": status, "count": count})
            })
            .collect();
        println!("{}", Value::Array(rows));
        return Ok(());
    }
    println!("{:<24} {:<14} {:>8}", "OPERATION", "STATUS", "COUNT");
    for ((operation, status), count) in &counts {
        println!("{operation:<24} {status:<14} {count:>8}");
    }
    Ok(())
}
