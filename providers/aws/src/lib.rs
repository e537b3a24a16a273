//! regbroker provider for AWS ECR (private registries) and ECR Public.
//!
//! Env vars and settings read (all through aws-config, lazily, on the first `fetch`):
//! - identity: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//!   `AWS_PROFILE`, `AWS_CONFIG_FILE`, `AWS_SHARED_CREDENTIALS_FILE`;
//!   `AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_SESSION_NAME` (IRSA);
//!   `AWS_CONTAINER_CREDENTIALS_FULL_URI`, `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`,
//!   `AWS_CONTAINER_AUTHORIZATION_TOKEN`, `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (EKS Pod
//!   Identity, ECS); `AWS_EC2_METADATA_SERVICE_ENDPOINT`, `AWS_EC2_METADATA_DISABLED` (IMDSv2);
//! - region of the identity chain's STS calls: `AWS_REGION`, `AWS_DEFAULT_REGION`, the
//!   profile's `region`, else `us-east-1` (the ECR call itself always uses the registry's
//!   region);
//! - endpoints: `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_ECR`, `AWS_ENDPOINT_URL_ECR_PUBLIC`,
//!   `AWS_ENDPOINT_URL_STS`, `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`, `AWS_USE_FIPS_ENDPOINT`,
//!   `AWS_USE_DUALSTACK_ENDPOINT`.
//!
//! [`AwsProvider::from_env`] does no I/O. [`AwsProvider::builder`] takes explicit settings
//! for tests (endpoint, credentials, retry and timeout settings, clock).
//!
//! Rule options: `region`, `account`, `role_arn` (see [`options`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod errors;
pub mod host;
pub mod options;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use aws_config::BehaviorVersion;
use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_config::retry::RetryConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_config::timeout::TimeoutConfig;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_types::SdkConfig;
use aws_types::region::Region;
use base64::Engine;
use regbroker_provider::{
    BoxFuture, Credential, Error, Options, Provider, Registry, SecretString, SharedClock, Target,
    system_clock,
};
use tokio::sync::OnceCell;

pub use errors::IDENTITY_SOURCES;
use host::EcrHost;
use options::RuleOptions;

/// The username of every ECR credential.
pub const USERNAME: &str = "AWS";
/// The region of the ECR Public API.
pub const PUBLIC_REGION: &str = "us-east-1";
/// Session name used when assuming a rule's `role_arn`.
pub const SESSION_NAME: &str = "regbroker";

const P_KIND: &str = "kind";
const P_REGION: &str = "region";
const P_ACCOUNT: &str = "account";
const P_ROLE: &str = "role_arn";
const KIND_PRIVATE: &str = "private";
const KIND_PUBLIC: &str = "public";

/// Tracing filter directives the broker must add after the user's own (e.g. to an
/// `EnvFilter`), so that even `RUST_LOG=trace` cannot log secrets: at TRACE the AWS SDK
/// logs request headers (the session token), the SigV4 canonical request and the raw
/// response body (the ECR token). Capped at DEBUG, nothing secret is logged
/// (`tests/logs.rs` checks both).
pub const LOG_DIRECTIVES: &[&str] = &[
    "aws_config=debug",
    "aws_credential_types=debug",
    "aws_runtime=debug",
    "aws_sigv4=debug",
    "aws_smithy_runtime=debug",
    "aws_smithy_runtime_api=debug",
    "aws_smithy_http=debug",
    "aws_smithy_http_client=debug",
    "aws_smithy_types=debug",
    "aws_smithy_json=debug",
    "aws_sdk_ecr=debug",
    "aws_sdk_ecrpublic=debug",
    "aws_sdk_sts=debug",
    "aws_sdk_sso=debug",
    "aws_sdk_ssooidc=debug",
    "hyper=debug",
    "hyper_util=debug",
    "h2=debug",
];

/// Retry and timeout settings of every AWS call (identity chain included).
#[derive(Clone, Debug)]
pub struct CallSettings {
    /// Attempts per call, first one included (throttling and 5xx are retried).
    pub max_attempts: u32,
    /// First backoff; later ones grow exponentially, with full jitter.
    pub initial_backoff: Duration,
    /// Longest single backoff.
    pub max_backoff: Duration,
    /// Limit for one attempt.
    pub attempt_timeout: Duration,
    /// Limit for a whole call, retries included.
    pub operation_timeout: Duration,
    /// TCP/TLS connect limit.
    pub connect_timeout: Duration,
}

impl Default for CallSettings {
    fn default() -> Self {
        CallSettings {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(25),
            connect_timeout: Duration::from_secs(3),
        }
    }
}

