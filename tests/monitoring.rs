//! The monitoring kit (issue 25) against real peers: `promtool` and `prometheus`, built
//! from the Go module proxy by `scripts/peers.sh`.
//!
//! - The rule file `deploy/monitoring/alerts.yaml` passes `promtool check rules`, and its
//!   unit tests (`tests/monitoring/alerts.test.yaml`, one scenario per alert that fires
//!   and one that does not) pass `promtool test rules`.
//! - A real Prometheus scrapes a running `regbroker serve` that keeps a Secret in a real
//!   kube-apiserver (tests/control_plane) and a docker config file fresh with gcplocal's
//!   one-hour Google tokens, refreshed every few seconds, and runs the
//!   RegistryCredential controller with leader election, one object Stalled. Through
//!   Prometheus' HTTP API, every metric the rules and the dashboard name has data, every
//!   dashboard query returns data, each alert expression returns what this state means,
//!   and once gcplocal is stopped, the expiry alert (its margin set just under the
//!   tokens' lifetime, so "nearing the end" takes seconds, not minutes) fires for the
//!   Secret and the file, and the refresh failure alert's expression has data. `promtool check metrics` reads
//!   the same `/metrics`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::ServeProcess;
use common::process::{KillOnDrop, run_bounded};
use control_plane::{ControlPlane, Peers};
use flux_support::Metadata;
use kube::api::{Api, PostParams};
use regbroker::controller::api::{RegistryCredential, RegistryCredentialSpec};
use registry_peer::free_port;

const REGISTRY: &str = "europe-west1-docker.pkg.dev";
/// gcplocal's tokens live an hour.
const TOKEN_LIFETIME: u64 = 3600;
/// The expiry margin the test renders the rules with: the alert fires once a token has
/// gone 20 s without a refresh (regbroker refreshes every 2 s here).
const TEST_MARGIN: u64 = TOKEN_LIFETIME - 20;
/// Bound on each wait for Prometheus (scrapes and evaluations every second).
const WAIT: Duration = Duration::from_secs(90);
const PROMTOOL_BOUND: Duration = Duration::from_secs(60);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn promtool(peers: &Peers, args: &[&str], stdin: Option<&[u8]>) -> (bool, String) {
    let out = run_bounded(
        Command::new(peers.get("promtool"))
            .args(args)
            .current_dir(root()),
        stdin,
        PROMTOOL_BOUND,
    );
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The rule file's alerts: (name, expression).
fn alerts(yaml: &str) -> Vec<(String, String)> {
    let doc: yaml_serde::Value = yaml_serde::from_str(yaml).unwrap();
    doc["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().trim().to_string(),
            )
        })
        .collect()
}

/// The dashboard's queries: (panel title, expression), `$__rate_interval` as Grafana
/// would set it for a 1 s scrape interval (four scrapes, at least 1 m by its default).
fn panel_queries(json: &str) -> Vec<(String, String)> {
    let doc: serde_json::Value = serde_json::from_str(json).unwrap();
    let mut out = Vec::new();
    for p in doc["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push((
                p["title"].as_str().unwrap().to_string(),
                t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "1m"),
            ));
        }
    }
    assert!(!out.is_empty());
    out
}

/// Every `regbroker_*` metric name in `expr` (a histogram's series by its family name).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("regbroker_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
#[ignore = "needs promtool from scripts/peers.sh: run scripts/test.sh"]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let peers = Peers::find();
    let (ok, out) = promtool(
        &peers,
        &["check", "rules", "deploy/monitoring/alerts.yaml"],
        None,
    );
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(
        &peers,
        &["test", "rules", "tests/monitoring/alerts.test.yaml"],
        None,
    );
    assert!(ok, "promtool test rules:\n{out}");
    // Every alert has its unit tests, and a runbook section in the docs.
    let rules = std::fs::read_to_string(root().join("deploy/monitoring/alerts.yaml")).unwrap();
    let tests = std::fs::read_to_string(root().join("tests/monitoring/alerts.test.yaml")).unwrap();
    let docs = std::fs::read_to_string(root().join("docs/src/monitoring.md")).unwrap();
    for (name, _) in alerts(&rules) {
        assert!(
            tests.contains(&format!("alertname: {name}\n        exp_alerts: []"))
                && tests.contains(&format!("alertname: {name}\n        exp_alerts:\n")),
            "{name} lacks a scenario where it fires or one where it does not"
        );
        assert!(
            docs.contains(&format!("### {name}\n")),
            "docs/src/monitoring.md has no runbook for {name}"
        );
    }
}

