//! regbroker provider for Azure Container Registry (ACR).
//!
//! Turns the pod's Entra ID identity (AKS Workload Identity, managed identity or a
//! service principal secret) into an ACR refresh token: an Entra ID access token is
//! fetched with `azure_identity`, then exchanged at `POST https://<registry>/oauth2/exchange`.
//! The credential is username `00000000-0000-0000-0000-000000000000` with the refresh
//! token as password, expiring at the token's JWT `exp`.
//!
//! Env vars read (snapshotted by [`AzureProvider::from_env`], never mutated):
//! - identity: `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
//!   `AZURE_CLIENT_SECRET`, `AZURE_AUTHORITY_HOST` (https only), and, read by the SDK from
//!   the process env, `IDENTITY_ENDPOINT` + `IDENTITY_HEADER` (see [`identity`]).
//! - `REGBROKER_AZURE_ACR_SUFFIXES`: comma list of extra private-cloud ACR suffixes
//!   (e.g. `azurecr.contoso.example`); invalid entries are logged and ignored.
//! - `REGBROKER_AZURE_EXCHANGE_URL`: send every exchange to this URL instead of
//!   `https://<registry>/oauth2/exchange` (proxies, tests); https, or http to loopback.
//! - `REGBROKER_AZURE_SCOPE`: Entra ID scope, default
//!   `https://containerregistry.azure.net/.default`.
//!
//! Rule options: `tenant`, `client_id`, `scope`, `authority_host`, `exchange_url`,
//! `service` (see [`OPTIONS`] and the README).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod exchange;
pub mod host;
pub mod identity;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use azure_core::http::{ExponentialRetryOptions, HttpClient, RetryOptions};
use regbroker_provider::{
    BoxFuture, Credential, Error, Options, Provider, Registry, SecretString, SharedClock, Target,
    check_known_options, system_clock,
};

/// The `azure_core` version the provider uses, for [`Builder::sdk_http_client`].
pub use azure_core;
pub use exchange::{ACR_USERNAME, FALLBACK_TTL};
pub use host::Cloud;
pub use identity::{Env, Kind};
/// The reqwest version the provider (and the SDK) uses, for [`Builder::http_client`].
pub use reqwest;

/// Env var: comma list of extra ACR suffixes for private clouds.
pub const ENV_ACR_SUFFIXES: &str = "REGBROKER_AZURE_ACR_SUFFIXES";
/// Env var: override of the exchange endpoint URL.
pub const ENV_EXCHANGE_URL: &str = "REGBROKER_AZURE_EXCHANGE_URL";
/// Env var: override of the default Entra ID scope.
pub const ENV_SCOPE: &str = "REGBROKER_AZURE_SCOPE";

/// The Entra ID scope ACR accepts by default.
pub const DEFAULT_SCOPE: &str = "https://containerregistry.azure.net/.default";

/// The rule options this provider accepts.
pub const OPTIONS: &[&str] = &[
    "tenant",
    "client_id",
    "scope",
    "authority_host",
    "exchange_url",
    "service",
];

/// Default bound on one whole fetch (token + exchange, with SDK retries).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

// Target params, set by recognise/target and read by fetch.
const P_KIND: &str = "kind";
const P_AUTHORITY: &str = "authority_host";
const P_TENANT: &str = "tenant";
const P_CLIENT_ID: &str = "client_id";
const P_SCOPE: &str = "scope";
const P_EXCHANGE_URL: &str = "exchange_url";
const P_SERVICE: &str = "service";

/// The Azure ACR provider.
///
/// Construction does no I/O; the HTTP client and the SDK credentials are built on the
/// first [`Provider::fetch`] and kept (one per identity, so the SDK's own token cache is
/// reused).
pub struct AzureProvider {
    env: Env,
    clock: SharedClock,
    suffixes: Vec<String>,
    http: OnceLock<reqwest::Client>,
    sdk_http: Option<Arc<dyn HttpClient>>,
    retry: RetryOptions,
    timeout: Duration,
    credentials: Mutex<HashMap<identity::Identity, Arc<dyn TokenCredential>>>,
}

