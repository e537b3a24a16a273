//! Leader election on a `coordination.k8s.io/v1` Lease, client-go's algorithm
//! (`k8s.io/client-go/tools/leaderelection`), so that of several replicas only one writes
//! the synced Secrets (`serve --leader-elect`).
//!
//! Settings (read by `cli::leader_elect`): `--leader-elect` (`REGBROKER_LEADER_ELECT`),
//! `--leader-elect-lease` (`REGBROKER_LEADER_ELECT_LEASE`, default `regbroker`),
//! `--leader-elect-namespace` (`REGBROKER_LEADER_ELECT_NAMESPACE`, else `POD_NAMESPACE`,
//! else the client's namespace: the service account's in a pod), and the durations
//! `--leader-elect-lease-duration` 15 s, `--leader-elect-renew-deadline` 10 s,
//! `--leader-elect-retry-period` 2 s. The holder identity is `POD_NAME` (else the host
//! name) plus `_` and a random suffix, as client-go's callers do.
//!
//! The rules, all in [`Elector::try_acquire_or_renew`] and [`Leadership`]:
//!
//! - every retry period (jittered by up to 1.2 retry periods while not leading) the Lease
//!   is read, and created if absent;
//! - the local instant at which the record (or its resourceVersion) was last seen to
//!   *change* is noted, taken once the call that returned it has come back (never the
//!   instant the round started: a read may take up to half the renew deadline, and the
//!   record it returns may have been written at any moment of that wait); another
//!   holder's lease counts as held until that instant plus its `leaseDurationSeconds`.
//!   The holder's own `renewTime` is never compared with the local clock: clocks differ;
//! - the lease is taken or renewed with `replace` carrying the `resourceVersion` just read,
//!   so a conflict (409) means another replica won the round; `acquireTime` and
//!   `leaseTransitions` are kept when renewing and bumped when taking over;
//! - a leader whose last successful renewal started a renew deadline ago stops leading,
//!   whatever its loop is doing ([`Leadership::may_write`] is checked again before every
//!   guarded write); each API call is bounded by half the renew deadline;
//! - on shutdown, once the guarded work has stopped, the leader writes an empty holder with
//!   `leaseDurationSeconds: 1`, so another replica takes over at its next retry.
//!
//! Why two replicas never write at once. Let leader A's last successful renewal be the
//! write W, made in a round that started at A's local instant `s`. A writes only while
//! `may_write`, that is before `s + renew deadline`, and cuts every guarded call there. A
//! replica B that last saw the record change at W noted that at an instant `o` taken
//! after its read returned, so after W was written, so after `s`: `o >= s` (W cannot be
//! returned before it exists, and `s` precedes W). B counts A's lease as held until
//! `o + lease duration`, and starts writing no earlier than that round's start. So B's
//! first write comes at least `lease duration - renew deadline` after A's last one may
//! have been sent; [`Config::validate`] keeps that margin at least [`MIN_MARGIN`], for the
//! API server to apply a write sent just before the deadline and for the replicas'
//! monotonic clocks to run at slightly different rates. A write that lands later still
//! carries the Secret's resourceVersion, so it cannot overwrite B's blindly. (Before
//! issue 30, `o` was the instant B's round *started*: a slow read that returned W counted
//! it as up to a renew deadline older than it was, and B could take over while A still
//! wrote.)
//!
//! The state machine runs over a [`LeaseStore`] trait and takes the local instant as an
//! argument, so the timing rules are unit tested with a fake store and no sleeping; the
//! real store is [`KubeLeaseStore`] (kube-rs), tested against a real API server in
//! `tests/kube_leader.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use regbroker_provider::SharedClock;
use tokio::sync::watch;
use tokio::time::Instant;

mod store;

use crate::metrics::Metrics;

/// client-go's `JitterFactor`: a candidate waits a retry period plus up to this many more.
pub const JITTER_FACTOR: f64 = 1.2;

/// Leader election settings (plain data; see the module docs for the flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's holder identity.
    pub identity: String,
    /// How long another holder's lease counts as held after its last observed change
    /// (whole seconds: the Lease stores seconds).
    pub lease_duration: Duration,
    /// How long a leader keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is read or renewed.
    pub retry_period: Duration,
}

/// The defaults client-go and the Kubernetes components use.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// See [`DEFAULT_LEASE_DURATION`].
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// See [`DEFAULT_LEASE_DURATION`].
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// The least lease duration less renew deadline that [`Config::validate`] accepts: the
/// time between a cut-off leader's last possible write and another replica's first (see
/// the module docs).
pub const MIN_MARGIN: Duration = Duration::from_secs(1);

