//! The credential cache: an expiry policy as one pure function, and single-flight fetches.
//!
//! Entries live in a bounded [`moka`] cache keyed by (provider, scope). Whether an entry
//! may be served is decided by [`plan`] against the injected [`Clock`], never by moka's
//! own timers (moka only evicts entries once they are useless). Concurrent misses for one
//! key share one upstream call: the first caller spawns the fetch, the others await it.
//! A fetch runs as its own task, so a client that disconnects does not cancel the call
//! other clients are waiting for. At most `max_concurrent_fetches` fetches run at once.

use std::collections::HashMap;
use std::sync::Arc;

use std::time::{Duration, SystemTime};
use tokio::sync::Mutex as AsyncMutex;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use moka::Expiry;
use regbroker_provider::{Credential, Error, SharedClock};
use serde::Deserialize;
use tokio::sync::Semaphore;

/// Cache settings: the `[cache]` table of the config file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Refresh once this fraction of a credential's lifetime has passed.
    pub refresh_fraction: f64,
    /// Never refresh sooner than this after a fetch (unless the credential dies first).
    #[serde(with = "humantime_serde")]
    pub min_refresh: Duration,
    /// Never keep a credential longer than this before refreshing.
    #[serde(with = "humantime_serde")]
    pub max_refresh: Duration,
    /// Stop serving a credential this long before it expires, so the client has time to
    /// use it.
    #[serde(with = "humantime_serde")]
    pub min_remaining: Duration,
    /// How long to keep a credential whose issuer gave no expiry, or an expiry already in
    /// the past (the issuer's clock disagrees with ours: trust neither).
    #[serde(with = "humantime_serde")]
    pub fallback_ttl: Duration,
    /// Most credentials kept at once.
    pub capacity: u64,
    /// Most upstream fetches running at once, across all keys.
    pub max_concurrent_fetches: usize,
    /// Longest one upstream fetch may take, the provider's own retries included.
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// After a failed fetch, answer the same error for this long without asking upstream
    /// again (doubling with each consecutive failure, with jitter), so a failing upstream
    /// is not hammered (ECR allows 20 requests per second per account and region).
    #[serde(with = "humantime_serde")]
    pub failure_backoff: Duration,
    /// The longest such pause.
    #[serde(with = "humantime_serde")]
    pub max_failure_backoff: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            refresh_fraction: 0.8,
            min_refresh: Duration::from_secs(30),
            max_refresh: Duration::from_secs(12 * 3600),
            min_remaining: Duration::from_secs(30),
            fallback_ttl: Duration::from_secs(60),
            capacity: 10_000,
            max_concurrent_fetches: 32,
            fetch_timeout: Duration::from_secs(30),
            failure_backoff: Duration::from_secs(1),
            max_failure_backoff: Duration::from_secs(30),
        }
    }
}

impl Config {
    /// Checks the settings, naming the first bad key.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.refresh_fraction > 0.0 && self.refresh_fraction <= 1.0) {
            return Err("cache.refresh_fraction must be greater than 0 and at most 1".into());
        }
        if self.min_refresh > self.max_refresh {
            return Err("cache.min_refresh must not be greater than cache.max_refresh".into());
        }
        if self.capacity == 0 {
            return Err("cache.capacity must be at least 1".into());
        }
        if self.max_concurrent_fetches == 0 {
            return Err("cache.max_concurrent_fetches must be at least 1".into());
        }
        if self.fetch_timeout.is_zero() {
            return Err("cache.fetch_timeout must be more than 0".into());
        }
        if self.failure_backoff > self.max_failure_backoff {
            return Err(
                "cache.failure_backoff must not be greater than cache.max_failure_backoff".into(),
            );
        }
        Ok(())
    }
}

/// When a freshly fetched credential should be refreshed, and when it must no longer be
/// served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// From here on, the next request fetches a new credential (and falls back to this
    /// one if that fails, until `stale_at`).
    pub refresh_at: SystemTime,
    /// From here on, this credential is never served.
    pub stale_at: SystemTime,
}

