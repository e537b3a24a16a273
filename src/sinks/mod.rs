//! The ways out: keeping credentials where clients that cannot ask regbroker read them.
//!
//! - [`docker_config`]: a docker `config.json` file (`serve --write-docker-config`);
//! - [`secret_sync`]: `kubernetes.io/dockerconfigjson` Secrets (`serve --sync-secret`);
//! - [`status`]: what each has written since start (readiness, metrics, `/v1/providers`).
//!
//! Both write the same registries on the same schedule, defined here: every registry
//! with a static entry or an exact provider rule, plus `--sink-registry`, fetched through
//! the broker (so from its cache while fresh) in one pass, the next pass due at the
//! earliest refresh point, clamped to [5 s, 60 s], or sooner when the static sources
//! change. A registry whose fetch fails keeps its previous entry until that entry's
//! credential goes stale.

pub mod docker_config;
pub mod secret_sync;
pub mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use regbroker_provider::{ExposeSecret, Registry};
use zeroize::Zeroizing;

use crate::broker::cache;
use crate::broker::routing::Source;
use crate::broker::{Broker, BrokerError};

/// Shortest and longest sleep between passes (shared with the Kubernetes Secret sync).
pub(crate) const MIN_SLEEP: Duration = Duration::from_secs(5);
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(60);

/// One registry's current `auth` value, when it goes stale and when it expires.
pub(crate) struct Held {
    auth: Zeroizing<String>,
    stale_at: Option<SystemTime>,
    expires_at: Option<SystemTime>,
}

/// The registries the sink writes.
pub fn registries(broker: &Broker, extra: &[Registry]) -> Vec<Registry> {
    let mut out: Vec<Registry> = broker
        .statics()
        .snapshot()
        .registries()
        .into_iter()
        .cloned()
        .collect();
    for rule in broker.router().rules() {
        let exact_provider_rule =
            !rule.pattern.is_glob() && matches!(rule.source, Source::Provider { .. });
        if let Some(r) = exact_provider_rule
            .then(|| Registry::parse(rule.pattern.as_str()).ok())
            .flatten()
        {
            out.push(r);
        }
    }
    out.extend(extra.iter().cloned());
    out.sort();
    out.dedup();
    out
}

/// How a pass gets a registry's credential: the broker's fresh credential, as this
/// process or as a workload. Takes the registry by value so the future borrows only what
/// the closure holds.
pub(crate) type Fetch<'a> = dyn Fn(Registry) -> futures_util::future::BoxFuture<'a, Result<crate::broker::Served, BrokerError>>
    + Send
    + Sync
    + 'a;

/// What [`pass`] did.
pub(crate) struct Passed {
    /// When the next pass is due.
    pub(crate) next: Duration,
    /// Each wanted registry's fetch outcome: `ok` or the error code.
    pub(crate) fetched: Vec<(Registry, &'static str)>,
    /// The expiry of each credential held after the pass (those that expire).
    pub(crate) expiries: Vec<(Registry, SystemTime)>,
}

/// Runs one pass: fetch every registry of `wanted` into `held`, with `fetch` (the
/// broker's fresh credential, as this process or as a workload). Returns when the next
/// pass is due and how each fetch went. Shared by the file sink and the Secret sync.
pub(crate) async fn pass(
    broker: &Broker,
    wanted: &[Registry],
    held: &mut BTreeMap<Registry, Held>,
    fetch: &Fetch<'_>,
) -> Passed {
    let now = broker.now();
    held.retain(|r, _| wanted.contains(r));
    let mut next = MAX_SLEEP;
    let mut fetched = Vec::with_capacity(wanted.len());
    for registry in wanted {
        // A credential the registry refuses is never written: checked once per fetch.
        let result = match fetch(registry.clone()).await {
            Ok(served) => broker.checked(served).await,
            Err(e) => Err(e),
        };
        fetched.push((
            registry.clone(),
            result.as_ref().map_or_else(|e| e.kind().code(), |_| "ok"),
        ));
        match result {
            Ok(served) => {
                let (h, refresh_at) = hold(broker, &served.credential, served.lifetime, now);
                if let Some(at) = refresh_at {
                    next = next.min(at.duration_since(now).unwrap_or(Duration::ZERO));
                }
                held.insert(registry.clone(), h);
            }
            Err(e) => {
                if let BrokerError::Provider { .. } = e {
                    tracing::warn!(%registry, error = %e, "Credential sink: fetch failed; keeping the previous entry while it is valid");
                    next = next.min(MIN_SLEEP);
                }
                if held
                    .get(registry)
                    .is_some_and(|h| h.stale_at.is_some_and(|s| s <= now))
                    || matches!(e, BrokerError::NotConfigured(_))
                {
                    held.remove(registry);
                }
            }
        }
    }
    Passed {
        next: next.clamp(MIN_SLEEP, MAX_SLEEP),
        fetched,
        expiries: expiries(held),
    }
}

/// The expiry of each credential in `held` that expires.
pub(crate) fn expiries(held: &BTreeMap<Registry, Held>) -> Vec<(Registry, SystemTime)> {
    held.iter()
        .filter_map(|(r, h)| h.expires_at.map(|e| (r.clone(), e)))
        .collect()
}

/// `credential` as a docker config entry, and when it should be fetched anew (its refresh
/// point, `None` if it does not expire): the cache's `lifetime` for it, else (an entry
/// of a docker config) as if got at `now`.
pub(crate) fn hold(
    broker: &Broker,
    credential: &regbroker_provider::Credential,
    lifetime: Option<cache::Lifetime>,
    now: SystemTime,
) -> (Held, Option<SystemTime>) {
    let pair = Zeroizing::new(format!(
        "{}:{}",
        credential.username(),
        credential.secret().expose_secret()
    ));
    let auth = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(pair.as_bytes()));
    let plan = lifetime.or_else(|| {
        credential
            .expires_at()
            .map(|e| cache::plan(broker.cache().config(), now, Some(e)))
    });
    let held = Held {
        auth,
        stale_at: plan.as_ref().map(|p| p.stale_at),
        expires_at: credential.expires_at(),
    };
    (held, plan.map(|p| p.refresh_at))
}

/// The docker config document (`{"auths": {...}}`) for `held`.
pub(crate) fn render(held: &BTreeMap<Registry, Held>) -> Zeroizing<String> {
    let auths: serde_json::Map<String, serde_json::Value> = held
        .iter()
        .map(|(r, h)| {
            (
                r.to_string(),
                serde_json::json!({ "auth": h.auth.as_str() }),
            )
        })
        .collect();
    Zeroizing::new(format!("{:#}\n", serde_json::json!({ "auths": auths })))
}

/// Sleeps until the next pass is due (`after`), or less if the static sources change.
pub(crate) async fn wait_for_next_pass(broker: &Broker, after: Duration) {
    let before = broker.statics().snapshot();
    let deadline = tokio::time::Instant::now() + after;
    while tokio::time::Instant::now() < deadline {
        let left = deadline - tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(1).min(left)).await;
        if !Arc::ptr_eq(&broker.statics().snapshot(), &before) {
            break;
        }
    }
}
