//! `idemctl`: the operator's tool for lambda-idempotency tables (feature `cli`).
//!
//! Works against AWS (the default credential chain) or a local endpoint (`DYNAMODB_ENDPOINT`);
//! the tables come from `IDEMPOTENCY_TABLE` / `UNIQUENESS_TABLE` or `--table` /
//! `--uniqueness-table`, the layout from `--sort-key ATTR=VALUE` (a single table) and
//! `--attribute FIELD=NAME` (renamed attributes, as `AttributeNames`).
//!
//! ```text
//! idemctl tables create [--unprotected] [--kms-key KEY]
//! idemctl get --key 'orders#place#v1#…'        idemctl get --identity 'orders#id=invoice:o-418'
//! idemctl stuck --older-than 10m [--json]
//! idemctl resolve (--key … | --identity …) --retention 24h
//!         (--completed result.json | --failed KIND --message TEXT | --release) [--reason WHY]
//!         [--operator NAME] [--yes]
//! idemctl stats [--json]
//! idemctl outbox pending [--older-than 10m] [--json]    idemctl outbox parked [--json]
//! idemctl outbox sweep [--older-than 10m]
//! ```
//!
//! `resolve` works on every state the engine leaves to an operator: an INDETERMINATE record, an
//! IN_PROGRESS record whose lease ran out (stuck), and evidence whose record is gone that still
//! says IN_PROGRESS or INDETERMINATE. It says what it found and exactly what it will write (the
//! status, the outcome's bytes, the retention, the trace, the evidence a release deletes) and
//! asks before writing; the write is conditional on what it read, and leaves who, when and what
//! on the record or evidence. Who is the caller as AWS identifies it (STS `GetCallerIdentity`:
//! see [`caller`]); when AWS cannot say, nothing is written unless `--operator NAME` is passed,
//! recorded as `unverified:NAME`.
//!
//! Safe to point at a table someone else can write: `stuck` and `stats` read only the records'
//! summaries (a projection: no outcome or step is read or decompressed), every decompression is
//! bounded, and everything printed from a table is escaped ([`show`]: no control character,
//! ANSI escape or bidirectional override reaches the terminal as it is).

// The binary stays at src/bin/idemctl.rs (as the layout names it); its modules beside it.
#[path = "idemctl/audit_trail.rs"]
mod audit_trail;
#[path = "idemctl/caller.rs"]
mod caller;
#[path = "idemctl/outbox.rs"]
mod outbox;
#[path = "idemctl/show.rs"]
mod show;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use lambda_idempotency::record::{
    Audit, Evidence, FailureKind, Record, RetainedFailure, Settlement, Status, StepRecord,
    epoch_millis,
};
use lambda_idempotency::record::{MAX_FAILURE_KIND_BYTES, MAX_FAILURE_MESSAGE_BYTES};
use lambda_idempotency::store::{
    AttributeNames, DynamoDbStore, SortKey, StoreExt, TABLE_VAR, TableProtection,
    UNIQUENESS_TABLE_VAR, dynamodb_config, stuck_since,
};
use lambda_idempotency::{BoxError, Config, Idempotency, OperationKey, Operator, Resolution};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use self::audit_trail::{Entry, Trail};
use self::caller::Caller;

/// The longest reason kept with a trace, in bytes (a longer one is refused, not cut: the
/// confirmation shows exactly what is written).
const MAX_REASON_BYTES: usize = 1024;
/// How much of an outcome the confirmation shows (its length and digest stand for the rest).
const SHOWN_OUTCOME_CHARS: usize = 4096;

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
    /// A single-table layout's sort key and the value this store's records have in it.
    #[arg(long, global = true, value_name = "ATTR=VALUE")]
    sort_key: Option<String>,
    /// A renamed attribute, as `AttributeNames` names the field (e.g. `expires_at=ttl`);
    /// repeat it for each.
    #[arg(long = "attribute", global = true, value_name = "FIELD=NAME")]
    attributes: Vec<String>,
    /// The outbox table, for `idemctl outbox` (default: $OUTBOX_TABLE).
    #[arg(long, global = true, env = "OUTBOX_TABLE")]
    outbox_table: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Store(StoreCommand),
    /// The outbox: pending and parked events, and a sweep on demand.
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
}

