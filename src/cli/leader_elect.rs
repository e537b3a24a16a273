//! `serve --leader-elect` and its settings: which Lease, who this replica is, and the
//! three durations, turned into a validated [`lease::Config`].
//!
//! Reads `REGBROKER_LEADER_ELECT*` (the flags' env forms), `POD_NAMESPACE` (the Lease's
//! namespace when no flag names one; else the client's: the service account's namespace
//! in a pod), and `POD_NAME` or else `HOSTNAME` / the kernel's host name (the identity's
//! base; in a pod the host name is the pod name).

use std::time::Duration;

use clap::Args;

use crate::kubernetes::lease::{self, Config};

/// Leader election flags of `serve`.
#[derive(Debug, Args)]
pub(super) struct LeaderElectArgs {
    /// Elect one leader among replicas on a coordination.k8s.io/v1 Lease: only the leader
    /// writes the synced Secrets and runs the RegistryCredential controller; every replica
    /// serves HTTP.
    #[arg(long, env = "REGBROKER_LEADER_ELECT", requires = "kube_writers", value_parser = crate::env::parse_bool)]
    leader_elect: bool,

    /// The Lease's name.
    #[arg(
        long,
        env = "REGBROKER_LEADER_ELECT_LEASE",
        value_name = "NAME",
        default_value = "regbroker",
        value_parser = dns_subdomain
    )]
    leader_elect_lease: String,

    /// The Lease's namespace (default: POD_NAMESPACE, else the service account's
    /// namespace in a pod, else the kubeconfig context's).
    #[arg(
        long,
        env = "REGBROKER_LEADER_ELECT_NAMESPACE",
        value_name = "NAMESPACE",
        value_parser = dns_label
    )]
    leader_elect_namespace: Option<String>,

    /// How long another replica's lease counts as held after its last observed renewal
    /// (whole seconds).
    #[arg(long, env = "REGBROKER_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    leader_elect_lease_duration: Duration,

    /// How long a leader keeps writing without a successful renewal.
    #[arg(long, env = "REGBROKER_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    leader_elect_renew_deadline: Duration,

    /// How often the Lease is renewed, or tried by the others.
    #[arg(long, env = "REGBROKER_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    leader_elect_retry_period: Duration,
}

/// A DNS-1123 subdomain (a Lease's name): lower-case letters, digits, `-`, `.`.
fn dns_subdomain(s: &str) -> Result<String, String> {
    if is_dns(s, 253) {
        Ok(s.to_string())
    } else {
        Err("not a DNS-1123 subdomain (lower-case letters, digits, '-', '.', at most 253)".into())
    }
}

/// A DNS-1123 label (a namespace): lower-case letters, digits, `-`.
fn dns_label(s: &str) -> Result<String, String> {
    if is_dns(s, 63) && !s.contains('.') {
        Ok(s.to_string())
    } else {
        Err("not a DNS-1123 label (lower-case letters, digits, '-', at most 63)".into())
    }
}

