//! The credential cache: an expiry policy as one pure function, and single-flight fetches.
//!
//! Entries live in a bounded [`moka`] cache keyed by (provider, scope). Whether an entry
//! may be served is decided by [`plan`] against the injected [`Clock`], never by moka's
//! own timers (moka only evicts entries once they are useless). Concurrent misses for one
//! key share one upstream call: the first caller spawns the fetch, the others await it.
//! A fetch runs as its own task, so a client that disconnects does not cancel the call
//! other clients are waiting for.
//!
//! From a credential's refresh point to its stale point, a request ([`Need::Servable`])
//! is answered at once with the cached credential while one fetch per key runs in the
//! background; only a caller with nothing servable, or one that asks for
//! [`Need::Fresh`] (the sinks, the one-shot modes), waits for the fetch; one that asks for
//! [`Need::Refetch`] (a manual trigger) has it fetch anew even before the refresh point.
//!
//! Upstream work is bounded three ways: at most `max_concurrent_fetches` fetches run at
//! once; at most `max_queued_fetches` more wait for a slot (beyond that a new key fails
//! at once with `overloaded`); and `fetch_timeout` counts from the moment a fetch is
//! queued, not from when it gets its slot. A queued fetch nobody waits for any more
//! (every client gave up) is dropped before it starts; one already running completes, for
//! the cache.
//!
//! The expiry policy and the settings are in [`policy`] (pure functions of the settings
//! and the clock); the single-flight fetch and its bounded queue in `flight`. This file
//! holds the cache itself: the lookup every request makes, and what a caller gets.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use std::time::{Duration, SystemTime};
use tokio::sync::Mutex as AsyncMutex;

use futures_util::future::BoxFuture;
use moka::Expiry;
use regbroker_provider::{Credential, Error, SharedClock};
use tokio::sync::Semaphore;

use super::memo::Memo;
use crate::metrics::Metrics;

mod flight;
pub mod policy;

use self::flight::{Flight, Joined};
pub use self::policy::{
    Config, Lifetime, MAX_SETTING, failure_pause, jittered, plan, random_failure_pause,
};

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
    /// The cached credential was due for refresh and served at once, while a background
    /// fetch replaces it.
    RefreshAhead,
    /// The cached credential was due for refresh and the caller waited for the fetch
    /// that replaced it ([`Need::Fresh`], or the old one was no longer servable).
    Refreshed,
    /// The refresh failed; the cached credential is still valid and was served.
    StaleServed,
}

/// What a caller needs from [`Cache::get_or_fetch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Any servable credential, at once if one is cached: a request from a client that
    /// is waiting. Past the refresh point the cached one is answered and the refresh runs
    /// in the background.
    Servable,
    /// The refreshed credential once the refresh point has passed, waiting for the fetch
    /// (falling back to the cached one if it fails): the sinks, which write what they get
    /// and come back only at its refresh point, and the one-shot modes, which exit before
    /// a background fetch could finish.
    Fresh,
    /// A credential fetched now, even before the refresh point, waiting for the fetch
    /// (joining one in flight; falling back to the cached one, while servable, if it
    /// fails, and answering a failure pause as [`Need::Fresh`] does): a manual trigger,
    /// a `RegistryCredential`'s `regbroker.dev/requestedAt`, after which the issuer may
    /// have rotated what it hands out.
    Refetch,
}

impl Outcome {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::RefreshAhead => "refresh_ahead",
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
    /// Forgets `key`'s entry. Errors are logged, never fatal.
    fn forget(&self, key: &Key);
}

/// The last failure for a key: answered without asking upstream until `until`.
#[derive(Clone, Debug)]
struct Failure {
    until: SystemTime,
    consecutive: u32,
    error: Arc<Error>,
}

/// The credential cache.
#[derive(Clone)]
pub struct Cache {
    entries: moka::future::Cache<Key, Arc<Entry>>,
    inflight: Arc<AsyncMutex<HashMap<Key, Flight>>>,
    failures: moka::future::Cache<Key, Failure>,
    fetch_permits: Arc<Semaphore>,
    /// Fetch tasks spawned and not yet finished: running or queued for a slot.
    outstanding: Arc<AtomicUsize>,
    next_flight: Arc<AtomicU64>,
    config: Arc<Config>,
    clock: SharedClock,
    persist: Option<Arc<dyn Persist>>,
    metrics: Option<Arc<Metrics>>,
    /// Answers made from the entries: forgotten whenever an entry comes or goes.
    memo: Arc<Memo>,
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
        let memo = Arc::new(Memo::default());
        let evicted = memo.clone();
        let entries = moka::future::Cache::builder()
            .max_capacity(config.capacity)
            .expire_after(EvictWhenStale {
                clock: clock.clone(),
            })
            // Replacing and dropping an entry are this file's own calls, which tell the
            // memo themselves; moka evicts on its own (size, staleness).
            .eviction_listener(move |_, _, cause| {
                if cause.was_evicted() {
                    evicted.changed();
                }
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
            outstanding: Arc::default(),
            next_flight: Arc::default(),
            config: Arc::new(config),
            clock,
            persist: None,
            metrics: None,
            memo,
        }
    }

    /// Also counts refreshes and dropped fetches in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Cache {
        self.metrics = Some(metrics);
        self
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

