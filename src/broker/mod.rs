//! The broker: which source serves a registry, and the credential it serves.
//!
//! Precedence, first match wins:
//! 1. a static entry for exactly this registry (Flux RFC-0002: `secretRef` wins over
//!    `provider`);
//! 2. the first routing rule whose pattern matches;
//! 3. auto-detection: the first provider that recognises the host by its own strict
//!    patterns;
//! 4. otherwise the registry is not configured (the client should go anonymous).
//!
//! The core's parts, each in its own module: [`routing`] (patterns and ordered rules),
//! [`static_secret`] (docker configs: parsing, snapshots, directory watch), [`cache`]
//! (the expiry policy as one pure function, single-flight fetches), [`config`] (the TOML
//! file as validated plain data) and [`providers`] (the clouds compiled in). [`build`]
//! assembles a broker from the config file and docker configs, for every mode.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use regbroker_provider::{
    Credential, Error, ErrorKind, Provider, Registry, SharedClock, Target, WorkloadIdentity,
};

pub mod cache;
pub mod check;
pub mod config;
pub mod memo;
pub mod providers;
pub mod routing;
pub mod static_secret;
pub mod status;

use self::cache::{Cache, Need};
use self::providers::Providers;
use self::routing::{Router, Source};
use crate::metrics::Metrics;

/// Why a source was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A static entry names this registry.
    StaticEntry,
    /// Routing rule number `index` (from 0) with this pattern matched.
    Rule {
        /// Position of the rule in the config file.
        index: usize,
        /// Its pattern.
        pattern: String,
    },
    /// A provider recognised the host.
    AutoDetected,
    /// Nothing applies.
    NoMatch,
}

/// What the broker decided for a registry, before fetching anything.
#[derive(Debug)]
pub struct Decision {
    /// Why.
    pub reason: Reason,
    /// What serves it.
    pub route: Route,
}

/// The chosen source.
#[derive(Debug)]
pub enum Route {
    /// The static credential.
    Static(Credential),
    /// A provider and its target.
    Provider(Arc<dyn Provider>, Target),
    /// Nothing: the message says why.
    NotConfigured(String),
    /// A rule routed to a provider but the provider refused the target.
    Failed(&'static str, Error),
}

/// A credential and where it came from.
#[derive(Clone, Debug)]
pub struct Served {
    /// The registry asked for.
    pub registry: Registry,
    /// The credential.
    pub credential: Credential,
    /// `static` or the provider name.
    pub source: &'static str,
    /// When the cache refreshes it and stops serving it; `None` for a static entry.
    pub lifetime: Option<cache::Lifetime>,
    /// The cache key it was served from; `None` for a static entry.
    pub key: Option<cache::Key>,
}

/// What [`Broker::report_refused`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// The cached credential is gone: the next request fetches anew.
    Forgotten,
    /// A report for this credential was taken within `refetch_interval`: try again after
    /// this long.
    TooSoon(Duration),
    /// A static entry serves the registry: nothing can be fetched anew.
    Static,
}

/// Why no credential was served.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// Nothing serves this registry.
    #[error("{0}")]
    NotConfigured(String),
    /// A provider failed. An identity failure ends with [`DOCTOR_HINT`]: every surface
    /// (the HTTP answer, `resolve`, the helper, the kubelet mode) shows this message, so
    /// the hint is added here, once.
    #[error("{provider}: {error}{}", doctor_hint(error.kind()))]
    Provider {
        /// Which provider.
        provider: &'static str,
        /// Its error.
        error: Arc<Error>,
    },
}

/// What an identity failure tells the user to do next.
pub const DOCTOR_HINT: &str = "run `regbroker doctor` to check the identity";

/// `"; DOCTOR_HINT"` for an identity failure, else nothing.
pub(crate) fn doctor_hint(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::IdentityMissing | ErrorKind::IdentityRejected => format!("; {DOCTOR_HINT}"),
        _ => String::new(),
    }
}

