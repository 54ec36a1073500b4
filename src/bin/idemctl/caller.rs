//! Who resolves: the caller as AWS identifies it (STS `GetCallerIdentity`), never a name the
//! environment gives (`$USER`).
//!
//! - AWS answers: the trace names the caller's ARN (an IAM user, or an assumed role with its
//!   session name), whatever else is passed.
//! - AWS does not answer (no network, no credentials, an endpoint that refuses): idemctl says
//!   so and writes nothing, unless `--operator NAME` was passed, which is then recorded as
//!   `unverified:NAME` so that every later reader knows AWS did not vouch for it.
//!
//! STS is reached as the SDK configures it: the region and credentials of the default chain,
//! and the endpoint `AWS_ENDPOINT_URL_STS` (or `AWS_ENDPOINT_URL`) names, for a local server.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sts::error::DisplayErrorContext;

/// How long idemctl waits for STS in all.
const STS_TIMEOUT: Duration = Duration::from_secs(10);
/// What an operator name AWS did not vouch for is recorded with.
pub(crate) const UNVERIFIED: &str = "unverified:";

/// Who the trace names, and how that was established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The ARN STS answered with.
    Verified(String),
    /// `--operator`'s name, STS having failed for the reason given.
    Unverified {
        /// The name as it is recorded (with [`UNVERIFIED`] before it).
        recorded: String,
        /// Why STS gave no answer.
        sts_error: String,
    },
}

impl Caller {
    /// The name the trace keeps.
    pub(crate) fn recorded(&self) -> &str {
        match self {
            Self::Verified(arn) => arn,
            Self::Unverified { recorded, .. } => recorded,
        }
    }
}

/// Asks STS who the caller is; falls back to `operator` (recorded as unverified) only when
/// STS does not answer.
///
/// # Errors
/// When STS does not answer and no `operator` was passed (or a blank one, which would name
/// nobody): nothing may be written.
pub(crate) async fn identify(
    sdk: &aws_config::SdkConfig,
    operator: Option<&str>,
) -> Result<Caller, String> {
    match caller_arn(sdk).await {
        Ok(arn) => Ok(Caller::Verified(arn)),
        Err(sts_error) => match operator.filter(|name| !name.trim().is_empty()) {
            Some(name) => Ok(Caller::Unverified {
                recorded: format!("{UNVERIFIED}{name}"),
                sts_error,
            }),
            None => Err(format!(
                "AWS cannot say who you are (STS GetCallerIdentity: {sts_error}): nothing \
                 changed. Check your credentials and network, or pass --operator NAME to \
                 record the resolution as by `{UNVERIFIED}NAME`"
            )),
        },
    }
}

/// The caller's ARN, from STS.
async fn caller_arn(sdk: &aws_config::SdkConfig) -> Result<String, String> {
    let config = aws_sdk_sts::config::Builder::from(sdk)
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(STS_TIMEOUT)
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .build();
    let answer = aws_sdk_sts::Client::from_conf(config)
        .get_caller_identity()
        .send()
        .await
        .map_err(|err| DisplayErrorContext(err).to_string())?;
    answer
        .arn()
        .filter(|arn| !arn.trim().is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "STS answered without an ARN".to_owned())
}
