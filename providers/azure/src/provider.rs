//! [`AzureProvider`]: the [`Provider`] for ACR. It recognises ACR login servers, turns a
//! registry and a rule's options into a [`Target`] (identity kind, authority, tenant,
//! client id, scope, exchange URL, service and the cache scope), and fetches: an Entra ID
//! token through the SDK credential of the target's identity (built once, kept), then the
//! ACR exchange.
//!
//! Env vars read, from the provider's env snapshot: `AZURE_AUTHORITY_HOST`,
//! `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `REGBROKER_AZURE_SCOPE`,
//! `REGBROKER_AZURE_EXCHANGE_URL` (a rule's options win over them), and what
//! [`identity`](crate::identity) reads to pick the identity kind. On a timeout, whether
//! `IDENTITY_ENDPOINT` is set in the process env (for the hint).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use azure_core::http::{HttpClient, RetryOptions};
use regbroker_provider::{
    BoxFuture, Credential, Diagnosis, Error, IdentityKind, Options, Provider, Registry,
    SecretString, SharedClock, Target, WorkloadIdentity,
};

use crate::http::Http;
use crate::options::{RuleOptions, check_https_url, check_scope};
use crate::{
    Builder, Cloud, DEFAULT_SCOPE, ENV_EXCHANGE_URL, ENV_SCOPE, Env, Kind, exchange, host, identity,
};

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
    pub(crate) env: Env,
    pub(crate) clock: SharedClock,
    suffixes: Vec<String>,
    http: OnceLock<Http>,
    tls_roots: Vec<Vec<u8>>,
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

/// Checks the URL and scope settings of `env` (the suffixes are checked by the builder).
pub(crate) fn check_env(env: &Env) -> Result<(), String> {
    if let Some(v) = env.get(ENV_EXCHANGE_URL)
        && check_https_url(ENV_EXCHANGE_URL, v, true).is_err()
    {
        return Err(format!(
            "{ENV_EXCHANGE_URL} must be an https URL without credentials (http only to loopback)"
        ));
    }
    if let Some(v) = env.get(identity::AZURE_AUTHORITY_HOST)
        && check_https_url(identity::AZURE_AUTHORITY_HOST, v, false).is_err()
    {
        return Err(format!(
            "{} must be an https URL without credentials",
            identity::AZURE_AUTHORITY_HOST
        ));
    }
    if let Some(v) = env.get(ENV_SCOPE) {
        check_scope(v).map_err(|e| format!("{ENV_SCOPE}: {e}"))?;
    }
    Ok(())
}

impl AzureProvider {
    /// A provider reading the process environment (a snapshot of [`Env::NAMES`]). Does no
    /// I/O and no cloud call. Fails on an invalid `REGBROKER_AZURE_ACR_SUFFIXES`,
    /// `REGBROKER_AZURE_EXCHANGE_URL`, `REGBROKER_AZURE_SCOPE` or `AZURE_AUTHORITY_HOST`,
    /// naming the variable, not its value (a configuration error: never ignored).
    pub fn from_env() -> Result<AzureProvider, String> {
        let env = Env::from_process();
        check_env(&env)?;
        AzureProvider::builder()
            .env(env)
            .build()
            .map_err(|e| format!("{}: {}", crate::ENV_ACR_SUFFIXES, e.message()))
    }

    /// A builder starting from an empty env, the system clock, 3 SDK retries from 500 ms
    /// and a 30 s bound per fetch.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// The provider with the builder's settings and these (validated) suffixes.
    pub(crate) fn new(b: Builder, suffixes: Vec<String>) -> AzureProvider {
        let http = OnceLock::new();
        if let Some(c) = b.http {
            let _ = http.set(Http::single(c));
        }
        AzureProvider {
            env: b.env,
            clock: b.clock,
            suffixes,
            http,
            tls_roots: b.tls_roots,
            sdk_http: b.sdk_http,
            retry: b.retry,
            timeout: b.timeout,
            credentials: Mutex::new(HashMap::new()),
        }
    }

    /// The private-cloud suffixes in force (normalised).
    pub fn acr_suffixes(&self) -> &[String] {
        &self.suffixes
    }