/// Explicit settings for an [`AwsProvider`]; everything unset comes from the environment
/// as aws-config reads it.
pub struct Builder {
    endpoint_url: Option<String>,
    credentials: Option<SharedCredentialsProvider>,
    calls: CallSettings,
    clock: SharedClock,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("endpoint_url", &self.endpoint_url)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "explicit"),
            )
            .field("calls", &self.calls)
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            endpoint_url: None,
            credentials: None,
            calls: CallSettings::default(),
            clock: system_clock(),
        }
    }
}

impl Builder {
    /// Sends every AWS call (ECR, ECR Public, STS) to `url`, like `AWS_ENDPOINT_URL`.
    pub fn endpoint_url(mut self, url: impl Into<String>) -> Builder {
        self.endpoint_url = Some(url.into());
        self
    }

    /// Uses these credentials instead of aws-config's default chain.
    pub fn credentials(mut self, credentials: SharedCredentialsProvider) -> Builder {
        self.credentials = Some(credentials);
        self
    }

    /// Retry and timeout settings.
    pub fn calls(mut self, calls: CallSettings) -> Builder {
        self.calls = calls;
        self
    }

    /// The clock the SDK signs requests and judges identity expiry with.
    pub fn clock(mut self, clock: SharedClock) -> Builder {
        self.clock = clock;
        self
    }

    /// The provider. Does no I/O: the SDK configuration is loaded on the first fetch.
    pub fn build(self) -> AwsProvider {
        AwsProvider {
            settings: self,
            sdk: OnceCell::new(),
            ecr: Mutex::new(HashMap::new()),
            public: Mutex::new(HashMap::new()),
        }
    }
}

/// Most clients kept at once. The region comes from the client's host, so a caller could
/// name many made-up regions; past this many the map starts afresh (a client is cheap to
/// rebuild: the base identity cache lives in the shared SDK config; a `role_arn` client
/// costs one more AssumeRole).
const MAX_CLIENTS: usize = 64;

/// Clients are kept per (role, region) so the SDK's identity cache (and any assumed role
/// session) is reused across fetches.
type ClientKey = (Option<String>, String);

/// The AWS provider: ECR and ECR Public.
pub struct AwsProvider {
    settings: Builder,
    sdk: OnceCell<SdkConfig>,
    ecr: Mutex<HashMap<ClientKey, aws_sdk_ecr::Client>>,
    public: Mutex<HashMap<Option<String>, aws_sdk_ecrpublic::Client>>,
}

impl fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsProvider")
            .field("settings", &self.settings)
            .field("loaded", &self.sdk.initialized())
            .finish()
    }
}

impl AwsProvider {
    /// The provider as deployed: identity, region and endpoints from the environment
    /// (aws-config's default chain), read on first use. Does no I/O.
    pub fn from_env() -> AwsProvider {
        Builder::default().build()
    }

    /// Explicit settings, for tests and embedding.
    pub fn builder() -> Builder {
        Builder::default()
    }

    async fn sdk_config(&self) -> &SdkConfig {
        self.sdk
            .get_or_init(|| async {
                let s = &self.settings;
                let calls = &s.calls;
                // Region of the identity chain's own calls (STS for IRSA/AssumeRole). IMDS
                // is left out on purpose: on EKS a pod often cannot reach it, and waiting
                // for it would only delay the first fetch.
                let region =
                    RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
                        .or_else(ProfileFileRegionProvider::new())
                        .or_else(Region::from_static(PUBLIC_REGION));
                let mut loader = aws_config::defaults(BehaviorVersion::latest())
                    .region(region)
                    .retry_config(
                        RetryConfig::standard()
                            .with_max_attempts(calls.max_attempts.max(1))
                            .with_initial_backoff(calls.initial_backoff)
                            .with_max_backoff(calls.max_backoff),
                    )
                    .timeout_config(
                        TimeoutConfig::builder()
                            .connect_timeout(calls.connect_timeout)
                            .operation_attempt_timeout(calls.attempt_timeout)
                            .operation_timeout(calls.operation_timeout)
                            .build(),
                    )
                    .time_source(ClockTimeSource(s.clock.clone()));
                if let Some(url) = &s.endpoint_url {
                    loader = loader.endpoint_url(url.clone());
                }
                if let Some(creds) = &s.credentials {
                    loader = loader.credentials_provider(creds.clone());
                }
                let config = loader.load().await;
                tracing::debug!(region = ?config.region(), "Loaded AWS configuration");
                config
            })
            .await
    }

