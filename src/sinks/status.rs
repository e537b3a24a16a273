//! What each sink has managed to write since start, for `/readyz?verbose`, the
//! `regbroker_sink_*` metrics and `GET /v1/providers`.
//!
//! A sink (the docker config file, each synced Secret) is *written* by a pass that fetched
//! every registry it should hold and then wrote it (or found it already up to date). A
//! sink with no such pass since start is *never written*: the state a pod stuck on a
//! failing `--sink-registry` is in, which readiness alone used to hide.
//!
//! The store lives in [`Metrics`](crate::metrics::Metrics) beside the providers' last
//! fetches: the broker hands it to every sink and the endpoint already holds it. It holds
//! names, times and codes (`ok`, `upstream_unavailable`, `secret_not_managed`, ...), never
//! a message, a credential or an upstream body.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use regbroker_provider::Registry;

/// What a sink is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The docker config file (`--write-docker-config`).
    DockerConfig,
    /// A Kubernetes Secret (`--sync-secret`, `[[secret]]`).
    Secret,
}

impl Kind {
    /// `docker_config` or `secret`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::DockerConfig => "docker_config",
            Kind::Secret => "secret",
        }
    }
}

/// Where a sink stands, as the endpoint reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No pass has finished yet.
    Pending,
    /// The last pass wrote every registry.
    Written,
    /// Written at least once since start, but the last pass missed a registry or could
    /// not write: what is there may go stale.
    Failing,
    /// Passes ran, none wrote every registry since start.
    NeverWritten,
    /// Another replica leads (leader election) and writes it; this one does not.
    Standby,
}

impl State {
    /// `pending`, `written`, `failing`, `never_written`, `standby`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Written => "written",
            State::Failing => "failing",
            State::NeverWritten => "never_written",
            State::Standby => "standby",
        }
    }

    /// Whether this state passes the readiness check of a sink: everything but a sink
    /// this replica is responsible for and has not written since start.
    pub fn passes(self) -> bool {
        !matches!(self, State::Pending | State::NeverWritten)
    }
}

/// What one pass did to a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pass {
    /// It ran: each registry's fetch outcome (`ok` or an error code), and the write's
    /// error code if the write failed.
    Ran {
        /// Per registry: `ok` or the fetch's error code.
        registries: Vec<(Registry, &'static str)>,
        /// `None`: written or already up to date; else why not (a code).
        write_error: Option<&'static str>,
        /// The expiry of each credential the sink holds once written (those that
        /// expire); ignored when the write failed, as the sink keeps what it held.
        expiries: Vec<(Registry, SystemTime)>,
    },
    /// Not this replica's to write: it does not lead.
    Standby,
}

/// One sink's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkStatus {
    /// `docker-config`, or `secret/NAMESPACE/NAME`: the readiness check's name (after
    /// `sink/`) and the metrics' `sink` label.
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// When its last pass finished (broker clock).
    pub last_attempt: Option<SystemTime>,
    /// When a pass last wrote every registry (broker clock).
    pub last_success: Option<SystemTime>,
    /// When a pass last missed a registry or could not write (broker clock).
    pub last_failure: Option<SystemTime>,
    /// The expiry of each credential the sink holds (those that expire), as the last
    /// pass that wrote left it.
    pub expiries: Vec<(Registry, SystemTime)>,
    /// The last pass's fetch outcome per registry (`ok` or an error code).
    pub registries: Vec<(Registry, &'static str)>,
    /// The last pass's write error code, if its write failed.
    pub write_error: Option<&'static str>,
    /// The last pass found this replica not leading.
    pub standby: bool,
}

impl SinkStatus {
    /// Where it stands.
    pub fn state(&self) -> State {
        if self.standby {
            State::Standby
        } else if self.last_attempt.is_none() {
            State::Pending
        } else if self.last_success.is_none() {
            State::NeverWritten
        } else if self.last_success == self.last_attempt {
            State::Written
        } else {
            State::Failing
        }
    }

