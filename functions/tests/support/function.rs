//! A function binary run as Lambda runs it: a fresh process polling a local Runtime API, its
//! tables on a local DynamoDB-compatible server (`DYNAMODB_ENDPOINT`, else an embedded one).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use lambda_idempotency::store::DynamoDbStore;
use lambda_idempotency::testing::local::{self, unique_table_name};
use lambda_idempotency_functions::ledger::Ledger;
use serde_json::Value;
use tokio::process::{Child, Command};

use super::recorder;
use super::runtime_api::RuntimeApi;

/// The sample event kept in `events/` for `trigger` (`sqs`, `http_api`, `eventbridge`,
/// `direct`, `checkout`, `dynamodb_stream`): the same file `cargo lambda invoke --data-file` sends.
pub fn sample_event(trigger: &str) -> Value {
    let text = match trigger {
        "sqs" => include_str!("../../events/sqs.json"),
        "http_api" => include_str!("../../events/http_api.json"),
        "eventbridge" => include_str!("../../events/eventbridge.json"),
        "direct" => include_str!("../../events/direct.json"),
        "checkout" => include_str!("../../events/checkout.json"),
        "dynamodb_stream" => include_str!("../../events/dynamodb_stream.json"),
        _ => panic!("no sample event for {trigger}"),
    };
    serde_json::from_str(text).expect("the sample event is JSON")
}

/// The tables a function uses, on one local endpoint.
pub struct Tables {
    /// The endpoint, the value of `DYNAMODB_ENDPOINT`.
    pub endpoint: String,
    /// The idempotency store (with a uniqueness table).
    pub store: DynamoDbStore,
    /// The ledger of the functions' effects.
    pub ledger: Ledger,
    /// Where the requests of the functions spawned on these tables are recorded, if anywhere.
    pub recording: Option<PathBuf>,
}

impl Tables {
    /// Fresh tables named after `prefix`, on `DYNAMODB_ENDPOINT` or a server started now.
    pub async fn create(prefix: &str) -> Self {
        let endpoint = local::endpoint().await.expect("a local endpoint");
        let client =
            aws_sdk_dynamodb::Client::from_conf(local::config_for(endpoint.clone()).build());
        let store = DynamoDbStore::new(
            client.clone(),
            unique_table_name(&format!("{prefix}-idempotency")),
        )
        .with_uniqueness_table(unique_table_name(&format!("{prefix}-uniqueness")));
        store.create_table().await.expect("idempotency tables");
        let ledger = Ledger::new(client, unique_table_name(&format!("{prefix}-ledger")));
        ledger.create().await.expect("ledger table");
        Self {
            endpoint,
            store,
            ledger,
            recording: None,
        }
    }

    /// The variable naming the uniqueness table, for a function that keeps evidence.
    pub fn uniqueness_env(&self) -> (&'static str, &str) {
        let table = self.store.uniqueness_table().expect("created with one");
        ("UNIQUENESS_TABLE", table)
    }

    /// Records every request of the functions spawned on these tables, in the recording `name`
    /// ([`recorder`]): what `scripts/iam-check.sh` evaluates against template.yaml.
    pub fn recorded(mut self, name: &str) -> Self {
        self.recording = Some(recorder::fresh_file(name));
        self
    }
}

/// A running function process and the Runtime API it polls.
pub struct Function {
    /// The Runtime API that invokes it.
    pub api: RuntimeApi,
    /// When the process was spawned.
    pub spawned: Instant,
    process: Child,
}

impl Function {
    /// Spawns `binary` with Lambda's environment, its tables from `tables` as template.yaml's
    /// `Globals` name them (`IDEMPOTENCY_TABLE`, `LEDGER_TABLE`; a function that keeps evidence
    /// is given `UNIQUENESS_TABLE` too, as an override: [`Tables::uniqueness_env`]).
    pub async fn spawn(binary: &str, name: &str, tables: &Tables) -> Self {
        Self::spawn_with(binary, name, tables, &[]).await
    }

    /// [`Self::spawn`], with `overrides` of its environment.
    pub async fn spawn_with(
        binary: &str,
        name: &str,
        tables: &Tables,
        overrides: &[(&str, &str)],
    ) -> Self {
        Self::start(binary, name, tables, overrides, false).await
    }

    /// [`Self::spawn_with`], its stdout and stderr kept for [`Self::output`] (for a process
    /// that exits by itself: nothing reads the pipes before then).
    pub async fn spawn_capturing(
        binary: &str,
        name: &str,
        tables: &Tables,
        overrides: &[(&str, &str)],
    ) -> Self {
        Self::start(binary, name, tables, overrides, true).await
    }