impl std::fmt::Debug for AzureProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureProvider")
            .field("env", &self.env)
            .field("suffixes", &self.suffixes)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Explicit settings for [`AzureProvider`] (tests, embedding).
#[derive(Debug)]
pub struct Builder {
    env: Env,
    clock: SharedClock,
    suffixes: Vec<String>,
    http: Option<reqwest::Client>,
    sdk_http: Option<Arc<dyn HttpClient>>,
    retry: RetryOptions,
    timeout: Duration,
}

impl Builder {
    /// Use this env snapshot instead of the process environment.
    pub fn env(mut self, env: Env) -> Builder {
        self.env = env;
        self
    }

    /// Read time from this clock.
    pub fn clock(mut self, clock: SharedClock) -> Builder {
        self.clock = clock;
        self
    }

    /// Adds a private-cloud ACR suffix (in addition to `REGBROKER_AZURE_ACR_SUFFIXES`).
    pub fn acr_suffix(mut self, suffix: impl Into<String>) -> Builder {
        self.suffixes.push(suffix.into());
        self
    }

    /// Use this HTTP client for Entra ID, managed identity and the exchange (e.g. one
    /// that trusts a test CA). It should not follow redirects.
    pub fn http_client(mut self, client: reqwest::Client) -> Builder {
        self.http = Some(client);
        self
    }

    /// Use this transport for the SDK's requests only (Entra ID, managed identity),
    /// e.g. to instrument or redirect them; the exchange keeps the reqwest client. By
    /// default the SDK uses the same reqwest client as the exchange.
    pub fn sdk_http_client(mut self, client: Arc<dyn HttpClient>) -> Builder {
        self.sdk_http = Some(client);
        self
    }

    /// SDK retries for Entra ID and App Service managed identity: `max_retries` with
    /// exponential backoff from `initial_delay` (IMDS keeps the SDK's own policy).
    pub fn retry(mut self, max_retries: u32, initial_delay: Duration) -> Builder {
        self.retry = retry_options(max_retries, initial_delay);
        self
    }

    /// Bound on one whole fetch.
    pub fn timeout(mut self, timeout: Duration) -> Builder {
        self.timeout = timeout;
        self
    }

    /// The provider. Fails on an invalid ACR suffix (from the env or [`Builder::acr_suffix`]).
    pub fn build(self) -> Result<AzureProvider, Error> {
        let mut suffixes = Vec::new();
        for raw in self.raw_suffixes() {
            let s = host::parse_suffix(&raw).map_err(Error::invalid_config)?;
            push_suffix(&mut suffixes, s);
        }
        Ok(self.assemble(suffixes))
    }

    /// Like [`Builder::build`], but an invalid suffix is logged and skipped.
    fn build_lenient(self) -> AzureProvider {
        let mut suffixes = Vec::new();
        for raw in self.raw_suffixes() {
            match host::parse_suffix(&raw) {
                Ok(s) => push_suffix(&mut suffixes, s),
                Err(e) => {
                    tracing::warn!(error = %e, "Ignoring an invalid {ENV_ACR_SUFFIXES} entry")
                }
            }
        }
        self.assemble(suffixes)
    }

    /// The env's comma list followed by the builder's suffixes, blanks dropped.
    fn raw_suffixes(&self) -> Vec<String> {
        let from_env = self.env.get(ENV_ACR_SUFFIXES).unwrap_or_default();
        from_env
            .split(',')
            .map(str::to_string)
            .chain(self.suffixes.iter().cloned())
            .filter(|s| !s.trim().is_empty())
            .collect()
    }

    fn assemble(self, suffixes: Vec<String>) -> AzureProvider {
        let http = OnceLock::new();
        if let Some(c) = self.http {
            let _ = http.set(c);
        }
        AzureProvider {
            env: self.env,
            clock: self.clock,
            suffixes,
            http,
            sdk_http: self.sdk_http,
            retry: self.retry,
            timeout: self.timeout,
            credentials: Mutex::new(HashMap::new()),
        }
    }
}

/// Adds a validated suffix unless it is built in or already there.
fn push_suffix(suffixes: &mut Vec<String>, s: String) {
    if !host::BUILTIN_SUFFIXES.iter().any(|(b, _)| *b == s) && !suffixes.contains(&s) {
        suffixes.push(s);
    }
}

