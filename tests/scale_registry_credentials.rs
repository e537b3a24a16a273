//! Scale benchmark for the `RegistryCredential` controller (issue 24, "Scale"): a figure
//! printer, not a timed test. It asserts only that every object became Ready; the figures
//! go into BENCHMARKS.md by hand.
//!
//! On the test control plane (etcd + kube-apiserver, no controller-manager), with moto as
//! STS and ECR: `REGBROKER_SCALE_OBJECTS` (default 1,000) `RegistryCredential`s spread
//! over `REGBROKER_SCALE_NAMESPACES` (default 100) namespaces, each with a ServiceAccount
//! of its own annotated with a role of its own (`arn:aws:iam::111111111111:role/puller-N`:
//! one AWS account, so every ECR call counts against one caller's budget, the case a
//! platform with one account meets). The controller is the real binary,
//! `regbroker serve --registry-credentials`, as the ServiceAccount and ClusterRole of
//! `deploy/registry-credentials/rbac.yaml`, so its RSS is read from `/proc`.
//!
//! moto issues twelve-hour ECR tokens here (`flux_support::Ecr`, as ECR does; stock moto's
//! say they expired in 2015), capped by the role session's hour: no refresh point falls
//! inside the run, and the steady state should write nothing.
//!
//! Printed: creation to all Ready; the API requests by verb and resource during start-up,
//! per minute over `REGBROKER_SCALE_STEADY_SECS` (default 180) of steady state (from the
//! API server's `apiserver_request_total`; nothing else talks to the API server then), and
//! during a restart; the controller's VmRSS and VmHWM; and how many Secrets and objects the
//! restart rewrote (resourceVersions before and after).
//!
//! ```sh
//! export REGBROKER_PEERS_FILE=/tmp/peers.txt PATH=.ci/.venv/bin:$PATH  # scripts/peers.sh; moto_server
//! cargo test --release --test scale_registry_credentials -- --ignored --nocapture
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "aws")]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::ServeProcess;
use control_plane::ControlPlane;
use flux_support::Ecr;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use regbroker::controller::api::{OWNER_LABEL, RegistryCredential, RegistryCredentialSpec};