    /// The answers kept ready from this cache's entries.
    pub fn memo(&self) -> &Arc<Memo> {
        &self.memo
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
        self.memo.changed();
        Some(entry)
    }

    /// Returns a servable credential for `key`, calling `fetch` only when none is cached
    /// or it is due for refresh, and only once however many callers ask at the same time.
    /// With [`Need::Servable`], a credential due for refresh is answered at once and the
    /// fetch runs in the background.
    pub async fn get_or_fetch<F>(
        &self,
        key: &Key,
        need: Need,
        fetch: F,
    ) -> Result<(Arc<Entry>, Outcome), Arc<Error>>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Credential, Error>>,
    {
        let cached = self.lookup(key).await;
        let had_entry = cached.is_some();
        let now = self.clock.now();
        if let Some(entry) = cached
            .as_ref()
            .filter(|e| need != Need::Refetch && now < e.lifetime.refresh_at)
        {
            return Ok((entry.clone(), Outcome::Hit));
        }
        let servable = cached.filter(|e| now < e.lifetime.stale_at);

        if let Some(failure) = self.failures.get(key).await.filter(|f| now < f.until) {
            return match servable {
                Some(entry) => Ok((entry, Outcome::StaleServed)),
                None => {
                    tracing::debug!(
                        provider = key.provider,
                        "Upstream failed recently; answering its error without asking again"
                    );
                    Err(failure.error)
                }
            };
        }

        if let (Some(entry), Need::Servable) = (&servable, need) {
            self.refresh_in_background(key, fetch).await;
            return Ok((entry.clone(), Outcome::RefreshAhead));
        }

        let refetch = need == Need::Refetch;
        let (shared, interest) = match self
            .join_or_start(key, fetch, servable.is_some(), refetch)
            .await
        {
            Ok(Joined::Fresh(entry)) => return Ok((entry.clone(), Outcome::Hit)),
            Ok(Joined::Flight(shared, interest)) => (shared, interest),
            Err(err) => {
                return match servable {
                    Some(entry) => Ok((entry, Outcome::StaleServed)),
                    None => Err(err),
                };
            }
        };
        let result = shared.await;
        drop(interest);
        match result {
            Ok(entry) => {
                let outcome = if had_entry {
                    Outcome::Refreshed
                } else {
                    Outcome::Miss
                };
                Ok((entry, outcome))
            }
            Err(err) => match servable {
                Some(entry) if self.clock.now() < entry.lifetime.stale_at => {
                    tracing::warn!(
                        provider = key.provider,
                        error = %err.chain(),
                        "Refresh failed; serving the cached credential until it goes stale"
                    );
                    Ok((entry, Outcome::StaleServed))
                }
                _ => Err(err),
            },
        }
    }

    /// Drops `key`'s credential if it is still the fetch of `lifetime` (a registry
    /// refused it; a newer one stays), so the next lookup fetches anew; whether it did.
    pub async fn forget_if(&self, key: &Key, lifetime: Lifetime) -> bool {
        match self.entries.get(key).await {
            Some(e) if e.lifetime == lifetime => {
                self.entries.invalidate(key).await;
                self.memo.changed();
                true
            }
            _ => false,
        }
    }

    /// Drops `key`'s credential, so the next lookup fetches anew (a client reported it
    /// refused).
    pub async fn forget(&self, key: &Key) {
        self.entries.invalidate(key).await;
        self.memo.changed();
        if let Some(p) = &self.persist {
            p.forget(key);
        }
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
    mod fetching {
        //! The fetch paths, on tokio's paused clock: a request that waits for an upstream
        //! hanging forever would let tokio jump the clock to the fetch timeout, so "no
        //! time passed" proves no request waited.

        use super::super::*;
        use futures_util::FutureExt;
        use regbroker_provider::{ExposeSecret, ManualClock};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::time::Instant;

        const HOUR: Duration = Duration::from_secs(3600);

        fn key(scope: &str) -> Key {
            Key {
                provider: "fake",
                scope: scope.to_string(),
            }
        }

        /// A fetch closure answering `secret`, living an hour, after `delay` (tokio
        /// time); `None` delay: never answers. `calls` counts the times upstream is
        /// asked: when the fetch is first polled, as a provider's request would go out.
        fn answer(
            clock: &ManualClock,
            calls: &Arc<AtomicUsize>,
            secret: &'static str,
            delay: Option<Duration>,
        ) -> impl FnOnce() -> BoxFuture<'static, Result<Credential, Error>> + use<> {
            let clock = clock.clone();
            let calls = calls.clone();
            move || {
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    match delay {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending::<()>().await,
                    }
                    let now = regbroker_provider::Clock::now(&clock);
                    Ok(Credential::new("u", secret.to_string(), Some(now + HOUR)))
                }
                .boxed()
            }
        }