/// The expiry policy, as one pure function of the settings, the fetch time and the
/// issuer's expiry.
///
/// - No expiry, or an expiry at or before the fetch time: keep for `fallback_ttl`.
/// - Otherwise serve until `min_remaining` before expiry (or until expiry, if the
///   credential lives shorter than that), and refresh after `refresh_fraction` of that
///   span, clamped to `[min_refresh, max_refresh]` and never after the stale point.
pub fn plan(config: &Config, fetched_at: SystemTime, expires_at: Option<SystemTime>) -> Lifetime {
    let remaining = expires_at.and_then(|e| e.duration_since(fetched_at).ok());
    match remaining {
        None | Some(Duration::ZERO) => {
            let at = fetched_at + config.fallback_ttl;
            Lifetime {
                refresh_at: at,
                stale_at: at,
            }
        }
        Some(remaining) => {
            let usable = remaining
                .checked_sub(config.min_remaining)
                .filter(|d| !d.is_zero())
                .unwrap_or(remaining);
            let refresh_in = usable
                .mul_f64(config.refresh_fraction)
                .clamp(config.min_refresh, config.max_refresh)
                .min(usable);
            Lifetime {
                refresh_at: fetched_at + refresh_in,
                stale_at: fetched_at + usable,
            }
        }
    }
}

/// What the cache holds for a key.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The credential.
    pub credential: Credential,
    /// Its lifetime, from [`plan`].
    pub lifetime: Lifetime,
}

/// Identifies interchangeable credentials: same provider, same scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// Provider name.
    pub provider: &'static str,
    /// Provider-defined scope (identity, region, account...).
    pub scope: String,
}

/// How a lookup was answered, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A fresh cached credential.
    Hit,
    /// Nothing usable was cached; a fetch (possibly shared) supplied it.
    Miss,
    /// The cached credential was due for refresh and a fetch replaced it.
    Refreshed,
    /// The refresh failed; the cached credential is still valid and was served.
    StaleServed,
}

impl Outcome {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::Refreshed => "refresh",
            Outcome::StaleServed => "stale",
        }
    }
}

/// A second-level store that outlives the process, for one-shot modes (the docker
/// credential helper and the kubelet provider run once per request).
pub trait Persist: Send + Sync + std::fmt::Debug {
    /// The stored entry for `key`, if any. Errors are logged and read as "none".
    fn load(&self, key: &Key) -> Option<Entry>;
    /// Stores `entry` for `key`. Errors are logged, never fatal.
    fn store(&self, key: &Key, entry: &Entry);
}

/// The last failure for a key: answered without asking upstream until `until`.
#[derive(Clone, Debug)]
struct Failure {
    until: SystemTime,
    consecutive: u32,
    error: Arc<Error>,
}

/// How long to hold back after the `consecutive`-th failure in a row: the base doubled
/// per failure, capped, then scaled by `jitter` in [0.5, 1] so that keys failing together
/// do not retry together.
pub fn failure_pause(config: &Config, consecutive: u32, jitter: f64) -> Duration {
    let exp = consecutive.saturating_sub(1).min(20);
    let pause = config
        .failure_backoff
        .saturating_mul(1u32 << exp)
        .min(config.max_failure_backoff);
    pause.mul_f64(jitter.clamp(0.5, 1.0))
}

type FetchResult = Result<Arc<Entry>, Arc<Error>>;
type InFlight = Shared<BoxFuture<'static, FetchResult>>;

/// The credential cache.
#[derive(Clone)]
pub struct Cache {
    entries: moka::future::Cache<Key, Arc<Entry>>,
    inflight: Arc<AsyncMutex<HashMap<Key, InFlight>>>,
    failures: moka::future::Cache<Key, Failure>,
    fetch_permits: Arc<Semaphore>,
    config: Arc<Config>,
    clock: SharedClock,
    persist: Option<Arc<dyn Persist>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("entries", &self.entries.entry_count())
            .field("config", &self.config)
            .finish()
    }
}

/// Evicts an entry once it can no longer be served. Durations are measured against the
/// injected clock at insert time; eviction only reclaims memory, it never decides what
/// may be served.
struct EvictWhenStale {
    clock: SharedClock,
}

impl Expiry<Key, Arc<Entry>> for EvictWhenStale {
    fn expire_after_create(
        &self,
        _key: &Key,
        value: &Arc<Entry>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(
            value
                .lifetime
                .stale_at
                .duration_since(self.clock.now())
                .unwrap_or(Duration::ZERO),
        )
    }

    fn expire_after_update(
        &self,
        key: &Key,
        value: &Arc<Entry>,
        updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, value, updated_at)
    }
}

impl Cache {
    /// A cache with `config` (already validated) reading time from `clock`.
    pub fn new(config: Config, clock: SharedClock) -> Cache {
        let entries = moka::future::Cache::builder()
            .max_capacity(config.capacity)
            .expire_after(EvictWhenStale {
                clock: clock.clone(),
            })
            .build();
        let failures = moka::future::Cache::builder()
            .max_capacity(config.capacity)
            .time_to_live(config.max_failure_backoff.max(Duration::from_secs(1)) * 4)
            .build();
        Cache {
            entries,
            inflight: Arc::default(),
            failures,
            fetch_permits: Arc::new(Semaphore::new(config.max_concurrent_fetches)),
            config: Arc::new(config),
            clock,
            persist: None,
        }
    }