fn retry_options(max_retries: u32, initial_delay: Duration) -> RetryOptions {
    let ms = i64::try_from(initial_delay.as_millis()).unwrap_or(i64::MAX);
    RetryOptions::exponential(ExponentialRetryOptions {
        initial_delay: azure_core::time::Duration::milliseconds(ms),
        max_retries,
        max_total_elapsed: azure_core::time::Duration::seconds(20),
        max_delay: azure_core::time::Duration::seconds(5),
    })
}

impl AzureProvider {
    /// A provider reading the process environment (a snapshot of [`Env::NAMES`]). Does no
    /// I/O and no cloud call. An invalid `REGBROKER_AZURE_ACR_SUFFIXES` entry is logged
    /// and ignored (use [`AzureProvider::builder`] to fail on it instead).
    pub fn from_env() -> AzureProvider {
        AzureProvider::builder()
            .env(Env::from_process())
            .build_lenient()
    }

    /// A builder starting from an empty env, the system clock, 3 SDK retries from 500 ms
    /// and a 30 s bound per fetch.
    pub fn builder() -> Builder {
        Builder {
            env: Env::default(),
            clock: system_clock(),
            suffixes: Vec::new(),
            http: None,
            sdk_http: None,
            retry: retry_options(3, Duration::from_millis(500)),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The private-cloud suffixes in force (normalised).
    pub fn acr_suffixes(&self) -> &[String] {
        &self.suffixes
    }

    fn http(&self) -> Result<reqwest::Client, Error> {
        if let Some(c) = self.http.get() {
            return Ok(c.clone());
        }
        let c = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(20))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::invalid_config("cannot build the HTTP client").with_source(e))?;
        Ok(self.http.get_or_init(|| c).clone())
    }

