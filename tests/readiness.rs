//! Readiness that says something about the sinks, with the real binary: a
//! `--sink-registry` whose fetch fails (the real GCP provider pointed at a metadata
//! server that is not there) leaves the docker config sink never written, and
//! `/readyz?verbose`, the metrics and `/v1/providers` say so; once a pass writes every
//! registry (the registry gains a static entry, which wins over the provider) each of
//! them flips. By default the sidecar stays ready through it; with
//! `--ready-requires-sinks` it is not ready until the first complete write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::{ServeProcess, docker_config};

/// The registry the sink should hold and cannot fetch at first.
const FAILING: &str = "us-docker.pkg.dev";
/// The code of its failed fetch: no metadata server answers, so no GCP identity.
const FAILING_CODE: &str = "identity_missing";

async fn get(addr: &str, path: &str) -> (u16, String) {
    let res = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

/// The value of the sample `name{sink="docker-config"}`.
fn sample(metrics: &str, name: &str) -> Option<i64> {
    let prefix = format!("{name}{{sink=\"docker-config\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

async fn sink_state(addr: &str) -> serde_json::Value {
    let (status, body) = get(addr, "/v1/providers").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sinks = v["sinks"].as_array().expect("a sinks list");
    assert_eq!(sinks.len(), 1, "{v}");
    sinks[0].clone()
}

/// A sidecar writing a docker config with a static registry and the failing one.
struct Setup {
    dir: tempfile::TempDir,
    statics: std::path::PathBuf,
    proc: ServeProcess,
}

fn start(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let statics = common::write_static(dir.path());
    let out = dir.path().join("out").join("config.json");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut args = vec![
        "--docker-config",
        statics.to_str().unwrap(),
        "--write-docker-config",
        out.to_str().unwrap(),
        "--sink-registry",
        FAILING,
    ];
    args.extend_from_slice(extra);
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let proc = ServeProcess::start(&args, &[("GCE_METADATA_HOST", "127.0.0.1:1")]);
    Setup { dir, statics, proc }
}

impl Setup {
    /// Gives the failing registry a static entry: the next pass writes every registry.
    fn serve_the_failing_registry(&self) {
        let next = docker_config(&[
            ("static.example.com", "s-user", "s-pw"),
            (FAILING, "g-user", "g-pw"),
        ]);
        let tmp = self.dir.path().join("static.json.tmp");
        std::fs::write(&tmp, next).unwrap();
        std::fs::rename(&tmp, &self.statics).unwrap();
    }

    /// Waits (bounded) until `/v1/providers` reports the sink `state`.
    async fn wait_state(&self, state: &str) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let sink = sink_state(&self.proc.addr).await;
            if sink["state"] == state {
                return sink;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sink never {state}: {sink}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// No password, nor an `auth` value, in what the endpoint says about the sinks.
fn assert_no_secret(body: &str) {
    for pw in ["s-pw", "g-pw"] {
        assert!(!body.contains(pw), "a password in: {body}");
    }
    for pair in ["s-user:s-pw", "g-user:g-pw"] {
        let auth = base64::engine::general_purpose::STANDARD.encode(pair);
        assert!(!body.contains(&auth), "an auth value in: {body}");
    }
}

#[tokio::test]
async fn a_sink_never_written_is_visible_everywhere_and_flips_once_written() {
    let mut s = start(&[]);
    let addr = s.proc.addr.clone();
    // The sink's first pass runs before the process listens: its state is known at once.
    let sink = s.wait_state("never_written").await;
    assert_eq!(sink["name"], "docker-config");
    assert_eq!(sink["kind"], "docker_config");
    assert!(sink["lastSuccess"].is_null(), "{sink}");
    assert!(sink["lastAttempt"].is_string(), "{sink}");
    assert!(sink["writeError"].is_null(), "the file was written: {sink}");
    assert_eq!(
        sink["registries"],
        serde_json::json!([
            {"registry": "static.example.com", "outcome": "ok"},
            {"registry": FAILING, "outcome": FAILING_CODE},
        ])
    );

    // The sidecar stays ready: its readiness must not hang on a cloud's health.
    let (status, body) = get(&addr, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, verbose) = get(&addr, "/readyz?verbose").await;
    assert_eq!(status, 200, "{verbose}");
    assert_eq!(
        verbose,
        format!(
            "[+]startup ok\n\
             [-]sink/docker-config failed: never written since start: 1 of 2 registries not fetched ({FAILING_CODE}) \
             (not required for readiness: --ready-requires-sinks is off)\n\
             readyz check passed\n"
        )
    );

    let (_, metrics) = get(&addr, "/metrics").await;
    assert_eq!(
        sample(&metrics, "regbroker_sink_never_written"),
        Some(1),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "regbroker_sink_last_success_timestamp_seconds"),
        Some(0)
    );
    assert_eq!(
        sample(&metrics, "regbroker_sink_failed_registries"),
        Some(1)
    );

    // A pass that fetches every registry writes the sink: everything flips.
    s.serve_the_failing_registry();
    let sink = s.wait_state("written").await;
    assert!(sink["lastSuccess"].is_string(), "{sink}");
    assert_eq!(sink["lastSuccess"], sink["lastAttempt"]);
    assert_eq!(sink["registries"][1]["outcome"], "ok", "{sink}");
    let (status, verbose) = get(&addr, "/readyz?verbose").await;
    assert_eq!(status, 200);
    assert_eq!(
        verbose,
        "[+]startup ok\n[+]sink/docker-config ok\nreadyz check passed\n"
    );
    let (_, metrics) = get(&addr, "/metrics").await;
    assert_eq!(sample(&metrics, "regbroker_sink_never_written"), Some(0));
    assert_eq!(
        sample(&metrics, "regbroker_sink_failed_registries"),
        Some(0)
    );
    let written = sample(&metrics, "regbroker_sink_last_success_timestamp_seconds").unwrap();
    let now = std::time::UNIX_EPOCH.elapsed().unwrap().as_secs() as i64;
    assert!(
        (now - 120..=now + 1).contains(&written),
        "last success {written}, now {now}"
    );

    for path in ["/readyz?verbose", "/metrics", "/v1/providers"] {
        assert_no_secret(&get(&addr, path).await.1);
    }
    assert!(s.proc.stop().success());
}

#[tokio::test]
async fn with_ready_requires_sinks_a_never_written_sink_holds_readiness_until_written() {
    let mut s = start(&["--ready-requires-sinks"]);
    let addr = s.proc.addr.clone();
    s.wait_state("never_written").await;
    // Not ready; the plain answer lists the checks, as kube-apiserver's does on failure.
    let expected = format!(
        "[+]startup ok\n\
         [-]sink/docker-config failed: never written since start: 1 of 2 registries not fetched ({FAILING_CODE})\n\
         readyz check failed\n"
    );
    assert_eq!(get(&addr, "/readyz").await, (503, expected.clone()));
    assert_eq!(get(&addr, "/readyz?verbose").await, (503, expected));
    // Alive all the same, and still serving what it can.
    assert_eq!(get(&addr, "/healthz").await.0, 200);
    assert_eq!(
        get(&addr, "/v1/credentials?registry=static.example.com")
            .await
            .0,
        200
    );

    s.serve_the_failing_registry();
    s.wait_state("written").await;
    assert_eq!(get(&addr, "/readyz").await, (200, "ok\n".to_string()));
    assert!(s.proc.stop().success());
}

#[test]
fn ready_requires_sinks_without_a_sink_is_a_usage_error() {
    let err = common::usage_error(&["serve", "--listen", "127.0.0.1:0", "--ready-requires-sinks"]);
    assert!(err.contains("--ready-requires-sinks needs a sink"), "{err}");
}
