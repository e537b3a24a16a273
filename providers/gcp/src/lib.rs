//! regbroker provider for Google Artifact Registry (`<location>-docker.pkg.dev`), Container
//! Registry (`gcr.io`, `<x>.gcr.io`) and Artifact Registry in Trusted Cloud by S3NS
//! (`docker.s3nsregistry.fr`).
//!
//! Env vars read (lazily, on the first fetch, never at construction):
//! - `GOOGLE_APPLICATION_CREDENTIALS`: a `service_account` key or an `external_account`
//!   (workload identity federation) credentials file. When unset, the metadata server.
//! - `GCE_METADATA_HOST`: the metadata server address (default `169.254.169.254`).
//! - `HTTPS_PROXY` / `NO_PROXY`: for calls to Google's token endpoints (never for the
//!   metadata server or loopback / link-local endpoints).
//!
//! The credential is username `oauth2accesstoken` and password an OAuth 2.0 access token
//! for the scope `https://www.googleapis.com/auth/cloud-platform`, valid for every
//! registry of the identity's universe ([`universe`]): Google's hosts share one cache scope
//! ([`CACHE_SCOPE`]), so one token serves `gcr.io`, `eu.gcr.io` and every
//! `*-docker.pkg.dev`; S3NS's (`s3nsapis.fr`) have a scope of their own. A token is only
//! ever sent to a registry of the universe that minted it: an identity of one universe
//! asked for a registry of another answers "not configured" without calling anything.
//! Its expiry is the token's own (`expires_in`, or `expireTime` when impersonating).
//!
//! See README.md for the IAM roles, GKE Workload Identity setup and the library choice.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod answers;
mod diagnose;
mod external_account;
mod hosts;
mod http;
mod identity;
mod metadata;
mod service_account;
mod token;
pub mod universe;
mod url;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use regbroker_provider::{
    BoxFuture, Credential, Diagnosis, Error, IdentityKind, Options, Provider, Registry,
    SharedClock, Target, check_known_options, system_clock,
};
use tokio::sync::OnceCell;

pub use http::HttpSettings;
pub use identity::{CREDENTIALS_ENV, METADATA_HOST_ENV};
pub use metadata::DEFAULT_METADATA_HOST;
pub use token::FALLBACK_TTL;

use identity::{Env, Identity};

/// The registry username that marks the password as a Google access token.
pub const USERNAME: &str = "oauth2accesstoken";

/// The OAuth 2.0 scope requested for service-account and external_account tokens.
pub const OAUTH_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// The first part of every target's cache scope: one credential per process identity
/// serves every registry host of its universe. See [`cache_scope`].
pub const CACHE_SCOPE: &str = "application-default";

/// The cache scope of targets in `universe` for the identity whose fingerprint is
/// `fingerprint`: `application-default:<fingerprint>` in Google's universe, with
/// `@<universe>` after it in any other, so neither two universes nor two identities
/// (two key files sharing one disk cache) ever share a cached token.
pub fn cache_scope(universe: &str, fingerprint: &str) -> String {
    // Pushed, not format!ted: every request a gcp host makes builds its scope.
    let other = universe != universe::DEFAULT_UNIVERSE;
    let mut scope = String::with_capacity(
        CACHE_SCOPE.len() + 1 + fingerprint.len() + if other { 1 + universe.len() } else { 0 },
    );
    scope.push_str(CACHE_SCOPE);
    scope.push(':');
    scope.push_str(fingerprint);
    if other {
        scope.push('@');
        scope.push_str(universe);
    }
    scope
}

/// Rule options this provider accepts: `universe_domain`, the universe of a host the
/// provider does not know (default: the host's own, by its domain, else
/// `googleapis.com`). The identity comes from the environment.
pub const KNOWN_OPTIONS: &[&str] = &["universe_domain"];

/// The target parameter naming the universe whose token a target may receive.
pub(crate) const UNIVERSE_PARAM: &str = "universe_domain";

/// The Google Artifact Registry and Container Registry provider.
pub struct GcpProvider {
    env: Env,
    clock: SharedClock,
    http: HttpSettings,
    identity: OnceCell<Identity>,
    /// HTTP clients for workload federation (Google APIs: proxied; loopback: direct).
    workload_clients: std::sync::OnceLock<(reqwest::Client, reqwest::Client)>,
    /// See [`identity::fingerprint`]; computed on first use.
    fingerprint: std::sync::OnceLock<String>,
}

impl fmt::Debug for GcpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcpProvider")
            .field("env", &self.env)
            .field("http", &self.http)
            .field("identity_loaded", &self.identity.initialized())
            .finish_non_exhaustive()
    }
}