    /// Credentials for `role_arn` (assumed from the base identity) in `region`, or `None`
    /// for the base identity itself.
    async fn role_credentials(
        &self,
        role_arn: Option<&str>,
        region: &str,
    ) -> Option<SharedCredentialsProvider> {
        let role = role_arn?;
        let sdk = self.sdk_config().await;
        let provider = AssumeRoleProvider::builder(role)
            .session_name(SESSION_NAME)
            .region(Region::new(region.to_string()))
            .configure(sdk)
            .build()
            .await;
        Some(SharedCredentialsProvider::new(provider))
    }

    async fn ecr_client(&self, role_arn: Option<&str>, region: &str) -> aws_sdk_ecr::Client {
        let key = (role_arn.map(str::to_string), region.to_string());
        if let Some(c) = lock(&self.ecr).get(&key) {
            return c.clone();
        }
        let sdk = self.sdk_config().await;
        let mut conf =
            aws_sdk_ecr::config::Builder::from(sdk).region(Region::new(region.to_string()));
        if let Some(creds) = self.role_credentials(role_arn, region).await {
            conf = conf.credentials_provider(creds);
        }
        let client = aws_sdk_ecr::Client::from_conf(conf.build());
        let mut clients = lock(&self.ecr);
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.entry(key).or_insert(client).clone()
    }

    async fn public_client(&self, role_arn: Option<&str>) -> aws_sdk_ecrpublic::Client {
        let key = role_arn.map(str::to_string);
        if let Some(c) = lock(&self.public).get(&key) {
            return c.clone();
        }
        let sdk = self.sdk_config().await;
        let mut conf = aws_sdk_ecrpublic::config::Builder::from(sdk)
            .region(Region::from_static(PUBLIC_REGION));
        if let Some(creds) = self.role_credentials(role_arn, PUBLIC_REGION).await {
            conf = conf.credentials_provider(creds);
        }
        let client = aws_sdk_ecrpublic::Client::from_conf(conf.build());
        let mut clients = lock(&self.public);
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.entry(key).or_insert(client).clone()
    }

    /// Exchanges the identity for an ECR credential for `target` (see [`Provider::fetch`]).
    pub async fn fetch_credential(&self, target: &Target) -> Result<Credential, Error> {
        let role = target.param(P_ROLE);
        match target.param(P_KIND) {
            Some(KIND_PRIVATE) => {
                let (Some(region), Some(account)) =
                    (target.param(P_REGION), target.param(P_ACCOUNT))
                else {
                    return Err(Error::invalid_config(
                        "aws target without region or account",
                    ));
                };
                self.fetch_private(role, region, account).await
            }
            Some(KIND_PUBLIC) => self.fetch_public(role).await,
            _ => Err(Error::invalid_config(format!(
                "{} was not prepared by the aws provider",
                target.registry()
            ))),
        }
    }

    async fn fetch_private(
        &self,
        role: Option<&str>,
        region: &str,
        account: &str,
    ) -> Result<Credential, Error> {
        let what = format!("ECR GetAuthorizationToken for account {account} in {region}");
        let client = self.ecr_client(role, region).await;
        // `registryIds` is deprecated (a token works for every registry the identity can
        // read), but it still selects the account whose proxy endpoint is returned, as
        // docker-credential-ecr-login does.
        #[allow(deprecated)]
        let out = client
            .get_authorization_token()
            .registry_ids(account)
            .send()
            .await
            .map_err(|e| errors::map_sdk_error(&what, e))?;
        let data = out
            .authorization_data()
            .iter()
            .find(|d| d.authorization_token().is_some())
            .ok_or_else(|| {
                Error::bad_response(format!("{what}: no authorization data in the answer"))
            })?;
        let token = data.authorization_token().unwrap_or_default();
        let password =
            decode_token(token).map_err(|why| Error::bad_response(format!("{what}: {why}")))?;
        let expires_at = expiry(data.expires_at());
        tracing::debug!(%account, %region, ?expires_at, "Fetched ECR token");
        Ok(Credential::new(USERNAME, password, expires_at))
    }

    async fn fetch_public(&self, role: Option<&str>) -> Result<Credential, Error> {
        let what = format!("ECR Public GetAuthorizationToken in {PUBLIC_REGION}");
        let client = self.public_client(role).await;
        let out = client
            .get_authorization_token()
            .send()
            .await
            .map_err(|e| errors::map_sdk_error(&what, e))?;
        let data = out
            .authorization_data()
            .filter(|d| d.authorization_token().is_some())
            .ok_or_else(|| {
                Error::bad_response(format!("{what}: no authorization data in the answer"))
            })?;
        let token = data.authorization_token().unwrap_or_default();
        let password =
            decode_token(token).map_err(|why| Error::bad_response(format!("{what}: {why}")))?;
        let expires_at = expiry(data.expires_at());
        tracing::debug!(?expires_at, "Fetched ECR Public token");
        Ok(Credential::new(USERNAME, password, expires_at))
    }