impl BrokerError {
    /// The message without the [`DOCTOR_HINT`] (for `doctor` itself) and, with `chain`,
    /// with the provider error's causes (for a human at a terminal).
    pub fn detail(&self, chain: bool) -> String {
        match self {
            BrokerError::NotConfigured(m) => m.clone(),
            BrokerError::Provider { provider, error } if chain => {
                format!("{provider}: {}", error.chain())
            }
            BrokerError::Provider { provider, error } => format!("{provider}: {error}"),
        }
    }

    /// The error kind, for status mapping.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BrokerError::NotConfigured(_) => ErrorKind::NotConfigured,
            BrokerError::Provider { error, .. } => error.kind(),
        }
    }
}

/// The broker.
#[derive(Debug)]
pub struct Broker {
    statics: Arc<static_secret::Store>,
    router: Router,
    providers: Providers,
    cache: Cache,
    checks: check::Checks,
    metrics: Arc<Metrics>,
    clock: SharedClock,
}

impl Broker {
    /// A broker from its parts.
    pub fn new(
        statics: Arc<static_secret::Store>,
        router: Router,
        providers: Providers,
        cache_config: cache::Config,
        metrics: Arc<Metrics>,
        clock: SharedClock,
    ) -> Broker {
        let cache = Cache::new(cache_config, clock.clone()).with_metrics(metrics.clone());
        statics.forget_on_reload(cache.memo());
        Broker {
            statics,
            router,
            providers,
            cache,
            checks: check::Checks::default(),
            metrics,
            clock,
        }
    }

    /// A client's report that `registry`'s credential was refused (`DELETE
    /// /v1/credentials`, the helper's `erase`): the cached one is dropped so the next
    /// request fetches anew (one fetch, however many clients ask), at most once per
    /// `refetch_interval` per credential.
    pub async fn report_refused(&self, registry: &Registry) -> Result<Reported, BrokerError> {
        match self.decide(registry).route {
            Route::Static(_) => Ok(Reported::Static),
            Route::NotConfigured(message) => Err(BrokerError::NotConfigured(message)),
            Route::Failed(provider, error) => Err(BrokerError::Provider {
                provider,
                error: Arc::new(error),
            }),
            Route::Provider(provider, target) => {
                let key = cache::Key {
                    provider: provider.name(),
                    scope: target.scope().to_string(),
                };
                let interval = self.cache.config().refetch_interval;
                if let Some(wait) = self.checks.refetch(&key, self.clock.now(), interval) {
                    return Ok(Reported::TooSoon(wait));
                }
                self.cache.forget(&key).await;
                tracing::info!(%registry, provider = key.provider, "A client reported the credential refused: the next request fetches anew");
                Ok(Reported::Forgotten)
            }
        }
    }

    /// Asks `served`'s registry whether it accepts the credential, with the rule's
    /// realms, whatever its `check` setting and without touching the cache: `doctor`.
    pub async fn verify(&self, served: &Served) -> check::Verdict {
        let policy = self.check_policy(&served.registry);
        self.checks
            .checker
            .check(&served.registry, &served.credential, &policy)
            .await
    }

    /// What the rule routing `registry` says about checking it (the default, on, for a
    /// registry no rule names).
    pub fn check_policy(&self, registry: &Registry) -> check::Policy {
        self.router
            .route(registry)
            .map(|(_, r)| r.check.clone())
            .unwrap_or_default()
    }

