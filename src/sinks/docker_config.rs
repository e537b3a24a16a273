//! The docker config file sink: `serve --write-docker-config PATH` keeps a docker
//! `config.json` with `auths` for every registry that has a static entry or an exact
//! routing rule to a provider, plus any named with `--sink-registry`, fresh before each
//! credential goes stale. Tools that only read a docker config (helm, oras, crane) then
//! use short-lived credentials with no code change.
//!
//! Writes are atomic (a temporary file in the same directory renamed over the target) with
//! mode 0600, and happen only when the contents change. A registry whose fetch fails keeps
//! its previous entry until that entry's credential goes stale.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use regbroker_provider::{ExposeSecret, Registry};
use zeroize::Zeroizing;

use crate::broker::{Broker, BrokerError};
use crate::cache;
use crate::routing::Source;

/// Sink settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The docker config file to keep.
    pub path: PathBuf,
    /// Registries to include besides static entries and exact provider rules.
    pub extra: Vec<Registry>,
}

/// Shortest and longest sleep between passes (shared with the Kubernetes Secret sync).
pub(crate) const MIN_SLEEP: Duration = Duration::from_secs(5);
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(60);

/// One registry's current `auth` value and when it goes stale.
pub(crate) struct Held {
    auth: Zeroizing<String>,
    stale_at: Option<SystemTime>,
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

/// Runs one pass: fetch every registry (`registries(broker, extra)`) into `held`.
/// Returns when the next pass is due. Shared by the file sink and the Secret sync.
pub(crate) async fn pass(
    broker: &Broker,
    extra: &[Registry],
    held: &mut BTreeMap<Registry, Held>,
) -> Duration {
    let now = broker.now();
    let wanted = registries(broker, extra);
    held.retain(|r, _| wanted.contains(r));
    let mut next = MAX_SLEEP;
    for registry in &wanted {
        match broker.credential(registry).await {
            Ok(served) => {
                let c = &served.credential;
                let pair =
                    Zeroizing::new(format!("{}:{}", c.username(), c.secret().expose_secret()));
                let auth = Zeroizing::new(
                    base64::engine::general_purpose::STANDARD.encode(pair.as_bytes()),
                );
                let stale_at = c
                    .expires_at()
                    .map(|e| cache::plan(broker.cache().config(), now, Some(e)).stale_at);
                if let Some(e) = c.expires_at() {
                    let refresh_at = cache::plan(broker.cache().config(), now, Some(e)).refresh_at;
                    next = next.min(refresh_at.duration_since(now).unwrap_or(Duration::ZERO));
                }
                held.insert(registry.clone(), Held { auth, stale_at });
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
    next.clamp(MIN_SLEEP, MAX_SLEEP)
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

/// Writes `contents` to `path` atomically with mode 0600.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(contents)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A docker config file kept fresh.
pub struct Sink {
    broker: Arc<Broker>,
    config: Config,
    held: BTreeMap<Registry, Held>,
    last: Zeroizing<String>,
    next: Duration,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("config", &self.config)
            .field("registries", &self.held.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Sink {
    /// Writes the file once (start-up); fails if it cannot be written.
    pub async fn start(broker: Arc<Broker>, config: Config) -> std::io::Result<Sink> {
        let mut held = BTreeMap::new();
        let next = pass(&broker, &config.extra, &mut held).await;
        let last = render(&held);
        write_atomic(&config.path, last.as_bytes())?;
        tracing::info!(path = %config.path.display(), registries = held.len(), "Wrote docker config");
        Ok(Sink {
            broker,
            config,
            held,
            last,
            next,
        })
    }

    /// One pass now: fetch every registry (from the cache where fresh) and rewrite the
    /// file if its contents changed. The run loop calls this at each refresh point.
    pub async fn refresh(&mut self) {
        self.next = pass(&self.broker, &self.config.extra, &mut self.held).await;
        let contents = render(&self.held);
        if *contents != *self.last {
            match write_atomic(&self.config.path, contents.as_bytes()) {
                Ok(()) => {
                    tracing::info!(path = %self.config.path.display(), registries = self.held.len(), "Wrote docker config");
                    self.last = contents;
                }
                Err(e) => {
                    tracing::warn!(path = %self.config.path.display(), error = %e, "Cannot write docker config; retrying");
                    self.next = MIN_SLEEP;
                }
            }
        }
    }

    /// When the next pass is due.
    pub fn next_pass_in(&self) -> Duration {
        self.next
    }

    /// Keeps the file fresh until the task is dropped.
    pub async fn run(mut self) {
        loop {
            crate::sink::wait_for_next_pass(&self.broker, self.next).await;
            self.refresh().await;
        }
    }
}