    /// The HTTP clients (built on first use): the proxy variables are honoured except
    /// for loopback and link-local hosts (see `http`).
    fn http(&self) -> Result<Http, Error> {
        if let Some(c) = self.http.get() {
            return Ok(c.clone());
        }
        let c = Http::build(&self.tls_roots)?;
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
        // Everything that picks the Entra ID identity is in the scope, the managed
        // identity endpoint too (App Service's), so two identities sharing a disk cache
        // never read each other's entries.
        let cache_scope = format!(
            "{}|authority={}|tenant={}|client_id={}|scope={}|service={}|exchange={}|endpoint={}",
            kind.as_str(),
            authority,
            tenant.as_deref().unwrap_or("-"),
            client_id.as_deref().unwrap_or("-"),
            scope,
            service,
            exchange_url,
            self.env.get(identity::IDENTITY_ENDPOINT).unwrap_or("-"),
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
    pub(crate) fn credential(
        &self,
        id: &identity::Identity,
    ) -> Result<Arc<dyn TokenCredential>, Error> {
        let mut map = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(id) {
            return Ok(c.clone());
        }
        let c = identity::build(id, &self.env, &self.sdk_settings()?)?;
        map.insert(id.clone(), c.clone());
        Ok(c)
    }

    fn sdk_settings(&self) -> Result<identity::SdkSettings, Error> {
        Ok(identity::SdkSettings {
            transport: match &self.sdk_http {
                Some(t) => t.clone(),
                None => Arc::new(self.http()?),
            },
            retry: self.retry.clone(),
        })
    }

    /// [`Provider::bind_workload`] for Azure: the same registry, authority, scope and
    /// exchange, with the workload's client id and tenant (see [`crate::workload`]).
    fn bind(&self, target: Target, workload: WorkloadIdentity) -> Result<Target, Error> {
        let (client_id, tenant) =
            crate::workload::client_of(&workload, self.env.get(identity::AZURE_TENANT_ID))?;
        let param = |k: &str| target.param(k).unwrap_or_default().to_string();
        let (authority, scope, service, exchange) = (
            param(P_AUTHORITY),
            param(P_SCOPE),
            param(P_SERVICE),
            param(P_EXCHANGE_URL),
        );
        let cache_scope = format!(
            "workload|authority={authority}|tenant={tenant}|client_id={client_id}|scope={scope}|service={service}|exchange={exchange}"
        );
        Ok(Target::new(target.registry().clone(), cache_scope)
            .with_param(P_KIND, Kind::Workload.as_str())
            .with_param(P_AUTHORITY, authority)
            .with_param(P_SCOPE, scope)
            .with_param(P_EXCHANGE_URL, exchange)
            .with_param(P_SERVICE, service)
            .with_param(P_TENANT, tenant)
            .with_param(P_CLIENT_ID, client_id)
            .for_workload(workload))
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

        // A workload's own identity: its token asserted for its client id, with an SDK
        // credential of its own (never this process's, never kept for another).
        let credential = match target.workload() {
            Some(w) => {
                let (Some(tenant), Some(client_id)) = (&id.tenant, &id.client_id) else {
                    return Err(Error::invalid_config(
                        "a workload target without a tenant or client id (not bound by the azure provider)",
                    ));
                };
                let options = azure_identity::ClientAssertionCredentialOptions {
                    client_options: self.sdk_settings()?.client_options(&id.authority_host),
                };
                crate::workload::credential(w, tenant, client_id, options)?
            }
            None => self.credential(&id)?,
        };
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

    fn bind_workload(&self, target: Target, workload: WorkloadIdentity) -> Result<Target, Error> {
        self.bind(target, workload)
    }

    fn workload_audience(
        &self,
        _target: &Target,
        _annotations: &std::collections::BTreeMap<String, String>,
    ) -> Result<String, Error> {
        Ok(crate::workload::AUDIENCE.to_string())
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_credential(target))
    }

    fn identity_kind(&self) -> IdentityKind {
        crate::diagnose::identity_kind(Kind::select(&self.env))
    }

    fn auto_detect_patterns(&self) -> Vec<String> {
        host::BUILTIN_SUFFIXES
            .iter()
            .map(|(s, _)| format!("*.{s}"))
            .chain(self.suffixes.iter().map(|s| format!("*.{s}")))
            .collect()
    }

    fn diagnose(&self, timeout: Duration) -> BoxFuture<'_, Diagnosis> {
        Box::pin(self.diagnosis(timeout))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::{opts, provider, reg};

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
    fn invalid_settings_are_errors_naming_the_variable() {
        for (var, value) in [
            (ENV_EXCHANGE_URL, "not a url"),
            (ENV_EXCHANGE_URL, "http://acr.example.com/oauth2/exchange"),
            (ENV_EXCHANGE_URL, "https://user:pw@acr.example.com/"),
            (identity::AZURE_AUTHORITY_HOST, "http://login.example.com"),
            (ENV_SCOPE, "two scopes"),
        ] {
            let e = check_env(&Env::from_pairs([(var, value)])).unwrap_err();
            assert!(
                e.starts_with(var) && !e.contains(value),
                "{var}={value}: {e}"
            );
        }
        assert!(
            check_env(&Env::from_pairs([(
                ENV_EXCHANGE_URL,
                "http://127.0.0.1:1/x"
            )]))
            .is_ok()
        );
        assert!(check_env(&Env::from_pairs([(ENV_SCOPE, DEFAULT_SCOPE)])).is_ok());
    }

    #[test]
    fn from_env_is_fast_and_does_no_io() {
        let start = std::time::Instant::now();
        let p = AzureProvider::from_env().unwrap();
        assert!(p.http.get().is_none(), "HTTP client must be built lazily");
        assert!(start.elapsed() < Duration::from_millis(100));
    }
}
