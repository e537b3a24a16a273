//! The credential health series, computed at each scrape from what the sinks and the
//! RegistryCredential controller hold, so that a series exists exactly while its subject
//! does: a sink this replica stopped writing (another replica leads) loses its expiry
//! series, a deleted object loses its series at once, and a term as leader that ended
//! takes its objects' series with it.
//!
//! Cardinality is what the operator configured (sinks and their registries) and what
//! tenants created (objects, at most [`MAX_REGISTRIES`](crate::controller::api::MAX_REGISTRIES)
//! registries each), never what a client sends. No series holds a credential, a token or
//! anything derived from one: names, times and condition words only.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::sinks::status::{Sinks, State};

/// The condition types of a RegistryCredential, in the order they are reported.
pub const CONDITION_TYPES: [&str; 3] = ["Ready", "Reconciling", "Stalled"];
/// The values a condition's status takes; each gets a series, 1 for the current one.
const STATUSES: [&str; 3] = ["True", "False", "Unknown"];

/// Objects reported at each scrape: the RegistryCredential controller while it leads.
pub trait Tenants: Send + Sync {
    /// The health of each object kept.
    fn health(&self) -> Vec<TenantHealth>;
}

/// One RegistryCredential's health.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantHealth {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The Secret it keeps, `secret/NAMESPACE/NAME`: the `sink` label.
    pub sink: String,
    /// Per condition type of [`CONDITION_TYPES`], its status (`True`, `False`,
    /// `Unknown`) and reason; an absent condition is `False` (kstatus), except `Ready`,
    /// `Unknown` until a status says.
    pub conditions: [(&'static str, String); 3],
    /// The expiry of each credential the Secret holds (those that expire).
    pub expiries: Vec<(String, SystemTime)>,
    /// Registries of the spec the Secret holds no fresh credential for.
    pub failed_registries: usize,
    /// When a look last found the Secret holding every registry, fresh.
    pub last_success: Option<SystemTime>,
    /// When a look last failed to (a fetch failed, or the object is Stalled).
    pub last_failure: Option<SystemTime>,
}

/// Leader election: not configured, following, leading.
const NO_ELECTION: u8 = 0;
const FOLLOWING: u8 = 1;
const LEADING: u8 = 2;

/// The collector registered in [`Metrics`](super::Metrics).
pub(super) struct Health {
    sinks: Arc<Sinks>,
    leader: AtomicU8,
    tenants: Mutex<Option<Weak<dyn Tenants>>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}

impl Health {
    pub(super) fn new(sinks: Arc<Sinks>) -> Health {
        Health {
            sinks,
            leader: AtomicU8::new(NO_ELECTION),
            tenants: Mutex::new(None),
        }
    }

    pub(super) fn set_tenants(&self, tenants: Weak<dyn Tenants>) {
        *self.tenants.lock().unwrap_or_else(|p| p.into_inner()) = Some(tenants);
    }

    pub(super) fn leader_election(&self) {
        let _ = self.leader.compare_exchange(
            NO_ELECTION,
            FOLLOWING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(super) fn set_leading(&self, leading: bool) {
        self.leader
            .store(if leading { LEADING } else { FOLLOWING }, Ordering::Release);
    }

    fn tenants(&self) -> Vec<TenantHealth> {
        let weak = self
            .tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        weak.and_then(|w| w.upgrade())
            .map(|t| t.health())
            .unwrap_or_default()
    }
}

/// Seconds since the Unix epoch, 0 for `None` (never) or a time before it.
fn unix(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// One gauge family of the collector: its name (after the prefix), help, and series.
struct Gauges<'a> {
    name: &'static str,
    help: &'static str,
    series: Vec<(Vec<(&'static str, &'a str)>, i64)>,
}

impl<'a> Gauges<'a> {
    fn new(name: &'static str, help: &'static str) -> Self {
        Gauges {
            name,
            help,
            series: Vec::new(),
        }
    }

    fn push(&mut self, labels: Vec<(&'static str, &'a str)>, value: i64) {
        self.series.push((labels, value));
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        if self.series.is_empty() {
            return Ok(());
        }
        let mut family =
            encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        for (labels, value) in &self.series {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

impl Collector for Health {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let sinks = self.sinks.snapshot();
        let tenants = self.tenants();
        let mut expiry = Gauges::new(
            "credential_expiry_timestamp_seconds",
            "Unix time the credential a sink holds for a registry expires (credentials that expire, in sinks this replica writes)",
        );
        let mut success = Gauges::new(
            "sink_last_success_timestamp_seconds",
            "Unix time a pass (a look, for a RegistryCredential's Secret) last found every registry of the sink fetched and written; 0 until then",
        );
        let mut failure = Gauges::new(
            "sink_last_failure_timestamp_seconds",
            "Unix time a pass (a look, for a RegistryCredential's Secret) last missed a registry of the sink or could not write it; 0 until then",
        );
        let mut never = Gauges::new(
            "sink_never_written",
            "1 while this replica should write the sink and no pass has written every registry of it since start, else 0 (also 0 on a replica that does not lead); not for RegistryCredential Secrets",
        );
        let mut failed = Gauges::new(
            "sink_failed_registries",
            "Registries of the sink whose fetch failed in its last pass (0 on a replica that does not lead)",
        );
        let mut conditions = Gauges::new(
            "registry_credential_condition",
            "A RegistryCredential's condition: 1 for its current status (True, False, Unknown) and reason, 0 for the other statuses",
        );
        let mut leader = Gauges::new(
            "leader",
            "1 while this replica holds the leader election Lease and may write Secrets, else 0; only with leader election",
        );
        for s in &sinks {
            let sink = s.name.as_str();
            let state = s.state();
            success.push(vec![("sink", sink)], unix(s.last_success));
            failure.push(vec![("sink", sink)], unix(s.last_failure));
            never.push(vec![("sink", sink)], i64::from(!state.passes()));
            let n = if state == State::Standby {
                0
            } else {
                s.failed().count()
            };
            failed.push(vec![("sink", sink)], i64::try_from(n).unwrap_or(i64::MAX));
            if state != State::Standby {
                for (registry, at) in &s.expiries {
                    expiry.push(
                        vec![("sink", sink), ("registry", registry.as_str())],
                        unix(Some(*at)),
                    );
                }
            }
        }
        for t in &tenants {
            let sink = t.sink.as_str();
            success.push(vec![("sink", sink)], unix(t.last_success));
            failure.push(vec![("sink", sink)], unix(t.last_failure));
            failed.push(
                vec![("sink", sink)],
                i64::try_from(t.failed_registries).unwrap_or(i64::MAX),
            );
            for (registry, at) in &t.expiries {
                expiry.push(
                    vec![("sink", sink), ("registry", registry.as_str())],
                    unix(Some(*at)),
                );
            }
            for (type_, (status, reason)) in CONDITION_TYPES.iter().zip(&t.conditions) {
                for s in STATUSES {
                    conditions.push(
                        vec![
                            ("namespace", t.namespace.as_str()),
                            ("name", t.name.as_str()),
                            ("type", type_),
                            ("status", s),
                            ("reason", reason.as_str()),
                        ],
                        i64::from(*status == s),
                    );
                }
            }
        }
        match self.leader.load(Ordering::Acquire) {
            NO_ELECTION => {}
            l => leader.push(Vec::new(), i64::from(l == LEADING)),
        }
        for g in [
            &expiry,
            &success,
            &failure,
            &never,
            &failed,
            &conditions,
            &leader,
        ] {
            g.encode(&mut encoder)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use regbroker_provider::Registry;

    use super::*;
    use crate::metrics::Metrics;
    use crate::sinks::status::{Kind, Pass};

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn reg(h: &str) -> Registry {
        Registry::parse(h).unwrap()
    }

    fn lines(m: &Metrics, name: &str) -> Vec<String> {
        let full = format!("regbroker_{name}");
        m.encode()
            .lines()
            .filter(|l| l.starts_with(&format!("{full}{{")) || l.starts_with(&format!("{full} ")))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_sink_reports_what_it_holds_until_another_replica_writes_it() {
        let m = Metrics::new();
        let sink = "secret/apps/pull";
        m.sink_registered(sink, Kind::Secret);
        assert_eq!(
            lines(&m, "sink_last_failure_timestamp_seconds"),
            [r#"regbroker_sink_last_failure_timestamp_seconds{sink="secret/apps/pull"} 0"#]
        );
        assert!(lines(&m, "credential_expiry_timestamp_seconds").is_empty());

        let ran = |ok: bool, write_error, expiries| Pass::Ran {
            registries: vec![
                (reg("a.example.com"), "ok"),
                (
                    reg("b.example.com"),
                    if ok { "ok" } else { "upstream_unavailable" },
                ),
            ],
            write_error,
            expiries,
        };
        m.sink_pass(
            sink,
            Kind::Secret,
            ran(true, None, vec![(reg("a.example.com"), at(5_000))]),
            at(1_000),
        );
        assert_eq!(
            lines(&m, "credential_expiry_timestamp_seconds"),
            [
                r#"regbroker_credential_expiry_timestamp_seconds{sink="secret/apps/pull",registry="a.example.com"} 5000"#
            ]
        );
        assert_eq!(
            lines(&m, "sink_last_success_timestamp_seconds"),
            [r#"regbroker_sink_last_success_timestamp_seconds{sink="secret/apps/pull"} 1000"#]
        );

        // A failed fetch: the failure is dated; what the Secret holds is what was written.
        m.sink_pass(
            sink,
            Kind::Secret,
            ran(false, None, vec![(reg("a.example.com"), at(6_000))]),
            at(1_100),
        );
        assert_eq!(
            lines(&m, "sink_last_failure_timestamp_seconds"),
            [r#"regbroker_sink_last_failure_timestamp_seconds{sink="secret/apps/pull"} 1100"#]
        );
        assert!(lines(&m, "credential_expiry_timestamp_seconds")[0].ends_with(" 6000"));
        // A failed write leaves the Secret, and its series, as they were.
        m.sink_pass(
            sink,
            Kind::Secret,
            ran(
                true,
                Some("api_error"),
                vec![(reg("a.example.com"), at(7_000))],
            ),
            at(1_200),
        );
        assert!(lines(&m, "credential_expiry_timestamp_seconds")[0].ends_with(" 6000"));
        assert!(lines(&m, "sink_last_failure_timestamp_seconds")[0].ends_with(" 1200"));

        // Another replica leads: this one no longer speaks for what the Secret holds.
        m.sink_pass(sink, Kind::Secret, Pass::Standby, at(1_300));
        assert!(lines(&m, "credential_expiry_timestamp_seconds").is_empty());
        assert_eq!(
            lines(&m, "sink_failed_registries"),
            [r#"regbroker_sink_failed_registries{sink="secret/apps/pull"} 0"#]
        );
    }

    #[test]
    fn the_leader_series_exists_only_with_leader_election() {
        let m = Metrics::new();
        assert!(lines(&m, "leader").is_empty());
        m.leader_election();
        assert_eq!(lines(&m, "leader"), ["regbroker_leader 0"]);
        m.leader_transition(true);
        assert_eq!(lines(&m, "leader"), ["regbroker_leader 1"]);
        // A second elector's start does not reset a leader.
        m.leader_election();
        assert_eq!(lines(&m, "leader"), ["regbroker_leader 1"]);
        m.leader_transition(false);
        assert_eq!(lines(&m, "leader"), ["regbroker_leader 0"]);
    }

    struct Fixed(Vec<TenantHealth>);

    impl Tenants for Fixed {
        fn health(&self) -> Vec<TenantHealth> {
            self.0.clone()
        }
    }

    #[test]
    fn tenants_are_reported_while_their_term_lives() {
        let m = Metrics::new();
        let t = TenantHealth {
            namespace: "team-a".into(),
            name: "ecr".into(),
            sink: "secret/team-a/ecr-pull".into(),
            conditions: [
                ("False", "UpstreamUnavailable".into()),
                ("True", "ProgressingWithRetry".into()),
                ("False", String::new()),
            ],
            expiries: vec![("1.dkr.ecr.eu-west-1.amazonaws.com".into(), at(9_000))],
            failed_registries: 1,
            last_success: Some(at(100)),
            last_failure: Some(at(200)),
        };
        let tenants: Arc<dyn Tenants> = Arc::new(Fixed(vec![t]));
        m.report_tenants(Arc::downgrade(&tenants));
        let text = m.encode();
        for want in [
            r#"regbroker_credential_expiry_timestamp_seconds{sink="secret/team-a/ecr-pull",registry="1.dkr.ecr.eu-west-1.amazonaws.com"} 9000"#,
            r#"regbroker_sink_last_success_timestamp_seconds{sink="secret/team-a/ecr-pull"} 100"#,
            r#"regbroker_sink_last_failure_timestamp_seconds{sink="secret/team-a/ecr-pull"} 200"#,
            r#"regbroker_sink_failed_registries{sink="secret/team-a/ecr-pull"} 1"#,
            r#"regbroker_registry_credential_condition{namespace="team-a",name="ecr",type="Ready",status="False",reason="UpstreamUnavailable"} 1"#,
            r#"regbroker_registry_credential_condition{namespace="team-a",name="ecr",type="Ready",status="True",reason="UpstreamUnavailable"} 0"#,
            r#"regbroker_registry_credential_condition{namespace="team-a",name="ecr",type="Reconciling",status="True",reason="ProgressingWithRetry"} 1"#,
            r#"regbroker_registry_credential_condition{namespace="team-a",name="ecr",type="Stalled",status="False",reason=""} 1"#,
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert_eq!(lines(&m, "registry_credential_condition").len(), 9);
        // The term ends (this replica stops leading): its objects go with it.
        drop(tenants);
        assert!(lines(&m, "registry_credential_condition").is_empty());
        assert!(lines(&m, "credential_expiry_timestamp_seconds").is_empty());
    }
}