        fn failing(
            calls: &Arc<AtomicUsize>,
        ) -> impl FnOnce() -> BoxFuture<'static, Result<Credential, Error>> + use<> {
            let calls = calls.clone();
            move || {
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err(Error::unavailable("upstream down"))
                }
                .boxed()
            }
        }

        /// A cache whose first failure pauses `backoff` (times the jitter), doubling up
        /// to an hour.
        fn with_backoff(backoff: Duration) -> (Cache, ManualClock) {
            cache(Config {
                failure_backoff: backoff,
                max_failure_backoff: HOUR,
                ..Config::default()
            })
        }

        fn cache(config: Config) -> (Cache, ManualClock) {
            let clock =
                ManualClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
            (Cache::new(config, Arc::new(clock.clone())), clock)
        }

        fn secret(e: &Entry) -> String {
            e.credential.secret().expose_secret().to_string()
        }

        /// A cache holding key `a`'s one-hour credential `old` (one call so far), its
        /// clock moved past the refresh point (0.8 of (1 h - 30 s) = 2856 s) but not the
        /// stale point (3570 s).
        async fn due_for_refresh() -> (Cache, ManualClock, Arc<AtomicUsize>, Key) {
            let (cache, clock) = cache(Config::default());
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            cache
                .get_or_fetch(
                    &k,
                    Need::Servable,
                    answer(&clock, &calls, "old", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            clock.advance(Duration::from_secs(2900));
            (cache, clock, calls, k)
        }

        /// Lets spawned tasks run without moving tokio's clock.
        async fn settle() {
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
        }

        #[tokio::test(start_paused = true)]
        async fn a_refused_fetch_is_dropped_unless_a_newer_one_replaced_it() {
            let (cache, clock) = cache(Config::default());
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            let (first, _) = cache
                .get_or_fetch(
                    &k,
                    Need::Servable,
                    answer(&clock, &calls, "one", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            // A refusal of an older fetch drops nothing: the newer credential stays.
            let older = Lifetime {
                refresh_at: first.lifetime.refresh_at - Duration::from_secs(1),
                stale_at: first.lifetime.stale_at,
            };
            assert!(!cache.forget_if(&k, older).await);
            assert!(cache.lookup(&k).await.is_some());
            assert!(cache.forget_if(&k, first.lifetime).await);
            assert!(cache.lookup(&k).await.is_none());
            let (c, outcome) = cache
                .get_or_fetch(
                    &k,
                    Need::Fresh,
                    answer(&clock, &calls, "two", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("two", Outcome::Miss));
            assert_eq!(calls.load(Ordering::SeqCst), 2);
            // A client's report drops whatever is cached.
            cache.forget(&k).await;
            assert!(cache.lookup(&k).await.is_none());
        }

        #[tokio::test(start_paused = true)]
        async fn past_the_refresh_point_requests_are_answered_at_once_while_the_refresh_hangs() {
            let (cache, clock, calls, k) = due_for_refresh().await;
            let started = Instant::now();
            for _ in 0..10 {
                let (c, outcome) = cache
                    .get_or_fetch(&k, Need::Servable, answer(&clock, &calls, "new", None))
                    .await
                    .unwrap();
                assert_eq!(secret(&c), "old");
                assert_eq!(outcome, Outcome::RefreshAhead);
            }
            assert_eq!(
                started.elapsed(),
                Duration::ZERO,
                "a request waited for the hanging refresh"
            );
            settle().await;
            assert_eq!(
                calls.load(Ordering::SeqCst),
                2,
                "one background refresh for ten requests"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_failed_background_refresh_serves_the_cached_credential_until_stale_then_the_error()
         {
            let (cache, clock, calls, k) = due_for_refresh().await;
            let (c, outcome) = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap();
            assert_eq!(
                (secret(&c).as_str(), outcome),
                ("old", Outcome::RefreshAhead)
            );
            settle().await;
            // The refresh failed: inside the failure pause the cached one is served stale.
            let (c, outcome) = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap();
            assert_eq!(
                (secret(&c).as_str(), outcome),
                ("old", Outcome::StaleServed)
            );
            // Past the stale point (1 h - 30 s) it is never served: the error is answered.
            clock.advance(Duration::from_secs(700));
            let err = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), regbroker_provider::ErrorKind::Unavailable);
        }

        #[tokio::test(start_paused = true)]
        async fn a_healed_refresh_replaces_the_credential_without_a_request_waiting() {
            let (cache, clock, calls, k) = due_for_refresh().await;
            let started = Instant::now();
            let (c, _) = cache
                .get_or_fetch(
                    &k,
                    Need::Servable,
                    answer(&clock, &calls, "new", Some(Duration::from_secs(5))),
                )
                .await
                .unwrap();
            assert_eq!(secret(&c), "old");
            assert_eq!(started.elapsed(), Duration::ZERO);
            // Once the background fetch has answered, the next request gets the new one
            // as a plain hit.
            tokio::time::sleep(Duration::from_secs(6)).await;
            let (c, outcome) = cache
                .get_or_fetch(&k, Need::Servable, answer(&clock, &calls, "never", None))
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("new", Outcome::Hit));
            assert_eq!(calls.load(Ordering::SeqCst), 2);
        }

        #[tokio::test(start_paused = true)]
        async fn a_fresh_caller_waits_for_the_due_refresh_and_joins_the_background_one() {
            let (cache, clock, calls, k) = due_for_refresh().await;
            // A request starts the background refresh; the sink then waits for that one.
            cache
                .get_or_fetch(
                    &k,
                    Need::Servable,
                    answer(&clock, &calls, "new", Some(Duration::from_secs(5))),
                )
                .await
                .unwrap();
            let (c, outcome) = cache
                .get_or_fetch(&k, Need::Fresh, answer(&clock, &calls, "never", None))
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("new", Outcome::Refreshed));
            assert_eq!(
                calls.load(Ordering::SeqCst),
                2,
                "the sink joined the running refresh"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn the_wait_for_a_fetch_slot_counts_against_the_fetch_timeout() {
            let (cache, clock) = cache(Config {
                max_concurrent_fetches: 1,
                fetch_timeout: Duration::from_secs(5),
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            let hog = {
                let (cache, f) = (cache.clone(), answer(&clock, &calls, "x", None));
                tokio::spawn(
                    async move { cache.get_or_fetch(&key("hog"), Need::Servable, f).await },
                )
            };
            settle().await;
            tokio::time::advance(Duration::from_secs(2)).await;
            // Queued 2 s after the hog took the only slot, which it holds until its own
            // deadline (5 s): our one deadline ends 5 s after we asked, the 3 s spent
            // queued included, not 5 s after we got the slot.
            let started = Instant::now();
            let err = cache
                .get_or_fetch(&key("b"), Need::Servable, answer(&clock, &calls, "b", None))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), regbroker_provider::ErrorKind::TimedOut);
            assert_eq!(
                started.elapsed(),
                Duration::from_secs(5),
                "one deadline, from the moment it was queued"
            );
            assert!(hog.await.unwrap().is_err());
        }

        #[tokio::test(start_paused = true)]
        async fn a_full_fetch_queue_fails_a_new_key_at_once_with_overloaded() {
            let (cache, clock) = cache(Config {
                max_concurrent_fetches: 1,
                max_queued_fetches: 2,
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            let mut waiting = Vec::new();
            for i in 0..3 {
                let (cache, f) = (cache.clone(), answer(&clock, &calls, "x", None));
                waiting.push(tokio::spawn(async move {
                    cache
                        .get_or_fetch(&key(&format!("k{i}")), Need::Servable, f)
                        .await
                }));
            }
            settle().await;
            let started = Instant::now();
            let err = cache
                .get_or_fetch(
                    &key("late"),
                    Need::Servable,
                    answer(&clock, &calls, "late", Some(Duration::ZERO)),
                )
                .await
                .unwrap_err();
            assert_eq!(err.kind(), regbroker_provider::ErrorKind::Overloaded);
            assert_eq!(started.elapsed(), Duration::ZERO);
            assert_eq!(
                calls.load(Ordering::SeqCst),
                1,
                "only the fetch holding the slot asked upstream; the refused key never did"
            );
            // A key already in flight is still joined, not refused.
            let (cache2, f) = (cache.clone(), answer(&clock, &calls, "x", None));
            let joined =
                tokio::spawn(
                    async move { cache2.get_or_fetch(&key("k0"), Need::Servable, f).await },
                );
            settle().await;
            assert!(
                !joined.is_finished(),
                "a waiter for a key in flight joins it"
            );
            joined.abort();
            for w in waiting {
                w.abort();
            }
        }

        #[tokio::test(start_paused = true)]
        async fn queued_fetches_whose_clients_gave_up_are_dropped_so_a_later_key_is_served_promptly()
         {
            // The finding: 2 slots, a 2 s upstream, 100 clients for distinct keys giving
            // up after 1 s; a legitimate key asked after them waited 60 s and failed.
            let (cache, clock) = cache(Config {
                max_concurrent_fetches: 2,
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            let mut impatient = Vec::new();
            for i in 0..100 {
                let (cache, f) = (
                    cache.clone(),
                    answer(&clock, &calls, "x", Some(Duration::from_secs(2))),
                );
                impatient.push(tokio::spawn(async move {
                    tokio::time::timeout(
                        Duration::from_secs(1),
                        cache.get_or_fetch(&key(&format!("k{i}")), Need::Servable, f),
                    )
                    .await
                }));
            }
            for t in impatient {
                assert!(t.await.unwrap().is_err(), "each impatient client gave up");
            }
            let started = Instant::now();
            let (c, _) = cache
                .get_or_fetch(
                    &key("legit"),
                    Need::Servable,
                    answer(&clock, &calls, "legit", Some(Duration::from_secs(2))),
                )
                .await
                .unwrap();
            assert_eq!(secret(&c), "legit");
            // The two fetches already running finish 1 s later; then ours takes 2 s.
            assert!(
                started.elapsed() <= Duration::from_secs(3),
                "waited {:?}",
                started.elapsed()
            );
            assert_eq!(
                calls.load(Ordering::SeqCst),
                3,
                "98 queued fetches were dropped unasked"
            );
            // The two that were running completed for the cache although their clients left.
            let (_, outcome) = cache
                .get_or_fetch(
                    &key("k0"),
                    Need::Servable,
                    answer(&clock, &calls, "x", None),
                )
                .await
                .unwrap();
            let (_, outcome1) = cache
                .get_or_fetch(
                    &key("k1"),
                    Need::Servable,
                    answer(&clock, &calls, "x", None),
                )
                .await
                .unwrap();
            assert_eq!((outcome, outcome1), (Outcome::Hit, Outcome::Hit));
        }

        #[tokio::test(start_paused = true)]
        async fn an_abandoned_fetch_records_no_failure_and_the_next_client_starts_afresh() {
            let (cache, clock) = cache(Config {
                max_concurrent_fetches: 1,
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            let hog = {
                let (cache, f) = (
                    cache.clone(),
                    answer(&clock, &calls, "x", Some(Duration::from_secs(3))),
                );
                tokio::spawn(
                    async move { cache.get_or_fetch(&key("hog"), Need::Servable, f).await },
                )
            };
            settle().await;
            let gave_up = tokio::time::timeout(
                Duration::from_secs(1),
                cache.get_or_fetch(
                    &key("b"),
                    Need::Servable,
                    answer(&clock, &calls, "first", Some(Duration::ZERO)),
                ),
            )
            .await;
            assert!(gave_up.is_err());
            settle().await;
            let (c, outcome) = cache
                .get_or_fetch(
                    &key("b"),
                    Need::Servable,
                    answer(&clock, &calls, "second", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("second", Outcome::Miss));
            hog.await.unwrap().unwrap();
        }
        #[tokio::test(start_paused = true)]
        async fn a_credential_past_its_stale_point_is_never_served_during_a_failure_pause() {
            // A pause of at least 30 min (jitter halves at most): long enough to outlast
            // the stale point, so the failure branch is what answers.
            let (cache, clock) = with_backoff(HOUR);
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            cache
                .get_or_fetch(
                    &k,
                    Need::Servable,
                    answer(&clock, &calls, "old", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            clock.advance(Duration::from_secs(2900));
            cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap();
            settle().await;
            assert_eq!(
                calls.load(Ordering::SeqCst),
                2,
                "the refresh ran and failed"
            );
            // Inside the pause and before the stale point (3570 s): served stale.
            let (c, outcome) = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap();
            assert_eq!(
                (secret(&c).as_str(), outcome),
                ("old", Outcome::StaleServed)
            );
            // Still inside the pause, past the stale point: the error, never the credential.
            clock.advance(Duration::from_secs(700));
            for need in [Need::Servable, Need::Fresh] {
                let got = cache.get_or_fetch(&k, need, failing(&calls)).await;
                assert!(
                    got.is_err(),
                    "{need:?}: a stale credential was served during the failure pause"
                );
            }
            assert_eq!(calls.load(Ordering::SeqCst), 2, "the pause asked nobody");
        }

        #[tokio::test(start_paused = true)]
        async fn a_fetch_that_finished_while_a_caller_waited_for_the_lock_is_not_repeated() {
            let (cache, clock) = cache(Config::default());
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            // Hold the in-flight lock, as a finishing fetch does while it leaves the map.
            let held = cache.inflight.lock().await;
            let waiter = {
                let (cache, k, f) = (
                    cache.clone(),
                    k.clone(),
                    answer(&clock, &calls, "second", Some(Duration::ZERO)),
                );
                tokio::spawn(async move { cache.get_or_fetch(&k, Need::Servable, f).await })
            };
            settle().await;
            assert!(!waiter.is_finished(), "the caller waits for the lock");
            // The fetch it missed stored its entry before letting go of the lock.
            let now = regbroker_provider::Clock::now(&clock);
            let credential = Credential::new("u", "first".to_string(), Some(now + HOUR));
            let lifetime = plan(cache.config(), now, credential.expires_at());
            cache
                .entries
                .insert(
                    k.clone(),
                    Arc::new(Entry {
                        credential,
                        lifetime,
                    }),
                )
                .await;
            drop(held);
            let (c, outcome) = waiter.await.unwrap().unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("first", Outcome::Hit));
            assert_eq!(
                calls.load(Ordering::SeqCst),
                0,
                "the entry found under the lock was fetched again"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_client_that_gives_up_does_not_cancel_the_running_fetch() {
            let (cache, clock) = cache(Config::default());
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            let first = {
                let (cache, k, f) = (
                    cache.clone(),
                    k.clone(),
                    answer(&clock, &calls, "one", Some(Duration::from_secs(2))),
                );
                tokio::spawn(async move { cache.get_or_fetch(&k, Need::Servable, f).await })
            };
            settle().await;
            assert_eq!(calls.load(Ordering::SeqCst), 1, "the fetch is running");
            let second = {
                let (cache, k, f) = (
                    cache.clone(),
                    k.clone(),
                    answer(&clock, &calls, "never", None),
                );
                tokio::spawn(async move { cache.get_or_fetch(&k, Need::Servable, f).await })
            };
            settle().await;
            assert_eq!(cache.waiting_for(&k).await, 2);
            // The client that started the fetch disconnects.
            first.abort();
            assert!(first.await.unwrap_err().is_cancelled());
            let (c, outcome) = second.await.unwrap().unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("one", Outcome::Miss));
            // Alone, a client that leaves while the fetch runs still leaves it to finish
            // for the cache.
            let lone = {
                let (cache, f) = (
                    cache.clone(),
                    answer(&clock, &calls, "two", Some(Duration::from_secs(2))),
                );
                tokio::spawn(async move { cache.get_or_fetch(&key("b"), Need::Servable, f).await })
            };
            settle().await;
            lone.abort();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let (c, outcome) = cache
                .get_or_fetch(&key("b"), Need::Servable, answer(&clock, &calls, "x", None))
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("two", Outcome::Hit));
            assert_eq!(calls.load(Ordering::SeqCst), 2, "one upstream call per key");
        }

        /// Keeps an answer for request `r` in `cache`'s memo, as the server does after a
        /// request it decided.
        fn keep_one(cache: &Cache, now: SystemTime) {
            let memo = cache.memo();
            let miss = memo.kept("r", || now, |_| {}).unwrap_err();
            let answer = crate::broker::memo::Answer {
                body: bytes::Bytes::from_static(b"{}"),
                registry: regbroker_provider::Registry::parse("r.example.com").unwrap(),
                source: "fake",
                cached: true,
                until: None,
            };
            memo.keep("r", miss, answer, now);
            assert_eq!(memo.len(), 1, "the answer was not kept");
        }

        #[tokio::test(start_paused = true)]
        async fn every_entry_that_comes_or_goes_forgets_the_kept_answers() {
            let (cache, clock) = cache(Config {
                capacity: 1,
                ..Config::default()
            });
            let now = || regbroker_provider::Clock::now(&clock);
            let calls = Arc::new(AtomicUsize::new(0));
            let fetch = |secret| answer(&clock, &calls, secret, Some(Duration::ZERO));
            let (a, b) = (key("a"), key("b"));

            keep_one(&cache, now());
            cache
                .get_or_fetch(&a, Need::Servable, fetch("a"))
                .await
                .unwrap();
            assert!(cache.memo().is_empty(), "a credential cached");

            keep_one(&cache, now());
            let (entry, _) = cache
                .get_or_fetch(&a, Need::Refetch, fetch("a2"))
                .await
                .unwrap();
            assert!(cache.memo().is_empty(), "a credential replaced");

            keep_one(&cache, now());
            assert!(cache.forget_if(&a, entry.lifetime).await);
            assert!(cache.memo().is_empty(), "a refused credential dropped");

            cache
                .get_or_fetch(&a, Need::Servable, fetch("a3"))
                .await
                .unwrap();
            keep_one(&cache, now());
            cache.forget(&a).await;
            assert!(cache.memo().is_empty(), "a reported credential dropped");

            // Over capacity, moka evicts on its own.
            cache
                .get_or_fetch(&a, Need::Servable, fetch("a4"))
                .await
                .unwrap();
            cache
                .get_or_fetch(&b, Need::Servable, fetch("b"))
                .await
                .unwrap();
            keep_one(&cache, now());
            cache.entries.run_pending_tasks().await;
            assert_eq!(cache.len(), 1);
            assert!(cache.memo().is_empty(), "a credential evicted");
        }

        #[tokio::test(start_paused = true)]
        async fn a_success_clears_the_failure_record_so_the_next_pause_starts_over() {
            // Pauses: 1st failure 5-10 s, 2nd 10-20 s, 3rd 20-40 s (jitter in [0.5, 1]).
            let (cache, clock) = with_backoff(Duration::from_secs(10));
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            for pause_over in [11, 21] {
                assert!(
                    cache
                        .get_or_fetch(&k, Need::Servable, failing(&calls))
                        .await
                        .is_err()
                );
                clock.advance(Duration::from_secs(pause_over));
            }
            cache
                .get_or_fetch(
                    &k,
                    Need::Servable,
                    answer(&clock, &calls, "ok", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            assert_eq!(calls.load(Ordering::SeqCst), 3);
            // Past its stale point the next fetch fails: the first failure since the
            // success, so its pause is at most 10 s, not a third doubling (20-40 s).
            clock.advance(HOUR);
            assert!(
                cache
                    .get_or_fetch(&k, Need::Servable, failing(&calls))
                    .await
                    .is_err()
            );
            clock.advance(Duration::from_secs(11));
            assert!(
                cache
                    .get_or_fetch(&k, Need::Servable, failing(&calls))
                    .await
                    .is_err()
            );
            assert_eq!(
                calls.load(Ordering::SeqCst),
                5,
                "11 s after the first failure since a success, upstream is asked again"
            );
        }

        #[derive(Debug)]
        struct Stored(Entry);

        impl Persist for Stored {
            fn load(&self, _key: &Key) -> Option<Entry> {
                Some(self.0.clone())
            }
            fn store(&self, _key: &Key, _entry: &Entry) {}
            fn forget(&self, _key: &Key) {}
        }

        #[tokio::test(start_paused = true)]
        async fn a_persisted_entry_is_served_while_fresh_and_never_once_stale() {
            let calls = Arc::new(AtomicUsize::new(0));
            let (fresh_cache, clock) = cache(Config::default());
            let now = regbroker_provider::Clock::now(&clock);
            let stored = |secret: &str, fetched: SystemTime| {
                let credential = Credential::new("u", secret.to_string(), Some(fetched + HOUR));
                let lifetime = plan(&Config::default(), fetched, credential.expires_at());
                Arc::new(Stored(Entry {
                    credential,
                    lifetime,
                }))
            };
            let fresh_cache = fresh_cache.with_persist(stored("disk", now));
            let (c, outcome) = fresh_cache
                .get_or_fetch(
                    &key("a"),
                    Need::Servable,
                    answer(&clock, &calls, "net", None),
                )
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("disk", Outcome::Hit));
            // Fetched 3580 s ago: past its stale point (3570 s), though not expired.
            let stale_cache = Cache::new(Config::default(), Arc::new(clock.clone()))
                .with_persist(stored("disk", now - Duration::from_secs(3580)));
            let (c, outcome) = stale_cache
                .get_or_fetch(
                    &key("a"),
                    Need::Servable,
                    answer(&clock, &calls, "net", Some(Duration::ZERO)),
                )
                .await
                .unwrap();
            assert_eq!((secret(&c).as_str(), outcome), ("net", Outcome::Miss));
            assert_eq!(calls.load(Ordering::SeqCst), 1);
        }
        #[tokio::test(start_paused = true)]
        async fn credentials_fetched_together_do_not_refresh_together() {
            let (cache, clock) = cache(Config::default());
            let calls = Arc::new(AtomicUsize::new(0));
            let mut points = std::collections::BTreeSet::new();
            for i in 0..50 {
                let k = key(&format!("id-{i}"));
                let fresh = answer(&clock, &calls, "s", Some(Duration::ZERO));
                let (entry, _) = cache.get_or_fetch(&k, Need::Servable, fresh).await.unwrap();
                let _ = entry;
                let e = cache.entries.get(&k).await.unwrap();
                points.insert(e.lifetime.refresh_at);
            }
            assert!(
                points.len() > 40,
                "50 credentials, {} refresh points",
                points.len()
            );
        }

        #[tokio::test(start_paused = true)]
        async fn the_refresh_and_stale_points_are_exact_boundaries() {
            // Without jitter, so the refresh point is exactly plan's.
            let (cache, clock) = cache(Config {
                refresh_jitter: 0.0,
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            let fresh = |s| answer(&clock, &calls, s, Some(Duration::ZERO));
            cache
                .get_or_fetch(&k, Need::Servable, fresh("old"))
                .await
                .unwrap();
            // 1 h credential: refresh at 2856 s, stale at 3570 s. One second before the
            // refresh point it is a plain hit; at it, the refresh starts.
            clock.advance(Duration::from_secs(2855));
            let (_, outcome) = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap();
            assert_eq!(outcome, Outcome::Hit);
            clock.advance(Duration::from_secs(1));
            let (_, outcome) = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await
                .unwrap();
            assert_eq!(
                outcome,
                Outcome::RefreshAhead,
                "at the refresh point exactly"
            );
            settle().await;
            // The refresh failed. At the stale point exactly (past the pause, which is at
            // most 1 s) nothing is served: upstream is asked, and its error answered.
            clock.advance(Duration::from_secs(3570 - 2856));
            let got = cache
                .get_or_fetch(&k, Need::Servable, failing(&calls))
                .await;
            assert!(got.is_err(), "served at the stale point exactly");
            assert_eq!(calls.load(Ordering::SeqCst), 3);
        }

        #[tokio::test(start_paused = true)]
        async fn with_no_failure_pause_the_next_request_asks_again_at_once() {
            let (cache, _clock) = cache(Config {
                failure_backoff: Duration::ZERO,
                max_failure_backoff: Duration::ZERO,
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            for _ in 0..3 {
                let got = cache
                    .get_or_fetch(&key("a"), Need::Servable, failing(&calls))
                    .await;
                assert!(got.is_err());
            }
            assert_eq!(
                calls.load(Ordering::SeqCst),
                3,
                "a zero pause held a request back"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_refetch_asks_upstream_before_the_refresh_point_and_keeps_the_old_one_if_it_fails()
         {
            async fn got(
                cache: &Cache,
                need: Need,
                fetch: impl FnOnce() -> BoxFuture<'static, Result<Credential, Error>>,
            ) -> (String, Outcome) {
                let (c, outcome) = cache.get_or_fetch(&key("a"), need, fetch).await.unwrap();
                (secret(&c), outcome)
            }
            let (cache, clock) = cache(Config::default());
            let calls = Arc::new(AtomicUsize::new(0));
            let first = answer(&clock, &calls, "old", Some(Duration::ZERO));
            assert_eq!(
                got(&cache, Need::Fresh, first).await,
                ("old".into(), Outcome::Miss)
            );
            // Long before the refresh point: a sink gets the cached one, a refetch asks.
            let never = answer(&clock, &calls, "never", None);
            assert_eq!(
                got(&cache, Need::Fresh, never).await,
                ("old".into(), Outcome::Hit)
            );
            let rotated = answer(&clock, &calls, "rotated", Some(Duration::ZERO));
            assert_eq!(
                got(&cache, Need::Refetch, rotated).await,
                ("rotated".into(), Outcome::Refreshed)
            );
            assert_eq!(calls.load(Ordering::SeqCst), 2);
            // The cache holds the new one for every caller.
            let never = answer(&clock, &calls, "never", None);
            assert_eq!(
                got(&cache, Need::Servable, never).await,
                ("rotated".into(), Outcome::Hit)
            );
            // A refetch that fails: the cached one, still valid.
            assert_eq!(
                got(&cache, Need::Refetch, failing(&calls)).await,
                ("rotated".into(), Outcome::StaleServed)
            );
            assert_eq!(calls.load(Ordering::SeqCst), 3);
        }

        #[tokio::test(start_paused = true)]
        async fn a_fresh_caller_whose_refresh_fails_gets_the_cached_one_only_while_servable() {
            let (cache, clock, calls, k) = due_for_refresh().await;
            // The sink waits for the refresh, which fails: it gets the cached one.
            let (c, outcome) = cache
                .get_or_fetch(&k, Need::Fresh, failing(&calls))
                .await
                .unwrap();
            assert_eq!(
                (secret(&c).as_str(), outcome),
                ("old", Outcome::StaleServed)
            );
            // Past the pause, a refresh that fails only after the stale point has passed
            // while it ran: the error, not the now stale credential.
            clock.advance(Duration::from_secs(600));
            let slow_failure = {
                let (clock, calls) = (clock.clone(), calls.clone());
                move || {
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        clock.advance(Duration::from_secs(100)); // 3600 s > 3570 s
                        Err(Error::unavailable("upstream down"))
                    }
                    .boxed()
                }
            };
            let got = cache.get_or_fetch(&k, Need::Fresh, slow_failure).await;
            assert!(got.is_err(), "served after it went stale during the fetch");
        }

        #[tokio::test(start_paused = true)]
        async fn a_finished_fetch_leaves_the_in_flight_map_so_it_holds_no_credential() {
            // The in-flight map is not bounded like the cache: a finished fetch left in it
            // would keep its credential (and a map slot per key) after the cache evicted
            // the entry.
            let (cache, clock) = cache(Config {
                failure_backoff: Duration::ZERO,
                ..Config::default()
            });
            let calls = Arc::new(AtomicUsize::new(0));
            for (i, fails) in [false, true].into_iter().enumerate() {
                let k = key(&format!("k{i}"));
                let got = if fails {
                    cache
                        .get_or_fetch(&k, Need::Servable, failing(&calls))
                        .await
                } else {
                    cache
                        .get_or_fetch(
                            &k,
                            Need::Servable,
                            answer(&clock, &calls, "s", Some(Duration::ZERO)),
                        )
                        .await
                };
                assert_eq!(got.is_err(), fails);
                settle().await;
                assert!(
                    cache.inflight.lock().await.get(&k).is_none(),
                    "a finished fetch (failed: {fails}) is still in the in-flight map"
                );
            }
        }

        #[tokio::test(start_paused = true)]
        async fn a_refresh_failing_exactly_at_the_stale_point_is_an_error_not_the_stale_one() {
            let (cache, clock, calls, k) = due_for_refresh().await;
            // Fetched at 0 s, stale at 3570 s, now at 2900 s: the refresh fails at 3570 s.
            let failure_at_stale_point = {
                let (clock, calls) = (clock.clone(), calls.clone());
                move || {
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        clock.advance(Duration::from_secs(670));
                        Err(Error::unavailable("upstream down"))
                    }
                    .boxed()
                }
            };
            let got = cache
                .get_or_fetch(&k, Need::Fresh, failure_at_stale_point)
                .await;
            assert!(got.is_err(), "served at its stale point");
            assert_eq!(calls.load(Ordering::SeqCst), 2);
        }

        #[tokio::test(start_paused = true)]
        async fn the_failure_pause_doubles_with_each_failure_in_a_row() {
            // Base 10 s: the first pause is 5-10 s, the second 10-20 s.
            let (cache, clock) = with_backoff(Duration::from_secs(10));
            let calls = Arc::new(AtomicUsize::new(0));
            let k = key("a");
            let fail = || async {
                assert!(
                    cache
                        .get_or_fetch(&k, Need::Servable, failing(&calls))
                        .await
                        .is_err()
                );
            };
            fail().await;
            clock.advance(Duration::from_secs(10));
            fail().await;
            assert_eq!(calls.load(Ordering::SeqCst), 2, "the first pause is over");
            // 10 s into the second pause (10-20 s): still paused, upstream not asked.
            clock.advance(Duration::from_secs(10));
            fail().await;
            assert_eq!(
                calls.load(Ordering::SeqCst),
                2,
                "the second failure in a row pauses at least twice the base"
            );
        }

        #[tokio::test(start_paused = true)]
        async fn failure_pauses_are_spread_over_half_to_all_of_the_backoff() {
            // Keys failing together must not retry together: each pause is the backoff
            // times a random factor in [0.5, 1).
            let backoff = Duration::from_secs(10);
            let (cache, clock) = with_backoff(backoff);
            let calls = Arc::new(AtomicUsize::new(0));
            let mut pauses = Vec::new();
            for i in 0..40 {
                let k = key(&format!("k{i}"));
                assert!(
                    cache
                        .get_or_fetch(&k, Need::Servable, failing(&calls))
                        .await
                        .is_err()
                );
                let until = cache
                    .failures
                    .get(&k)
                    .await
                    .expect("a failure record")
                    .until;
                let now = regbroker_provider::Clock::now(&clock);
                pauses.push(until.duration_since(now).unwrap());
            }
            for p in &pauses {
                assert!(
                    *p >= backoff / 2 && *p < backoff,
                    "pause {p:?} outside [5 s, 10 s)"
                );
            }
            let short = pauses.iter().filter(|p| **p < backoff * 3 / 4).count();
            assert!(
                short > 0 && short < pauses.len(),
                "40 pauses all on one side of 7.5 s: not spread ({pauses:?})"
            );
        }
    }
}
