//! Building a [`DynamoDbStore`]: its constructors (with a client of the caller's, from the
//! environment, for a Lambda function), [`prime`](DynamoDbStore::prime) for a function's
//! init, the `with_*` builders and the accessors.

use std::future::Future;
use std::time::Duration;

use aws_sdk_dynamodb::Client;

use super::error::map_sdk_error;
use super::{
    AttributeNames, DynamoDbStore, OutcomeStorage, TABLE_VAR, UNIQUENESS_TABLE_VAR, client,
    replication,
};
use crate::error::{ConfigError, StoreError};
use crate::key::{FUNCTION_NAME_VAR, OperationKey};

impl DynamoDbStore {
    /// A store on `table` through `client`, with the default attribute names. A client
    /// without an operation timeout or an attempt timeout gets the store's
    /// ([`OPERATION_TIMEOUT`], [`ATTEMPT_TIMEOUT`]): each of the engine's tries
    /// is bounded, so that one hung request cannot use up the time a settlement has left.
    ///
    /// [`OPERATION_TIMEOUT`]: super::OPERATION_TIMEOUT
    /// [`ATTEMPT_TIMEOUT`]: super::ATTEMPT_TIMEOUT
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let client = client::with_timeouts(client.config()).map_or(client, Client::from_conf);
        let store = Self {
            client,
            table: table.into(),
            uniqueness_table: None,
            names: AttributeNames::default(),
            outcomes: OutcomeStorage::default(),
            unscoped_evidence: true,
            accept_eventual: false,
            prime_namespace: None,
            verdict: replication::Verdict::default(),
            strong: replication::Strong::default(),
            owed: replication::Owed::default(),
        };
        // The first claim checks the tables' replication when `prime` did not (a store that is
        // never primed, as `Idempotency::from_env` builds it): a global table whose Regions
        // could both claim one key is refused on every path, not only the primed one.
        store.owe_replication_check();
        store
    }

    /// A store on the tables named by `IDEMPOTENCY_TABLE` and (if set) `UNIQUENESS_TABLE`, with
    /// the default AWS configuration (aws-config: the credential chain, profiles, every
    /// `AWS_*` setting, `AWS_ENDPOINT_URL_DYNAMODB` among them); `DYNAMODB_ENDPOINT`, when set,
    /// overrides the endpoint.
    /// [`Self::for_lambda`] is leaner inside a Lambda function.
    #[cfg(feature = "from-env")]
    #[cfg_attr(docsrs, doc(cfg(feature = "from-env")))]
    pub async fn from_env() -> Result<Self, ConfigError> {
        let table = table_from_env()?;
        Ok(
            Self::new(Client::from_conf(client::from_env().await), table)
                .with_uniqueness_from_env(),
        )
    }

    /// A store for a Lambda function: the tables as [`Self::from_env`] names them, the region
    /// and the execution role's credentials from the variables Lambda sets (`AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), the endpoint
    /// [`configured_endpoint`](crate::store::configured_endpoint) names, and an HTTPS client that trusts Mozilla's roots compiled into the
    /// binary (the system's when `SSL_CERT_FILE` or `SSL_CERT_DIR` is set).
    ///
    /// It reads no file and calls no credential provider, so a cold start is shorter, and a
    /// binary that uses it instead of [`Self::from_env`] links none of aws-config's credential
    /// chain (BENCHMARKS.md has the figures). Other `AWS_*` settings (`AWS_MAX_ATTEMPTS`,
    /// profiles) are not read: use [`Self::from_env`] for them.
    ///
    /// ```no_run
    /// # async fn build() -> Result<(), lambda_idempotency::ConfigError> {
    /// use lambda_idempotency::{DynamoDbStore, Idempotency};
    ///
    /// let idem = Idempotency::new(DynamoDbStore::for_lambda()?);
    /// # let _ = idem; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::MissingEnv`] when a table's, the region's or the credentials' variable
    /// is not set (outside Lambda).
    pub fn for_lambda() -> Result<Self, ConfigError> {
        let table = table_from_env()?;
        Ok(Self::new(Client::from_conf(client::for_lambda()?), table).with_uniqueness_from_env())
    }

    /// Keeps permanent evidence in the table `UNIQUENESS_TABLE` names, if set.
    fn with_uniqueness_from_env(self) -> Self {
        match named(std::env::var(UNIQUENESS_TABLE_VAR).ok()) {
            Some(uniqueness) => self.with_uniqueness_table(uniqueness),
            None => self,
        }
    }

    /// Warms the client and checks the tables during a function's init: one eventually
    /// consistent `GetItem` of a key no operation uses, inside the function's namespace (so a
    /// policy that scopes item actions to it allows the read: [`Self::with_prime_namespace`]), so the connection (TCP and TLS), the
    /// credentials, the endpoint and the SDK's first-use paths are ready before the first event
    /// instead of delaying it, and, at the same time, [`Self::check_replication`]
    /// (`DescribeTable` of each table), which refuses a global table that would let two
    /// Regions claim one key. In Lambda, init runs with a full CPU and, with provisioned
    /// concurrency, before any request. It finds a missing or forbidden table before an event
    /// does. It gives up after 2 s, well inside Lambda's 10 s init.
    ///
    /// ```no_run
    /// # async fn init() -> Result<(), Box<dyn std::error::Error>> {
    /// use lambda_idempotency::DynamoDbStore;
    ///
    /// let store = DynamoDbStore::for_lambda()?;
    /// if let Err(err) = store.prime().await {
    ///     if !err.is_transient() {
    ///         return Err(err.into()); // a missing table or permission: fail the init
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError::TableNotFound`], [`StoreError::UniquenessTableNotFound`],
    /// [`StoreError::AccessDenied`] (the role needs `dynamodb:DescribeTable` too),
    /// [`StoreError::Rejected`] (the table's key schema is not the store's),
    /// [`StoreError::EventuallyConsistentReplicas`], [`StoreError::TransactionsUnsupported`],
    /// or a transient error ([`StoreError::is_transient`]: throttled, unavailable, or no answer
    /// within 2 s) that the first event's own requests will retry (a replication check left
    /// undone is tried again by the claims, one at a time, until it completes: until then
    /// they claim unchecked).
    pub async fn prime(&self) -> Result<(), StoreError> {
        let key = OperationKey::from_stored(prime_key(self.prime_namespace.as_deref()));
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.names.key(&key)))
            .projection_expression("#pk")
            .expression_attribute_names("#pk", &self.names.partition_key)
            .send();
        let read = async {
            read.await
                .map(drop)
                .map_err(|err| map_sdk_error("prime", &self.table, err))
        };
        // Owed until it completes: should it fail for now, claims try it again.
        self.owe_replication_check();
        let (read, checked) = futures_util::future::join(
            within(PRIME_TIMEOUT, read),
            within(PRIME_TIMEOUT, async {
                self.check_replication().await.map(drop)
            }),
        )
        .await;
        // A lasting error first: it fails the init; a transient one leaves it to the events.
        match (read, checked) {
            (Err(err), _) | (_, Err(err)) if !err.is_transient() => Err(err),
            (read, checked) => read.and(checked),
        }
    }

    /// The namespace whose key [`Self::prime`] reads, when the function's operations are not in
    /// its own ([`OperationScope::new`](crate::key::OperationScope::new) with a namespace of yours): a least-privilege policy
    /// that scopes item actions by `dynamodb:LeadingKeys` to `<namespace>#*` lets prime read
    /// there. By default, the function's name (`AWS_LAMBDA_FUNCTION_NAME`), the namespace of
    /// [`OperationScope::for_function`](crate::key::OperationScope::for_function).
    pub fn with_prime_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.prime_namespace = Some(namespace.into());
        self
    }

    /// Keeps permanent evidence of business identities in `table`.
    pub fn with_uniqueness_table(mut self, table: impl Into<String>) -> Self {
        self.uniqueness_table = Some(table.into());
        self.reset_replication_check();
        self
    }

    /// Whether a claim that declares a business identity also looks for its evidence in the
    /// other forms it may have been kept in (default `true`): under another
    /// [`IdentityScope`](crate::key::IdentityScope) of the operation's namespace and tenant (a
    /// deploy changed the scope), and under the bare identity
    /// (versions before 0.2 did not scope evidence). Such evidence of an operation the claim's
    /// scope shares the identity with refuses it, as the memory store always does. Each form
    /// is one more `ConditionCheck` item in the claim's transaction (one to three), which needs
    /// `dynamodb:ConditionCheckItem` on the uniqueness table. Turn it off only when every
    /// operation on the table has always kept one identity scope and one tenancy, and no
    /// version before 0.2 wrote to it.
    pub fn with_unscoped_evidence_check(mut self, check: bool) -> Self {
        self.unscoped_evidence = check;
        self
    }

    /// Renames the attributes (the key and TTL attributes must match the table).
    pub fn with_attribute_names(mut self, names: AttributeNames) -> Self {
        self.names = names;
        self
    }

    /// Chooses where outcomes are kept: inline in a record up to 1 KB, compressed, then in
    /// part items beside it by default (see [`OutcomeStorage`]).
    pub fn with_outcome_storage(mut self, outcomes: OutcomeStorage) -> Self {
        self.outcomes = outcomes;
        self
    }

    /// The SDK client (to reuse its configuration for the handler's own tables).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The idempotency table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The uniqueness table's name, if configured.
    pub fn uniqueness_table(&self) -> Option<&str> {
        self.uniqueness_table.as_deref()
    }
}