const HOST: &str = "111111111111.dkr.ecr.us-east-1.amazonaws.com";
const ACCOUNT: &str = "111111111111";

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn puller(i: usize) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta {
            name: Some(format!("puller-{i}")),
            annotations: Some(BTreeMap::from([(
                "eks.amazonaws.com/role-arn".to_string(),
                format!("arn:aws:iam::{ACCOUNT}:role/puller-{i}"),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn object(i: usize) -> RegistryCredential {
    RegistryCredential::new(
        &format!("pull-{i}"),
        RegistryCredentialSpec {
            registries: vec![HOST.to_string()],
            service_account_name: Some(format!("puller-{i}")),
            secret_ref: None,
            target: None,
            suspend: false,
        },
    )
}

/// `apiserver_request_total` summed by `VERB group/resource[/subresource]`.
async fn api_requests(cp: &ControlPlane) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = cp.admin().request_text(req).await.unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let (group, resource, sub) = (label("group"), label("resource"), label("subresource"));
        if resource.is_empty() {
            continue;
        }
        let mut what = if group.is_empty() {
            resource
        } else {
            format!("{group}/{resource}")
        };
        if !sub.is_empty() {
            what = format!("{what}/{sub}");
        }
        *out.entry(format!("{} {what}", label("verb")))
            .or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    out
}

/// `after - before`, the nonzero rows.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

fn is_write(row: &str) -> bool {
    ["CREATE", "UPDATE", "PATCH", "DELETE", "APPLY"]
        .iter()
        .any(|v| row.starts_with(v))
}

fn print_rows(title: &str, rows: &BTreeMap<String, f64>, per: f64) {
    eprintln!("{title}");
    for (k, v) in rows {
        eprintln!("    {k:<60} {:>10.1}", v / per);
    }
}

/// (VmRSS, VmHWM) of `pid` in MiB.
fn rss(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// `regbroker_upstream_requests_total` with outcome ok, from the process's /metrics.
async fn upstream_ok(process: &ServeProcess) -> f64 {
    let Ok(res) = reqwest::get(format!("http://{}/metrics", process.addr)).await else {
        return 0.0;
    };
    let text = res.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("regbroker_upstream_requests_total{") && l.contains("\"ok\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// How many objects are Ready, of how many.
async fn ready(cp: &ControlPlane) -> (usize, usize) {
    let all = Api::<RegistryCredential>::all(cp.admin())
        .list(&ListParams::default())
        .await
        .unwrap();
    let n = all
        .items
        .iter()
        .filter(|o| {
            o.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .count();
    (n, all.items.len())
}

/// resourceVersions of the controller's Secrets and of the objects, by namespace/name.
async fn versions(cp: &ControlPlane) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let key = |m: &ObjectMeta| {
        (
            format!(
                "{}/{}",
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default()
            ),
            m.resource_version.clone().unwrap_or_default(),
        )
    };
    let secrets = Api::<Secret>::all(cp.admin())
        .list_metadata(&ListParams::default().labels(OWNER_LABEL))
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| key(&s.metadata))
        .collect();
    let objects = Api::<RegistryCredential>::all(cp.admin())
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| key(&s.metadata))
        .collect();
    (secrets, objects)
}

fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> usize {
    after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark (minutes; figures for BENCHMARKS.md): peers of scripts/peers.sh and moto_server, run with --ignored --nocapture"]
async fn scale_registry_credentials() {
    let objects = setting("REGBROKER_SCALE_OBJECTS", 1000) as usize;
    let namespaces = setting("REGBROKER_SCALE_NAMESPACES", 100).max(1) as usize;
    let steady = Duration::from_secs(setting("REGBROKER_SCALE_STEADY_SECS", 180));
    let cp = ControlPlane::shared();
    let moto = Ecr::start();
    let operator_ns = cp.registry_credential_operator().await;
    let kubeconfig = cp
        .service_account_kubeconfig(&operator_ns, "regbroker")
        .await;

    let mut nss = Vec::new();
    for _ in 0..namespaces {
        nss.push(cp.namespace("tenant").await);
    }
    let ns_of = |i: usize| nss[i % namespaces].clone();
    futures_util::stream::iter(0..objects)
        .map(|i| {
            let api = Api::<ServiceAccount>::namespaced(cp.admin(), &ns_of(i));
            async move {
                api.create(&PostParams::default(), &puller(i))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("regbroker.toml");
    std::fs::write(&config, "").unwrap();
    let endpoint = format!("http://{}", moto.addr);
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--registry-credentials",
    ];
    let env = [
        ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("REGBROKER_LOG", "info"),
    ];
    let mut controller = tokio::task::block_in_place(|| ServeProcess::start(&args, &env));
    let idle = rss(controller.child.id());

    // Creation to all Ready.
    let m0 = api_requests(cp).await;
    let t0 = Instant::now();
    futures_util::stream::iter(0..objects)
        .map(|i| {
            let api = Api::<RegistryCredential>::namespaced(cp.admin(), &ns_of(i));
            async move {
                api.create(&PostParams::default(), &object(i))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created_in = t0.elapsed();
    let mut half = None;
    let ready_in = loop {
        let (n, of) = ready(cp).await;
        if half.is_none() && n * 2 >= objects {
            half = Some(t0.elapsed());
        }
        if n == objects && of == objects {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "only {n} of {objects} Ready after 900 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let upstream_start = upstream_ok(&controller).await;
    let peak_start = rss(controller.child.id());

    // Steady state: nothing but the controller talks to the API server.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m1 = api_requests(cp).await;
    let (secrets_before, objects_before) = versions(cp).await;
    let m1b = api_requests(cp).await;
    tokio::time::sleep(steady).await;
    let m2 = api_requests(cp).await;
    let steady_rss = rss(controller.child.id());
    let upstream_steady = upstream_ok(&controller).await - upstream_start;
    let (secrets_after, objects_after) = versions(cp).await;
    let steady_rows = delta(&m1b, &m2);
    let minutes = steady.as_secs_f64() / 60.0;

    // Restart: a new process must find every Secret as it should be, and keep it.
    let m3 = api_requests(cp).await;
    let stop = tokio::task::block_in_place(|| controller.stop());
    let t1 = Instant::now();
    let controller = tokio::task::block_in_place(|| ServeProcess::start(&args, &env));
    // Done when it has read every object's Secret and then nothing but Leases moved for
    // five seconds.
    let touched = |rows: &BTreeMap<String, f64>| -> f64 {
        rows.iter()
            .filter(|(k, _)| !k.contains("leases"))
            .map(|(_, v)| v)
            .sum()
    };
    let mut last = api_requests(cp).await;
    let restart_done = loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = api_requests(cp).await;
        let read = delta(&m3, &now).get("GET secrets").copied().unwrap_or(0.0);
        let quiet = touched(&delta(&last, &now)) == 0.0;
        last = now;
        if read >= objects as f64 && quiet {
            break t1.elapsed().saturating_sub(Duration::from_secs(5));
        }
        assert!(
            t1.elapsed() < Duration::from_secs(900),
            "the restarted controller was not done in 900 s"
        );
    };
    let restart_fetched = upstream_ok(&controller).await;
    let (secrets_restarted, objects_restarted) = versions(cp).await;
    let restart_rows = delta(&m3, &last);
    let restart_rss = rss(controller.child.id());

    eprintln!("\n=== scale_registry_credentials");
    eprintln!(
        "{objects} RegistryCredentials in {namespaces} namespaces, one ServiceAccount and role each (one account), one ECR registry each"
    );
    eprintln!(
        "creation: {:.1} s for all creates; half Ready {:.1} s, all Ready {:.1} s after the first create; {upstream_start} upstream exchanges",
        created_in.as_secs_f64(),
        half.unwrap_or_default().as_secs_f64(),
        ready_in.as_secs_f64()
    );
    print_rows(
        "API requests, from the first create to 10 s after all Ready (all clients):",
        &delta(&m0, &m1),
        1.0,
    );
    print_rows(
        &format!(
            "API requests per minute in the steady state ({:.0} s, {upstream_steady} upstream exchanges):",
            steady.as_secs_f64()
        ),
        &steady_rows,
        minutes,
    );
    let steady_writes: f64 = steady_rows
        .iter()
        .filter(|(k, _)| is_write(k))
        .map(|(_, v)| v)
        .sum();
    eprintln!(
        "steady state: {steady_writes} writes in all; Secrets changed {} of {}, objects changed {} of {}",
        changed(&secrets_before, &secrets_after),
        secrets_before.len(),
        changed(&objects_before, &objects_after),
        objects_before.len()
    );
    eprintln!(
        "RSS MiB (VmRSS / VmHWM): idle {:.1}/{:.1}, all Ready {:.1}/{:.1}, steady {:.1}/{:.1}, after the restart {:.1}/{:.1}",
        idle.0,
        idle.1,
        peak_start.0,
        peak_start.1,
        steady_rss.0,
        steady_rss.1,
        restart_rss.0,
        restart_rss.1
    );
    eprintln!(
        "restart (SIGTERM: {stop}): done {:.1} s after the new start; {restart_fetched} upstream exchanges",
        restart_done.as_secs_f64()
    );
    print_rows("API requests during the restart:", &restart_rows, 1.0);
    eprintln!(
        "restart: Secrets rewritten {} of {}, objects (status) rewritten {} of {}",
        changed(&secrets_after, &secrets_restarted),
        secrets_after.len(),
        changed(&objects_after, &objects_restarted),
        objects_after.len()
    );
    let (n, of) = ready(cp).await;
    assert_eq!((n, of), (objects, objects), "all Ready after the restart");
}