    /// Also keeps entries in `persist`, and looks there before fetching.
    pub fn with_persist(mut self, persist: Arc<dyn Persist>) -> Cache {
        self.persist = Some(persist);
        self
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    async fn lookup(&self, key: &Key) -> Option<Arc<Entry>> {
        if let Some(e) = self.entries.get(key).await {
            return Some(e);
        }
        let persist = self.persist.as_ref()?;
        let entry = Arc::new(persist.load(key)?);
        if self.clock.now() >= entry.lifetime.stale_at {
            return None;
        }
        self.entries.insert(key.clone(), entry.clone()).await;
        Some(entry)
    }

    /// Returns a servable credential for `key`, calling `fetch` only when none is cached
    /// (or it is due for refresh), and only once however many callers ask at the same time.
    pub async fn get_or_fetch<F>(
        &self,
        key: &Key,
        fetch: F,
    ) -> Result<(Credential, Outcome), Arc<Error>>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Credential, Error>>,
    {
        let cached = self.lookup(key).await;
        let now = self.clock.now();
        if let Some(entry) = cached.as_ref().filter(|e| now < e.lifetime.refresh_at) {
            return Ok((entry.credential.clone(), Outcome::Hit));
        }

        if let Some(failure) = self.failures.get(key).await.filter(|f| now < f.until) {
            return match cached {
                Some(entry) if now < entry.lifetime.stale_at => {
                    Ok((entry.credential.clone(), Outcome::StaleServed))
                }
                _ => {
                    tracing::debug!(
                        provider = key.provider,
                        "Upstream failed recently; answering its error without asking again"
                    );
                    Err(failure.error)
                }
            };
        }

        let shared = {
            let mut inflight = self.inflight.lock().await;
            match inflight.get(key) {
                Some(f) => f.clone(),
                None => {
                    // Double-check under the lock: a fetch that finished since our first
                    // look has already stored its entry (it stores before it leaves the
                    // in-flight map), so a fresh entry here must be served, not refetched.
                    if let Some(entry) = self
                        .entries
                        .get(key)
                        .await
                        .filter(|e| now < e.lifetime.refresh_at)
                    {
                        return Ok((entry.credential.clone(), Outcome::Hit));
                    }
                    let f = self.spawn_fetch(key.clone(), fetch());
                    inflight.insert(key.clone(), f.clone());
                    f
                }
            }
        };

        match shared.await {
            Ok(entry) => {
                let outcome = if cached.is_some() {
                    Outcome::Refreshed
                } else {
                    Outcome::Miss
                };
                Ok((entry.credential.clone(), outcome))
            }
            Err(err) => match cached {
                Some(entry) if self.clock.now() < entry.lifetime.stale_at => {
                    tracing::warn!(
                        provider = key.provider,
                        error = %err.chain(),
                        "Refresh failed; serving the cached credential until it goes stale"
                    );
                    Ok((entry.credential.clone(), Outcome::StaleServed))
                }
                _ => Err(err),
            },
        }
    }

    fn spawn_fetch(
        &self,
        key: Key,
        fetch: BoxFuture<'static, Result<Credential, Error>>,
    ) -> InFlight {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let result = {
                let _permit = this.fetch_permits.acquire().await;
                let timeout = this.config.fetch_timeout;
                match tokio::time::timeout(timeout, fetch).await {
                    Ok(r) => r,
                    Err(_) => Err(Error::timed_out(format!(
                        "no answer from upstream within {}",
                        humantime::format_duration(timeout)
                    ))),
                }
            };
            let result = match result {
                Ok(credential) => {
                    let lifetime = plan(&this.config, this.clock.now(), credential.expires_at());
                    let entry = Arc::new(Entry {
                        credential,
                        lifetime,
                    });
                    this.entries.insert(key.clone(), entry.clone()).await;
                    this.failures.invalidate(&key).await;
                    if let Some(p) = &this.persist {
                        p.store(&key, &entry);
                    }
                    Ok(entry)
                }
                Err(e) => {
                    let error = Arc::new(e);
                    let consecutive =
                        this.failures.get(&key).await.map_or(0, |f| f.consecutive) + 1;
                    let pause =
                        failure_pause(&this.config, consecutive, 0.5 + fastrand::f64() / 2.0);
                    let failure = Failure {
                        until: this.clock.now() + pause,
                        consecutive,
                        error: error.clone(),
                    };
                    this.failures.insert(key.clone(), failure).await;
                    Err(error)
                }
            };
            this.inflight.lock().await.remove(&key);
            result
        });
        async move {
            match task.await {
                Ok(result) => result,
                Err(join) => Err(Arc::new(
                    Error::unavailable("credential fetch task failed").with_source(join),
                )),
            }
        }
        .boxed()
        .shared()
    }

    /// Number of cached credentials (approximate; for metrics and benchmarks).
    pub fn len(&self) -> u64 {
        self.entries.entry_count()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3600;

    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn twelve_hour_token_refreshes_at_four_fifths_of_usable_life() {
        let c = Config::default();
        let l = plan(&c, t0(), Some(t0() + secs(12 * H)));
        let usable = secs(12 * H) - c.min_remaining;
        assert_eq!(l.stale_at, t0() + usable);
        assert_eq!(l.refresh_at, t0() + usable.mul_f64(0.8));
    }

    #[test]
    fn refresh_is_clamped_to_the_ceiling() {
        let c = Config {
            max_refresh: secs(H),
            ..Config::default()
        };
        let l = plan(&c, t0(), Some(t0() + secs(12 * H)));
        assert_eq!(l.refresh_at, t0() + secs(H));
    }

    #[test]
    fn refresh_is_clamped_to_the_floor_but_never_past_stale() {
        let c = Config {
            min_refresh: secs(120),
            ..Config::default()
        };
        // 100 s of life, 70 s usable: the floor (120 s) would pass the stale point.
        let l = plan(&c, t0(), Some(t0() + secs(100)));
        assert_eq!(l.stale_at, t0() + secs(70));
        assert_eq!(l.refresh_at, l.stale_at);
        // 1000 s of life: 0.8 * 970 = 776 s, above the floor.
        let l = plan(&c, t0(), Some(t0() + secs(1000)));
        assert_eq!(l.refresh_at, t0() + secs(776));
        // 200 s of life: 0.8 * 170 = 136 s, above the floor of 120.
        let c = Config {
            min_refresh: secs(150),
            ..Config::default()
        };
        let l = plan(&c, t0(), Some(t0() + secs(200)));
        assert_eq!(l.refresh_at, t0() + secs(150));
    }

    #[test]
    fn credential_shorter_lived_than_the_margin_is_served_until_expiry() {
        let c = Config::default();
        let l = plan(&c, t0(), Some(t0() + secs(10)));
        assert_eq!(l.stale_at, t0() + secs(10));
        assert_eq!(l.refresh_at, t0() + secs(10));
    }

    #[test]
    fn no_expiry_gets_the_fallback_ttl() {
        let c = Config::default();
        let l = plan(&c, t0(), None);
        assert_eq!(l.refresh_at, t0() + c.fallback_ttl);
        assert_eq!(l.stale_at, t0() + c.fallback_ttl);
    }

    #[test]
    fn expiry_in_the_past_gets_the_fallback_ttl_not_its_stated_life() {
        let c = Config::default();
        for past in [
            t0(),
            t0() - secs(1),
            SystemTime::UNIX_EPOCH + secs(1_420_070_400),
        ] {
            let l = plan(&c, t0(), Some(past));
            assert_eq!(l.stale_at, t0() + c.fallback_ttl, "expiry {past:?}");
        }
    }

    #[test]
    fn failure_pause_doubles_caps_and_jitters() {
        let c = Config {
            failure_backoff: secs(1),
            max_failure_backoff: secs(30),
            ..Config::default()
        };
        assert_eq!(failure_pause(&c, 1, 1.0), secs(1));
        assert_eq!(failure_pause(&c, 2, 1.0), secs(2));
        assert_eq!(failure_pause(&c, 5, 1.0), secs(16));
        assert_eq!(failure_pause(&c, 6, 1.0), secs(30));
        assert_eq!(failure_pause(&c, 1000, 1.0), secs(30));
        assert_eq!(failure_pause(&c, 3, 0.5), secs(2));
        assert_eq!(
            failure_pause(&c, 3, 0.0),
            secs(2),
            "jitter never below half"
        );
    }

    #[test]
    fn config_validation_names_the_key() {
        let bad = Config {
            refresh_fraction: 1.5,
            ..Config::default()
        };
        assert!(bad.validate().unwrap_err().contains("refresh_fraction"));
        let bad = Config {
            min_refresh: secs(10 * H),
            max_refresh: secs(H),
            ..Config::default()
        };
        assert!(bad.validate().unwrap_err().contains("min_refresh"));
        assert!(Config::default().validate().is_ok());
    }
}