impl GcpProvider {
    /// A provider that reads its identity from the process environment on first use.
    /// Does no I/O. Fails on an invalid `REGBROKER_GCP_STS_URL`,
    /// `REGBROKER_GCP_IAM_CREDENTIALS_URL` or `REGBROKER_GKE_CLUSTER`, naming the variable
    /// (a configuration error: such a value is never ignored).
    pub fn from_env() -> Result<GcpProvider, String> {
        let p = GcpProvider::builder().build();
        p.check_env()?;
        Ok(p)
    }

    /// Checks the `REGBROKER_GCP_*` and `REGBROKER_GKE_CLUSTER` settings of this
    /// provider's env; the error names the variable, not its value.
    pub fn check_env(&self) -> Result<(), String> {
        workload::check_env(&self.env)
    }

    /// A builder for explicit settings (tests, embedding).
    pub fn builder() -> Builder {
        Builder::default()
    }

    fn fingerprint(&self) -> &str {
        self.fingerprint
            .get_or_init(|| identity::fingerprint(&self.env))
    }

    fn target_in(
        &self,
        registry: &Registry,
        kind: &'static str,
        universe: std::borrow::Cow<'static, str>,
    ) -> Target {
        Target::new(registry.clone(), cache_scope(&universe, self.fingerprint()))
            .with_param("host_kind", kind)
            .with_param(UNIVERSE_PARAM, universe)
    }

    /// A workload's own federation (see [`workload`]): never this process's identity.
    async fn fetch_for_workload(
        &self,
        target: &Target,
        w: &regbroker_provider::WorkloadIdentity,
    ) -> Result<Credential, Error> {
        let universe = target
            .param(UNIVERSE_PARAM)
            .unwrap_or(universe::DEFAULT_UNIVERSE);
        let federation = workload::federation(&self.env, target, w, universe)?;
        let (api, local) = match self.workload_clients.get() {
            Some(c) => c,
            None => {
                let built = (
                    http::client(&self.http, true)?,
                    http::client(&self.http, false)?,
                );
                self.workload_clients.get_or_init(|| built)
            }
        };
        let token = federation
            .token(api, local, &self.http, &self.clock, OAUTH_SCOPE)
            .await?;
        tracing::debug!(
            registry = %target.registry(),
            service_account = %w.service_account(),
            identity = %federation.describe(),
            "Fetched Google access token for a workload"
        );
        Ok(Credential::issued(
            USERNAME,
            token.secret,
            Some(token.expires_at),
            self.clock.now(),
        ))
    }

    async fn fetch_credential(&self, target: &Target) -> Result<Credential, Error> {
        if let Some(w) = target.workload() {
            return self.fetch_for_workload(target, w).await;
        }
        let identity = self
            .identity
            .get_or_try_init(|| Identity::load(&self.env, &self.http))
            .await?;
        // The token goes to the registry only if both are of one universe: checked before
        // any token call, so a mismatch never even mints one.
        let wanted = target
            .param(UNIVERSE_PARAM)
            .unwrap_or(universe::DEFAULT_UNIVERSE);
        let have = identity.universe(&self.http).await?;
        if have != wanted {
            return Err(Error::not_configured(format!(
                "{} belongs to the universe {wanted}, and the GCP identity ({}) to {have}: its token is never sent to another universe's registry",
                target.registry(),
                identity.describe()
            )));
        }
        let token = identity.token(&self.http, &self.clock, OAUTH_SCOPE).await?;
        tracing::debug!(
            registry = %target.registry(),
            identity = %identity.describe(),
            expires_at = ?token.expires_at,
            "Fetched Google access token"
        );
        Ok(Credential::issued(
            USERNAME,
            token.secret,
            Some(token.expires_at),
            self.clock.now(),
        ))
    }
}

/// Builds a [`GcpProvider`] with explicit settings.
#[derive(Debug, Default)]
pub struct Builder {
    env: Option<BTreeMap<String, String>>,
    clock: Option<SharedClock>,
    http: Option<HttpSettings>,
}

impl Builder {
    /// Reads `GOOGLE_APPLICATION_CREDENTIALS` and `GCE_METADATA_HOST` from this map instead
    /// of the process environment (a variable absent from the map is unset).
    pub fn env<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Builder {
        self.env = Some(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        );
        self
    }

    /// The clock that stamps token expiry and assertion times (default: the system clock).
    pub fn clock(mut self, clock: SharedClock) -> Builder {
        self.clock = Some(clock);
        self
    }

    /// Timeouts and retries (default: [`HttpSettings::default`]).
    pub fn http(mut self, http: HttpSettings) -> Builder {
        self.http = Some(http);
        self
    }