/// The key [`DynamoDbStore::prime`] reads, after the namespace: not an operation key (those
/// carry a version and a hash), so it is never stored.
const PRIME_KEY: &str = "lambda-idempotency#prime";

/// The key [`DynamoDbStore::prime`] reads: inside `namespace`, else inside the function's
/// (`AWS_LAMBDA_FUNCTION_NAME`, the namespace of [`OperationScope::for_function`](crate::key::OperationScope::for_function)), where a
/// least-privilege policy lets the function read (`dynamodb:LeadingKeys` `<namespace>#*`);
/// the bare key only outside Lambda, with no namespace given.
fn prime_key(namespace: Option<&str>) -> String {
    let from_env = std::env::var(FUNCTION_NAME_VAR).ok();
    match namespace.or(from_env.as_deref()) {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}#{PRIME_KEY}"),
        _ => PRIME_KEY.to_owned(),
    }
}
/// How long [`DynamoDbStore::prime`] waits for its read, and a claim for a replication check
/// it owes.
pub(super) const PRIME_TIMEOUT: Duration = Duration::from_secs(2);

/// `request`'s answer, or [`StoreError::Unavailable`] when it has none within `limit`.
pub(super) async fn within(
    limit: Duration,
    request: impl Future<Output = Result<(), StoreError>>,
) -> Result<(), StoreError> {
    tokio::time::timeout(limit, request)
        .await
        .unwrap_or_else(|elapsed| {
            Err(StoreError::Unavailable {
                operation: "prime",
                source: Box::new(elapsed),
            })
        })
}