fn is_dns(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl LeaderElectArgs {
    /// Whether leader election is on.
    pub(super) fn enabled(&self) -> bool {
        self.leader_elect
    }

    /// The validated settings, given the environment and the client's default namespace.
    pub(super) fn config(
        &self,
        env: impl Fn(&str) -> Option<String>,
        client_namespace: &str,
    ) -> Result<Config, String> {
        let namespace = self
            .leader_elect_namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE"))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| client_namespace.to_string());
        let base = env("POD_NAME")
            .or_else(|| env("HOSTNAME"))
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "regbroker".to_string());
        let config = Config {
            namespace,
            name: self.leader_elect_lease.clone(),
            identity: lease::identity(&base),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        self.check(&config)?;
        Ok(config)
    }

    /// The durations alone, checked before anything starts.
    pub(super) fn check_durations(&self) -> Result<(), String> {
        if !self.leader_elect {
            return Ok(());
        }
        Config {
            namespace: String::new(),
            name: String::new(),
            identity: String::new(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }
        .validate()
    }

    fn check(&self, config: &Config) -> Result<(), String> {
        config.validate()?;
        let valid = is_dns;
        if !valid(&config.name, 253) {
            return Err(format!(
                "--leader-elect-lease {:?} is not a DNS-1123 subdomain",
                config.name
            ));
        }
        if !valid(&config.namespace, 63) || config.namespace.contains('.') {
            return Err(format!(
                "--leader-elect-namespace (or POD_NAMESPACE) {:?} is not a DNS-1123 label",
                config.namespace
            ));
        }
        Ok(())
    }
}

/// Starts electing, as `args` say, through `client`; the leadership goes to the Secret
/// sync, the metrics to `/metrics`.
pub(super) fn start(
    args: &LeaderElectArgs,
    client: &kube::Client,
    core: &crate::broker::Built,
) -> Result<lease::Running, super::Failure> {
    let config = args
        .config(|k| std::env::var(k).ok(), client.default_namespace())
        .map_err(super::Failure::Config)?;
    tracing::info!(
        lease = %format_args!("{}/{}", config.namespace, config.name),
        identity = %config.identity,
        lease_duration = ?config.lease_duration,
        renew_deadline = ?config.renew_deadline,
        retry_period = ?config.retry_period,
        "Leader election"
    );
    let store = std::sync::Arc::new(lease::KubeLeaseStore::new(client.clone(), &config));
    Ok(
        lease::Elector::new(config, store, regbroker_provider::system_clock())
            .with_metrics(core.metrics.clone())
            .spawn(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    #[command(group(clap::ArgGroup::new("kube_writers").args(["sync_secret"])))]
    struct Cli {
        #[arg(long)]
        sync_secret: Option<String>,
        #[command(flatten)]
        leader: LeaderElectArgs,
    }

    fn parse(args: &[&str]) -> Result<LeaderElectArgs, String> {
        let mut argv = vec!["regbroker", "--sync-secret", "ns/name"];
        argv.extend(args);
        Cli::try_parse_from(argv)
            .map(|c| c.leader)
            .map_err(|e| e.to_string())
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults_are_client_gos_and_the_pods_namespace() {
        let a = parse(&["--leader-elect"]).unwrap();
        assert!(a.enabled());
        let c = a
            .config(
                env(&[
                    ("POD_NAME", "regbroker-5d8-abc"),
                    ("POD_NAMESPACE", "regbroker"),
                ]),
                "default",
            )
            .unwrap();
        assert_eq!(c.name, "regbroker");
        assert_eq!(c.namespace, "regbroker");
        assert!(
            c.identity.starts_with("regbroker-5d8-abc_"),
            "{}",
            c.identity
        );
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        // No POD_NAMESPACE: the client's (the service account's namespace in a pod).
        let c = a.config(env(&[("HOSTNAME", "h")]), "from-sa").unwrap();
        assert_eq!(c.namespace, "from-sa");
        assert!(c.identity.starts_with("h_"));
        // A flag wins over both.
        let a = parse(&["--leader-elect", "--leader-elect-namespace", "other"]).unwrap();
        let c = a.config(env(&[("POD_NAMESPACE", "x")]), "y").unwrap();
        assert_eq!(c.namespace, "other");
    }

    #[test]
    fn misordered_durations_are_refused() {
        let a = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration",
            "10s",
            "--leader-elect-renew-deadline",
            "10s",
        ])
        .unwrap();
        let e = a.check_durations().unwrap_err();
        assert!(e.contains("must be at least 1s longer than"), "{e}");
        // Longer, but by less than the margin a cut-off leader needs.
        let a = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration",
            "10s",
            "--leader-elect-renew-deadline",
            "9500ms",
        ])
        .unwrap();
        let e = a.check_durations().unwrap_err();
        assert!(e.contains("must be at least 1s longer than"), "{e}");
        let a = parse(&["--leader-elect", "--leader-elect-retry-period", "9s"]).unwrap();
        assert!(a.check_durations().is_err());
        let a = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "500ms",
        ])
        .unwrap();
        assert_eq!(a.check_durations(), Ok(()));
    }

    #[test]
    fn leader_election_needs_a_secret_to_guard() {
        let e = Cli::try_parse_from(["regbroker", "--leader-elect"]).unwrap_err();
        assert!(e.to_string().contains("--sync-secret"), "{e}");
    }

    #[test]
    fn bad_lease_names_are_refused() {
        // On the command line (or its env form): refused as it is parsed.
        let e = parse(&["--leader-elect", "--leader-elect-lease", "Bad_Name"]).unwrap_err();
        assert!(e.contains("DNS-1123"), "{e}");
        let e = parse(&["--leader-elect", "--leader-elect-namespace", "a.b"]).unwrap_err();
        assert!(e.contains("DNS-1123"), "{e}");
        // From POD_NAMESPACE: refused when the settings are put together.
        let a = parse(&["--leader-elect"]).unwrap();
        assert!(a.config(env(&[("POD_NAMESPACE", "Bad_NS")]), "ns").is_err());
    }
}