impl Config {
    /// Checks client-go's ordering: lease duration > renew deadline > retry period ×
    /// [`JITTER_FACTOR`], with the lease duration at least [`MIN_MARGIN`] longer than the
    /// renew deadline, and a lease duration of whole seconds.
    pub fn validate(&self) -> Result<(), String> {
        let ld = self.lease_duration;
        let rd = self.renew_deadline;
        let rp = self.retry_period;
        if rp.is_zero() {
            return Err("--leader-elect-retry-period must be more than 0".into());
        }
        if ld.subsec_nanos() != 0 || ld.as_secs() > i32::MAX as u64 {
            return Err(format!(
                "--leader-elect-lease-duration must be a whole number of seconds (the Lease stores seconds), not {ld:?}"
            ));
        }
        if ld < rd.saturating_add(MIN_MARGIN) {
            return Err(format!(
                "--leader-elect-lease-duration ({ld:?}) must be at least {MIN_MARGIN:?} longer than --leader-elect-renew-deadline ({rd:?}): \
                 a leader that cannot renew stops writing at its renew deadline, and another replica may write from the lease duration on"
            ));
        }
        if rd.as_secs_f64() <= rp.as_secs_f64() * JITTER_FACTOR {
            return Err(format!(
                "--leader-elect-renew-deadline ({rd:?}) must be longer than {JITTER_FACTOR} × --leader-elect-retry-period ({rp:?})"
            ));
        }
        Ok(())
    }

