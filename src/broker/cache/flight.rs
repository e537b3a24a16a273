//! Single-flight fetches and their bounded queue: concurrent misses for one key share one
//! upstream call; at most `max_concurrent_fetches` run and `max_queued_fetches` wait; a
//! queued fetch every client gave up on is dropped before it asks upstream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use regbroker_provider::{Credential, Error};

use super::{Cache, Entry, Failure, Key, jittered, plan, random_failure_pause};

type FetchResult = Result<Arc<Entry>, Arc<Error>>;
type InFlight = Shared<BoxFuture<'static, FetchResult>>;

/// Held by everyone waiting for a fetch (and by a background refresh's own task). When
/// the last holder lets go, the sender drops and the fetch task, if still queued for a
/// slot, gives up: nobody would read its answer.
pub(super) struct Interest {
    _alive: tokio::sync::oneshot::Sender<()>,
}

/// A fetch in progress for a key.
pub(super) struct Flight {
    /// Tells this flight from a later one for the same key (an abandoned flight must not
    /// remove its successor from the map).
    id: u64,
    future: InFlight,
    interest: Weak<Interest>,
    /// A background refresh, whose task holds one interest of its own.
    refresh: bool,
}

/// Counts one fetch task as outstanding for as long as it lives, however it ends.
struct Outstanding(Arc<AtomicUsize>);

