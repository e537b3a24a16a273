//! `serve`'s environment: each flag's `REGBROKER_*` form is read, and a flag given too
//! wins over it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::process::{CLI_BOUND, run_bounded};
use common::{FakeMetadata, ServeProcess, docker_config};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");
const TOKEN: &str = "env-bearer-token-0123456789abcdef";

fn auths(path: &std::path::Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["auths"].as_object().unwrap().keys().cloned().collect()
}

#[test]
fn the_listen_flag_wins_over_its_env() {
    // Were the env read instead, the socket's directory does not exist: no Listening.
    let mut p = ServeProcess::start(
        &[],
        &[("REGBROKER_LISTEN", "unix:/nonexistent-regbroker-dir/sock")],
    );
    assert!(p.addr.starts_with("127.0.0.1:"), "{}", p.addr);
    p.wait_healthy();
    assert!(p.stop().success());
}

#[test]
fn write_docker_config_and_sink_registry_are_read_from_env_and_the_flag_wins() {
    let meta = FakeMetadata::start(3600, false);
    let dir = tempfile::tempdir().unwrap();
    let statics = dir.path().join("static.json");
    std::fs::write(&statics, docker_config(&[("r.example.com", "u", "pw")])).unwrap();
    let from_env = dir.path().join("env.json");
    let mut p = ServeProcess::start(
        &["--docker-config", statics.to_str().unwrap()],
        &[
            ("GCE_METADATA_HOST", meta.addr.as_str()),
            ("REGBROKER_WRITE_DOCKER_CONFIG", from_env.to_str().unwrap()),
            ("REGBROKER_SINK_REGISTRY", "gcr.io,eu.gcr.io"),
        ],
    );
    // The file is written before the process listens.
    assert_eq!(
        auths(&from_env),
        ["eu.gcr.io", "gcr.io", "r.example.com"],
        "comma-separated REGBROKER_SINK_REGISTRY"
    );
    assert!(p.stop().success());

    let from_flag = dir.path().join("flag.json");
    let ignored = dir.path().join("ignored.json");
    let mut p = ServeProcess::start(
        &[
            "--docker-config",
            statics.to_str().unwrap(),
            "--write-docker-config",
            from_flag.to_str().unwrap(),
            "--sink-registry",
            "gcr.io",
        ],
        &[
            ("GCE_METADATA_HOST", meta.addr.as_str()),
            ("REGBROKER_WRITE_DOCKER_CONFIG", ignored.to_str().unwrap()),
            ("REGBROKER_SINK_REGISTRY", "eu.gcr.io"),
        ],
    );
    assert_eq!(auths(&from_flag), ["gcr.io", "r.example.com"]);
    assert!(!ignored.exists(), "the env's path was written too");
    assert!(p.stop().success());
}

#[tokio::test]
async fn auth_token_file_is_read_from_env_and_the_flag_wins() {
    let dir = tempfile::tempdir().unwrap();
    let statics = dir.path().join("static.json");
    std::fs::write(&statics, docker_config(&[("r.example.com", "u", "pw")])).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let other = dir.path().join("other");
    std::fs::write(&other, "another-token-0123456789abcdef\n").unwrap();
    let get = |addr: String, bearer: Option<&'static str>| async move {
        let mut req = reqwest::Client::new().get(format!(
            "http://{addr}/v1/credentials?registry=r.example.com"
        ));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        req.send().await.unwrap().status().as_u16()
    };

    let mut p = ServeProcess::start(
        &["--docker-config", statics.to_str().unwrap()],
        &[("REGBROKER_AUTH_TOKEN_FILE", token.to_str().unwrap())],
    );
    assert_eq!(get(p.addr.clone(), None).await, 401);
    assert_eq!(get(p.addr.clone(), Some(TOKEN)).await, 200);
    assert!(p.stop().success());

    let mut p = ServeProcess::start(
        &[
            "--docker-config",
            statics.to_str().unwrap(),
            "--auth-token-file",
            token.to_str().unwrap(),
        ],
        &[("REGBROKER_AUTH_TOKEN_FILE", other.to_str().unwrap())],
    );
    assert_eq!(get(p.addr.clone(), Some(TOKEN)).await, 200);
    assert_eq!(
        get(p.addr.clone(), Some("another-token-0123456789abcdef")).await,
        401
    );
    assert!(p.stop().success());
}

#[test]
fn sync_secret_is_read_from_env_and_the_flag_wins() {
    // A malformed reference is a usage error (64) naming it: so the env was read.
    // Bounded: were the env not read, serve would run on.
    let out = run_bounded(
        Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_clear()
            .env("REGBROKER_SYNC_SECRET", "ns/ok,not-a-reference"),
        None,
        CLI_BOUND,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("not-a-reference"), "{err}");
    // A valid flag wins: the malformed env is never parsed, and the process gets as far
    // as looking for a Kubernetes client (none here: exit 1, not 64).
    let home = tempfile::tempdir().unwrap();
    let out = run_bounded(
        Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--sync-secret",
                "ns/name",
            ])
            .env_clear()
            .env("HOME", home.path())
            .env("KUBECONFIG", home.path().join("missing"))
            .env("REGBROKER_SYNC_SECRET", "not-a-reference"),
        None,
        CLI_BOUND,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("not-a-reference"), "{err}");
}