    /// The timeout of each API call: half the renew deadline, so a hung call leaves time
    /// for another attempt.
    pub fn call_timeout(&self) -> Duration {
        self.renew_deadline / 2
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

pub use store::{KubeLeaseStore, LeaseStore, Observed, Record, StoreError};

#[derive(Debug)]
struct State {
    leading: bool,
    /// When the last successful acquisition or renewal *started* (local, monotonic).
    renewed_at: Option<Instant>,
}

#[derive(Debug)]
struct Shared {
    identity: String,
    renew_deadline: Duration,
    state: Mutex<State>,
    /// Counts the terms this replica started leading; guarded work waits on it.
    terms: watch::Sender<u64>,
}

/// Whether this replica may act as the leader now. Cheap to clone; shared between the
/// elector and the guarded work (the Secret sync).
#[derive(Clone, Debug)]
pub struct Leadership(Arc<Shared>);

impl Leadership {
    fn new(identity: String, renew_deadline: Duration) -> Leadership {
        Leadership(Arc::new(Shared {
            identity,
            renew_deadline,
            state: Mutex::new(State {
                leading: false,
                renewed_at: None,
            }),
            terms: watch::Sender::new(0),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This replica's holder identity (written into the Lease and into each Secret).
    pub fn identity(&self) -> &str {
        &self.0.identity
    }

    /// The instant from which this replica must no longer write: its last successful
    /// renewal's start plus the renew deadline; `None` when it is not leading.
    pub fn write_deadline(&self) -> Option<Instant> {
        let s = self.state();
        s.leading
            .then_some(s.renewed_at)
            .flatten()
            .map(|r| r + self.0.renew_deadline)
    }

    /// True while this replica leads and `now` is before its [`Self::write_deadline`].
    pub fn may_write_at(&self, now: Instant) -> bool {
        self.write_deadline().is_some_and(|d| now < d)
    }

    /// [`Self::may_write_at`] now. Guarded work calls it immediately before each write.
    pub fn may_write(&self) -> bool {
        self.may_write_at(Instant::now())
    }

    /// Changes each time this replica starts leading (a new term).
    pub fn terms(&self) -> watch::Receiver<u64> {
        self.0.terms.subscribe()
    }

    fn start_term(&self, at: Instant) {
        {
            let mut s = self.state();
            s.leading = true;
            s.renewed_at = Some(at);
        }
        self.0.terms.send_modify(|t| *t += 1);
    }

    fn renewed(&self, at: Instant) {
        let mut s = self.state();
        if s.leading {
            s.renewed_at = Some(at);
        }
    }

    fn stop(&self) {
        let mut s = self.state();
        s.leading = false;
        s.renewed_at = None;
    }

    /// A leadership that is always granted, with no renew deadline: for guarded code run
    /// without election in tests.
    #[doc(hidden)]
    pub fn always(identity: &str) -> Leadership {
        let l = Leadership::new(identity.to_string(), Duration::from_secs(u32::MAX as u64));
        l.start_term(Instant::now());
        l
    }
}

/// The outcome of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Round {
    /// This replica holds the lease (acquired or renewed).
    Held,
    /// Another replica holds a lease that has not expired by our observation.
    HeldBy(String),
    /// The round was lost (conflict) or failed (API error); try again.
    Failed,
}

/// client-go's elector over a [`LeaseStore`].
#[derive(Debug)]
pub struct Elector {
    config: Config,
    store: Arc<dyn LeaseStore>,
    clock: SharedClock,
    leadership: Leadership,
    metrics: Option<Arc<Metrics>>,
    observed: Option<Observed>,
    /// The local instant the observed record last changed.
    observed_at: Option<Instant>,
    /// The local monotonic clock: tokio's `Instant::now` (explicit instants in tests).
    instant: fn() -> Instant,
}

fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + fastrand::f64() * JITTER_FACTOR)
}

impl Elector {
    /// An elector for `config`; `clock` gives the (informative) wall-clock times written
    /// into the Lease.
    pub fn new(config: Config, store: Arc<dyn LeaseStore>, clock: SharedClock) -> Elector {
        let leadership = Leadership::new(config.identity.clone(), config.renew_deadline);
        Elector {
            config,
            store,
            clock,
            leadership,
            metrics: None,
            observed: None,
            observed_at: None,
            instant: Instant::now,
        }
    }

    /// Reads the local monotonic clock with `instant` instead of tokio's `Instant::now`:
    /// for tests that date each observation explicitly.
    #[cfg(test)]
    fn with_instant(mut self, instant: fn() -> Instant) -> Elector {
        self.instant = instant;
        self
    }

    /// Reports leadership in `metrics` (`regbroker_leader`, `regbroker_leader_transitions_total`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Elector {
        metrics.leader_election();
        self.metrics = Some(metrics);
        self
    }

    /// The handle the guarded work checks.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The record as last read or written.
    pub fn observed(&self) -> Option<&Observed> {
        self.observed.as_ref()
    }

    /// Notes `o`, just returned by a store call, and the local instant now as the instant
    /// of the last change if it differs from the last seen. The instant is taken here,
    /// after the call came back, never before it: `o` may have been written at any moment
    /// while the call was under way, and dating the observation earlier would count the
    /// holder's lease as older than it is (see the module docs). The resourceVersion
    /// counts too (client-go compares the record only): a renewal by a holder whose clock
    /// stands still is still a sign of life, and seeing more changes can only delay a
    /// takeover, never hasten it.
    fn observe(&mut self, o: Observed) {
        if self.observed.as_ref() != Some(&o) {
            self.observed_at = Some((self.instant)());
        }
        self.observed = Some(o);
    }

    fn is_holder(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|o| o.record.holder == self.config.identity)
    }

    /// One round of client-go's `tryAcquireOrRenew`, `now` being the local instant the
    /// round starts (what another holder's expiry is judged at, and what a new term or a
    /// renewal counts from: both no later than any write the round makes).
    pub async fn try_acquire_or_renew(&mut self, now: Instant) -> Round {
        let wall = self.clock.now();
        let mut ours = Record {
            holder: self.config.identity.clone(),
            lease_duration_seconds: self.config.lease_seconds(),
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions: 0,
        };

        // Fast path: the leader renews on the version it wrote last.
        if self.is_holder()
            && let Some(o) = &self.observed
        {
            ours.acquire_time = o.record.acquire_time;
            ours.transitions = o.record.transitions;
            let rv = o.resource_version.clone();
            match self.store.update(&ours, &rv).await {
                Ok(o) => {
                    self.observe(o);
                    return Round::Held;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "Lease renewal on the last version failed; reading it again")
                }
            }
        }

        let current = match self.store.get().await {
            Ok(Some(o)) => o,
            Ok(None) => {
                ours.acquire_time = Some(wall);
                ours.transitions = 0;
                return match self.store.create(&ours).await {
                    Ok(o) => {
                        self.observe(o);
                        Round::Held
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "Cannot create the Lease");
                        Round::Failed
                    }
                };
            }
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "Cannot read the Lease");
                return Round::Failed;
            }
        };
        self.observe(current.clone());
        let record = &current.record;
        let other = !record.holder.is_empty() && record.holder != self.config.identity;
        if other {
            let seconds = u64::try_from(record.lease_duration_seconds).unwrap_or(0);
            // A duration past the monotonic clock's range (another writer's nonsense)
            // never runs out, rather than overflowing.
            let held = self.observed_at.is_some_and(|at| {
                at.checked_add(Duration::from_secs(seconds))
                    .is_none_or(|e| now < e)
            });
            if held {
                return Round::HeldBy(record.holder.clone());
            }
        }
        if record.holder == self.config.identity {
            ours.acquire_time = record.acquire_time;
            ours.transitions = record.transitions;
        } else {
            ours.acquire_time = Some(wall);
            ours.transitions = record.transitions.saturating_add(1);
        }
        match self.store.update(&ours, &current.resource_version).await {
            Ok(o) => {
                self.observe(o);
                Round::Held
            }
            Err(StoreError::Conflict) => Round::Failed,
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "Cannot update the Lease");
                Round::Failed
            }
        }
    }

    /// client-go's `release`: an empty holder with a one-second lease, on the version last
    /// seen, if this replica holds it. Call only once the guarded work has stopped.
    pub async fn release(&mut self) -> bool {
        self.step_down();
        if !self.is_holder() {
            return false;
        }
        let Some(o) = self.observed.clone() else {
            return false;
        };
        let wall = self.clock.now();
        let released = Record {
            holder: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            transitions: o.record.transitions,
        };
        let mut result = self.store.update(&released, &o.resource_version).await;
        if matches!(result, Err(StoreError::Conflict)) {
            // Our last renewal may have landed after its call timed out here, leaving the
            // version we hold stale: read again, and release only if we still hold it.
            match self.store.get().await {
                Ok(Some(current)) if current.record.holder == self.config.identity => {
                    result = self
                        .store
                        .update(&released, &current.resource_version)
                        .await;
                }
                _ => {}
            }
        }
        match result {
            Ok(o) => {
                self.observed = Some(o);
                tracing::info!(lease = %self.config.name, "Released the Lease");
                true
            }
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "Cannot release the Lease; another replica takes over when it expires");
                false
            }
        }
    }

    fn start_leading(&mut self, at: Instant) {
        self.leadership.start_term(at);
        if let Some(m) = &self.metrics {
            m.leader_transition(true);
        }
        let transitions = self.observed.as_ref().map(|o| o.record.transitions);
        tracing::info!(lease = %self.config.name, identity = %self.config.identity, ?transitions, "Leading");
    }

    fn step_down(&mut self) {
        if self.leadership.write_deadline().is_some() {
            self.leadership.stop();
            if let Some(m) = &self.metrics {
                m.leader_transition(false);
            }
        }
    }

    /// Runs client-go's loop until `stop` fires (or its sender is dropped), then releases
    /// the lease if this replica holds it.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut holder_logged: Option<String> = None;
        'outer: loop {
            // Candidate: try every jittered retry period.
            loop {
                let now = Instant::now();
                // Each call is bounded by the store; this bounds the round as a whole.
                let round = tokio::time::timeout(
                    self.config.renew_deadline,
                    self.try_acquire_or_renew(now),
                )
                .await
                .unwrap_or(Round::Failed);
                match round {
                    Round::Held => {
                        self.start_leading(now);
                        break;
                    }
                    Round::HeldBy(h) => {
                        if holder_logged.as_ref() != Some(&h) {
                            tracing::info!(lease = %self.config.name, holder = %h, "Following");
                            holder_logged = Some(h);
                        }
                    }
                    Round::Failed => {}
                }
                tokio::select! {
                    _ = tokio::time::sleep(jittered(self.config.retry_period)) => {}
                    _ = stop.wait_for(|s| *s) => break 'outer,
                }
            }
            holder_logged = None;
            // Leader: renew every retry period; stop leading at the renew deadline.
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.retry_period) => {}
                    _ = stop.wait_for(|s| *s) => break 'outer,
                }
                let Some(deadline) = self.leadership.write_deadline() else {
                    break;
                };
                let now = Instant::now();
                let round = tokio::time::timeout_at(deadline, self.try_acquire_or_renew(now))
                    .await
                    .unwrap_or(Round::Failed);
                match round {
                    Round::Held => self.leadership.renewed(now),
                    Round::HeldBy(h) => {
                        tracing::warn!(lease = %self.config.name, holder = %h, "Lost the Lease to another replica");
                        self.step_down();
                        break;
                    }
                    Round::Failed if Instant::now() >= deadline => {
                        tracing::warn!(lease = %self.config.name, renew_deadline = ?self.config.renew_deadline, "Cannot renew the Lease within the renew deadline; no longer leading");
                        self.step_down();
                        break;
                    }
                    Round::Failed => {}
                }
            }
        }
        self.release().await;
    }

    /// Starts [`Self::run`] on a task; the handle stops it and releases the lease.
    pub fn spawn(self) -> Running {
        let leadership = self.leadership();
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(self.run(stop_rx));
        Running {
            leadership,
            stop,
            task,
        }
    }
}