impl Outstanding {
    fn enter(count: &Arc<AtomicUsize>) -> Outstanding {
        count.fetch_add(1, Ordering::SeqCst);
        Outstanding(count.clone())
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether a caller found a fetch to wait for, or a fresh entry after all.
pub(super) enum Joined {
    Flight(InFlight, Arc<Interest>),
    Fresh(Arc<Entry>),
}

impl Cache {
    /// Makes sure a fetch for `key` is running, without waiting for it. A full queue
    /// skips the refresh: the cached credential is still served and the next request
    /// tries again.
    pub(super) async fn refresh_in_background<F>(&self, key: &Key, fetch: F)
    where
        F: FnOnce() -> BoxFuture<'static, Result<Credential, Error>>,
    {
        match self.join_or_start(key, fetch, true, false).await {
            Ok(Joined::Flight(_, interest)) => {
                // A flight we started holds its own interest (see `join_or_start`); one we
                // joined belongs to its waiters, and we are not one.
                drop(interest);
            }
            Ok(Joined::Fresh(_)) => {}
            Err(err) => {
                tracing::debug!(provider = key.provider, error = %err, "Background refresh not started");
            }
        }
    }

    /// Joins the fetch in flight for `key`, or starts one. Fails with `overloaded` when
    /// the queue is full. A started refresh (`refresh`) keeps its own interest, so it runs
    /// to the end even if nobody waits; a miss is dropped while still queued once its
    /// waiters are gone. `refetch` ([`Need::Refetch`]) starts a fetch even when a fresh
    /// entry is stored.
    pub(super) async fn join_or_start<F>(
        &self,
        key: &Key,
        fetch: F,
        refresh: bool,
        refetch: bool,
    ) -> Result<Joined, Arc<Error>>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Credential, Error>>,
    {
        let mut inflight = self.inflight.lock().await;
        if let Some(flight) = inflight.get(key)
            && let Some(interest) = flight.interest.upgrade()
        {
            return Ok(Joined::Flight(flight.future.clone(), interest));
        }
        // Double-check under the lock: a fetch that finished since our first look has
        // already stored its entry (it stores before it leaves the in-flight map), so a
        // fresh entry here must be served, not refetched.
        let now = self.clock.now();
        if let Some(entry) = self
            .entries
            .get(key)
            .await
            .filter(|e| !refetch && now < e.lifetime.refresh_at)
        {
            return Ok(Joined::Fresh(entry));
        }
        let bound = self.config.max_concurrent_fetches + self.config.max_queued_fetches;
        if self.outstanding.load(Ordering::SeqCst) >= bound {
            self.count_dropped("overloaded");
            tracing::warn!(
                provider = key.provider,
                running = self.config.max_concurrent_fetches,
                queued = self.config.max_queued_fetches,
                "Fetch queue full; refusing a new key"
            );
            return Err(Arc::new(Error::new(
                regbroker_provider::ErrorKind::Overloaded,
                format!(
                    "too many credential fetches in progress ({} running, {} queued); try again shortly",
                    self.config.max_concurrent_fetches, self.config.max_queued_fetches
                ),
            )));
        }
        let (alive, abandoned) = tokio::sync::oneshot::channel();
        let interest = Arc::new(Interest { _alive: alive });
        let id = self.next_flight.fetch_add(1, Ordering::Relaxed);
        let own = refresh.then(|| interest.clone());
        let future = self.spawn_fetch(key.clone(), id, fetch(), abandoned, own, refresh);
        inflight.insert(
            key.clone(),
            Flight {
                id,
                future: future.clone(),
                interest: Arc::downgrade(&interest),
                refresh,
            },
        );
        Ok(Joined::Flight(future, interest))
    }

    fn count_dropped(&self, reason: &'static str) {
        if let Some(m) = &self.metrics {
            m.fetch_dropped(reason);
        }
    }

    fn count_refresh(&self, result: &'static str) {
        if let Some(m) = &self.metrics {
            m.cache_refresh(result);
        }
    }

    fn spawn_fetch(
        &self,
        key: Key,
        id: u64,
        fetch: BoxFuture<'static, Result<Credential, Error>>,
        mut abandoned: tokio::sync::oneshot::Receiver<()>,
        own_interest: Option<Arc<Interest>>,
        refresh: bool,
    ) -> InFlight {
        let this = self.clone();
        let outstanding = Outstanding::enter(&self.outstanding);
        if refresh {
            self.count_refresh("started");
        }
        let task = tokio::spawn(async move {
            // Held to the end: a background refresh completes for the cache.
            let _own_interest = own_interest;
            let timeout = this.config.fetch_timeout;
            let deadline = tokio::time::Instant::now() + timeout;
            let permit = tokio::select! {
                biased;
                permit = tokio::time::timeout_at(deadline, this.fetch_permits.acquire()) => Some(permit),
                _ = &mut abandoned => None,
            };
            let result = match permit {
                None => Err(None),
                Some(Err(_)) => Err(Some(Error::timed_out(format!(
                    "no free upstream fetch slot within {} ({} fetches running)",
                    humantime::format_duration(timeout),
                    this.config.max_concurrent_fetches
                )))),
                Some(Ok(permit)) => {
                    let _permit = permit;
                    match tokio::time::timeout_at(deadline, fetch).await {
                        Ok(r) => r.map_err(Some),
                        Err(_) => Err(Some(Error::timed_out(format!(
                            "no answer from upstream within {}",
                            humantime::format_duration(timeout)
                        )))),
                    }
                }
            };
            let result = match result {
                Ok(credential) => {
                    let now = this.clock.now();
                    let lifetime = jittered(
                        &this.config,
                        now,
                        plan(&this.config, now, credential.expires_at()),
                        fastrand::f64(),
                    );
                    let entry = Arc::new(Entry {
                        credential,
                        lifetime,
                    });
                    this.entries.insert(key.clone(), entry.clone()).await;
                    this.memo.changed();
                    this.failures.invalidate(&key).await;
                    // A pass-through credential is a ServiceAccount token: it never
                    // reaches a disk cache (it is fetched again, cheaply, from the token).
                    if let Some(p) = &this.persist
                        && !entry.credential.passes_subject_token()
                    {
                        p.store(&key, &entry);
                    }
                    if refresh {
                        this.count_refresh("ok");
                    }
                    Ok(entry)
                }
                Err(Some(e)) => {
                    let error = Arc::new(e);
                    let consecutive =
                        this.failures.get(&key).await.map_or(0, |f| f.consecutive) + 1;
                    let pause = random_failure_pause(&this.config, consecutive);
                    let failure = Failure {
                        until: this.clock.now() + pause,
                        consecutive,
                        error: error.clone(),
                    };
                    this.failures.insert(key.clone(), failure).await;
                    if refresh {
                        this.count_refresh("failed");
                    }
                    Err(error)
                }
                Err(None) => {
                    // Every waiter left while the fetch was still queued: nobody reads
                    // this, and upstream was never asked, so no failure is recorded.
                    this.count_dropped("abandoned");
                    tracing::debug!(
                        provider = key.provider,
                        "Queued fetch dropped: nobody waits for it"
                    );
                    Err(Arc::new(Error::unavailable(
                        "the fetch was dropped: every client waiting for it gave up",
                    )))
                }
            };
            {
                let mut inflight = this.inflight.lock().await;
                if inflight.get(&key).is_some_and(|f| f.id == id) {
                    inflight.remove(&key);
                }
            }
            drop(outstanding);
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

    /// Fetches running or queued now (for tests and benchmarks that let background
    /// refreshes finish before moving a simulated clock).
    pub fn fetches_in_progress(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    /// Clients waiting now for the fetch in flight for `key` (a background refresh's own
    /// hold not counted): for tests that must know every client has joined a fetch
    /// before letting it answer.
    pub async fn waiting_for(&self, key: &Key) -> usize {
        let inflight = self.inflight.lock().await;
        let Some(flight) = inflight.get(key) else {
            return 0;
        };
        let own = usize::from(flight.refresh);
        flight
            .interest
            .upgrade()
            .map_or(0, |i| Arc::strong_count(&i).saturating_sub(1 + own))
    }
}