/// The idempotency table's name, from `IDEMPOTENCY_TABLE`.
fn table_from_env() -> Result<String, ConfigError> {
    named(std::env::var(TABLE_VAR).ok()).ok_or(ConfigError::MissingEnv {
        name: TABLE_VAR,
        hint: "set it to the idempotency table's name (template.yaml outputs it)",
    })
}

/// A table's name from a variable's `value`, trimmed (a value pasted with a space or a
/// newline names the same table): blank is unset (a template's
/// `!If [HasIdentity, !Ref Table, ""]`), never a name DynamoDB would refuse at the first call.
fn named(value: Option<String>) -> Option<String> {
    value
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_table_variable_is_unset() {
        assert_eq!(named(None), None);
        assert_eq!(named(Some(String::new())), None);
        assert_eq!(named(Some("  ".into())), None);
        assert_eq!(named(Some(" orders\n".into())), Some("orders".to_owned()));
        assert_eq!(named(Some("orders".into())).as_deref(), Some("orders"));
    }

    #[test]
    fn prime_reads_inside_the_namespace_a_least_privilege_policy_allows() {
        // The leading key `<namespace>#…` is what `dynamodb:LeadingKeys` `<namespace>#*` allows.
        assert_eq!(
            prime_key(Some("orders-fn")),
            "orders-fn#lambda-idempotency#prime"
        );
    }
}