/// A Prometheus server on loopback, killed when dropped.
struct Prometheus {
    url: String,
    _process: KillOnDrop,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(peers: &Peers, target: &str, rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [rules.yaml]\n\
             scrape_configs:\n  - job_name: regbroker\n    static_configs:\n      - targets: [\"{target}\"]\n"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(peers.get("prometheus"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // The first scrape after 1 s, not after the default 5 s.
            .arg("--scrape.discovery-reload-interval=1s")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let p = Prometheus {
            url: format!("http://127.0.0.1:{port}"),
            _process: KillOnDrop(child),
            _dir: dir,
        };
        let deadline = Instant::now() + WAIT;
        while registry_peer::http_status(&format!("127.0.0.1:{port}"), "/-/ready") != 200 {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within {WAIT:?}:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> serde_json::Value {
        let res = reqwest::Client::new()
            .get(format!("{}{path}", self.url))
            .query(query)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body: serde_json::Value = res.json().await.unwrap();
        assert!(
            status.is_success() && body["status"] == "success",
            "{path} {query:?}: {status} {body}"
        );
        body["data"].clone()
    }

    /// An instant query's result vector; panics if Prometheus refuses the expression.
    async fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await;
        assert_eq!(data["resultType"], "vector", "{expr}: {data}");
        data["result"].as_array().unwrap().clone()
    }

    /// The alerts firing with `name`.
    async fn firing(&self, name: &str) -> Vec<serde_json::Value> {
        let data = self.api("/api/v1/alerts", &[]).await;
        data["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .cloned()
            .collect()
    }
}

/// Waits (bounded) until `check` holds, then returns what it gave.
async fn until<T>(what: &str, p: &Prometheus, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(t) = check().await {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT:?}; prometheus' log:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn label<'a>(series: &'a serde_json::Value, name: &str) -> &'a str {
    series["metric"][name].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs etcd, kube-apiserver, kubectl, prometheus and promtool from scripts/peers.sh, and gcplocal: run scripts/test.sh"]
async fn a_real_prometheus_evaluates_every_alert_and_panel_and_the_expiry_alert_fires() {
    let cp = ControlPlane::shared();
    cp.registry_credential_operator().await;
    let ns = cp.namespace("monitoring").await;
    // An object naming a ServiceAccount that does not exist: Stalled, Ready False.
    let stalled = RegistryCredential::new(
        "stalled",
        RegistryCredentialSpec {
            registries: vec![REGISTRY.to_string()],
            service_account_name: Some("nobody".into()),
            secret_ref: None,
            target: None,
            suspend: false,
        },
    );
    Api::<RegistryCredential>::namespaced(cp.admin(), &ns)
        .create(&PostParams::default(), &stalled)
        .await
        .unwrap();

    let metadata = Metadata::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("regbroker.toml");
    std::fs::write(
        &config,
        "[cache]\nmin_refresh = \"1s\"\nmax_refresh = \"2s\"\nrefresh_jitter = 0.0\n",
    )
    .unwrap();
    let docker_config = dir.path().join("config.json");
    let secret = format!("{ns}/pull");
    let args = [
        format!("--config={}", config.display()),
        format!("--sync-secret={secret}"),
        format!("--sink-registry={REGISTRY}"),
        format!("--write-docker-config={}", docker_config.display()),
        "--registry-credentials".to_string(),
        format!("--registry-credentials-namespace={ns}"),
        "--leader-elect".to_string(),
        format!("--leader-elect-namespace={ns}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let regbroker = tokio::task::block_in_place(|| {
        ServeProcess::start(
            &args,
            &[
                ("KUBECONFIG", cp.admin_kubeconfig.to_str().unwrap()),
                ("POD_NAME", "regbroker-0"),
                ("HOME", home.to_str().unwrap()),
                ("GCE_METADATA_HOST", metadata.addr.as_str()),
                ("REGBROKER_LOG", "info"),
            ],
        )
    });

    // The rules as the chart renders them with a margin just under the tokens' lifetime.
    let rules = std::fs::read_to_string(root().join("deploy/monitoring/alerts.yaml")).unwrap();
    let expiry_expr = "regbroker_credential_expiry_timestamp_seconds - time() < 600";
    assert!(rules.contains(expiry_expr), "the expiry rule changed shape");
    let test_rules = rules.replace(
        expiry_expr,
        &format!("regbroker_credential_expiry_timestamp_seconds - time() < {TEST_MARGIN}"),
    );
    let peers = &cp.peers;
    let prom = Prometheus::start(peers, &regbroker.addr, &test_rules);

    // Scraped, the Secret and the file written, the object reconciled, leading.
    let secret_sink = format!("secret/{secret}");
    until("every health series scraped", &prom, async || {
        let expiry = prom
            .query("regbroker_credential_expiry_timestamp_seconds")
            .await;
        let conditions = prom
            .query("regbroker_registry_credential_condition{type=\"Stalled\",status=\"True\"} == 1")
            .await;
        let leader = prom.query("regbroker_leader == 1").await;
        let sinks: BTreeSet<&str> = expiry.iter().map(|s| label(s, "sink")).collect();
        (sinks.contains(secret_sink.as_str())
            && sinks.contains("docker-config")
            && !conditions.is_empty()
            && !leader.is_empty())
        .then_some(())
    })
    .await;
    // Let refreshes, rates and histograms fill (rate windows need two samples).
    tokio::time::sleep(Duration::from_secs(15)).await;

    // `promtool check metrics` on the real exposition (every family present now).
    let text = reqwest::get(format!("http://{}/metrics", regbroker.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (ok, out) = promtool(peers, &["check", "metrics"], Some(text.as_bytes()));
    assert!(ok, "promtool check metrics:\n{out}\n---\n{text}");

    // Every metric an alert or a panel names is in what Prometheus scraped.
    let dashboard =
        std::fs::read_to_string(root().join("deploy/monitoring/dashboard.json")).unwrap();
    let rule_list = alerts(&rules);
    let panels = panel_queries(&dashboard);
    let named: BTreeSet<String> = rule_list
        .iter()
        .map(|(_, e)| e)
        .chain(panels.iter().map(|(_, e)| e))
        .flat_map(|e| metric_names(e))
        .collect();
    for name in &named {
        let series = prom.query(&format!("count({{__name__=\"{name}\"}})")).await;
        assert!(!series.is_empty(), "no {name} series scraped");
    }
    // Every dashboard query returns data (a rate needs two samples in its window: on a
    // loaded machine a scrape can come late, so each query gets until WAIT).
    for (title, expr) in &panels {
        until(
            &format!("panel {title:?}: {expr} returns data"),
            &prom,
            async || (!prom.query(expr).await.is_empty()).then_some(()),
        )
        .await;
    }

    // Each alert expression says what this state means.
    let expect_now = |name: &str| -> Option<bool> {
        Some(match name {
            // Fresh: refreshed every 2 s, so far from the margin.
            "RegbrokerCredentialExpiringSoon" => false,
            "RegbrokerRefreshFailing" => false,
            // The object naming a missing ServiceAccount.
            "RegbrokerRegistryCredentialNotReady" | "RegbrokerRegistryCredentialStalled" => true,
            "RegbrokerSinkNeverWritten" => false,
            "RegbrokerNoLeader" => false,
            "RegbrokerTargetMissing" => false,
            _ => return None,
        })
    };
    for (name, expr) in &rule_list {
        let expr = if name == "RegbrokerCredentialExpiringSoon" {
            expr.replace("< 600", &format!("< {TEST_MARGIN}"))
        } else {
            expr.clone()
        };
        let want = expect_now(name).unwrap_or_else(|| panic!("no expectation for {name}"));
        let result = prom.query(&expr).await;
        assert_eq!(!result.is_empty(), want, "{name}: {expr} gave {result:?}");
        if name == "RegbrokerRegistryCredentialStalled" {
            assert_eq!(label(&result[0], "namespace"), ns);
            assert_eq!(label(&result[0], "name"), "stalled");
            assert_eq!(label(&result[0], "reason"), "ServiceAccountNotFound");
        }
    }
    assert!(
        prom.firing("RegbrokerCredentialExpiringSoon")
            .await
            .is_empty()
    );

    // The upstream stops: no refresh succeeds; within about 20 s of the last one the
    // expiry alert fires for both sinks, and the failures show.
    drop(metadata);
    let fired = until("the expiry alert fires", &prom, async || {
        let firing = prom.firing("RegbrokerCredentialExpiringSoon").await;
        let sinks: BTreeSet<String> = firing
            .iter()
            .map(|a| a["labels"]["sink"].as_str().unwrap_or("").to_string())
            .collect();
        (sinks.contains(&secret_sink) && sinks.contains("docker-config")).then_some(firing)
    })
    .await;
    for a in &fired {
        assert_eq!(a["labels"]["registry"], REGISTRY, "{a}");
        assert_eq!(a["labels"]["severity"], "critical", "{a}");
    }
    // The cache keeps serving the valid token to the sinks while its refreshes fail:
    // the refresh failure alert's expression has data (it fires after its `for`).
    let (_, refresh_failing) = rule_list
        .iter()
        .find(|(n, _)| n == "RegbrokerRefreshFailing")
        .unwrap();
    let failing = prom.query(refresh_failing).await;
    assert!(!failing.is_empty(), "{refresh_failing}: nothing");
    drop(regbroker);
}
