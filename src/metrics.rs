//! Prometheus metrics. Labels hold only route templates, status codes, provider names,
//! outcome words, the names of the sinks (`docker-config`, `secret/NAMESPACE/NAME`), and,
//! in the health series ([`health`]), the registries and RegistryCredential objects the
//! operator or tenants configured: never a registry secret, and never a raw path or a
//! registry name a client sent (unbounded cardinality).

pub mod health;

use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::broker::providers::KNOWN;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    provider: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

fn latency_histogram() -> Histogram {
    // 5 ms .. ~10 s: cloud token exchanges.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.0, 12,
    ))
}

/// All of regbroker's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    cache: Family<ResultLabels, Counter>,
    cache_refreshes: Family<ResultLabels, Counter>,
    fetches_dropped: Family<ResultLabels, Counter>,
    served: Family<SourceLabels, Counter>,
    upstream: Family<UpstreamLabels, Counter>,
    upstream_seconds: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    static_reloads: Family<ResultLabels, Counter>,
    /// Registries with a static credential.
    pub static_entries: Gauge,
    /// Each provider's last fetch (outcome code and time), for `GET /v1/providers`.
    pub last_fetches: crate::broker::status::LastFetches,
    leader_transitions: Family<TransitionLabels, Counter>,
    sink_writes: Family<KindLabels, Counter>,
    registry_checks: Family<ResultLabels, Counter>,
    /// Each sink's record since start, for `/readyz?verbose`, `GET /v1/providers` and
    /// the `regbroker_sink_*` and `regbroker_credential_*` series.
    pub sinks: Arc<crate::sinks::status::Sinks>,
    health: Arc<health::Health>,
    hot: Hot,
}

/// The counters every answered credential request increments, each taken from its family
/// once, on first use: a cache hit then adds to an atomic, rather than taking the family's
/// lock and hashing its labels three times. The series appear when first counted, as
/// before, and the families are never cleared, so a handle stays the series' own.
#[derive(Debug, Default)]
struct Hot {
    credentials_ok: OnceLock<Counter>,
    cache_hit: OnceLock<Counter>,
    served: [OnceLock<Counter>; HOT_SOURCES],
}

/// The sources whose `credentials_served` counter has a handle in [`Hot`]: `static`
/// (slot 0), then every provider regbroker knows, in [`KNOWN`] order.
const HOT_SOURCES: usize = 1 + KNOWN.len();

/// `source`'s slot in [`Hot::served`].
fn hot_slot(source: &str) -> Option<usize> {
    if source == "static" {
        return Some(0);
    }
    KNOWN.iter().position(|s| *s == source).map(|i| i + 1)
}