    /// Builds the target for `registry` from the rule options and the env.
    fn make_target(&self, registry: &Registry, cloud: Option<Cloud>, opts: &RuleOptions) -> Target {
        let kind = Kind::select(&self.env);
        let authority = opts
            .authority_host
            .clone()
            .or_else(|| {
                self.env
                    .get(identity::AZURE_AUTHORITY_HOST)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| cloud.unwrap_or(Cloud::Public).authority_host().to_string());
        let authority = authority.trim_end_matches('/').to_string();
        let tenant = opts
            .tenant
            .clone()
            .or_else(|| self.env.get(identity::AZURE_TENANT_ID).map(str::to_string));
        let client_id = opts
            .client_id
            .clone()
            .or_else(|| self.env.get(identity::AZURE_CLIENT_ID).map(str::to_string));
        let scope = opts
            .scope
            .clone()
            .or_else(|| self.env.get(ENV_SCOPE).map(str::to_string))
            .unwrap_or_else(|| DEFAULT_SCOPE.to_string());
        let exchange_url = opts
            .exchange_url
            .clone()
            .or_else(|| self.env.get(ENV_EXCHANGE_URL).map(str::to_string))
            .unwrap_or_else(|| format!("https://{}/oauth2/exchange", registry.as_str()));
        let service = opts
            .service
            .clone()
            .unwrap_or_else(|| registry.host().to_string());
        let cache_scope = format!(
            "{}|authority={}|tenant={}|client_id={}|scope={}|service={}|exchange={}",
            kind.as_str(),
            authority,
            tenant.as_deref().unwrap_or("-"),
            client_id.as_deref().unwrap_or("-"),
            scope,
            service,
            exchange_url,
        );
        let mut t = Target::new(registry.clone(), cache_scope)
            .with_param(P_KIND, kind.as_str())
            .with_param(P_AUTHORITY, authority)
            .with_param(P_SCOPE, scope)
            .with_param(P_EXCHANGE_URL, exchange_url)
            .with_param(P_SERVICE, service);
        if let Some(x) = tenant {
            t = t.with_param(P_TENANT, x);
        }
        if let Some(x) = client_id {
            t = t.with_param(P_CLIENT_ID, x);
        }
        t
    }

    /// The credential for `identity`, built once and kept.
    fn credential(&self, id: &identity::Identity) -> Result<Arc<dyn TokenCredential>, Error> {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(id) {
            return Ok(c.clone());
        }
        let sdk = identity::SdkSettings {
            transport: match &self.sdk_http {
                Some(t) => t.clone(),
                None => Arc::new(self.http()?),
            },
            retry: self.retry.clone(),
        };
        let c = identity::build(id, &self.env, &sdk)?;
        map.insert(id.clone(), c.clone());
        Ok(c)
    }

    /// Fetches a credential for `target`: Entra ID token, then the ACR exchange.
    pub async fn fetch_credential(&self, target: &Target) -> Result<Credential, Error> {
        let registry = target.registry().to_string();
        match tokio::time::timeout(self.timeout, self.fetch_inner(target)).await {
            Ok(r) => r,
            Err(_) => {
                let imds = target.param(P_KIND) == Some(Kind::Managed.as_str())
                    && std::env::var_os(identity::IDENTITY_ENDPOINT).is_none();
                let hint = if imds {
                    "; no AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_SECRET or IDENTITY_ENDPOINT is set, so the managed identity endpoint IMDS (169.254.169.254) was tried: is this an Azure VM or AKS node?"
                } else {
                    ""
                };
                Err(Error::timed_out(format!(
                    "fetching an ACR credential for {registry} took longer than {:?}{hint}",
                    self.timeout
                )))
            }
        }
    }

    async fn fetch_inner(&self, target: &Target) -> Result<Credential, Error> {
        let param = |k: &str| target.param(k).map(str::to_string);
        let kind = target
            .param(P_KIND)
            .and_then(Kind::parse)
            .ok_or_else(|| Error::invalid_config("azure target without an identity kind"))?;
        let authority = param(P_AUTHORITY).unwrap_or_default();
        check_https_url(
            "authority host (AZURE_AUTHORITY_HOST / authority_host)",
            &authority,
            false,
        )
        .map_err(Error::invalid_config)?;
        let scope = param(P_SCOPE).unwrap_or_else(|| DEFAULT_SCOPE.to_string());
        check_scope(&scope).map_err(Error::invalid_config)?;
        let exchange_url = param(P_EXCHANGE_URL).unwrap_or_default();
        let exchange_url = check_https_url(
            "exchange URL (REGBROKER_AZURE_EXCHANGE_URL / exchange_url)",
            &exchange_url,
            true,
        )
        .map_err(Error::invalid_config)?;
        let service = param(P_SERVICE).unwrap_or_else(|| target.registry().host().to_string());
        let id = identity::Identity {
            kind,
            authority_host: authority,
            tenant: param(P_TENANT),
            client_id: param(P_CLIENT_ID),
        };

        let credential = self.credential(&id)?;
        let token = credential
            .get_token(&[scope.as_str()], None)
            .await
            .map_err(|e| identity::token_error(&id, &scope, &e))?;
        let access_token = SecretString::from(token.token.secret().to_string());
        // The exchange wants the tenant; managed identity does not tell us, so fall back
        // to the token's own `tid` claim (read, not verified: ACR verifies the token).
        let tenant = id.tenant.clone().or_else(|| {
            use regbroker_provider::ExposeSecret;
            exchange::jwt_claim(access_token.expose_secret(), "tid")
                .and_then(|v| v.as_str().map(str::to_string))
        });
        tracing::debug!(registry = %target.registry(), identity = %id.describe(), "Exchanging Entra ID token at ACR");
        exchange::exchange(
            &self.http()?,
            exchange::Request {
                url: &exchange_url,
                service: &service,
                tenant: tenant.as_deref(),
                access_token: &access_token,
            },
            self.clock.now(),
        )
        .await
    }
}

/// Parsed rule options.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct RuleOptions {
    tenant: Option<String>,
    client_id: Option<String>,
    scope: Option<String>,
    authority_host: Option<String>,
    exchange_url: Option<String>,
    service: Option<String>,
}