/// The commands on the idempotency (and uniqueness) tables.
#[derive(Subcommand)]
enum StoreCommand {
    /// Table management.
    #[command(subcommand)]
    Tables(TablesCommand),
    /// Show one record (by operation key) or one evidence (by its key in the uniqueness table).
    Get {
        /// The operation key.
        #[arg(
            long,
            conflicts_with = "identity",
            required_unless_present = "identity"
        )]
        key: Option<String>,
        /// The evidence's key: the business identity under its scope
        /// (`namespace[#t=tenant]#id=identity`).
        #[arg(long)]
        identity: Option<String>,
    },
    /// List IN_PROGRESS records past their lease and INDETERMINATE ones, older than a duration.
    Stuck {
        /// How long past its lease (or, for INDETERMINATE, since it was held), e.g. 10m, 2h, 1d.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Resolve an operation held for an operator: an INDETERMINATE or stuck IN_PROGRESS record
    /// (--key), or the evidence of one whose record is gone (--identity). One conditional
    /// write: nothing else is touched, nothing that changed meanwhile is overwritten.
    Resolve {
        /// The operation key.
        #[arg(
            long,
            conflicts_with = "identity",
            required_unless_present = "identity"
        )]
        key: Option<String>,
        /// The evidence's key in the uniqueness table.
        #[arg(long)]
        identity: Option<String>,
        /// The effect exists: record the JSON result in this file (for evidence: its result
        /// reference).
        #[arg(long, group = "decision")]
        completed: Option<std::path::PathBuf>,
        /// The operation failed for good: record a failure of this kind.
        #[arg(long, group = "decision", requires = "message")]
        failed: Option<String>,
        /// The failure's message (with --failed, and only with it).
        #[arg(long)]
        message: Option<String>,
        /// The effect does not exist: the next delivery runs (the record stays, released and
        /// expired, with the trace; the identity's permanent evidence is deleted).
        #[arg(long, group = "decision")]
        release: bool,
        /// The deployment's retention (e.g. 24h, 5d): how long the resolved outcome is kept.
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Duration,
        /// Who resolves, only if AWS cannot say (STS GetCallerIdentity fails): recorded as
        /// `unverified:NAME`. When AWS answers, the trace names the caller's ARN.
        #[arg(long, value_name = "NAME")]
        operator: Option<String>,
        /// Gone: the trace names the caller as AWS identifies it (see --operator).
        #[arg(long, hide = true)]
        by: Option<String>,
        /// Why, kept with the trace (at most 1024 bytes).
        #[arg(long)]
        reason: Option<String>,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// Resolve without appending to the audit trail (kept in the uniqueness table, under
        /// keys that start with `#audit#`): only for a store without a uniqueness table.
        #[arg(long)]
        without_audit_trail: bool,
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
    /// template.yaml deploys them: protected from deletion, with point-in-time recovery.
    Create {
        /// No deletion protection and no point-in-time recovery: for a local server (which
        /// keeps no backups) or a throwaway table.
        #[arg(long)]
        unprotected: bool,
        /// Encrypt both tables with this customer-managed KMS key (ARN, id or alias).
        #[arg(long, value_name = "KEY")]
        kms_key: Option<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut cli = Cli::parse();
    cli.tables = cli.tables.named();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // An error may quote what a table holds (a key, a reason).
            eprintln!("idemctl: {}", show::text(&err.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), BoxError> {
    let command = match cli.command {
        Command::Outbox(command) => return outbox::run(command, cli.tables.outbox_table).await,
        Command::Store(command) => command,
    };
    let (store, sdk) = store(&cli.tables).await?;
    match command {
        StoreCommand::Tables(TablesCommand::Create {
            unprotected,
            kms_key,
        }) => {
            let protection = match unprotected {
                true => TableProtection::none(),
                false => TableProtection::production(),
            };
            let protection = match kms_key {
                Some(key) => protection.with_kms_key(key),
                None => protection,
            };
            store.create_tables(&protection).await?;
            println!("created {}", store.table());
        }
        StoreCommand::Get { key, identity } => get(&store, key, identity).await?,
        StoreCommand::Stuck { older_than, json } => stuck(&store, older_than, json).await?,
        StoreCommand::Resolve {
            key,
            identity,
            completed,
            failed,
            message,
            release,
            retention,
            operator,
            by,
            reason,
            yes,
            without_audit_trail,
        } => {
            if by.is_some() {
                return Err(
                    "--by is gone: the trace names the caller as AWS identifies it (STS \
                     GetCallerIdentity); pass --operator NAME only if AWS cannot say"
                        .into(),
                );
            }
            // A message recorded nowhere is refused, never dropped unsaid (clap does not
            // enforce `requires` on a member of a group another member filled).
            if message.is_some() && failed.is_none() {
                return Err(
                    "--message goes with --failed only: drop it, or say --failed KIND \
                            --message TEXT"
                        .into(),
                );
            }
            // What an operator types is kept in the table: no control or invisible character.
            let typed = [
                ("--operator", &operator),
                ("--reason", &reason),
                ("--failed", &failed),
                ("--message", &message),
            ];
            for (what, text) in typed {
                if let Some(text) = text {
                    show::typed(what, text)?;
                }
            }
            // Blank is no value, and what is kept says something (`--operator` blank names
            // nobody, and is read so above).
            for (what, text) in [
                ("--reason", &reason),
                ("--failed", &failed),
                ("--message", &message),
            ] {
                if text.as_deref().is_some_and(|text| text.trim().is_empty()) {
                    return Err(format!("{what} takes a value that is not blank").into());
                }
            }
            // The engine's own kinds say what the engine found (an effect applied but its result
            // not kept, an operator's release): an operator's failure is named as a handler's.
            if let Some(kind) = &failed
                && !matches!(FailureKind::from(kind.as_str()), FailureKind::Terminal(_))
            {
                return Err(format!(
                    "--failed {}: that name is the engine's own; name the failure as the handler's classifier would (e.g. declined), or use --release",
                    show::text(kind)
                )
                .into());
            }
            // Refused, not cut: what the confirmation shows is exactly what is written.
            let limits = [
                ("--reason", &reason, MAX_REASON_BYTES),
                ("--failed", &failed, MAX_FAILURE_KIND_BYTES),
                ("--message", &message, MAX_FAILURE_MESSAGE_BYTES),
            ];
            for (what, text, limit) in limits {
                if text.as_ref().is_some_and(|text| text.len() > limit) {
                    return Err(format!("{what} takes at most {limit} bytes").into());
                }
            }
            let resolution = if let Some(path) = completed {
                let text = std::fs::read(&path)
                    .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
                let value: Value = serde_json::from_slice(&text)
                    .map_err(|err| format!("{} is not JSON: {err}", path.display()))?;
                Resolution::Completed(value)
            } else if let Some(kind) = failed {
                Resolution::Failed(RetainedFailure {
                    kind: kind.into(),
                    message: message.unwrap_or_default(),
                })
            } else if release {
                Resolution::Release
            } else {
                return Err(
                    "say --completed FILE, --failed KIND --message TEXT or --release".into(),
                );
            };
            let caller = caller::identify(&sdk, operator.as_deref()).await?;
            if let Caller::Unverified { sts_error, .. } = &caller {
                eprintln!(
                    "AWS cannot say who you are (STS GetCallerIdentity: {}): the trace records {}",
                    show::text(sts_error),
                    show::text(caller.recorded())
                );
            }
            // Evidence keeps no failure of its own: the kind and message go into its trace's
            // reason, where a later reader finds them.
            let reason = match (&identity, &resolution) {
                (Some(_), Resolution::Failed(failure)) => {
                    let failure = format!("failed {}: {}", failure.kind.as_str(), failure.message);
                    let joined = match reason {
                        Some(reason) => format!("{reason} ({failure})"),
                        None => failure,
                    };
                    if joined.len() > 1024 {
                        return Err("--reason, --failed and --message take at most 1024 bytes together with --identity: the evidence keeps them in its trace's reason".into());
                    }
                    Some(joined)
                }
                _ => reason,
            };
            let operator = match &reason {
                Some(reason) => Operator::new(caller.recorded())?.with_reason(reason),
                None => Operator::new(caller.recorded())?,
            };
            let config = Config::builder().retention(retention).build()?;
            let target = match (key, identity) {
                (Some(key), _) => Held::Record(OperationKey::from_stored(key)),
                (None, Some(identity)) => Held::Evidence(identity),
                (None, None) => return Err("pass --key or --identity".into()),
            };
            let trace = Trace {
                by: caller.recorded().to_owned(),
                reason,
                retention,
            };
            let audit = match (store.uniqueness_table(), without_audit_trail) {
                (Some(_), true) => {
                    return Err("--without-audit-trail is for a store without a uniqueness table: this one keeps the trail".into());
                }
                (Some(table), false) => Some(table.to_owned()),
                (None, true) => None,
                (None, false) => {
                    return Err("no uniqueness table for the audit trail: pass --uniqueness-table (or set UNIQUENESS_TABLE), or --without-audit-trail for a store without one".into());
                }
            };
            let client = store.client().clone();
            let trail = audit.as_deref().map(|table| Trail {
                client: &client,
                table,
            });
            let decision = Decision {
                operator: &operator,
                trace: &trace,
                trail,
                yes,
            };
            resolve(store, config, target, resolution, decision).await?;
        }
        StoreCommand::Stats { json } => stats(&store, json).await?,
    }
    Ok(())
}

impl Tables {
    /// The table names trimmed, a blank one (an empty variable, a pasted line break) taken as
    /// unset, as the functions read them: a blank name would be sent to DynamoDB as a table.
    fn named(self) -> Self {
        let named = |name: Option<String>| {
            name.map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
        };
        Self {
            table: named(self.table),
            uniqueness_table: named(self.uniqueness_table),
            outbox_table: named(self.outbox_table),
            ..self
        }
    }
}

/// The store, and the SDK configuration it was built from (for STS).
async fn store(tables: &Tables) -> Result<(DynamoDbStore, aws_config::SdkConfig), BoxError> {
    let table = tables
        .table
        .clone()
        .ok_or("no table: pass --table or set IDEMPOTENCY_TABLE")?;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let client = aws_sdk_dynamodb::Client::from_conf(dynamodb_config(&sdk));
    let store = DynamoDbStore::new(client, table).with_attribute_names(layout(tables)?);
    let store = match &tables.uniqueness_table {
        Some(uniqueness) => store.with_uniqueness_table(uniqueness),
        None => store,
    };
    Ok((store, sdk))
}

/// The table's layout from `--sort-key` and `--attribute`.
fn layout(tables: &Tables) -> Result<AttributeNames, BoxError> {
    let mut names = AttributeNames::default();
    if let Some(sort_key) = &tables.sort_key {
        let (attribute, value) = sort_key
            .split_once('=')
            .ok_or("--sort-key takes ATTR=VALUE, e.g. sk=idempotency")?;
        names.sort_key = Some(SortKey {
            attribute: attribute.to_owned(),
            value: value.to_owned(),
        });
    }
    for renamed in &tables.attributes {
        let (field, name) = renamed
            .split_once('=')
            .ok_or("--attribute takes FIELD=NAME, e.g. expires_at=ttl")?;
        let slot = match field {
            "partition_key" => &mut names.partition_key,
            "status" => &mut names.status,
            "fingerprint" => &mut names.fingerprint,
            "key_rule" => &mut names.key_rule,
            "lease_token" => &mut names.lease_token,
            "attempt" => &mut names.attempt,
            "lease_expires_at" => &mut names.lease_expires_at,
            "expires_at" => &mut names.expires_at,
            "outcome" => &mut names.outcome,
            "outcome_format" => &mut names.outcome_format,
            "created_at" => &mut names.created_at,
            "completed_at" => &mut names.completed_at,
            "request_id" => &mut names.request_id,
            "identity" => &mut names.identity,
            "audit" => &mut names.audit,
            "steps" => &mut names.steps,
            "steps_version" => &mut names.steps_version,
            other => {
                return Err(format!("--attribute: no field `{other}` (see AttributeNames)").into());
            }
        };
        *slot = name.to_owned();
    }
    Ok(names)
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
        (None, Some(identity)) => store
            .evidence(&identity)
            .await?
            .map(|evidence| evidence_json(&evidence)),
        (None, None) => return Err("pass --key or --identity".into()),
    };
    match shown {
        Some(shown) => println!("{}", show::json_pretty(&shown)),
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
        "audit": record.audit.as_ref().map(audit_json),
        // The marks (an adoption's, a give-back's) matter only while the record is unsettled.
        "steps": record
            .steps
            .iter()
            .filter(|step| !(step.is_mark() && record.status.is_settled()))
            .map(step_json)
            .collect::<Vec<_>>(),
    })
}

