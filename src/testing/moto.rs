//! moto's server on loopback: a real implementation of EventBridge, SNS and SQS (and more)
//! for the relay's tests to publish to and read back from. No hand-written fake of an AWS API.
//!
//! `MOTO_ENDPOINT`, when set, names a running server. Otherwise `moto_server` is found on the
//! `PATH`, or in the virtual environment `~/.cache/lambda-idempotency/venv-moto` (created on
//! first use, about two minutes: in the repository, with the version CI pins, by
//! `scripts/python-venv.sh` from `ci/python/moto/requirements.txt`; elsewhere with
//! `pip install "moto[server]"`), and started on a free port for as long as the returned
//! [`Moto`] lives.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use aws_sdk_dynamodb::config::{Credentials, Region, SharedCredentialsProvider};

/// The environment variable naming a running moto server.
pub const MOTO_ENDPOINT_VAR: &str = "MOTO_ENDPOINT";

/// A moto server, stopped when dropped (unless it was given by `MOTO_ENDPOINT`).
#[derive(Debug)]
pub struct Moto {
    /// Its endpoint URL.
    pub endpoint: String,
    child: Option<Child>,
}

impl Moto {
    /// An SDK configuration aimed at the server (region `us-east-1`, placeholder credentials):
    /// for any service client.
    pub fn sdk_config(&self) -> aws_config::SdkConfig {
        aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "test", "test", None, None, "static",
            )))
            .build()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts moto's server (or connects to `MOTO_ENDPOINT`).
///
/// # Errors
/// When moto cannot be found, installed or started.
pub async fn start() -> Result<Moto, String> {
    if let Ok(endpoint) = std::env::var(MOTO_ENDPOINT_VAR) {
        return Ok(Moto {
            endpoint,
            child: None,
        });
    }
    let server = tokio::task::spawn_blocking(|| server().clone())
        .await
        .map_err(|err| err.to_string())??;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|err| format!("no free port: {err}"))?
        .port();
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| format!("{} does not start: {err}", server.display()))?;
    let moto = Moto {
        endpoint: format!("http://127.0.0.1:{port}"),
        child: Some(child),
    };
    // Ready once it accepts connections (a process starting, not a race being papered over).
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(moto);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("moto_server did not accept connections within 30 s".into())
}

/// The `moto_server` executable, found or installed once per process.
fn server() -> &'static Result<PathBuf, String> {
    static SERVER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SERVER.get_or_init(find_or_install)
}

fn find_or_install() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("moto_server"))
            .find(|candidate| candidate.is_file())
    });
    if let Some(found) = on_path {
        return Ok(found);
    }
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let venv = PathBuf::from(home).join(".cache/lambda-idempotency/venv-moto");
    let server = venv.join("bin/moto_server");
    if server.is_file() {
        return Ok(server);
    }
    let run = |program: &std::path::Path, args: &[&str]| -> Result<(), String> {
        let status = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .map_err(|err| format!("{} does not run: {err}", program.display()))?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("{} {args:?} failed: {status}", program.display()))
    };
    let venv_arg = venv.to_string_lossy().into_owned();
    let repository = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (install, pinned) = (
        repository.join("scripts/python-venv.sh"),
        repository.join("ci/python/moto/requirements.txt"),
    );
    if install.is_file() && pinned.is_file() {
        let (install, pinned) = (install.to_string_lossy(), pinned.to_string_lossy());
        run("bash".as_ref(), &[&install, &venv_arg, &pinned])?;
    } else {
        run("python3".as_ref(), &["-m", "venv", &venv_arg])?;
        run(
            &venv.join("bin/pip"),
            &["install", "--quiet", "moto[server]"],
        )?;
    }
    Ok(server)
}