    /// Registries whose fetch failed in the last pass.
    pub fn failed(&self) -> impl Iterator<Item = &(Registry, &'static str)> {
        self.registries.iter().filter(|(_, o)| *o != "ok")
    }

    /// One line on why the last pass was not a success (codes and counts only), or
    /// `None` if it was.
    pub fn problem(&self) -> Option<String> {
        let failed: Vec<&'static str> = self.failed().map(|(_, o)| *o).collect();
        let mut parts = Vec::new();
        if !failed.is_empty() {
            let mut codes = failed.clone();
            codes.sort_unstable();
            codes.dedup();
            parts.push(format!(
                "{} of {} registries not fetched ({})",
                failed.len(),
                self.registries.len(),
                codes.join(", ")
            ));
        }
        if let Some(code) = self.write_error {
            parts.push(format!("write failed ({code})"));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// The readiness check line's verdict after `ok` / `failed`: `None` for a plain
    /// `ok`.
    pub fn check_detail(&self) -> Option<String> {
        match self.state() {
            State::Pending => Some("no pass finished yet".into()),
            State::Written => None,
            State::Standby => Some("standby: not leading, another replica writes it".into()),
            State::NeverWritten => Some(format!(
                "never written since start: {}",
                self.problem().unwrap_or_default()
            )),
            State::Failing => Some(format!(
                "written {} ago, last pass: {}",
                self.last_success
                    .zip(self.last_attempt)
                    .and_then(|(s, a)| a.duration_since(s).ok())
                    .map(
                        |d| humantime::format_duration(std::time::Duration::from_secs(d.as_secs()))
                            .to_string()
                    )
                    .unwrap_or_default(),
                self.problem().unwrap_or_default()
            )),
        }
    }
}

/// `name`'s record in `sinks`, added (pending) if absent.
fn entry<'a>(sinks: &'a mut Vec<SinkStatus>, name: &str, kind: Kind) -> &'a mut SinkStatus {
    let at = match sinks.iter().position(|s| s.name == name) {
        Some(i) => i,
        None => {
            sinks.push(SinkStatus {
                name: name.to_string(),
                kind,
                last_attempt: None,
                last_success: None,
                last_failure: None,
                expiries: Vec::new(),
                registries: Vec::new(),
                write_error: None,
                standby: false,
            });
            sinks.len() - 1
        }
    };
    &mut sinks[at]
}

/// Every sink's record, in the order the sinks registered.
#[derive(Debug, Default)]
pub struct Sinks {
    sinks: Mutex<Vec<SinkStatus>>,
    required: AtomicBool,
}