/// A record as the stuck scan reads it: its summary only. The parts it does not read
/// (identity, steps, audit, request id, outcome) are left out rather than shown empty: `get`
/// shows them.
fn summary_json(record: &Record) -> Value {
    let mut shown = record_json(record);
    if let Some(fields) = shown.as_object_mut() {
        for unread in ["outcome_bytes", "request_id", "identity", "audit", "steps"] {
            fields.remove(unread);
        }
    }
    shown
}

/// A step as an operator sees it: whether its result is recorded, and its size (an uncertain
/// step, `done: false`, is what to check downstream before resolving).
fn step_json(step: &StepRecord) -> Value {
    if step.marks_steps_lost() {
        return json!({"lost": "the record was re-created from its evidence after TTL deleted it: the crashed attempt's steps are unknown"});
    }
    if step.marks_given_back() {
        return json!({"given_back_by_attempt": step.attempt});
    }
    json!({
        "name": step.name,
        "attempt": step.attempt,
        "done": step.is_done(),
        "result_bytes": step.result.as_ref().map(Vec::len),
    })
}

/// An evidence as an operator sees it.
fn evidence_json(evidence: &Evidence) -> Value {
    json!({
        "identity": evidence.identity,
        "operation_key": evidence.key.as_str(),
        "status": evidence.status.as_str(),
        "result_ref": evidence.result_ref,
        "created_at_ms": epoch_millis(evidence.created_at),
        "completed_at_ms": evidence.completed_at.map(epoch_millis),
        "audit": evidence.audit.as_ref().map(audit_json),
    })
}