    async fn start(
        binary: &str,
        name: &str,
        tables: &Tables,
        overrides: &[(&str, &str)],
        capture: bool,
    ) -> Self {
        let api = RuntimeApi::start().await;
        let mut command = Command::new(binary);
        command
            .env_clear()
            .env("AWS_LAMBDA_RUNTIME_API", &api.address)
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_LEVEL", "WARN")
            .env("AWS_REGION", env_or("AWS_REGION", "us-east-1"))
            .env("AWS_ACCESS_KEY_ID", env_or("AWS_ACCESS_KEY_ID", "test"))
            .env(
                "AWS_SECRET_ACCESS_KEY",
                env_or("AWS_SECRET_ACCESS_KEY", "test"),
            )
            .env(
                "DYNAMODB_ENDPOINT",
                endpoint_for(&tables.endpoint, binary, name, tables, overrides).await,
            )
            .env("IDEMPOTENCY_TABLE", tables.store.table())
            .env("LEDGER_TABLE", tables.ledger.table())
            .stdin(Stdio::null())
            .stdout(if capture {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true);
        if capture {
            command.stderr(Stdio::piped());
        }
        for (variable, value) in overrides {
            // Another service's endpoint (`AWS_ENDPOINT_URL_SQS`): recorded as DynamoDB's is.
            let value = match variable.starts_with("AWS_ENDPOINT_URL") {
                true => endpoint_for(value, binary, name, tables, overrides).await,
                false => (*value).to_owned(),
            };
            command.env(variable, value);
        }
        let spawned = Instant::now();
        let process = command.spawn().expect("start the function binary");
        Self {
            api,
            spawned,
            process,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.id().expect("the function is running")
    }

    /// Waits for the process to exit by itself; its exit status.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        self.process.wait().await.expect("the function exits")
    }

    /// Waits for a process spawned by [`Self::spawn_capturing`] to exit by itself: its exit
    /// status, stdout and stderr.
    pub async fn output(self) -> std::process::Output {
        self.process
            .wait_with_output()
            .await
            .expect("the function exits")
    }

    /// Stops a process spawned by [`Self::spawn_capturing`]: what it wrote until then.
    pub async fn stop_capturing(mut self) -> std::process::Output {
        self.process.start_kill().expect("stop the function");
        self.output().await
    }

    /// Stops the process.
    pub async fn stop(mut self) {
        self.process.kill().await.expect("stop the function");
    }
}

/// A client of the tables' endpoint that records its requests as the function `name` (of
/// `binary`, with `overrides` of its environment) sends them: for driving a function's own
/// layer in-process through paths its binary takes only under faults (a panic, a large
/// outcome), so that the IAM check sees those request kinds too.
pub async fn recorded_client(
    binary: &str,
    name: &str,
    tables: &Tables,
    overrides: &[(&str, &str)],
) -> aws_sdk_dynamodb::Client {
    let endpoint = endpoint_for(&tables.endpoint, binary, name, tables, overrides).await;
    aws_sdk_dynamodb::Client::from_conf(local::config_for(endpoint).build())
}

/// The endpoint the function `name` (of `binary`) is given for `upstream`: a recording proxy
/// in front of it when the tables are recorded, else `upstream` itself.
async fn endpoint_for(
    upstream: &str,
    binary: &str,
    name: &str,
    tables: &Tables,
    overrides: &[(&str, &str)],
) -> String {
    let Some(recording) = &tables.recording else {
        return upstream.to_owned();
    };
    let mut env = serde_json::Map::new();
    env.insert("IDEMPOTENCY_TABLE".into(), tables.store.table().into());
    env.insert("LEDGER_TABLE".into(), tables.ledger.table().into());
    for (variable, value) in overrides {
        // The resources the function names: what the IAM check maps to the template's.
        if variable.ends_with("_TABLE") || variable.ends_with("_QUEUE_URL") {
            env.insert((*variable).into(), (*value).into());
        }
    }
    let binary = Path::new(binary)
        .file_name()
        .and_then(|file| file.to_str())
        .expect("a binary's file name");
    let mut function = serde_json::Map::new();
    function.insert("binary".into(), binary.into());
    function.insert("function_name".into(), name.into());
    function.insert("env".into(), Value::Object(env));
    recorder::start(upstream, recording, function).await
}

/// This process's `name`, else `default`: a real endpoint gets real credentials.
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}