    /// The provider. Does no I/O.
    pub fn build(self) -> GcpProvider {
        GcpProvider {
            env: self.env.map(Env::Map).unwrap_or(Env::Process),
            clock: self.clock.unwrap_or_else(system_clock),
            http: self.http.unwrap_or_default(),
            identity: OnceCell::new(),
            workload_clients: std::sync::OnceLock::new(),
            fingerprint: std::sync::OnceLock::new(),
        }
    }
}

impl Provider for GcpProvider {
    fn name(&self) -> &'static str {
        "gcp"
    }

    fn recognise(&self, registry: &Registry) -> Option<Target> {
        let kind = hosts::classify(registry)?;
        Some(self.target_in(registry, kind.as_str(), kind.universe().into()))
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        check_known_options("gcp", options, KNOWN_OPTIONS)?;
        if let Some(u) = options.get(UNIVERSE_PARAM) {
            universe::checked(u, "option `universe_domain`")
                .map_err(|e| e.message().to_string())?;
        }
        Ok(())
    }

    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error> {
        self.check_options(options).map_err(Error::invalid_config)?;
        let kind = hosts::classify(registry).map_or("custom", |k| k.as_str());
        let by_domain = hosts::domain_universe(registry);
        let chosen = options.get(UNIVERSE_PARAM).and_then(|u| universe::parse(u));
        let universe = match (chosen, by_domain) {
            (Some(c), Some(d)) if c != d => {
                return Err(Error::invalid_config(format!(
                    "{registry} is a registry of the universe {d}; option `universe_domain` says {c}"
                )));
            }
            (Some(c), _) => c,
            (None, Some(d)) => d.to_string(),
            (None, None) => universe::DEFAULT_UNIVERSE.to_string(),
        };
        Ok(self.target_in(registry, kind, universe.into()))
    }

    fn bind_workload(
        &self,
        target: Target,
        workload: regbroker_provider::WorkloadIdentity,
    ) -> Result<Target, Error> {
        let universe = target
            .param(UNIVERSE_PARAM)
            .unwrap_or(universe::DEFAULT_UNIVERSE)
            .to_string();
        workload::bind(&self.env, target, workload, &universe)
    }

    fn workload_audience(
        &self,
        _target: &Target,
        annotations: &BTreeMap<String, String>,
    ) -> Result<String, Error> {
        workload::audience(&self.env, annotations, universe::DEFAULT_UNIVERSE)
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_credential(target))
    }

    fn identity_kind(&self) -> IdentityKind {
        diagnose::identity_kind(&self.env)
    }

    fn auto_detect_patterns(&self) -> Vec<String> {
        [
            "gcr.io",
            "*.gcr.io",
            "*-docker.pkg.dev",
            "docker.s3nsregistry.fr",
        ]
        .map(String::from)
        .to_vec()
    }

    fn diagnose(&self, timeout: Duration) -> BoxFuture<'_, Diagnosis> {
        Box::pin(self.diagnosis(timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(s: &str) -> Registry {
        Registry::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn s3ns_never_shares_a_cache_scope_with_google() {
        let p = GcpProvider::builder().env([("X", "Y")]).build();
        let google = cache_scope(universe::DEFAULT_UNIVERSE, p.fingerprint());
        let s3ns = p.recognise(&reg("docker.s3nsregistry.fr")).unwrap();
        assert_eq!(
            s3ns.scope(),
            format!("application-default:{}@s3nsapis.fr", p.fingerprint())
        );
        assert_eq!(s3ns.param("universe_domain"), Some("s3nsapis.fr"));
        assert_ne!(s3ns.scope(), google);
        // An explicit rule to another S3NS host lands in S3NS's scope by its domain...
        let regional = p
            .target(
                &reg("u-france-east1-docker.s3nsregistry.fr"),
                &Options::new(),
            )
            .unwrap();
        assert_eq!(regional.scope(), s3ns.scope());
        // ... and a rule cannot move a known host into the other universe.
        let mut o = Options::new();
        o.insert("universe_domain".into(), "googleapis.com".into());
        let e = p.target(&reg("docker.s3nsregistry.fr"), &o).err().unwrap();
        assert_eq!(e.kind(), regbroker_provider::ErrorKind::InvalidConfig);
        // A custom domain is Google's unless the rule says otherwise.
        let custom = p
            .target(&reg("images.example.com"), &Options::new())
            .unwrap();
        assert_eq!(custom.scope(), google);
        o.insert("universe_domain".into(), "s3nsapis.fr".into());
        let custom = p.target(&reg("images.example.com"), &o).unwrap();
        assert_eq!(custom.scope(), s3ns.scope());
        o.insert("universe_domain".into(), "not a domain".into());
        assert!(p.check_options(&o).is_err());
    }

    #[test]
    fn the_cache_scope_names_the_identity_and_any_universe_but_google_s() {
        assert_eq!(
            cache_scope(universe::DEFAULT_UNIVERSE, "sa@p.iam"),
            "application-default:sa@p.iam"
        );
        assert_eq!(
            cache_scope("s3nsapis.fr", "sa@p.iam"),
            "application-default:sa@p.iam@s3nsapis.fr"
        );
        assert_eq!(
            cache_scope("s3nsapis.fr", ""),
            "application-default:@s3nsapis.fr"
        );
    }

    #[test]
    fn every_google_host_shares_one_cache_scope() {
        let p = GcpProvider::builder().env([("X", "Y")]).build();
        let google = cache_scope(universe::DEFAULT_UNIVERSE, p.fingerprint());
        let scopes: Vec<String> = [
            "gcr.io",
            "eu.gcr.io",
            "europe-west1-docker.pkg.dev",
            "us-docker.pkg.dev",
        ]
        .iter()
        .map(|h| {
            p.recognise(&reg(h))
                .unwrap_or_else(|| panic!("{h} not recognised"))
                .scope()
                .to_string()
        })
        .collect();
        assert!(scopes.iter().all(|s| *s == google), "{scopes:?}");
        let custom = p
            .target(&reg("registry.example.com:8443"), &Options::new())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(custom.scope(), google);
        assert_eq!(custom.param("host_kind"), Some("custom"));
    }

    #[test]
    fn two_identities_never_share_a_cache_scope() {
        // Tried as a new user would: two service-account key files sharing one
        // REGBROKER_CACHE_DIR got each other's tokens while every scope was
        // `application-default`. The scope now names the identity (client email and key
        // id), and never the private key.
        let dir = tempfile::tempdir().unwrap();
        let key = |email: &str, key_id: &str, private: &str| {
            let path = dir.path().join(format!("{email}-{key_id}.json"));
            std::fs::write(
                &path,
                serde_json::json!({
                    "type": "service_account",
                    "client_email": email,
                    "private_key_id": key_id,
                    "private_key": private,
                    "token_uri": "https://oauth2.googleapis.com/token",
                })
                .to_string(),
            )
            .unwrap();
            path.display().to_string()
        };
        let scope_of = |path: &str| {
            let p = GcpProvider::builder()
                .env([(CREDENTIALS_ENV, path)])
                .build();
            p.recognise(&reg("europe-docker.pkg.dev"))
                .unwrap()
                .scope()
                .to_string()
        };
        let a = scope_of(&key("a@p.iam.gserviceaccount.com", "k1", "PRIVATE-A"));
        let b = scope_of(&key("b@p.iam.gserviceaccount.com", "k1", "PRIVATE-B"));
        let a2 = scope_of(&key("a@p.iam.gserviceaccount.com", "k2", "PRIVATE-A2"));
        assert_ne!(a, b, "two service accounts");
        assert_ne!(a, a2, "two keys of one service account");
        // The same identity from a copy of its file shares the scope.
        let copy = dir.path().join("copy.json");
        std::fs::copy(key("a@p.iam.gserviceaccount.com", "k1", "PRIVATE-A"), &copy).unwrap();
        assert_eq!(a, scope_of(&copy.display().to_string()));
        for s in [&a, &b, &a2] {
            assert!(!s.contains("PRIVATE"), "{s}");
        }
        // The metadata server at another address is another identity too.
        let m1 = GcpProvider::builder()
            .env([(METADATA_HOST_ENV, "127.0.0.1:1")])
            .build();
        let m2 = GcpProvider::builder()
            .env([(METADATA_HOST_ENV, "127.0.0.1:2")])
            .build();
        assert_ne!(
            m1.recognise(&reg("gcr.io")).unwrap().scope(),
            m2.recognise(&reg("gcr.io")).unwrap().scope()
        );
    }

    #[test]
    fn unknown_options_are_rejected_by_name() {
        let p = GcpProvider::from_env().unwrap();
        assert!(p.check_options(&Options::new()).is_ok());
        let mut o = Options::new();
        o.insert("universe_domain".into(), "s3nsapis.fr".into());
        assert!(p.check_options(&o).is_ok());
        o.insert("project".into(), "p".into());
        let e = p.check_options(&o).err().unwrap_or_default();
        assert!(e.contains("`project`"), "{e}");
        let e = p.target(&reg("gcr.io"), &o).err().map(|e| e.kind());
        assert_eq!(e, Some(regbroker_provider::ErrorKind::InvalidConfig));
    }

    #[test]
    fn from_env_does_no_io_and_loads_nothing() {
        let p = GcpProvider::from_env().unwrap();
        assert!(!p.identity.initialized());
        assert_eq!(p.name(), "gcp");
    }
}
