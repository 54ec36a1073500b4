//! The SDK configurations the store's constructors build.
//!
//! - [`from_env`](super::DynamoDbStore::from_env): the SDK's default configuration
//!   (aws-config: the credential chain, profiles, every `AWS_*` setting, the SDKs' endpoint
//!   variables `AWS_ENDPOINT_URL_DYNAMODB` and `AWS_ENDPOINT_URL` among them), with
//!   `DYNAMODB_ENDPOINT` over all of them.
//! - [`for_lambda`](super::DynamoDbStore::for_lambda): only what a Lambda execution
//!   environment gives: the region and the execution role's credentials from the variables
//!   Lambda sets, and the same endpoint variables. A binary that never calls aws-config links none of
//!   its credential chain (profiles, SSO, STS, IMDS, ECS).
//!
//! `for_lambda` also chooses the HTTPS client's trusted roots. The SDK's default client reads
//! the system's CA bundle and every file of its certificate directory when it is built, and
//! parses each one: milliseconds of every cold start (hundreds of files on some images).
//! Instead, from Mozilla's roots compiled into the binary (webpki-root-certs):
//!
//! | endpoint | trusted roots |
//! |---|---|
//! | the region's, in the `aws` partition | Amazon Trust Services' (Amazon Root CA 1–4, Starfield Services Root G2), which sign every AWS endpoint there |
//! | the region's, in another partition (China, GovCloud, ISO, EU sovereign) or unknown | all of Mozilla's |
//! | a configured endpoint (`DYNAMODB_ENDPOINT`, `AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL`) over `https` | all of Mozilla's |
//! | a configured endpoint over `http` (a local server) | none: no TLS is spoken |
//! | any, with `SSL_CERT_FILE` or `SSL_CERT_DIR` set | the system's (the SDK's default) |

use std::time::Duration;

#[cfg(feature = "from-env")]
use aws_config::SdkConfig;
use aws_sdk_dynamodb::config::BehaviorVersion;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{Credentials, Region, SharedHttpClient};
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
use aws_smithy_http_client::{Builder, ConnectorBuilder};
use base64::Engine;

#[cfg(feature = "from-env")]
use super::ENDPOINT_VAR;
use super::configured_endpoint;
use crate::error::ConfigError;

/// The variables with which a deployment names its own trusted certificates.
const CERT_VARS: [&str; 2] = ["SSL_CERT_FILE", "SSL_CERT_DIR"];

/// The longest one HTTP attempt of a request may take: DynamoDB answers in milliseconds, so a
/// request that has not answered by then is hung (a dead connection), and is sent again.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest one request may take, the SDK's own retries included: the bound on each of the
/// engine's tries, so that a settlement retried until the invocation's deadline is never stuck
/// in one of them.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The SDK's connect timeout, kept when the store adds its operation timeouts.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3100);

/// `config` with [`ATTEMPT_TIMEOUT`] and [`OPERATION_TIMEOUT`] where it sets none (its connect
/// and read timeouts kept); `None` when it sets both already.
pub(super) fn with_timeouts(config: &aws_sdk_dynamodb::Config) -> Option<aws_sdk_dynamodb::Config> {
    let timeouts = bounded(config.timeout_config(), OPERATION_TIMEOUT, ATTEMPT_TIMEOUT)?;
    Some(config.to_builder().timeout_config(timeouts).build())
}

/// `current` with an operation and an attempt timeout where it sets none (its connect and read
/// timeouts kept, the SDK's connect timeout where it sets none; a timeout it disables stays
/// disabled); `None` when it changes nothing. A client of an AWS service has no operation
/// timeout by default: a request to a service that stopped answering waits until the
/// invocation's own timeout.
pub(crate) fn bounded(
    current: Option<&TimeoutConfig>,
    operation: Duration,
    attempt: Duration,
) -> Option<TimeoutConfig> {
    let mut filled = current
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build());
    filled.take_defaults_from(
        &TimeoutConfig::builder()
            .operation_timeout(operation)
            .operation_attempt_timeout(attempt)
            .connect_timeout(CONNECT_TIMEOUT)
            .build(),
    );
    (current != Some(&filled)).then_some(filled)
}

/// A DynamoDB client's configuration from the SDK's defaults (aws-config reads
/// `AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL`, profiles and the ignore switch itself),
/// with `DYNAMODB_ENDPOINT` over all of them: set on the client's own configuration, which the
/// SDK's service-specific settings do not override.
#[cfg(feature = "from-env")]
pub(super) async fn from_env() -> aws_sdk_dynamodb::Config {
    dynamodb_config(&aws_config::defaults(BehaviorVersion::latest()).load().await)
}