    /// `served` once its registry accepted it, as a client logging in would be
    /// ([`check`]): the sinks call this before writing a credential. A provider
    /// credential is checked once per registry and fetch; a static entry, a rule with
    /// `check = false`, or a check that could not decide lets it through. A refusal is
    /// answered as a `credential_rejected` error, and stands for the failure pause
    /// (longer with each refusal in a row) without asking that registry again; the
    /// credential is dropped from the cache unless another registry let it through.
    pub async fn checked(&self, served: Served) -> Result<Served, BrokerError> {
        let (Some(key), Some(lifetime)) = (served.key.clone(), served.lifetime) else {
            return Ok(served);
        };
        let registry = &served.registry;
        let provider = served.source;
        if !self.check_policy(registry).enabled {
            return Ok(served);
        }
        let now = self.clock.now();
        let rejected = |status: u16| {
            let error = Arc::new(regbroker_provider::Error::new(
                ErrorKind::CredentialRejected,
                format!(
                    "{registry} refused the credential {provider} issued (HTTP {status}); asking again after a pause"
                ),
            ));
            BrokerError::Provider { provider, error }
        };
        match self.checks.get(&key, registry, now) {
            // A refusal stands for its pause, whatever was fetched since: the registry is
            // not asked again until then.
            Some(s) if s.refusals > 0 && now < s.until => return Err(rejected(s.status)),
            Some(s) if s.refusals == 0 && s.lifetime == lifetime => return Ok(served),
            _ => {}
        }
        let verdict = self
            .checks
            .checker
            .check(registry, &served.credential, &self.check_policy(registry))
            .await;
        self.metrics.registry_check(verdict.as_str());
        let pause = |n| cache::random_failure_pause(self.cache.config(), n);
        match verdict {
            check::Verdict::Accepted(status) => {
                tracing::info!(%registry, provider, status, "The registry accepted the credential");
                self.checks.record(&key, registry, lifetime, None, pause);
                Ok(served)
            }
            check::Verdict::Skipped(why) => {
                tracing::warn!(%registry, provider, reason = %why, "Registry check skipped; the credential is written unchecked");
                self.checks.record(&key, registry, lifetime, None, pause);
                Ok(served)
            }
            check::Verdict::Refused(status) => {
                let refusals =
                    self.checks
                        .record(&key, registry, lifetime, Some((status, now)), pause);
                // Refused everywhere it was asked (a revoked token): drop it, so the next
                // fetch gets another. Let through by another registry: the refusal is this
                // registry's alone, and the credential stays for the others.
                let dropped = !self.checks.let_through_elsewhere(&key, registry, lifetime)
                    && self.cache.forget_if(&key, lifetime).await;
                tracing::warn!(%registry, provider, status, refusals, dropped, "The registry refused the credential: not writing it; asking again after a pause");
                Err(rejected(status))
            }
        }
    }

    /// Also keeps fetched credentials in `persist` (the one-shot modes' disk cache).
    pub fn with_persist(mut self, persist: Arc<dyn cache::Persist>) -> Broker {
        self.cache = self.cache.with_persist(persist);
        self
    }

    /// The routing rules.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Decides which source serves `registry`, without fetching.
    pub fn decide(&self, registry: &Registry) -> Decision {
        if let Some(c) = self.statics.snapshot().get(registry) {
            return Decision {
                reason: Reason::StaticEntry,
                route: Route::Static(c.clone()),
            };
        }
        self.decide_contextual(registry)
    }

    /// Decides as [`Broker::decide`] does, without the static entries: the routing rules
    /// and the providers' own hosts only. What a tenant's `RegistryCredential` may get
    /// (the operator's static entries are not the tenants').
    pub fn decide_contextual(&self, registry: &Registry) -> Decision {
        if let Some((index, rule)) = self.router.route(registry) {
            let reason = Reason::Rule {
                index,
                pattern: rule.pattern.as_str().to_string(),
            };
            let route = match &rule.source {
                Source::None => Route::NotConfigured(format!(
                    "no credentials for {registry}: rule {} ({}) disables contextual login",
                    index + 1,
                    rule.pattern.as_str()
                )),
                Source::Static => Route::NotConfigured(format!(
                    "no credentials for {registry}: rule {} ({}) wants a static entry and none names this registry",
                    index + 1,
                    rule.pattern.as_str()
                )),
                Source::Provider { name, options } => match self.providers.get(name) {
                    // Config validation guarantees the provider exists.
                    None => Route::NotConfigured(format!("provider {name} is not available")),
                    Some(p) => match p.target(registry, options) {
                        Ok(t) => Route::Provider(p.clone(), t),
                        Err(e) if e.kind() == ErrorKind::NotConfigured => {
                            Route::NotConfigured(e.message().to_string())
                        }
                        Err(e) => Route::Failed(p.name(), e),
                    },
                },
            };
            return Decision { reason, route };
        }
        for p in self.providers.iter() {
            if let Some(t) = p.recognise(registry) {
                return Decision {
                    reason: Reason::AutoDetected,
                    route: Route::Provider(p.clone(), t),
                };
            }
        }
        Decision {
            reason: Reason::NoMatch,
            route: Route::NotConfigured(format!(
                "no credentials for {registry}: no static entry, no rule, and no provider recognises it"
            )),
        }
    }