fn audit_json(audit: &Audit) -> Value {
    json!({
        "by": audit.by,
        "at_ms": epoch_millis(audit.at),
        "action": audit.action,
        "reason": audit.reason,
    })
}

/// Every record's summary (key, status, lease, times: no outcome or step is read), page by
/// page, with progress on stderr for long scans.
async fn scan_summaries(store: &DynamoDbStore) -> Result<Vec<Record>, BoxError> {
    let mut all = Vec::new();
    let mut start = None;
    let mut pages = 0;
    let mut skipped_all = 0;
    loop {
        let (records, skipped, next) = store.scan_summary_page(start).await?;
        pages += 1;
        all.extend(records);
        skipped_all += skipped;
        start = next;
        if start.is_none() {
            break;
        }
        if pages % 10 == 0 {
            eprintln!("scanned {pages} pages, {} records…", all.len());
        }
    }
    if skipped_all > 0 {
        eprintln!("skipped {skipped_all} items that do not decode as idempotency records");
    }
    Ok(all)
}

async fn stuck(store: &DynamoDbStore, older_than: Duration, json: bool) -> Result<(), BoxError> {
    let now = SystemTime::now();
    let found = store.find_stuck(now, older_than, u32::MAX).await?;
    if store.uniqueness_table().is_none() {
        eprintln!(
            "evidence not read (no uniqueness table given): unsettled evidence whose record is gone is not listed; pass --uniqueness-table (or set UNIQUENESS_TABLE) to read it"
        );
    }
    if found.skipped > 0 {
        eprintln!("skipped {} items that do not decode", found.skipped);
    }
    eprintln!("read {} scan pages", found.pages);
    let (stuck, orphans) = (found.records, found.orphans);
    if json {
        for record in &stuck {
            println!("{}", show::json(&summary_json(record)));
        }
        for evidence in &orphans {
            println!("{}", show::json(&evidence_json(evidence)));
        }
        return Ok(());
    }
    println!(
        "{:<14} {:<24} {:>7}  {:<13}  KEY",
        "STATUS", "OPERATION", "ATTEMPT", "STUCK FOR"
    );
    let age = |since: SystemTime| {
        let stuck_for = now.duration_since(since).unwrap_or_default();
        humantime::format_duration(Duration::from_secs(stuck_for.as_secs())).to_string()
    };
    for record in &stuck {
        println!(
            "{:<14} {:<24} {:>7}  {:<13}  {}",
            record.status.as_str(),
            show::text(record.key.operation()),
            record.lease.attempt,
            stuck_since(record).map(age).unwrap_or_default(),
            show::text(record.key.as_str())
        );
    }
    for evidence in &orphans {
        println!(
            "{:<14} {:<24} {:>7}  {:<13}  {} (evidence; its record is gone: resolve --identity)",
            evidence.status.as_str(),
            show::text(evidence.key.operation()),
            "-",
            age(evidence.created_at),
            show::text(&evidence.identity)
        );
    }
    println!("{} stuck", stuck.len() + orphans.len());
    Ok(())
}