/// `sdk`'s DynamoDB client configuration, with `DYNAMODB_ENDPOINT` over whatever endpoint it
/// names (the SDK's service settings, `AWS_ENDPOINT_URL_DYNAMODB`, do not override a client's
/// own): what [`DynamoDbStore::from_env`](super::DynamoDbStore::from_env) and `idemctl` use.
///
/// ```no_run
/// # async fn demo() {
/// let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let client = aws_sdk_dynamodb::Client::from_conf(lambda_idempotency::store::dynamodb_config(&sdk));
/// # let _ = client; }
/// ```
#[cfg(feature = "from-env")]
#[cfg_attr(docsrs, doc(cfg(feature = "from-env")))]
pub fn dynamodb_config(sdk: &SdkConfig) -> aws_sdk_dynamodb::Config {
    let config = aws_sdk_dynamodb::config::Builder::from(sdk);
    // Read as `configured_endpoint` reads it (trimmed: a value pasted with a space or a
    // newline names the same endpoint); the SDK's own variables are `sdk`'s already.
    let ours = |name: &str| match name {
        ENDPOINT_VAR => std::env::var(name).ok(),
        _ => None,
    };
    match super::endpoint_from(ours) {
        Some(endpoint) => config.endpoint_url(endpoint).build(),
        None => config.build(),
    }
}

/// The variable an environment sets when it serves the role's credentials from an endpoint
/// (SnapStart, ECS, and long-lived environments) instead of in variables.
const CONTAINER_CREDENTIALS_VAR: &str = "AWS_CONTAINER_CREDENTIALS_FULL_URI";

/// What to do about a variable [`for_lambda`] misses: in an environment that serves the role's
/// credentials from an endpoint (`endpoint`), which [`for_lambda`] does not call, the chain of
/// `DynamoDbStore::from_env` fetches them and refreshes them before they expire.
fn missing_env_hint(endpoint: bool) -> &'static str {
    match endpoint {
        true => {
            "this environment serves the role's credentials from an endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI), which DynamoDbStore::for_lambda does not call: use DynamoDbStore::from_env, whose credential chain fetches and refreshes them"
        }
        false => {
            "Lambda sets it for the execution role; outside Lambda, use DynamoDbStore::from_env"
        }
    }
}

/// The configuration from a Lambda execution environment's variables.
pub(super) fn for_lambda() -> Result<aws_sdk_dynamodb::Config, ConfigError> {
    let hint = missing_env_hint(std::env::var_os(CONTAINER_CREDENTIALS_VAR).is_some());
    let var = |name: &'static str| {
        std::env::var(name).map_err(|_| ConfigError::MissingEnv { name, hint })
    };
    let credentials = Credentials::new(
        var("AWS_ACCESS_KEY_ID")?,
        var("AWS_SECRET_ACCESS_KEY")?,
        std::env::var("AWS_SESSION_TOKEN").ok(),
        None,
        "lambda-environment",
    );
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(credentials);
    let endpoint = configured_endpoint();
    let region = var("AWS_REGION")?;
    let own_certs = CERT_VARS.iter().any(|var| std::env::var_os(var).is_some());
    let roots = (!own_certs).then(|| trusted_roots(endpoint.as_deref(), &region));
    let mut config = config.region(Region::new(region));
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    if let Some(client) = roots.and_then(|roots| https_client(&roots)) {
        config = config.http_client(client);
    }
    Ok(config.build())
}

/// The compiled-in roots to trust (DER) for `endpoint` in `region`.
fn trusted_roots(endpoint: Option<&str>, region: &str) -> Vec<&'static [u8]> {
    let all = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .map(|root| root.as_ref());
    match endpoint {
        Some(endpoint) if endpoint.starts_with("http://") => Vec::new(),
        Some(_) => all.collect(),
        None if in_aws_partition(region) => {
            let amazon: Vec<&[u8]> = all.clone().filter(|root| is_amazon_root(root)).collect();
            // Should the compiled-in list ever lose them, trust it all.
            if amazon.is_empty() {
                all.collect()
            } else {
                amazon
            }
        }
        None => all.collect(),
    }
}

/// Whether `region` is in the `aws` partition, by the SDK's pattern for it
/// (`^(us|eu|ap|sa|ca|me|af|il|mx)-\w+-\d+$`): not China, GovCloud, the ISO or EU sovereign
/// partitions, nor a region unknown to it (which gets all of Mozilla's roots).
fn in_aws_partition(region: &str) -> bool {
    const PREFIXES: [&str; 9] = ["us", "eu", "ap", "sa", "ca", "me", "af", "il", "mx"];
    let parts: Vec<&str> = region.split('-').collect();
    match parts.as_slice() {
        [prefix, name, number] => {
            PREFIXES.contains(prefix)
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !number.is_empty()
                && number.chars().all(|c| c.is_ascii_digit())
        }
        _ => false,
    }
}

/// Whether a root certificate (DER) is one of Amazon Trust Services': its subject (a root's
/// issuer too) names one of their CAs.
fn is_amazon_root(der: &[u8]) -> bool {
    const NAMES: [&[u8]; 2] = [
        b"Amazon Root CA ",
        b"Starfield Services Root Certificate Authority - G2",
    ];
    NAMES
        .iter()
        .any(|name| der.windows(name.len()).any(|window| window == *name))
}