    /// The answer kept for `request` by [`Broker::keep_answer`], if it is still what
    /// [`Broker::credential`] would answer (counted and logged as that would be); else a
    /// [`memo::Miss`] to keep the answer decided now.
    pub fn kept_answer(&self, request: &str) -> Result<bytes::Bytes, memo::Miss> {
        self.cache.memo().kept(
            request,
            || self.clock.now(),
            |kept| {
                if kept.cached {
                    self.metrics.cache_lookup(cache::Outcome::Hit.as_str());
                    tracing::debug!(registry = %kept.registry, source = kept.source, cache = "hit", "Serving credential");
                } else {
                    tracing::debug!(registry = %kept.registry, source = kept.source, "Serving credential");
                }
                self.metrics.credential_served(kept.source);
            },
        )
    }

    /// Keeps `body`, the answer to `request` made from `served`, until `served` stops
    /// being [`Broker::credential`]'s answer (see [`memo`]).
    pub fn keep_answer(
        &self,
        request: &str,
        miss: memo::Miss,
        served: &Served,
        body: bytes::Bytes,
    ) {
        let until = [
            served.lifetime.map(|l| l.refresh_at),
            served.credential.expires_at(),
        ]
        .into_iter()
        .flatten()
        .min();
        let answer = memo::Answer {
            body,
            registry: served.registry.clone(),
            source: served.source,
            cached: served.key.is_some(),
            until,
        };
        self.cache
            .memo()
            .keep(request, miss, answer, self.clock.now());
    }

    /// The credential for `registry`, at once if a servable one is cached (a refresh
    /// due then runs in the background).
    pub async fn credential(&self, registry: &Registry) -> Result<Served, BrokerError> {
        self.credential_with(registry, Need::Servable).await
    }

    /// The credential for `registry`, waiting for a due refresh ([`Need::Fresh`]): for
    /// callers that write what they get, or exit before a background fetch could end.
    pub async fn fresh_credential(&self, registry: &Registry) -> Result<Served, BrokerError> {
        self.credential_with(registry, Need::Fresh).await
    }

    /// The credential for `registry` as `workload`'s own identity, waiting for a due
    /// refresh ([`Need::Fresh`]), as [`Broker::fresh_credential`] does for this process's
    /// identity. A static entry still wins (RFC-0002); a provider reads the workload's
    /// identity from its annotations ([`Provider::bind_workload`]) and never falls back to
    /// this process's identity.
    pub async fn fresh_credential_for(
        &self,
        registry: &Registry,
        workload: &WorkloadIdentity,
    ) -> Result<Served, BrokerError> {
        let route = bind(self.decide(registry).route, workload);
        self.serve_with(registry, route, Need::Fresh).await
    }

    /// The credential for `registry` as a tenant's `workload`: as
    /// [`Broker::fresh_credential_for`], but never from this process's static entries
    /// ([`Broker::decide_contextual`]).
    pub async fn fresh_contextual_credential_for(
        &self,
        registry: &Registry,
        workload: &WorkloadIdentity,
    ) -> Result<Served, BrokerError> {
        self.contextual_credential_for(registry, workload, Need::Fresh)
            .await
    }