    fn private_target(
        registry: &Registry,
        role: Option<&str>,
        region: &str,
        account: &str,
    ) -> Target {
        let identity = role.unwrap_or("default");
        let mut t = Target::new(registry.clone(), format!("{identity}|{region}|{account}"))
            .with_param(P_KIND, KIND_PRIVATE)
            .with_param(P_REGION, region)
            .with_param(P_ACCOUNT, account);
        if let Some(r) = role {
            t = t.with_param(P_ROLE, r);
        }
        t
    }

    fn public_target(registry: &Registry, role: Option<&str>) -> Target {
        let identity = role.unwrap_or("default");
        let mut t = Target::new(
            registry.clone(),
            format!("{identity}|{PUBLIC_REGION}|public"),
        )
        .with_param(P_KIND, KIND_PUBLIC);
        if let Some(r) = role {
            t = t.with_param(P_ROLE, r);
        }
        t
    }
}

impl Provider for AwsProvider {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn recognise(&self, registry: &Registry) -> Option<Target> {
        match host::parse(registry.host(), registry.port())? {
            EcrHost::Private {
                account, region, ..
            } => Some(Self::private_target(registry, None, &region, &account)),
            EcrHost::Public => Some(Self::public_target(registry, None)),
        }
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        RuleOptions::parse(options).map(|_| ())
    }

    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error> {
        let opts = RuleOptions::parse(options).map_err(Error::invalid_config)?;
        let role = opts.role_arn.as_deref();
        // An explicit rule may name an ECR host with a port (a tunnel); its shape still
        // gives region and account.
        match host::parse(registry.host(), None) {
            Some(EcrHost::Public) => {
                if opts.region.is_some() || opts.account.is_some() {
                    return Err(Error::invalid_config(format!(
                        "{registry} is ECR Public: options `region` and `account` do not apply"
                    )));
                }
                Ok(Self::public_target(registry, role))
            }
            Some(EcrHost::Private {
                account, region, ..
            }) => {
                for (key, given, from_host) in [
                    ("region", &opts.region, &region),
                    ("account", &opts.account, &account),
                ] {
                    if let Some(g) = given
                        && g != from_host
                    {
                        return Err(Error::invalid_config(format!(
                            "option `{key}` = `{g}` contradicts the host {registry} ({from_host})"
                        )));
                    }
                }
                Ok(Self::private_target(registry, role, &region, &account))
            }
            None => match (&opts.region, &opts.account) {
                (Some(region), Some(account)) => {
                    Ok(Self::private_target(registry, role, region, account))
                }
                _ => Err(Error::invalid_config(format!(
                    "{registry} is not an ECR host: a rule sending it to the aws provider needs options `region` and `account`"
                ))),
            },
        }
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_credential(target))
    }
}

/// Decodes ECR's `base64("AWS:<password>")`. The error never holds the token.
pub fn decode_token(token: &str) -> Result<SecretString, &'static str> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map(secrecy::zeroize::Zeroizing::new)
        .map_err(|_| "the authorization token is not base64")?;
    let text = std::str::from_utf8(&bytes).map_err(|_| "the authorization token is not UTF-8")?;
    match text.strip_prefix("AWS:") {
        Some(password) if !password.is_empty() => Ok(SecretString::from(password.to_string())),
        _ => Err("the authorization token is not `AWS:<password>`"),
    }
}