/// The SDK's default HTTPS client (hyper 1, rustls on aws-lc, proxy settings from the
/// environment), trusting `roots`. `None`: the TLS context could not be built, so the SDK's
/// default is kept.
fn https_client(roots: &[&[u8]]) -> Option<SharedHttpClient> {
    let mut trust = TrustStore::empty().with_native_roots(false);
    for root in roots {
        trust.add_pem_certificate(pem(root));
    }
    let context = TlsContext::builder().with_trust_store(trust).build().ok()?;
    Some(
        Builder::new().build_with_connector_fn(move |settings, runtime_components| {
            let mut connector = ConnectorBuilder::default()
                .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(context.clone());
            connector.set_connector_settings(settings.cloned());
            if let Some(components) = runtime_components {
                connector.set_sleep_impl(components.sleep_impl());
            }
            connector.set_proxy_config(Some(ProxyConfig::from_env()));
            connector.build()
        }),
    )
}

/// A DER certificate as PEM, the form the SDK's trust store takes.
fn pem(der: &[u8]) -> Vec<u8> {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = Vec::with_capacity(body.len() + body.len() / 64 + 64);
    pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.extend_from_slice(line);
        pem.push(b'\n');
    }
    pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    use super::{https_client, missing_env_hint, pem, trusted_roots};

    #[test]
    fn an_environment_serving_credentials_from_an_endpoint_is_pointed_at_from_env() {
        assert!(missing_env_hint(true).contains("use DynamoDbStore::from_env"));
        assert!(missing_env_hint(true).contains("AWS_CONTAINER_CREDENTIALS_FULL_URI"));
        assert!(!missing_env_hint(false).contains("AWS_CONTAINER_CREDENTIALS_FULL_URI"));
    }

    #[test]
    fn every_compiled_in_root_reads_back_from_its_pem() {
        for root in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
            let read: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(&pem(root))
                .collect::<Result<_, _>>()
                .expect("valid PEM");
            assert_eq!(read, std::slice::from_ref(root));
        }
    }

    #[test]
    fn an_aws_region_trusts_amazon_trust_services_only() {
        let roots = trusted_roots(None, "eu-west-1");
        assert_eq!(
            roots.len(),
            5,
            "Amazon Root CA 1-4 and Starfield Services Root G2"
        );
        assert!(https_client(&roots).is_some());
    }

    #[test]
    fn other_partitions_and_custom_endpoints_trust_all_of_mozilla() {
        let all = webpki_root_certs::TLS_SERVER_ROOT_CERTS.len();
        assert!(all > 100);
        for (endpoint, region) in [
            (None, "cn-north-1"),
            (None, "us-gov-west-1"),
            (None, "us-iso-east-1"),
            (None, "eusc-de-east-1"),
            (None, "xx-new-1"),
            (Some("https://dynamodb.example.internal"), "eu-west-1"),
        ] {
            let roots = trusted_roots(endpoint, region);
            assert_eq!(roots.len(), all, "{endpoint:?} in {region}");
        }
        assert!(https_client(&trusted_roots(None, "cn-north-1")).is_some());
    }

    #[test]
    fn every_client_gets_a_bound_on_each_try_and_keeps_its_own() {
        use std::time::Duration;

        use aws_sdk_dynamodb::config::timeout::TimeoutConfig;

        use super::{ATTEMPT_TIMEOUT, OPERATION_TIMEOUT, with_timeouts};

        let bare = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        let bounded = with_timeouts(&bare).expect("timeouts added");
        let timeouts = bounded.timeout_config().expect("timeouts");
        assert_eq!(timeouts.operation_timeout(), Some(OPERATION_TIMEOUT));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        assert!(timeouts.connect_timeout().is_some());
        assert!(with_timeouts(&bounded).is_none(), "set once");

        let own = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(9))
                    .read_timeout(Duration::from_secs(1))
                    .build(),
            )
            .build();
        let kept = with_timeouts(&own).expect("the attempt bound added");
        let timeouts = kept.timeout_config().expect("timeouts");
        assert_eq!(timeouts.operation_timeout(), Some(Duration::from_secs(9)));
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        assert_eq!(timeouts.read_timeout(), Some(Duration::from_secs(1)));

        let disabled = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .timeout_config(TimeoutConfig::disabled())
            .build();
        assert!(
            with_timeouts(&disabled).is_none(),
            "timeouts switched off on purpose stay off"
        );
    }

    #[test]
    fn a_plain_http_endpoint_needs_no_roots() {
        let roots = trusted_roots(Some("http://127.0.0.1:8000"), "us-east-1");
        assert!(roots.is_empty());
        assert!(https_client(&roots).is_some());
    }
}