    /// As [`Broker::fresh_contextual_credential_for`], but fetched anew even before the
    /// refresh point ([`Need::Refetch`]): a tenant asked for a refresh.
    pub async fn refetched_contextual_credential_for(
        &self,
        registry: &Registry,
        workload: &WorkloadIdentity,
    ) -> Result<Served, BrokerError> {
        self.contextual_credential_for(registry, workload, Need::Refetch)
            .await
    }

    async fn contextual_credential_for(
        &self,
        registry: &Registry,
        workload: &WorkloadIdentity,
        need: Need,
    ) -> Result<Served, BrokerError> {
        let route = bind(self.decide_contextual(registry).route, workload);
        self.serve_with(registry, route, need).await
    }

    async fn credential_with(
        &self,
        registry: &Registry,
        need: Need,
    ) -> Result<Served, BrokerError> {
        let decision = self.decide(registry);
        self.serve_with(registry, decision.route, need).await
    }

    /// Serves a decision made by [`Broker::decide`] to a waiting client.
    pub async fn serve(&self, registry: &Registry, route: Route) -> Result<Served, BrokerError> {
        self.serve_with(registry, route, Need::Servable).await
    }

    async fn serve_with(
        &self,
        registry: &Registry,
        route: Route,
        need: Need,
    ) -> Result<Served, BrokerError> {
        match route {
            Route::Static(credential) => {
                self.metrics.credential_served("static");
                tracing::debug!(%registry, source = "static", "Serving credential");
                Ok(Served {
                    registry: registry.clone(),
                    credential,
                    source: "static",
                    lifetime: None,
                    key: None,
                })
            }
            Route::NotConfigured(message) => Err(BrokerError::NotConfigured(message)),
            Route::Failed(provider, error) => Err(BrokerError::Provider {
                provider,
                error: Arc::new(error),
            }),
            Route::Provider(provider, target) => {
                let name = provider.name();
                let key = cache::Key {
                    provider: name,
                    scope: target.scope().to_string(),
                };
                let metrics = self.metrics.clone();
                let clock = self.clock.clone();
                let fetch = move || {
                    async move {
                        let started = Instant::now();
                        tracing::debug!(provider = name, registry = %target.registry(), scope = target.scope(), "Fetching credential");
                        // Every provider's credential enters the cache here: an expiry
                        // years ahead is a broken answer, capped at MAX_LIFETIME.
                        let result = provider
                            .fetch(&target)
                            .await
                            .map(|c| c.capped(clock.now()));
                        let outcome = match &result {
                            Ok(_) => "ok",
                            Err(e) => e.kind().code(),
                        };
                        metrics.upstream_call(name, outcome, started.elapsed().as_secs_f64());
                        metrics.last_fetches.record(name, outcome, clock.now());
                        match &result {
                            Ok(c) => tracing::info!(provider = name, scope = target.scope(), expires_at = ?c.expires_at().map(crate::rfc3339), "Fetched credential"),
                            Err(e) => tracing::warn!(provider = name, scope = target.scope(), error = %e.chain(), "Credential fetch failed"),
                        }
                        result
                    }
                    .boxed()
                };
                match self.cache.get_or_fetch(&key, need, fetch).await {
                    Ok((entry, outcome)) => {
                        self.metrics.cache_lookup(outcome.as_str());
                        self.metrics.credential_served(name);
                        tracing::debug!(%registry, source = name, cache = outcome.as_str(), "Serving credential");
                        Ok(Served {
                            registry: registry.clone(),
                            credential: entry.credential.clone(),
                            source: name,
                            lifetime: Some(entry.lifetime),
                            key: Some(key),
                        })
                    }
                    Err(error) => Err(BrokerError::Provider {
                        provider: name,
                        error,
                    }),
                }
            }
        }
    }

    /// The current static credentials.
    pub fn statics(&self) -> &static_secret::Store {
        &self.statics
    }