/// What an operator resolves.
enum Held {
    /// A record, by its operation key.
    Record(OperationKey),
    /// The evidence of a record that is gone, by its key in the uniqueness table.
    Evidence(String),
}

/// The trace a resolution leaves, as the confirmation shows it.
struct Trace {
    /// Who, as recorded.
    by: String,
    /// Why, if given.
    reason: Option<String>,
    /// How long a COMPLETED or FAILED outcome is kept.
    retention: Duration,
}

/// Who resolves, why, where the trail is kept, and whether to ask.
struct Decision<'a> {
    operator: &'a Operator,
    trace: &'a Trace,
    trail: Option<Trail<'a>>,
    yes: bool,
}

async fn resolve(
    store: DynamoDbStore,
    config: Config,
    held: Held,
    resolution: Resolution,
    decision: Decision<'_>,
) -> Result<(), BoxError> {
    let Decision {
        operator,
        trace,
        trail,
        yes,
    } = decision;
    let found = describe(&store, &held).await?;
    if let Some(ago) = found.lease_ended_ago
        && ago < CLOCK_MARGIN
    {
        return Err(format!(
            "its lease ran out only {} ago by this machine's clock, which may run ahead of the holder's: look again in {}; nothing changed",
            humantime::format_duration(Duration::from_secs(ago.as_secs())),
            humantime::format_duration(Duration::from_secs((CLOCK_MARGIN - ago).as_secs().max(1)))
        )
        .into());
    }
    if let Some(why) = &found.not_held {
        return Err(format!(
            "not resolved: {why}; nothing changed (and nothing added to the audit trail)"
        )
        .into());
    }
    let change = what_it_writes(&held, &found, &resolution);
    eprintln!("{}", show::text(&found.summary));
    eprintln!("will: {}", show::text(&change));
    eprintln!("it writes, if nothing changes before the write:");
    let writes = exact_writes(&held, &found, &resolution, trace);
    for line in &writes {
        eprintln!("  {line}");
    }
    if !yes {
        eprint!("go ahead? [y/N] ");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err("not confirmed: nothing changed".into());
        }
        // What was confirmed is what is written: a change meanwhile stops here (a record's
        // write is conditional on the attempt read, however long the confirmation took).
        if describe(&store, &held).await?.state != found.state {
            return Err("it changed while you decided: nothing changed; look again".into());
        }
    }
    // The attempt is on the trail before anything is written: every resolution has its entry.
    let attempt = match &trail {
        Some(trail) => {
            let (target_kind, target) = match &held {
                Held::Record(key) => ("record", key.as_str()),
                Held::Evidence(identity) => ("evidence", identity.as_str()),
            };
            let kept: Vec<String> = writes.iter().map(|line| on_the_trail(line)).collect();
            let entry = Entry {
                target_kind,
                target,
                by: &trace.by,
                reason: trace.reason.as_deref(),
                writes: &kept,
            };
            Some(trail.attempt(&entry, SystemTime::now()).await?)
        }
        None => None,
    };
    let idem = Idempotency::new(store).with_config(config);
    let answer = match &held {
        Held::Record(key) => match &found.read {
            Some(read) => {
                idem.resolve_as_read::<Value>(read, resolution, operator)
                    .await
            }
            None => idem.resolve::<Value>(key, resolution, operator).await,
        },
        Held::Evidence(identity) => {
            idem.resolve_evidence::<Value>(identity, resolution, operator)
                .await
        }
    };
    // Every attempt on the trail gets its result, an error's kind included.
    let mut unrecorded = None;
    if let (Some(trail), Some(attempt)) = (&trail, &attempt) {
        let result = match &answer {
            Ok(resolved) => Ok(*resolved),
            Err(err) => Err(err.kind().name()),
        };
        if let Err(err) = trail.result(attempt, result, SystemTime::now()).await {
            eprintln!("{}", show::text(&err.to_string()));
            unrecorded = Some(attempt);
        }
    }
    let resolved = answer?;
    if !resolved {
        return Err(
            "not resolved: it is not held for an operator (a live lease, settled, gone, or changed since it was read); nothing changed"
                .into(),
        );
    }
    println!("resolved: {}", show::text(&change));
    match unrecorded {
        // Written, but the trail does not say so: a failure, so that no script reads the
        // trail as complete.
        Some(attempt) => Err(format!(
            "the resolution was written, but the audit trail lacks its result: append the item `{}#result` (event resolution_result, resolved true) so that the trail says it applied",
            show::text(attempt)
        )
        .into()),
        None => Ok(()),
    }
}