impl RuleOptions {
    fn parse(options: &Options) -> Result<RuleOptions, String> {
        check_known_options("azure", options, OPTIONS)?;
        let get = |k: &str| -> Result<Option<String>, String> {
            match options.get(k).map(|v| v.trim()) {
                None => Ok(None),
                Some("") => Err(format!("option `{k}` for the azure provider is empty")),
                Some(v) => Ok(Some(v.to_string())),
            }
        };
        let o = RuleOptions {
            tenant: get("tenant")?,
            client_id: get("client_id")?,
            scope: get("scope")?,
            authority_host: get("authority_host")?,
            exchange_url: get("exchange_url")?,
            service: get("service")?,
        };
        let id_ok = |v: &str| {
            v.len() <= 128
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        };
        if let Some(t) = &o.tenant
            && !id_ok(t)
        {
            return Err("option `tenant`: expected a tenant id (letters, digits, `-`, `.`)".into());
        }
        if let Some(c) = &o.client_id
            && !id_ok(c)
        {
            return Err("option `client_id`: expected a client id (letters, digits, `-`)".into());
        }
        if let Some(s) = &o.scope {
            check_scope(s).map_err(|e| format!("option `scope`: {e}"))?;
        }
        if let Some(a) = &o.authority_host {
            check_https_url("authority host", a, false)
                .map_err(|e| format!("option `authority_host`: {e}"))?;
        }
        if let Some(u) = &o.exchange_url {
            check_https_url("exchange URL", u, true)
                .map_err(|e| format!("option `exchange_url`: {e}"))?;
        }
        if let Some(s) = &o.service {
            Registry::parse(s)
                .ok()
                .filter(|r| r.as_str() == s.to_ascii_lowercase() && r.port().is_none())
                .ok_or_else(|| "option `service`: expected a bare registry host name such as myregistry.azurecr.io".to_string())?;
        }
        Ok(o)
    }
}

/// Entra ID scopes are URIs like `https://containerregistry.azure.net/.default`.
fn check_scope(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 256
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "./-_:".contains(c));
    if ok {
        Ok(())
    } else {
        Err("expected one scope such as https://containerregistry.azure.net/.default".into())
    }
}

/// An https URL, or (when `loopback_http`) an http URL whose host is loopback.
fn check_https_url(what: &str, raw: &str, loopback_http: bool) -> Result<url::Url, String> {
    let shown: String = raw.chars().take(80).collect();
    let u = url::Url::parse(raw).map_err(|_| format!("{what} `{shown}` is not a URL"))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!("{what} must not hold credentials"));
    }
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match u.scheme() {
        "https" if u.host().is_some() => Ok(u),
        "http" if loopback_http && loopback => Ok(u),
        "http" if loopback_http => Err(format!(
            "{what} `{shown}` must use https (http is allowed only to loopback)"
        )),
        _ => Err(format!("{what} `{shown}` must use https")),
    }
}