    /// The cache (for metrics and benchmarks).
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The metrics it counts into (the sinks record their passes there too).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Now, by the broker's clock.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// The broker's clock (the one-shot modes' disk cache reads time from it too).
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }
}

/// `route` for `workload`'s own identity: a provider's target bound to it (or the
/// provider's refusal); every other route as it is.
pub fn bind(route: Route, workload: &WorkloadIdentity) -> Route {
    match route {
        Route::Provider(provider, target) => {
            match provider.bind_workload(target, workload.clone()) {
                Ok(target) => Route::Provider(provider, target),
                Err(e) if e.kind() == ErrorKind::NotConfigured => {
                    Route::NotConfigured(e.message().to_string())
                }
                Err(e) => Route::Failed(provider.name(), e),
            }
        }
        other => other,
    }
}

/// The in-process broker and the pieces the sidecar also needs.
#[derive(Debug)]
pub struct Built {
    /// The broker.
    pub broker: Arc<Broker>,
    /// Its static credentials.
    pub statics: Arc<static_secret::Store>,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// The Secrets the config file declares (`[[secret]]`), for `serve`'s Secret sync.
    pub secrets: Vec<config::SecretEntry>,
}

/// Builds the in-process broker shared by every mode. Errors are configuration errors,
/// naming the file.
pub fn build(config: Option<&PathBuf>, docker_config: &[PathBuf]) -> Result<Built, String> {
    let providers = Providers::from_env()?;
    let config = match config {
        Some(path) => config::load(path, &providers)
            .map_err(|e| format!("{e} (--config / REGBROKER_CONFIG)"))?,
        None => config::Config::default(),
    };
    let metrics = Arc::new(Metrics::new());
    let statics = Arc::new(
        static_secret::Store::open(docker_config.to_vec(), metrics.clone())
            .map_err(|e| format!("{e} (--docker-config / REGBROKER_DOCKER_CONFIG)"))?,
    );
    let broker = Broker::new(
        statics.clone(),
        config.router,
        providers,
        config.cache,
        metrics.clone(),
        regbroker_provider::system_clock(),
    );
    Ok(Built {
        broker: Arc::new(broker),
        statics,
        metrics,
        secrets: config.secrets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use regbroker_provider::{BoxFuture, Options};

    /// The hint is said for identity failures only, once, and `detail` (what `doctor`
    /// and `resolve` print) leaves it out, with the causes only when asked.
    #[test]
    fn identity_failures_point_to_doctor_and_detail_leaves_the_hint_out() {
        let failure = |kind| BrokerError::Provider {
            provider: "aws",
            error: Arc::new(
                Error::new(kind, "refused").with_source(std::io::Error::other("the cause")),
            ),
        };
        for kind in [ErrorKind::IdentityMissing, ErrorKind::IdentityRejected] {
            let e = failure(kind);
            assert_eq!(e.to_string(), format!("aws: refused; {DOCTOR_HINT}"));
            assert_eq!(e.detail(false), "aws: refused");
            let chained = e.detail(true);
            assert!(
                chained.starts_with("aws: refused") && chained.contains("the cause"),
                "{chained}"
            );
            assert!(!chained.contains(DOCTOR_HINT), "{chained}");
        }
        for kind in [ErrorKind::Unavailable, ErrorKind::InvalidConfig] {
            assert_eq!(failure(kind).to_string(), "aws: refused");
        }
        let none = BrokerError::NotConfigured("nothing serves x.test".into());
        assert_eq!(none.detail(true), "nothing serves x.test");
        assert_eq!(none.to_string(), "nothing serves x.test");
    }

    /// Recognises `*.test`; refuses every workload with the error kind it was made with.
    #[derive(Debug)]
    struct Refusing(ErrorKind);

    impl Provider for Refusing {
        fn name(&self) -> &'static str {
            "refusing"
        }
        fn recognise(&self, registry: &Registry) -> Option<Target> {
            registry
                .host()
                .ends_with(".test")
                .then(|| Target::new(registry.clone(), "own"))
        }
        fn check_options(&self, _: &Options) -> Result<(), String> {
            Ok(())
        }
        fn target(&self, registry: &Registry, _: &Options) -> Result<Target, Error> {
            // A rule's host outside `*.test` is one this provider does not serve.
            if registry.host().ends_with(".test") {
                Ok(Target::new(registry.clone(), "own"))
            } else {
                Err(Error::new(self.0, "not a host of this provider"))
            }
        }
        fn bind_workload(&self, _: Target, _: WorkloadIdentity) -> Result<Target, Error> {
            Err(Error::new(self.0, "refused for this workload"))
        }
        fn fetch<'a>(&'a self, _: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
            Box::pin(async { Err(Error::unavailable("never fetched")) })
        }
    }

    fn route(kind: ErrorKind) -> Route {
        let p: Arc<dyn Provider> = Arc::new(Refusing(kind));
        let registry = Registry::parse("a.test").unwrap_or_else(|e| panic!("{e}"));
        let target = p
            .recognise(&registry)
            .unwrap_or_else(|| panic!("recognised"));
        let workload = WorkloadIdentity::from_token(
            regbroker_provider::test_util::service_account_jwt("team-a", "puller", "u-1").into(),
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        bind(Route::Provider(p, target), &workload)
    }

    /// How a rule sending `host` to the `Refusing` provider is decided.
    fn decided(kind: ErrorKind, host: &str) -> Route {
        let p: Arc<dyn Provider> = Arc::new(Refusing(kind));
        let rule = routing::Rule {
            pattern: routing::Pattern::parse(host).unwrap_or_else(|e| panic!("{e}")),
            source: routing::Source::Provider {
                name: "refusing".into(),
                options: Options::default(),
            },
            check: Default::default(),
        };
        let metrics = Arc::new(Metrics::new());
        let broker = Broker::new(
            Arc::new(static_secret::Store::empty(metrics.clone())),
            Router::new(vec![rule]),
            Providers::new(vec![p]),
            cache::Config::default(),
            metrics,
            Arc::new(regbroker_provider::ManualClock::fixed()),
        );
        broker
            .decide(&Registry::parse(host).unwrap_or_else(|e| panic!("{e}")))
            .route
    }

    #[test]
    fn a_rule_to_a_provider_that_does_not_serve_the_host_is_not_configured_not_a_failure() {
        match decided(ErrorKind::NotConfigured, "elsewhere.example.com") {
            Route::NotConfigured(m) => assert!(m.contains("not a host of this provider"), "{m}"),
            other => panic!("{other:?}"),
        }
        match decided(ErrorKind::InvalidConfig, "elsewhere.example.com") {
            Route::Failed("refusing", e) => assert_eq!(e.kind(), ErrorKind::InvalidConfig),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decided(ErrorKind::NotConfigured, "a.test"),
            Route::Provider(..)
        ));
    }

    #[test]
    fn a_provider_declining_a_workload_means_not_configured_and_a_refusal_fails() {
        // Declined (the client goes anonymous, as for a host nobody serves).
        match route(ErrorKind::NotConfigured) {
            Route::NotConfigured(m) => assert!(m.contains("refused for this workload"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Refused: an error for this workload, never another route.
        match route(ErrorKind::InvalidConfig) {
            Route::Failed("refusing", e) => assert_eq!(e.kind(), ErrorKind::InvalidConfig),
            other => panic!("{other:?}"),
        }
        // Routes without a provider are left as they are.
        let statics = bind(
            Route::NotConfigured("nothing".into()),
            &WorkloadIdentity::from_token(
                regbroker_provider::test_util::service_account_jwt("a", "b", "c").into(),
                Default::default(),
            )
            .unwrap_or_else(|e| panic!("{e}")),
        );
        assert!(matches!(statics, Route::NotConfigured(m) if m == "nothing"));
    }
}