fn expiry(at: Option<&aws_smithy_types::DateTime>) -> Option<SystemTime> {
    at.and_then(|d| SystemTime::try_from(*d).ok())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The injected clock as the SDK's time source.
#[derive(Debug)]
struct ClockTimeSource(SharedClock);

impl aws_smithy_async::time::TimeSource for ClockTimeSource {
    fn now(&self) -> SystemTime {
        self.0.now()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use regbroker_provider::ExposeSecret;

    fn reg(s: &str) -> Registry {
        Registry::parse(s).unwrap()
    }

    fn opts(pairs: &[(&str, &str)]) -> Options {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn from_env_is_lazy() {
        let p = AwsProvider::from_env();
        assert!(!p.sdk.initialized());
        assert_eq!(p.name(), "aws");
    }

    #[test]
    fn recognised_targets_carry_region_account_and_scope() {
        let p = AwsProvider::from_env();
        let t = p
            .recognise(&reg("123456789012.dkr.ecr.eu-west-1.amazonaws.com"))
            .unwrap();
        assert_eq!(t.param("region"), Some("eu-west-1"));
        assert_eq!(t.param("account"), Some("123456789012"));
        assert_eq!(t.param("role_arn"), None);
        assert_eq!(t.scope(), "default|eu-west-1|123456789012");
        // FIPS and dual-stack hosts of the same account and region share the credential.
        let fips = p
            .recognise(&reg("123456789012.dkr.ecr-fips.eu-west-1.amazonaws.com"))
            .unwrap();
        let dual = p
            .recognise(&reg("123456789012.dkr-ecr.eu-west-1.on.aws"))
            .unwrap();
        assert_eq!(fips.scope(), t.scope());
        assert_eq!(dual.scope(), t.scope());
        let other = p
            .recognise(&reg("123456789012.dkr.ecr.eu-west-2.amazonaws.com"))
            .unwrap();
        assert_ne!(other.scope(), t.scope());
        let public = p.recognise(&reg("public.ecr.aws")).unwrap();
        assert_eq!(public.param("kind"), Some("public"));
        assert_ne!(public.scope(), t.scope());
        assert!(p.recognise(&reg("example.com")).is_none());
        assert!(
            p.recognise(&reg("123456789012.dkr.ecr.eu-west-1.amazonaws.com:443"))
                .is_none()
        );
    }

    #[test]
    fn custom_domain_needs_region_and_account() {
        let p = AwsProvider::from_env();
        let proxy = reg("registry.internal.example:5000");
        assert!(p.recognise(&proxy).is_none());
        for missing in [
            opts(&[]),
            opts(&[("region", "eu-west-1")]),
            opts(&[("account", "123456789012")]),
        ] {
            let e = p.target(&proxy, &missing).unwrap_err();
            assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
            assert!(e.message().contains("`region` and `account`"), "{e}");
        }
        let t = p
            .target(
                &proxy,
                &opts(&[("region", "eu-west-1"), ("account", "123456789012")]),
            )
            .unwrap();
        assert_eq!(t.registry(), &proxy);
        assert_eq!(t.param("region"), Some("eu-west-1"));
        assert_eq!(t.scope(), "default|eu-west-1|123456789012");
    }

    #[test]
    fn role_arn_is_part_of_the_scope() {
        let p = AwsProvider::from_env();
        let ecr = reg("123456789012.dkr.ecr.us-east-1.amazonaws.com");
        let role = "arn:aws:iam::123456789012:role/puller";
        let t = p.target(&ecr, &opts(&[("role_arn", role)])).unwrap();
        assert_eq!(t.param("role_arn"), Some(role));
        assert_eq!(t.scope(), format!("{role}|us-east-1|123456789012"));
        assert_ne!(t.scope(), p.recognise(&ecr).unwrap().scope());
        let public = p
            .target(&reg("public.ecr.aws"), &opts(&[("role_arn", role)]))
            .unwrap();
        assert_ne!(
            public.scope(),
            p.recognise(&reg("public.ecr.aws")).unwrap().scope()
        );
    }

    #[test]
    fn options_contradicting_an_ecr_host_are_rejected() {
        let p = AwsProvider::from_env();
        let ecr = reg("123456789012.dkr.ecr.us-east-1.amazonaws.com");
        assert!(p.target(&ecr, &opts(&[("region", "us-east-1")])).is_ok());
        let e = p
            .target(&ecr, &opts(&[("region", "eu-west-1")]))
            .unwrap_err();
        assert!(e.message().contains("`region`"), "{e}");
        let e = p
            .target(&ecr, &opts(&[("account", "000000000000")]))
            .unwrap_err();
        assert!(e.message().contains("`account`"), "{e}");
        let e = p
            .target(&reg("public.ecr.aws"), &opts(&[("region", "us-east-1")]))
            .unwrap_err();
        assert!(e.message().contains("ECR Public"), "{e}");
        let e = p.target(&ecr, &opts(&[("bogus", "1")])).unwrap_err();
        assert!(e.message().contains("`bogus`"), "{e}");
        assert!(
            p.check_options(&opts(&[("bogus", "1")]))
                .unwrap_err()
                .contains("`bogus`")
        );
    }

    #[test]
    fn tokens_decode_only_in_the_aws_shape() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            decode_token(&enc("AWS:pa:ss")).unwrap().expose_secret(),
            "pa:ss"
        );
        for bad in [
            "not base64!".to_string(),
            enc("aws:s3cr3t"),
            enc("AWS"),
            enc("AWS:"),
            enc("user:s3cr3t"),
            enc(":AWS:s3cr3t"),
        ] {
            let err = decode_token(&bad).unwrap_err();
            assert!(!err.contains("s3cr3t"), "{err}");
        }
    }
}