/// A running elector.
#[derive(Debug)]
pub struct Running {
    leadership: Leadership,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// The handle the guarded work checks.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// Stops the loop and releases the lease if held (each call bounded by the call
    /// timeout). Call once the guarded work has stopped.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A holder identity: `base` (the pod name or host name) plus `_` and a random suffix, so
/// a restarted pod of the same name is a new holder.
pub fn identity(base: &str) -> String {
    let suffix: String = (0..8).map(|_| fastrand::alphanumeric()).collect();
    let base = if base.is_empty() { "regbroker" } else { base };
    format!("{base}_{}", suffix.to_ascii_lowercase())
}

#[cfg(test)]
impl Leadership {
    /// For unit tests elsewhere in the crate: a replica that leads from now on, or one
    /// that does not lead.
    pub(crate) fn for_tests(identity: &str, leading: bool) -> Leadership {
        let l = Leadership::new(identity.to_string(), Duration::from_secs(10));
        if leading {
            l.start_term(Instant::now());
        }
        l
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use regbroker_provider::BoxFuture;
    use regbroker_provider::{Clock, ManualClock};

    /// A Lease in memory with a resourceVersion counter; calls can be made to fail.
    #[derive(Debug, Default)]
    struct FakeStore {
        lease: Mutex<Option<Observed>>,
        version: Mutex<u64>,
        failing: std::sync::atomic::AtomicBool,
        hanging: std::sync::atomic::AtomicBool,
        /// The next read waits for this before it reads (a slow read: what it returns is
        /// the Lease as it is when it is answered).
        slow_read: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    }

    impl FakeStore {
        fn put(&self, record: Record) -> Observed {
            let mut v = self.version.lock().unwrap();
            *v += 1;
            let o = Observed {
                record,
                resource_version: v.to_string(),
            };
            *self.lease.lock().unwrap() = Some(o.clone());
            o
        }
        fn record(&self) -> Record {
            self.lease.lock().unwrap().clone().unwrap().record
        }
        async fn check(&self) -> Result<(), StoreError> {
            if self.hanging.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Api("unreachable".into()));
            }
            Ok(())
        }
    }