impl Provider for AzureProvider {
    fn name(&self) -> &'static str {
        "azure"
    }

    fn recognise(&self, registry: &Registry) -> Option<Target> {
        let acr = host::recognise(registry, &self.suffixes)?;
        Some(self.make_target(registry, acr.cloud, &RuleOptions::default()))
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        RuleOptions::parse(options).map(|_| ())
    }

    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error> {
        let opts = RuleOptions::parse(options).map_err(Error::invalid_config)?;
        let cloud = host::cloud_of_suffix(registry.host());
        Ok(self.make_target(registry, cloud, &opts))
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_credential(target))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn provider(env: &[(&str, &str)]) -> AzureProvider {
        AzureProvider::builder()
            .env(Env::from_pairs(env.iter().copied()))
            .build()
            .expect("provider")
    }

    fn reg(s: &str) -> Registry {
        Registry::parse(s).expect("registry")
    }

    fn opts(pairs: &[(&str, &str)]) -> Options {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn cloud_follows_the_host_suffix() {
        let p = provider(&[]);
        let cases = [
            ("r1234.azurecr.io", "https://login.microsoftonline.com"),
            ("r1234.azurecr.cn", "https://login.chinacloudapi.cn"),
            ("r1234.azurecr.us", "https://login.microsoftonline.us"),
            ("r1234.azurecr.de", "https://login.microsoftonline.de"),
        ];
        for (host, authority) in cases {
            let t = p.recognise(&reg(host)).expect(host);
            assert_eq!(t.param(P_AUTHORITY), Some(authority), "{host}");
            assert!(t.scope().contains(authority), "{}", t.scope());
            assert_eq!(t.param(P_SCOPE), Some(DEFAULT_SCOPE));
            assert_eq!(
                t.param(P_EXCHANGE_URL),
                Some(format!("https://{host}/oauth2/exchange").as_str())
            );
        }
    }

    #[test]
    fn authority_env_and_rule_option_override_the_suffix() {
        let p = provider(&[("AZURE_AUTHORITY_HOST", "https://login.example/")]);
        let t = p.recognise(&reg("r1234.azurecr.cn")).expect("recognised");
        assert_eq!(t.param(P_AUTHORITY), Some("https://login.example"));
        let t = p
            .target(
                &reg("r1234.azurecr.cn"),
                &opts(&[("authority_host", "https://login.other")]),
            )
            .expect("target");
        assert_eq!(t.param(P_AUTHORITY), Some("https://login.other"));
    }

    #[test]
    fn cache_scope_names_identity_cloud_and_registry() {
        let p = provider(&[
            ("AZURE_CLIENT_ID", "client-a"),
            ("AZURE_TENANT_ID", "tenant-a"),
            ("AZURE_FEDERATED_TOKEN_FILE", "/token"),
        ]);
        let a = p.recognise(&reg("registrya.azurecr.io")).expect("a");
        let b = p.recognise(&reg("registryb.azurecr.io")).expect("b");
        assert_ne!(a.scope(), b.scope(), "refresh tokens are per registry");
        for part in [
            "workload",
            "client-a",
            "tenant-a",
            "login.microsoftonline.com",
            "registrya.azurecr.io",
        ] {
            assert!(
                a.scope().contains(part),
                "{part} missing from {}",
                a.scope()
            );
        }
        let other_id = p
            .target(
                &reg("registrya.azurecr.io"),
                &opts(&[("client_id", "client-b")]),
            )
            .expect("target");
        assert_ne!(a.scope(), other_id.scope());
        let china = p.recognise(&reg("registrya.azurecr.cn")).expect("cn");
        assert_ne!(a.scope(), china.scope());
        let other_scope = p
            .target(
                &reg("registrya.azurecr.io"),
                &opts(&[("scope", "https://management.azure.com/.default")]),
            )
            .expect("target");
        assert_ne!(a.scope(), other_scope.scope());
    }

    #[test]
    fn unknown_and_bad_options_are_rejected_by_name() {
        let p = provider(&[]);
        let e = p.check_options(&opts(&[("region", "x")])).unwrap_err();
        assert!(e.contains("`region`"), "{e}");
        let bad = [
            ("tenant", "a/b"),
            ("client_id", "x y"),
            ("scope", "https://x/.default other"),
            ("authority_host", "http://login.microsoftonline.com"),
            ("exchange_url", "http://proxy.example/oauth2/exchange"),
            ("exchange_url", "https://user:pw@proxy.example/"),
            ("service", "https://r.azurecr.io/v2/"),
            ("service", "r.azurecr.io:443"),
            ("tenant", ""),
        ];
        for (k, v) in bad {
            let e = p.check_options(&opts(&[(k, v)])).unwrap_err();
            assert!(e.contains(&format!("`{k}`")), "{k}={v}: {e}");
            assert!(!e.contains("pw@"), "{e}");
            let t = p.target(&reg("r1234.azurecr.io"), &opts(&[(k, v)]));
            assert_eq!(
                t.map(|_| ()).unwrap_err().kind(),
                regbroker_provider::ErrorKind::InvalidConfig
            );
        }
        p.check_options(&opts(&[
            ("tenant", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
            ("client_id", "00000000-1111-2222-3333-444444444444"),
            ("scope", "https://management.azure.com/.default"),
            ("authority_host", "https://login.microsoftonline.us"),
            ("exchange_url", "http://127.0.0.1:8080/oauth2/exchange"),
            ("service", "myregistry.azurecr.io"),
        ]))
        .expect("valid options");
    }

    #[test]
    fn explicit_rule_serves_a_proxy_host_with_its_own_service() {
        let p = provider(&[]);
        let t = p
            .target(
                &reg("acr-proxy.internal.example:5000"),
                &opts(&[("service", "myregistry.azurecr.io")]),
            )
            .expect("target");
        assert_eq!(t.param(P_SERVICE), Some("myregistry.azurecr.io"));
        assert_eq!(
            t.param(P_EXCHANGE_URL),
            Some("https://acr-proxy.internal.example:5000/oauth2/exchange")
        );
        assert_eq!(
            t.param(P_AUTHORITY),
            Some("https://login.microsoftonline.com")
        );
    }

    #[test]
    fn suffixes_come_from_env_and_builder_and_are_validated() {
        let p = AzureProvider::builder()
            .env(Env::from_pairs([(
                ENV_ACR_SUFFIXES,
                "azurecr.contoso.example, ,azurecr.io",
            )]))
            .acr_suffix("AzureCR.Fabrikam.Example")
            .build()
            .expect("provider");
        assert_eq!(
            p.acr_suffixes(),
            ["azurecr.contoso.example", "azurecr.fabrikam.example"]
        );
        assert!(
            p.recognise(&reg("myregistry.azurecr.fabrikam.example"))
                .is_some()
        );
        let e = AzureProvider::builder()
            .env(Env::from_pairs([(ENV_ACR_SUFFIXES, "com")]))
            .build()
            .unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
    }

    #[test]
    fn from_env_style_build_skips_bad_suffixes() {
        let p = AzureProvider::builder()
            .env(Env::from_pairs([(
                ENV_ACR_SUFFIXES,
                "com,azurecr.contoso.example,*.x",
            )]))
            .build_lenient();
        assert_eq!(p.acr_suffixes(), ["azurecr.contoso.example"]);
    }

    #[test]
    fn url_checks() {
        assert!(check_https_url("x", "https://login.example", false).is_ok());
        assert!(check_https_url("x", "http://127.0.0.1:1/x", true).is_ok());
        assert!(check_https_url("x", "http://[::1]:1/x", true).is_ok());
        assert!(check_https_url("x", "http://localhost:1/x", true).is_ok());
        assert!(check_https_url("x", "http://127.0.0.1:1/x", false).is_err());
        assert!(check_https_url("x", "http://10.0.0.1/x", true).is_err());
        assert!(check_https_url("x", "http://localhost.evil.com/x", true).is_err());
        assert!(check_https_url("x", "ftp://x/", true).is_err());
        assert!(check_https_url("x", "not a url", true).is_err());
    }

    #[tokio::test]
    async fn bad_env_authority_is_invalid_config_at_fetch() {
        let p = provider(&[("AZURE_AUTHORITY_HOST", "http://login.microsoftonline.com")]);
        let t = p.recognise(&reg("r1234.azurecr.io")).expect("recognised");
        let e = p.fetch(&t).await.unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
        assert!(e.message().contains("https"), "{e}");
    }

    #[tokio::test]
    async fn workload_identity_without_tenant_names_the_env_vars() {
        let p = provider(&[
            ("AZURE_FEDERATED_TOKEN_FILE", "/nonexistent"),
            ("AZURE_CLIENT_ID", "c"),
        ]);
        let t = p.recognise(&reg("r1234.azurecr.io")).expect("recognised");
        let e = p.fetch(&t).await.unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::IdentityMissing);
        assert!(e.message().contains("AZURE_TENANT_ID"), "{e}");
    }

    #[tokio::test]
    async fn unreadable_token_file_is_identity_missing() {
        let p = provider(&[
            ("AZURE_FEDERATED_TOKEN_FILE", "/nonexistent/regbroker/token"),
            ("AZURE_CLIENT_ID", "c"),
            ("AZURE_TENANT_ID", "t"),
        ]);
        let t = p.recognise(&reg("r1234.azurecr.io")).expect("recognised");
        let e = p.fetch(&t).await.unwrap_err();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::IdentityMissing);
        assert!(e.message().contains("/nonexistent/regbroker/token"), "{e}");
    }

    #[test]
    fn from_env_is_fast_and_does_no_io() {
        let start = std::time::Instant::now();
        let p = AzureProvider::from_env();
        assert!(p.http.get().is_none(), "HTTP client must be built lazily");
        assert!(start.elapsed() < Duration::from_millis(100));
    }
}