/// Exactly what a resolution writes, one field a line, every value from a table or a file
/// escaped ([`show`]): the status, the outcome's bytes (the first
/// [`SHOWN_OUTCOME_CHARS`] characters, its length and SHA-256), the retention, and the trace.
fn exact_writes(held: &Held, found: &Found, resolution: &Resolution, trace: &Trace) -> Vec<String> {
    let mut lines = Vec::new();
    match held {
        Held::Record(key) => lines.push(format!("record     {}", show::text(key.as_str()))),
        Held::Evidence(identity) => {
            lines.push(format!("evidence   {}", show::text(identity)));
        }
    }
    // As the engine keeps it: the retention from the write, or a crashed claim's own expiry
    // (its lease's end plus its operation's retention) when that is later.
    let own_expiry = found
        .read
        .as_ref()
        .filter(|read| read.status == Status::InProgress)
        .map(|read| read.expires_at);
    let kept = match own_expiry {
        Some(until) if until > SystemTime::now() + trace.retention => format!(
            "kept       until {} (the record's own expiry, later than {} from the write)",
            humantime::format_rfc3339_seconds(until),
            humantime::format_duration(trace.retention)
        ),
        _ => format!(
            "kept       {} from the write",
            humantime::format_duration(trace.retention)
        ),
    };
    match (held, resolution) {
        (Held::Record(_), Resolution::Completed(value)) => {
            lines.push("status     COMPLETED".into());
            lines.push(outcome_line(&value.to_string().into_bytes()));
            lines.push(kept);
        }
        (Held::Record(_), Resolution::Failed(failure)) => {
            // The bytes the engine stores for a retained failure.
            let settled = Settlement::failed(failure, SystemTime::now(), trace.retention);
            lines.push("status     FAILED".into());
            lines.push(outcome_line(settled.outcome.as_deref().unwrap_or_default()));
            lines.push(kept);
        }
        (Held::Record(_), Resolution::Release) => {
            lines.push("status     FAILED, kind `released` (the next delivery runs again)".into());
            lines.push("kept       already expired (an hour before the write)".into());
            lines.push("steps      cleared".into());
            if let Some(identity) = &found.evidence {
                lines.push(format!("deletes    the evidence {}", show::text(identity)));
            }
        }
        (Held::Evidence(_), Resolution::Completed(value)) => {
            lines.push("status     COMPLETED".into());
            let reference = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            lines.push(match reference.len() <= 1024 {
                true => format!("result_ref {}", show::json(&Value::String(reference))),
                false => "result_ref none (over 1024 bytes: not kept)".into(),
            });
        }
        (Held::Evidence(_), Resolution::Failed(_)) => lines.push("status     FAILED".into()),
        (Held::Evidence(_), Resolution::Release) => {
            lines.push("deletes    this evidence".into());
            lines.push(format!(
                "record     {} FAILED, kind `released`, already expired",
                show::text(found.operation.as_str())
            ));
        }
    }
    let action = match resolution {
        Resolution::Completed(_) => "completed",
        Resolution::Failed(_) => "failed",
        Resolution::Release => "released",
    };
    lines.push(format!("trace by   {}", show::text(&trace.by)));
    lines.push(format!("trace what {action} from {}", found.status));
    lines.push(format!(
        "trace why  {}",
        trace
            .reason
            .as_deref()
            .map_or(Cow::Borrowed("(none)"), show::text)
    ));
    lines.push("trace at   the time of the write".into());
    lines
}