    impl LeaseStore for FakeStore {
        fn get(&self) -> BoxFuture<'_, Result<Option<Observed>, StoreError>> {
            Box::pin(async move {
                self.check().await?;
                let slow = self.slow_read.lock().unwrap().take();
                if let Some(answered) = slow {
                    let _ = answered.await;
                }
                Ok(self.lease.lock().unwrap().clone())
            })
        }
        fn create<'a>(&'a self, r: &'a Record) -> BoxFuture<'a, Result<Observed, StoreError>> {
            Box::pin(async move {
                self.check().await?;
                if self.lease.lock().unwrap().is_some() {
                    return Err(StoreError::Conflict);
                }
                Ok(self.put(r.clone()))
            })
        }
        fn update<'a>(
            &'a self,
            r: &'a Record,
            rv: &'a str,
        ) -> BoxFuture<'a, Result<Observed, StoreError>> {
            Box::pin(async move {
                self.check().await?;
                let current = self.lease.lock().unwrap().clone();
                match current {
                    Some(o) if o.resource_version == rv => Ok(self.put(r.clone())),
                    _ => Err(StoreError::Conflict),
                }
            })
        }
    }

    fn config(identity: &str) -> Config {
        Config {
            namespace: "regbroker".into(),
            name: "regbroker".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn elector(identity: &str, store: &Arc<FakeStore>, clock: &ManualClock) -> Elector {
        Elector::new(config(identity), store.clone(), Arc::new(clock.clone()))
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[tokio::test]
    async fn absent_lease_is_created_and_held() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let mut a = elector("a", &store, &clock);
        assert_eq!(a.try_acquire_or_renew(Instant::now()).await, Round::Held);
        let r = store.record();
        assert_eq!(r.holder, "a");
        assert_eq!(r.lease_duration_seconds, 15);
        assert_eq!(r.transitions, 0);
        assert_eq!(r.acquire_time, Some(clock.now()));
    }

    #[tokio::test]
    async fn another_holders_lease_is_judged_by_local_observation_not_its_timestamps() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        // The holder's clock is an hour behind ours: its renewTime looks long expired.
        store.put(Record {
            holder: "a".into(),
            lease_duration_seconds: 15,
            renew_time: Some(clock.now() - secs(3600)),
            acquire_time: Some(clock.now() - secs(3600)),
            transitions: 4,
        });
        let mut b = explicit(config("b"), &store, &clock);
        let t0 = Instant::now();
        assert_eq!(
            round_at(&mut b, t0).await,
            Round::HeldBy("a".into()),
            "first seen now: held for a lease duration from now"
        );
        // Unchanged record: still held just before t0 + 15 s, free at t0 + 15 s.
        assert_eq!(
            round_at(&mut b, t0 + secs(14)).await,
            Round::HeldBy("a".into())
        );
        // A renewal (any change) restarts the local count, whatever its timestamps say.
        let mut r = store.record();
        r.renew_time = Some(clock.now() + secs(7200));
        store.put(r);
        assert_eq!(
            round_at(&mut b, t0 + secs(16)).await,
            Round::HeldBy("a".into())
        );
        assert_eq!(
            round_at(&mut b, t0 + secs(30)).await,
            Round::HeldBy("a".into())
        );
        assert_eq!(round_at(&mut b, t0 + secs(31)).await, Round::Held);
        let r = store.record();
        assert_eq!(r.holder, "b");
        assert_eq!(r.transitions, 5, "a takeover bumps leaseTransitions");
        assert_eq!(r.acquire_time, Some(clock.now()), "and sets acquireTime");
    }

    thread_local! {
        /// The local monotonic clock of the electors made with [`explicit`]: the tests
        /// set it to the instant each store call is answered.
        static NOW: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }

    fn explicit_now() -> Instant {
        NOW.with(|n| n.get())
            .expect("the test sets the instant first")
    }

    fn set_now(t: Instant) {
        NOW.with(|n| n.set(Some(t)));
    }

    /// One round starting at `t`, every call of it answered at once (at `t`).
    async fn round_at(e: &mut Elector, t: Instant) -> Round {
        set_now(t);
        e.try_acquire_or_renew(t).await
    }

    /// An elector on `config` whose every observation is dated by [`set_now`].
    fn explicit(config: Config, store: &Arc<FakeStore>, clock: &ManualClock) -> Elector {
        Elector::new(config, store.clone(), Arc::new(clock.clone())).with_instant(explicit_now)
    }

    /// Issue 30, finding 1. Leader `a` renews while follower `b`'s read is under way; the
    /// read returns that renewal. `a` is then cut off. `b` must not take over (nor so
    /// start writing) before `a`'s write deadline: it dates what it saw from when its read
    /// returned, not from when its round started. Returns (a's write deadline, the first
    /// instant, probed every 100 ms, at which b takes over).
    async fn takeover_after_a_slow_read(
        config: Config,
        b_round: Duration,
        a_renews: Duration,
        answered: Duration,
    ) -> (Instant, Instant) {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let start = Instant::now();
        let t0 = start + secs(20);
        let mut a = explicit(
            Config {
                identity: "a".into(),
                ..config.clone()
            },
            &store,
            &clock,
        );
        let mut b = explicit(
            Config {
                identity: "b".into(),
                ..config
            },
            &store,
            &clock,
        );
        // a leads; b has followed it for a while.
        set_now(start);
        assert_eq!(round_at(&mut a, start).await, Round::Held);
        a.start_leading(start);
        assert_eq!(round_at(&mut b, start).await, Round::HeldBy("a".into()));
        set_now(t0);
        assert_eq!(round_at(&mut a, t0).await, Round::Held);
        a.leadership.renewed(t0);
        assert_eq!(round_at(&mut b, t0).await, Round::HeldBy("a".into()));

        // b starts a round; its read is answered only after a's next renewal.
        let (answer, slow) = tokio::sync::oneshot::channel();
        *store.slow_read.lock().unwrap() = Some(slow);
        let started = t0 + b_round;
        set_now(started);
        let round = tokio::spawn(async move {
            let r = round_at(&mut b, started).await;
            (b, r)
        });
        tokio::task::yield_now().await;
        let renewal = t0 + a_renews;
        set_now(renewal);
        assert_eq!(round_at(&mut a, renewal).await, Round::Held);
        a.leadership.renewed(renewal);
        set_now(t0 + answered);
        answer.send(()).unwrap();
        let (mut b, r) = round.await.unwrap();
        assert_eq!(r, Round::HeldBy("a".into()), "a had just renewed");

        // a is cut off from here on: no more renewals. b tries every 100 ms.
        let a_deadline = a.leadership().write_deadline().unwrap();
        let mut t = t0 + answered;
        loop {
            t += Duration::from_millis(100);
            set_now(t);
            if round_at(&mut b, t).await == Round::Held {
                return (a_deadline, t);
            }
            assert!(t < t0 + secs(120), "b never took over");
        }
    }

    #[tokio::test]
    async fn a_renewal_seen_by_a_slow_read_counts_from_when_the_read_returned() {
        // The issue's scenario with the defaults (15 s / 10 s / 2 s): b's round starts at
        // T0, a renews at T0 + 9 s, b's read returns at T0 + 9.5 s. a may write until
        // T0 + 19 s; b took over at T0 + 15 s before the fix.
        let (a_deadline, b_takes_over) =
            takeover_after_a_slow_read(config("x"), secs(0), secs(9), Duration::from_millis(9500))
                .await;
        assert!(
            b_takes_over >= a_deadline,
            "b took over {:?} before a's write deadline",
            a_deadline - b_takes_over
        );
    }

    #[tokio::test]
    async fn one_slow_read_cannot_make_two_leaders_with_the_shortest_lease_allowed() {
        // 11 s / 10 s: the smallest margin validation accepts. b's round starts at T0 + 1 s,
        // a renews at T0 + 5 s, the read returns at T0 + 6 s (less than half the renew
        // deadline, the call timeout). Before the fix b took over at T0 + 12 s, a wrote
        // until T0 + 15 s.
        let tight = Config {
            lease_duration: secs(11),
            ..config("x")
        };
        assert_eq!(tight.validate(), Ok(()));
        let (a_deadline, b_takes_over) =
            takeover_after_a_slow_read(tight, secs(1), secs(5), secs(6)).await;
        assert!(
            b_takes_over >= a_deadline + MIN_MARGIN,
            "b took over {:?} after a's write deadline; the margin is {MIN_MARGIN:?}",
            b_takes_over.checked_duration_since(a_deadline)
        );
        // And b takes over once the lease duration has passed since the read returned.
        assert!(
            b_takes_over <= a_deadline + secs(2),
            "{:?}",
            b_takes_over - a_deadline
        );
    }

    #[tokio::test]
    async fn a_lease_duration_beyond_the_clock_never_expires_and_does_not_panic() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        store.put(Record {
            holder: "a".into(),
            lease_duration_seconds: i32::MAX,
            ..Record::default()
        });
        let mut b = elector("b", &store, &clock);
        let t0 = Instant::now();
        assert_eq!(b.try_acquire_or_renew(t0).await, Round::HeldBy("a".into()));
        assert_eq!(
            b.try_acquire_or_renew(t0 + secs(86_400)).await,
            Round::HeldBy("a".into())
        );
    }

    #[tokio::test]
    async fn renewal_keeps_acquire_time_and_transitions() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let mut a = elector("a", &store, &clock);
        let t0 = Instant::now();
        assert_eq!(a.try_acquire_or_renew(t0).await, Round::Held);
        let first = store.record();
        clock.advance(secs(2));
        assert_eq!(a.try_acquire_or_renew(t0 + secs(2)).await, Round::Held);
        let renewed = store.record();
        assert_eq!(renewed.acquire_time, first.acquire_time);
        assert_eq!(renewed.transitions, first.transitions);
        assert_eq!(renewed.renew_time, Some(clock.now()));
        assert!(renewed.renew_time > first.renew_time);
    }

    #[tokio::test]
    async fn a_write_on_a_stale_version_loses_the_round() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let mut a = explicit(config("a"), &store, &clock);
        let mut b = explicit(config("b"), &store, &clock);
        let t0 = Instant::now();
        // Both see the same expired lease of a third replica.
        store.put(Record {
            holder: "c".into(),
            lease_duration_seconds: 15,
            ..Record::default()
        });
        assert_eq!(round_at(&mut a, t0).await, Round::HeldBy("c".into()));
        assert_eq!(round_at(&mut b, t0).await, Round::HeldBy("c".into()));
        let stale = store.lease.lock().unwrap().clone().unwrap();
        assert_eq!(round_at(&mut a, t0 + secs(15)).await, Round::Held);
        // b's update carries the version it read before a's write: 409, b does not lead.
        let mut theirs = stale.record.clone();
        theirs.holder = "b".into();
        assert!(matches!(
            store.update(&theirs, &stale.resource_version).await,
            Err(StoreError::Conflict)
        ));
        assert_eq!(
            round_at(&mut b, t0 + secs(15)).await,
            Round::HeldBy("a".into())
        );
        assert_eq!(store.record().holder, "a");
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_at_the_next_round() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let mut a = elector("a", &store, &clock);
        let mut b = elector("b", &store, &clock);
        let t0 = Instant::now();
        assert_eq!(a.try_acquire_or_renew(t0).await, Round::Held);
        a.start_leading(t0);
        assert_eq!(b.try_acquire_or_renew(t0).await, Round::HeldBy("a".into()));
        assert!(a.release().await);
        assert!(!a.leadership().may_write_at(t0), "released: no more writes");
        let released = store.record();
        assert_eq!(released.holder, "");
        assert_eq!(released.lease_duration_seconds, 1);
        assert_eq!(b.try_acquire_or_renew(t0 + secs(1)).await, Round::Held);
        assert_eq!(store.record().transitions, 1);
        // A replica that does not hold it releases nothing.
        assert!(!a.release().await);
        assert_eq!(store.record().holder, "b");
    }

    #[test]
    fn may_write_is_false_from_the_renew_deadline_on() {
        let l = Leadership::new("a".into(), secs(10));
        let t0 = Instant::now();
        assert!(!l.may_write_at(t0), "not leading yet");
        l.start_term(t0);
        assert!(l.may_write_at(t0 + secs(9)));
        assert!(!l.may_write_at(t0 + secs(10)));
        l.renewed(t0 + secs(8));
        assert!(l.may_write_at(t0 + secs(17)));
        assert!(!l.may_write_at(t0 + secs(18)));
        l.stop();
        assert!(!l.may_write_at(t0 + secs(9)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_stops_leading_at_the_renew_deadline() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let metrics = Arc::new(Metrics::new());
        let running = elector("a", &store, &clock)
            .with_metrics(metrics.clone())
            .spawn();
        let l = running.leadership();
        let mut terms = l.terms();
        terms.changed().await.unwrap();
        let acquired = Instant::now();
        assert!(l.may_write());
        assert!(metrics.encode().contains("regbroker_leader 1"));
        // Renewals succeed for a while: still leading after several renew deadlines.
        tokio::time::sleep(secs(25)).await;
        assert!(l.may_write());
        // Then every call hangs (a partition): writes stop by the renew deadline after
        // the last successful renewal, which started at most a retry period ago.
        store
            .hanging
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let cut = Instant::now();
        while l.may_write() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stopped = Instant::now();
        assert!(stopped - cut <= secs(10), "{:?}", stopped - cut);
        assert!(stopped - cut >= secs(8), "{:?}", stopped - cut);
        assert!(acquired < cut);
        // The gauge follows once the loop notices (it times out at the same deadline).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let text = metrics.encode();
        assert!(text.contains("regbroker_leader 0"), "{text}");
        assert!(
            text.contains(r#"regbroker_leader_transitions_total{to="follower"} 1"#),
            "{text}"
        );
        store
            .hanging
            .store(false, std::sync::atomic::Ordering::SeqCst);
        running.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_releases_the_lease_and_a_follower_takes_over_within_a_retry_period() {
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let a = elector("a", &store, &clock).spawn();
        let mut a_terms = a.leadership().terms();
        a_terms.changed().await.unwrap();
        let b = elector("b", &store, &clock).spawn();
        let b_lead = b.leadership();
        let mut b_terms = b_lead.terms();
        tokio::time::sleep(secs(20)).await;
        assert!(!b_lead.may_write(), "b follows while a renews");
        let stopped = Instant::now();
        a.shutdown().await;
        assert_eq!(store.record().holder, "", "released");
        b_terms.changed().await.unwrap();
        let took = Instant::now() - stopped;
        assert!(
            took <= secs(2).mul_f64(1.0 + JITTER_FACTOR),
            "took {took:?}"
        );
        assert!(b_lead.may_write());
        assert!(store.record().holder == "b");
        b.shutdown().await;
    }

    #[tokio::test]
    async fn release_works_when_our_last_renewal_landed_unseen() {
        // A renewal whose call timed out here may still have been applied: the version
        // we hold is then stale. Release reads again and still hands the Lease over.
        let store = Arc::new(FakeStore::default());
        let clock = ManualClock::fixed();
        let mut a = elector("a", &store, &clock);
        assert_eq!(a.try_acquire_or_renew(Instant::now()).await, Round::Held);
        let mut landed = store.record();
        landed.renew_time = Some(clock.now() + secs(1));
        store.put(landed);
        assert!(a.release().await, "released despite the stale version");
        assert_eq!(store.record().holder, "");
        // And a replica that no longer holds it never releases another's Lease.
        let mut b = elector("b", &store, &clock);
        assert_eq!(b.try_acquire_or_renew(Instant::now()).await, Round::Held);
        assert!(!a.release().await);
        assert_eq!(store.record().holder, "b");
    }

    #[test]
    fn durations_must_be_ordered_as_client_go_requires() {
        let ok = config("a");
        assert_eq!(ok.validate(), Ok(()));
        let with = |ld: f64, rd: f64, rp: f64| Config {
            lease_duration: Duration::from_secs_f64(ld),
            renew_deadline: Duration::from_secs_f64(rd),
            retry_period: Duration::from_secs_f64(rp),
            ..config("a")
        };
        assert_eq!(with(4.0, 3.0, 0.5).validate(), Ok(()));
        assert_eq!(with(12.0, 10.0, 2.0).validate(), Ok(()));
        assert_eq!(
            with(11.0, 10.0, 2.0).validate(),
            Ok(()),
            "exactly the margin"
        );
        for (ld, rd, rp) in [
            (10.0, 10.0, 2.0),
            (9.0, 10.0, 2.0),
            // Less than MIN_MARGIN between the lease duration and the renew deadline.
            (11.0, 10.5, 2.0),
            (4.0, 3.001, 0.5),
            (15.0, 2.4, 2.0),
            (15.0, 10.0, 0.0),
            (15.5, 10.0, 2.0),
        ] {
            let e = with(ld, rd, rp).validate().unwrap_err();
            assert!(e.contains("--leader-elect-"), "{e}");
        }
    }

    #[test]
    fn identities_are_the_base_and_a_random_suffix() {
        let a = identity("regbroker-7d9f-x2");
        let b = identity("regbroker-7d9f-x2");
        assert!(a.starts_with("regbroker-7d9f-x2_"), "{a}");
        assert_ne!(a, b);
        assert!(identity("").starts_with("regbroker_"));
    }
}
