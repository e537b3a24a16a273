//! Opt-in end-to-end test: the sidecar, run from a pod with a real cloud identity (EKS
//! IRSA / Pod Identity, AKS Workload Identity, GKE Workload Identity), serves credentials
//! a real client uses to read a private artifact from a real registry. Walkthrough for
//! each cloud: deploy/e2e/README.md.
//!
//! Env vars: `REGBROKER_E2E_SIDECAR=1` enables it; `REGBROKER_E2E_REGISTRY` names the
//! registry host (ECR, ACR or Artifact Registry); `REGBROKER_E2E_ARTIFACT` names a private
//! artifact in it as `REPOSITORY:TAG` (e.g. a Helm chart pushed with `helm push`:
//! `charts/podinfo:6.7.0`). The cloud identity comes from the pod's environment. Needs
//! skopeo. `#[ignore]`d in every mode (plain `cargo test` and `scripts/test.sh`, which skips
//! `e2e_real_cloud_*`): run it with `--ignored`. Run without its env vars, it fails.
//!
//! Asserted, in order: anonymous access to the artifact is refused (so the rest proves
//! authentication); `GET /v1/credentials` answers 200 with a cloud provider and a future
//! expiry; skopeo reads the artifact's manifest through `docker-credential-regbroker`
//! asking the sidecar; and skopeo reads it again with only the docker config the sidecar
//! keeps (`--write-docker-config`, the same document `--sync-secret` puts in the Secret).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};

use common::ServeProcess;
use common::process::{PEER_CLIENT_BOUND, run_bounded};

fn skopeo(args: &[&str], env: &[(&str, String)]) -> Output {
    run_bounded(
        Command::new("skopeo")
            .arg("--insecure-policy")
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
        None,
        PEER_CLIENT_BOUND,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
#[ignore = "real cloud: set REGBROKER_E2E_SIDECAR=1, REGBROKER_E2E_REGISTRY and REGBROKER_E2E_ARTIFACT (see deploy/e2e/README.md)"]
async fn e2e_real_cloud_sidecar_serves_a_real_registry_to_a_real_client() {
    let (Ok("1"), Ok(host), Ok(artifact)) = (
        std::env::var("REGBROKER_E2E_SIDECAR").as_deref(),
        std::env::var("REGBROKER_E2E_REGISTRY"),
        std::env::var("REGBROKER_E2E_ARTIFACT"),
    ) else {
        panic!(
            "this real-cloud test needs REGBROKER_E2E_SIDECAR=1, REGBROKER_E2E_REGISTRY=<host> \
             and REGBROKER_E2E_ARTIFACT=<repository>:<tag>, in a pod with a cloud identity \
             (see deploy/e2e/README.md)"
        );
    };
    let reference = format!("docker://{host}/{artifact}");
    let dir = tempfile::tempdir().unwrap();

    let anonymous = skopeo(&["inspect", "--raw", "--no-creds", &reference], &[]);
    assert!(
        !anonymous.status.success(),
        "{reference} is readable anonymously; use a private artifact"
    );

    let sink = dir.path().join("config.json");
    let mut proc = ServeProcess::start(
        &[
            "--write-docker-config",
            sink.to_str().unwrap(),
            "--sink-registry",
            &host,
        ],
        &[],
    );
    let endpoint = format!("http://{}", proc.addr);
    let res = reqwest::get(format!("{endpoint}/v1/credentials?registry={host}"))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    assert!(
        ["aws", "azure", "gcp"].contains(&body["provider"].as_str().unwrap()),
        "provider {}",
        body["provider"]
    );
    let expires = humantime::parse_rfc3339(body["expiresAt"].as_str().expect("an expiry")).unwrap();
    assert!(
        expires > std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000)
    );

    // skopeo -> docker-credential-regbroker -> the sidecar.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_regbroker"),
        bin.join("docker-credential-regbroker"),
    )
    .unwrap();
    let authfile = dir.path().join("auth.json");
    std::fs::write(
        &authfile,
        serde_json::json!({"credHelpers": {&host: "regbroker"}}).to_string(),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let via_helper = skopeo(
        &[
            "inspect",
            "--raw",
            "--authfile",
            authfile.to_str().unwrap(),
            &reference,
        ],
        &[("PATH", path), ("REGBROKER_ENDPOINT", endpoint)],
    );
    assert!(
        via_helper.status.success(),
        "through the helper: {}",
        text(&via_helper.stderr)
    );
    assert!(text(&via_helper.stdout).contains("schemaVersion"));

    // The docker config the sidecar keeps (what the synced Secret holds).
    let via_sink = skopeo(
        &[
            "inspect",
            "--raw",
            "--authfile",
            sink.to_str().unwrap(),
            &reference,
        ],
        &[],
    );
    assert!(
        via_sink.status.success(),
        "with the written docker config: {}",
        text(&via_sink.stderr)
    );
    assert!(proc.stop().success());
}