impl Sinks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SinkStatus>> {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes readiness require every sink to have been written since start (or to be on
    /// standby): `serve --ready-requires-sinks`.
    pub fn set_required(&self, required: bool) {
        self.required.store(required, Ordering::Release);
    }

    /// Whether readiness requires the sinks.
    pub fn required(&self) -> bool {
        self.required.load(Ordering::Acquire)
    }

    /// Adds a sink, pending, if it is not there yet; returns its record.
    pub(crate) fn register(&self, name: &str, kind: Kind) -> SinkStatus {
        let mut sinks = self.lock();
        entry(&mut sinks, name, kind).clone()
    }

    /// Records a pass of `name` that finished at `at`; returns the updated record.
    pub(crate) fn record(&self, name: &str, kind: Kind, pass: Pass, at: SystemTime) -> SinkStatus {
        let mut sinks = self.lock();
        let s = entry(&mut sinks, name, kind);
        match pass {
            Pass::Standby => s.standby = true,
            Pass::Ran {
                registries,
                write_error,
                expiries,
            } => {
                s.standby = false;
                s.last_attempt = Some(at);
                if write_error.is_none() && registries.iter().all(|(_, o)| *o == "ok") {
                    s.last_success = Some(at);
                } else {
                    s.last_failure = Some(at);
                }
                if write_error.is_none() {
                    s.expiries = expiries;
                }
                s.registries = registries;
                s.write_error = write_error;
            }
        }
        s.clone()
    }

    /// A copy of every record.
    pub fn snapshot(&self) -> Vec<SinkStatus> {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn r(h: &str) -> Registry {
        Registry::parse(h).unwrap()
    }

    fn ran(outcomes: &[(&str, &'static str)], write_error: Option<&'static str>) -> Pass {
        Pass::Ran {
            registries: outcomes.iter().map(|(h, o)| (r(h), *o)).collect(),
            write_error,
            expiries: Vec::new(),
        }
    }

    #[test]
    fn a_sink_is_never_written_until_a_pass_fetches_every_registry_and_writes() {
        let sinks = Sinks::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        sinks.register("docker-config", Kind::DockerConfig);
        assert_eq!(sinks.snapshot()[0].state(), State::Pending);
        assert!(!State::Pending.passes());

        let s = sinks.record(
            "docker-config",
            Kind::DockerConfig,
            ran(
                &[
                    ("a.example.com", "ok"),
                    ("b.example.com", "upstream_unavailable"),
                ],
                None,
            ),
            t0,
        );
        assert_eq!(s.state(), State::NeverWritten);
        assert!(!s.state().passes());
        assert_eq!(
            s.check_detail().unwrap(),
            "never written since start: 1 of 2 registries not fetched (upstream_unavailable)"
        );
        // Every registry fetched, but the write failed: still never written.
        let s = sinks.record(
            "docker-config",
            Kind::DockerConfig,
            ran(&[("a.example.com", "ok")], Some("write_failed")),
            t0 + Duration::from_secs(5),
        );
        assert_eq!(s.state(), State::NeverWritten);
        assert_eq!(s.problem().unwrap(), "write failed (write_failed)");

        let t1 = t0 + Duration::from_secs(10);
        let s = sinks.record(
            "docker-config",
            Kind::DockerConfig,
            ran(&[("a.example.com", "ok"), ("b.example.com", "ok")], None),
            t1,
        );
        assert_eq!(s.state(), State::Written);
        assert_eq!(s.last_success, Some(t1));
        assert_eq!(s.check_detail(), None);

        // A later failure: written once, so it passes, and says how long ago.
        let s = sinks.record(
            "docker-config",
            Kind::DockerConfig,
            ran(&[("b.example.com", "identity_missing")], None),
            t1 + Duration::from_secs(90),
        );
        assert_eq!(s.state(), State::Failing);
        assert!(s.state().passes());
        assert_eq!(s.last_success, Some(t1));
        assert_eq!(
            s.check_detail().unwrap(),
            "written 1m 30s ago, last pass: 1 of 1 registries not fetched (identity_missing)"
        );
    }

    #[test]
    fn a_replica_that_does_not_lead_is_on_standby_not_broken() {
        let sinks = Sinks::default();
        let t0 = SystemTime::UNIX_EPOCH;
        sinks.register("secret/ns/name", Kind::Secret);
        let s = sinks.record("secret/ns/name", Kind::Secret, Pass::Standby, t0);
        assert_eq!(s.state(), State::Standby);
        assert!(s.state().passes());
        // Leading later, it is judged by its own passes from then on.
        let s = sinks.record(
            "secret/ns/name",
            Kind::Secret,
            ran(&[("a.example.com", "upstream_timeout")], None),
            t0,
        );
        assert_eq!(s.state(), State::NeverWritten);
    }

    #[test]
    fn sinks_keep_their_registration_order_and_the_required_flag() {
        let sinks = Sinks::default();
        sinks.register("secret/b/x", Kind::Secret);
        sinks.register("docker-config", Kind::DockerConfig);
        sinks.register("secret/b/x", Kind::Secret);
        let names: Vec<String> = sinks.snapshot().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["secret/b/x", "docker-config"]);
        assert!(!sinks.required());
        sinks.set_required(true);
        assert!(sinks.required());
    }
}