/// `labels`' counter in `family`, through its handle in `slot`.
fn hot<'a, L>(slot: &'a OnceLock<Counter>, family: &Family<L, Counter>, labels: &L) -> &'a Counter
where
    L: Clone + std::hash::Hash + Eq,
{
    slot.get_or_init(|| family.get_or_create(labels).clone())
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric under the `regbroker_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("regbroker");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route template and status code",
            requests.clone(),
        );
        let cache = Family::<ResultLabels, Counter>::default();
        registry.register(
            "cache_lookups",
            "Credential cache lookups by result (hit, miss, refresh_ahead, refresh, stale)",
            cache.clone(),
        );
        let cache_refreshes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "cache_refreshes",
            "Refreshes of a cached credential by result (started, ok, failed)",
            cache_refreshes.clone(),
        );
        let fetches_dropped = Family::<ResultLabels, Counter>::default();
        registry.register(
            "fetches_dropped",
            "Upstream fetches not made, by reason (overloaded: the queue was full; abandoned: every waiting client gave up while it was queued)",
            fetches_dropped.clone(),
        );
        let served = Family::<SourceLabels, Counter>::default();
        registry.register(
            "credentials_served",
            "Credentials served by source (static or provider name)",
            served.clone(),
        );
        let upstream = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "upstream_requests",
            "Upstream credential exchanges by provider and outcome",
            upstream.clone(),
        );
        let upstream_seconds =
            Family::<ProviderLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "upstream_request_duration_seconds",
            "Upstream credential exchange latency by provider",
            upstream_seconds.clone(),
        );
        let static_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "static_reloads",
            "Reloads of static docker config sources by result (ok, error)",
            static_reloads.clone(),
        );
        let static_entries = Gauge::default();
        registry.register(
            "static_entries",
            "Registries with a static credential",
            static_entries.clone(),
        );
        let leader_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "leader_transitions",
            "Times this replica started (to=leader) or stopped (to=follower) leading",
            leader_transitions.clone(),
        );
        let sink_writes = Family::<KindLabels, Counter>::default();
        registry.register(
            "sink_writes",
            "Writes of a sink that changed it, by kind (docker_config, secret, registry_credential: a RegistryCredential's Secret)",
            sink_writes.clone(),
        );
        let registry_checks = Family::<ResultLabels, Counter>::default();
        registry.register(
            "registry_checks",
            "Checks of a fetched credential with its registry before a sink writes it, by result (accepted, refused, skipped: the registry could not say)",
            registry_checks.clone(),
        );
        let sinks = Arc::new(crate::sinks::status::Sinks::default());
        let health = Arc::new(health::Health::new(sinks.clone()));
        registry.register_collector(Box::new(health.clone()));
        Metrics {
            registry,
            requests,
            cache,
            cache_refreshes,
            fetches_dropped,
            served,
            upstream,
            upstream_seconds,
            static_reloads,
            static_entries,
            last_fetches: Default::default(),
            leader_transitions,
            sink_writes,
            registry_checks,
            sinks,
            health,
            hot: Hot::default(),
        }
    }

    /// Registers a sink (pending: never written), so it is reported before its first
    /// pass finishes.
    pub fn sink_registered(&self, name: &str, kind: crate::sinks::status::Kind) {
        self.sinks.register(name, kind);
    }

    /// Records a sink's pass that finished at `at` (broker clock).
    pub fn sink_pass(
        &self,
        name: &str,
        kind: crate::sinks::status::Kind,
        pass: crate::sinks::status::Pass,
        at: std::time::SystemTime,
    ) {
        self.sinks.record(name, kind, pass, at);
    }

    /// Reports the objects `tenants` keeps at each scrape while it lives (the
    /// RegistryCredential controller, for its term as leader).
    pub fn report_tenants(&self, tenants: std::sync::Weak<dyn health::Tenants>) {
        self.health.set_tenants(tenants);
    }

    /// Makes `regbroker_leader` appear (0 until this replica leads): only replicas that
    /// take part in leader election have it.
    pub fn leader_election(&self) {
        self.health.leader_election();
    }

    /// Records that this replica started (`leading`) or stopped leading.
    pub fn leader_transition(&self, leading: bool) {
        self.health.set_leading(leading);
        let to = if leading { "leader" } else { "follower" };
        self.leader_transitions
            .get_or_create(&TransitionLabels { to })
            .inc();
    }

    /// Counts a write that changed a sink of `kind`.
    pub fn sink_write(&self, kind: &'static str) {
        self.sink_writes.get_or_create(&KindLabels { kind }).inc();
    }

    /// Counts a registry check (`accepted`, `refused`, `skipped`).
    pub fn registry_check(&self, result: &'static str) {
        self.registry_checks
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts an HTTP request.
    pub fn http_request(&self, route: &'static str, status: u16) {
        let labels = RequestLabels { route, status };
        if route == "/v1/credentials" && status == 200 {
            hot(&self.hot.credentials_ok, &self.requests, &labels).inc();
        } else {
            self.requests.get_or_create(&labels).inc();
        }
    }

    /// Counts a cache lookup.
    pub fn cache_lookup(&self, result: &'static str) {
        let labels = ResultLabels { result };
        if result == "hit" {
            hot(&self.hot.cache_hit, &self.cache, &labels).inc();
        } else {
            self.cache.get_or_create(&labels).inc();
        }
    }

    /// Counts a refresh of a cached credential: `started`, then `ok` or `failed`.
    pub fn cache_refresh(&self, result: &'static str) {
        self.cache_refreshes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts an upstream fetch not made (`overloaded`, `abandoned`).
    pub fn fetch_dropped(&self, result: &'static str) {
        self.fetches_dropped
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts a credential served.
    pub fn credential_served(&self, source: &'static str) {
        let labels = SourceLabels { source };
        match hot_slot(source) {
            Some(i) => hot(&self.hot.served[i], &self.served, &labels).inc(),
            None => self.served.get_or_create(&labels).inc(),
        };
    }

    /// Records one upstream exchange.
    pub fn upstream_call(&self, provider: &'static str, outcome: &'static str, seconds: f64) {
        self.upstream
            .get_or_create(&UpstreamLabels { provider, outcome })
            .inc();
        self.upstream_seconds
            .get_or_create(&ProviderLabels { provider })
            .observe(seconds);
    }

    /// Counts a static reload.
    pub fn static_reload(&self, result: &'static str) {
        self.static_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The exposition in the Prometheus text format (version 0.0.4), for clients that do
    /// not ask for OpenMetrics (`promtool check metrics`, `curl`).
    pub fn encode_text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_has_its_own_hot_slot() {
        let slots: Vec<Option<usize>> = std::iter::once("static")
            .chain(KNOWN.iter().copied())
            .map(hot_slot)
            .collect();
        let want: Vec<Option<usize>> = (0..HOT_SOURCES).map(Some).collect();
        assert_eq!(slots, want);
        assert_eq!(hot_slot("none"), None);
    }
}
