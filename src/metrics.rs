//! Prometheus metrics. Labels hold only route templates, status codes, provider names,
//! outcome words and the names of the configured sinks (`docker-config`,
//! `secret/NAMESPACE/NAME`): never a registry secret, and never a raw path or registry
//! name (unbounded cardinality).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
struct SinkLabels {
    sink: String,
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
    /// 1 while this replica holds the leader election Lease (`serve --leader-elect`).
    leader: Gauge,
    leader_transitions: Family<TransitionLabels, Counter>,
    /// Each sink's record since start, for `/readyz?verbose` and `GET /v1/providers`.
    pub sinks: crate::sinks::status::Sinks,
    sink_last_success: Family<SinkLabels, Gauge>,
    sink_never_written: Family<SinkLabels, Gauge>,
    sink_failed_registries: Family<SinkLabels, Gauge>,
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
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader election Lease and may write Secrets, else 0",
            leader.clone(),
        );
        let leader_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "leader_transitions",
            "Times this replica started (to=leader) or stopped (to=follower) leading",
            leader_transitions.clone(),
        );
        let sink_last_success = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "sink_last_success_timestamp_seconds",
            "Unix time a pass last fetched every registry of the sink and wrote it; 0 until then",
            sink_last_success.clone(),
        );
        let sink_never_written = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "sink_never_written",
            "1 while this replica should write the sink and no pass has written every registry of it since start, else 0 (also 0 on a replica that does not lead)",
            sink_never_written.clone(),
        );
        let sink_failed_registries = Family::<SinkLabels, Gauge>::default();
        registry.register(
            "sink_failed_registries",
            "Registries of the sink whose fetch failed in its last pass",
            sink_failed_registries.clone(),
        );
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
            leader,
            leader_transitions,
            sinks: Default::default(),
            sink_last_success,
            sink_never_written,
            sink_failed_registries,
        }
    }

    /// Registers a sink (pending: never written), so it is reported before its first
    /// pass finishes.
    pub fn sink_registered(&self, name: &str, kind: crate::sinks::status::Kind) {
        self.publish_sink(&self.sinks.register(name, kind));
    }

    /// Records a sink's pass that finished at `at` (broker clock).
    pub fn sink_pass(
        &self,
        name: &str,
        kind: crate::sinks::status::Kind,
        pass: crate::sinks::status::Pass,
        at: std::time::SystemTime,
    ) {
        self.publish_sink(&self.sinks.record(name, kind, pass, at));
    }

    fn publish_sink(&self, s: &crate::sinks::status::SinkStatus) {
        use crate::sinks::status::State;
        let labels = SinkLabels {
            sink: s.name.clone(),
        };
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        };
        self.sink_last_success
            .get_or_create(&labels)
            .set(s.last_success.map_or(0, unix));
        let state = s.state();
        self.sink_never_written
            .get_or_create(&labels)
            .set(i64::from(!state.passes()));
        let failed = if state == State::Standby {
            0
        } else {
            s.failed().count()
        };
        self.sink_failed_registries
            .get_or_create(&labels)
            .set(i64::try_from(failed).unwrap_or(i64::MAX));
    }

    /// Records that this replica started (`leading`) or stopped leading.
    pub fn leader_transition(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        let to = if leading { "leader" } else { "follower" };
        self.leader_transitions
            .get_or_create(&TransitionLabels { to })
            .inc();
    }

    /// Counts an HTTP request.
    pub fn http_request(&self, route: &'static str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { route, status })
            .inc();
    }

    /// Counts a cache lookup.
    pub fn cache_lookup(&self, result: &'static str) {
        self.cache.get_or_create(&ResultLabels { result }).inc();
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
        self.served.get_or_create(&SourceLabels { source }).inc();
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

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