/// The start of the confirmation's outcome line.
const OUTCOME_LINE: &str = "outcome    ";

/// A confirmation line as the audit trail keeps it: an outcome by its length and digest alone.
/// The trail has no TTL and the stuck check's role scans its table, while the record drops
/// the outcome (a payment's answer, an address) when its retention ends.
fn on_the_trail(line: &str) -> String {
    match line.strip_prefix(OUTCOME_LINE) {
        Some(outcome) => {
            let sized = outcome.split_once(": ").map_or(outcome, |(sized, _)| sized);
            format!("{OUTCOME_LINE}{sized} (its text shown to the operator, not kept)")
        }
        None => line.to_owned(),
    }
}

/// An outcome's exact bytes as the confirmation shows them: `OUTCOME_LINE`, its length and
/// digest, then `: ` and its start.
fn outcome_line(bytes: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(bytes));
    let text = match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => show::json(&value),
        Err(_) => show::text(&String::from_utf8_lossy(bytes)).into_owned(),
    };
    let shown: String = text.chars().take(SHOWN_OUTCOME_CHARS).collect();
    let cut = match shown.len() < text.len() {
        true => " … (cut here: the length and digest are the whole outcome's)",
        false => "",
    };
    format!(
        "{OUTCOME_LINE}{} bytes, sha256 {digest}: {shown}{cut}",
        bytes.len()
    )
}

/// What a resolution writes, said from what was found.
fn what_it_writes(held: &Held, found: &Found, resolution: &Resolution) -> String {
    match (held, resolution) {
        (Held::Record(_), Resolution::Completed(value)) => format!(
            "record it COMPLETED with this {}-byte result ({}), replayed to every later delivery",
            value.to_string().len(),
            shape(value)
        ),
        (Held::Record(_), Resolution::Failed(failure)) => {
            format!(
                "record it FAILED ({}), replayed to every later delivery",
                failure.kind
            )
        }
        (Held::Record(_), Resolution::Release) => {
            let evidence = found
                .evidence
                .as_ref()
                .map(|identity| {
                    format!(", and DELETE the permanent evidence of identity {identity}")
                })
                .unwrap_or_default();
            format!(
                "release it: the record is kept as FAILED `released`, already expired, with this trace, so that the next delivery runs the operation again{evidence}{}",
                steps_run_again(&found.steps)
            )
        }
        (Held::Evidence(_), Resolution::Completed(value)) => {
            let reference = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let kept = match reference.len() <= 1024 {
                true => format!("with result reference {reference}"),
                false => "with no result reference (over 1024 bytes: not kept)".to_owned(),
            };
            format!(
                "mark the evidence COMPLETED {kept}; later deliveries are refused as already done (KeyExpiredConflict), never run"
            )
        }
        (Held::Evidence(_), Resolution::Failed(failure)) => format!(
            "mark the evidence FAILED ({}); later deliveries are refused as failed, never run",
            failure.kind
        ),
        (Held::Evidence(identity), Resolution::Release) => format!(
            "DELETE the permanent evidence of identity {identity} and write a released record (FAILED, already expired, with this trace), so that the next delivery runs the operation again"
        ),
    }
}

/// What a release says of the steps it clears: the next execution runs each again as new.
fn steps_run_again(steps: &[(String, bool)]) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let named = |done: bool| {
        let names: Vec<&str> = steps
            .iter()
            .filter(|(_, is_done)| *is_done == done)
            .map(|(name, _)| name.as_str())
            .collect();
        match names.is_empty() {
            true => "none".to_owned(),
            false => names.join(", "),
        }
    };
    format!(
        "; the steps it recorded are cleared and run again as new (done: {}; uncertain: {}): a transactional one commits its writes again, and every outbox event it or the completion publishes gets a new event id, which a consumer deduplicating on ids takes for a new event",
        named(true),
        named(false)
    )
}

/// What an operator is about to resolve, as found.
struct Found {
    summary: String,
    /// The state it is resolved from (the trace's `… from STATUS`).
    status: Status,
    /// The operation key.
    operation: OperationKey,
    /// The record's steps (marks left out), each with whether its result is recorded.
    steps: Vec<(String, bool)>,
    /// The evidence a release deletes: the record's identity, when its evidence is its own.
    evidence: Option<String>,
    /// What the write will be conditional on, to tell whether it changed (with the steps'
    /// version: a step recorded meanwhile changes what was decided on).
    state: String,
    /// The record as read (a record's resolution), which the engine's write is conditional on.
    read: Option<Record>,
    /// How long ago, by this machine's clock, an IN_PROGRESS record's lease ran out.
    lease_ended_ago: Option<Duration>,
    /// Why it is not held for an operator (a live lease, settled), if it is not: the engine
    /// would refuse its resolution.
    not_held: Option<String>,
}

/// How long after its lease's end, by the operator's clock, a stuck claim may be resolved: the
/// operator's machine may run ahead of the holder's (a laptop's clock after sleep), and a
/// release while the holder still runs would let its effect happen twice.
const CLOCK_MARGIN: Duration = Duration::from_secs(120);

async fn describe(store: &DynamoDbStore, held: &Held) -> Result<Found, BoxError> {
    let now = SystemTime::now();
    match held {
        Held::Record(key) => {
            let record = store.get(key).await?.ok_or("no record under this key")?;
            let lease = match record.status {
                Status::InProgress if record.lease.is_expired(now) => format!(
                    ", its lease ran out {} ago",
                    humantime::format_duration(Duration::from_secs(
                        now.duration_since(record.lease.expires_at)
                            .unwrap_or_default()
                            .as_secs()
                    ))
                ),
                Status::InProgress => ", its lease is LIVE: it cannot be resolved".into(),
                _ => String::new(),
            };
            let evidence = match &record.identity {
                Some(identity) => store
                    .evidence(identity)
                    .await?
                    .filter(|evidence| evidence.key == *key)
                    .map(|evidence| evidence.identity),
                None => None,
            };
            Ok(Found {
                summary: format!(
                    "found operation {} {} (attempt {}{lease})",
                    key.as_str(),
                    record.status,
                    record.lease.attempt
                ),
                status: record.status,
                operation: key.clone(),
                steps: record
                    .steps
                    .iter()
                    .filter(|step| !step.is_mark())
                    .map(|step| (step.name.clone(), step.is_done()))
                    .collect(),
                evidence,
                state: format!(
                    "{} {} {} {}",
                    record.status, record.lease.token, record.lease.attempt, record.steps_version
                ),
                lease_ended_ago: (record.status == Status::InProgress)
                    .then(|| now.duration_since(record.lease.expires_at).ok())
                    .flatten(),
                read: Some(record.clone()),
                not_held: match record.status {
                    Status::Indeterminate => None,
                    Status::InProgress if record.lease.is_expired(now) => None,
                    Status::InProgress => {
                        Some("its lease is live: its holder may still run".into())
                    }
                    status => Some(format!("it is {status}, settled")),
                },
            })
        }
        Held::Evidence(identity) => {
            let evidence = store
                .evidence(identity)
                .await?
                .ok_or("no evidence under this key")?;
            // The engine resolves evidence only once its record is gone (or settled and
            // expired); while it stands, the record is what an operator resolves.
            let stands = store
                .get(&evidence.key)
                .await?
                .filter(|record| !record.counts_as_absent(now))
                .map(|record| {
                    format!(
                        "its record still stands ({}): resolve it with --key {}",
                        record.status,
                        show::text(evidence.key.as_str())
                    )
                });
            Ok(Found {
                summary: format!(
                    "found evidence {identity} {} of operation {}",
                    evidence.status,
                    evidence.key.as_str()
                ),
                status: evidence.status,
                operation: evidence.key.clone(),
                steps: Vec::new(),
                evidence: Some(identity.clone()),
                state: format!(
                    "{} {} {}",
                    evidence.status,
                    evidence.key.as_str(),
                    epoch_millis(evidence.created_at)
                ),
                lease_ended_ago: None,
                read: None,
                not_held: match evidence.status {
                    Status::InProgress | Status::Indeterminate => stands,
                    status => Some(format!("the evidence is {status}, settled")),
                },
            })
        }
    }
}

/// A JSON value's shape, for the confirmation: its type and, for an object, its fields.
fn shape(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let names: Vec<&str> = fields.keys().map(String::as_str).take(8).collect();
            format!("an object with fields {}", names.join(", "))
        }
        Value::Array(items) => format!("an array of {}", items.len()),
        Value::String(_) => "a string".into(),
        Value::Number(_) => "a number".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Null => "null".into(),
    }
}

/// The status `stats` counts a record under: a settled record past its retention counts as
/// absent everywhere (TTL deletes it lazily, days late at times, and a release writes one
/// already expired), so it is counted apart, not as COMPLETED or FAILED.
fn counted_as(record: &Record, now: SystemTime) -> &'static str {
    match record.counts_as_absent(now) {
        true => "EXPIRED",
        false => record.status.as_str(),
    }
}

async fn stats(store: &DynamoDbStore, json: bool) -> Result<(), BoxError> {
    let now = SystemTime::now();
    let mut counts: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    for record in scan_summaries(store).await? {
        *counts
            .entry((record.key.operation().to_owned(), counted_as(&record, now)))
            .or_default() += 1;
    }
    if json {
        let rows: Vec<Value> = counts
            .iter()
            .map(|((operation, status), count)| {
                json!({"operation": operation, "status": status, "count": count})
            })
            .collect();
        println!("{}", show::json(&Value::Array(rows)));
        return Ok(());
    }
    println!("{:<24} {:<14} {:>8}", "OPERATION", "STATUS", "COUNT");
    for ((operation, status), count) in &counts {
        println!("{:<24} {status:<14} {count:>8}", show::text(operation));
    }
    Ok(())
}
