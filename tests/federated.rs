//! Workload-identity federation end to end on loopback (issue 27): the real API server
//! issues ServiceAccount tokens (TokenRequest) and serves its JWKS; a stand-in of Quay's
//! robot federation endpoint (written here from Red Hat's Quay documentation: no Quay runs
//! here) checks each token's ES256 signature against that JWKS, its issuer, audience,
//! subject and expiry, and answers the robot token, which is the htpasswd password of a
//! real distribution registry. skopeo pushes and pulls through the docker credential
//! helper; the sidecar answers the same credential, and refusals reach its clients as
//! 403 with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod federated_support;
mod registry_peer;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use common::ServeProcess;
use common::process::{PEER_CLIENT_BOUND, run_bounded};
use control_plane::ControlPlane;
use federated_support::{AUDIENCE, Exchange, ROBOT, discovery, forged, rand_u128, serve};
use registry_peer::{Registry, oci_layout, peer};

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

fn config(dir: &Path, name: &str, registry: &str, exchange: &str, token_file: &Path) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[[rule]]\nmatch = \"{registry}\"\nsource = \"quay\"\noptions = {{ audience = \"{AUDIENCE}\", robot = \"{ROBOT}\", url = \"{exchange}\", token_file = \"{}\" }}\n",
            token_file.display()
        ),
    )
    .unwrap();
    path
}

fn skopeo(args: &[&str], dir: &Path, config: &Path) -> Output {
    let bin = dir.join("bin");
    if !bin.exists() {
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(BIN, bin.join("docker-credential-regbroker")).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_bounded(
        Command::new("skopeo")
            .arg("--insecure-policy")
            .args(args)
            .env_clear()
            .env("HOME", dir)
            .env("TMPDIR", std::env::temp_dir())
            .env("PATH", path)
            .env("REGBROKER_CONFIG", config),
        None,
        PEER_CLIENT_BOUND,
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn credentials(sidecar: &ServeProcess, registry: &str) -> (u16, serde_json::Value) {
    let res = reqwest::Client::new()
        .get(format!("http://{}/v1/credentials", sidecar.addr))
        .query(&[("registry", registry)])
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver from scripts/peers.sh, skopeo, docker-registry, htpasswd: run scripts/test.sh"]
async fn quay_federation_pulls_with_the_pods_token_and_refuses_every_other_token() {
    peer("skopeo", "apt-get install skopeo");
    let cp = ControlPlane::shared();
    let ns = cp.namespace("quay-fed").await;
    let dir = tempfile::tempdir().unwrap();
    let robot_token = format!("robot-{:032x}", rand_u128());
    let registry = Registry::start_with(Some((ROBOT, &robot_token)));
    let (issuer, keys) = discovery(cp).await;
    let kid = keys[0].0.clone();
    let exchange = Arc::new(Exchange {
        issuer: issuer.clone(),
        keys,
        subject: format!("system:serviceaccount:{ns}:puller"),
        robot_token: robot_token.clone(),
        seen: Mutex::default(),
    });
    let url = serve(exchange.clone()).await;

    // The pod's projected token, as the kubelet writes it: TokenRequest for the audience.
    let token = cp.service_account_token(&ns, "puller", &[AUDIENCE]).await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let good = config(dir.path(), "good", &registry.host, &url, &token_file);

    // skopeo pushes and pulls through the helper, which exchanges the token.
    let authfile = dir.path().join("auth.json");
    std::fs::write(
        &authfile,
        serde_json::json!({"credHelpers": {registry.host.as_str(): "regbroker"}}).to_string(),
    )
    .unwrap();
    let layout = oci_layout(dir.path(), "federated");
    let image = format!("docker://{}/acme/app:v1", registry.host);
    let auth = authfile.to_str().unwrap();
    let push = skopeo(
        &[
            "copy",
            "--authfile",
            auth,
            "--dest-tls-verify=false",
            &format!("oci:{}:v1", layout.display()),
            &image,
        ],
        dir.path(),
        &good,
    );
    assert!(push.status.success(), "push: {}", text(&push.stderr));
    let pulled = dir.path().join("pulled");
    let pull = skopeo(
        &[
            "copy",
            "--authfile",
            auth,
            "--src-tls-verify=false",
            &image,
            &format!("oci:{}:v1", pulled.display()),
        ],
        dir.path(),
        &good,
    );
    assert!(pull.status.success(), "pull: {}", text(&pull.stderr));
    assert!(pulled.join("index.json").is_file());
    assert!(exchange.requests() >= 1);
    assert!(exchange.seen.lock().unwrap().iter().all(|(_, v)| v.is_ok()));

    // The sidecar answers the same credential.
    let sidecar = ServeProcess::start(&["--config", good.to_str().unwrap()], &[]);
    let (status, body) = credentials(&sidecar, &registry.host).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["username"], ROBOT);
    assert_eq!(body["password"], robot_token.as_str());
    // A host outside every rule gets nothing, and the exchange hears nothing of it.
    let before = exchange.requests();
    let (status, body) = credentials(&sidecar, "127.0.0.1:1").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(exchange.requests(), before);
    drop(sidecar);

    // Adversaries, each through a fresh sidecar: the refusal reaches the client as 403
    // with its reason, and no credential.
    let other = cp.service_account_token(&ns, "intruder", &[AUDIENCE]).await;
    let forged = forged(&issuer, &format!("system:serviceaccount:{ns}:puller"), &kid);
    let elsewhere = cp
        .service_account_token(&ns, "puller", &["sts.amazonaws.com"])
        .await;
    for (name, bad, reason, reaches_exchange) in [
        ("another-sa", &other, "subject is not trusted", true),
        ("another-key", &forged, "signature does not verify", true),
        (
            "another-audience",
            &elsewhere,
            "not the rule's `quay.regbroker.test`",
            false,
        ),
    ] {
        let file = dir.path().join(format!("token-{name}"));
        std::fs::write(&file, bad).unwrap();
        let cfg = config(dir.path(), name, &registry.host, &url, &file);
        let sidecar = ServeProcess::start(&["--config", cfg.to_str().unwrap()], &[]);
        let before = exchange.requests();
        let (status, body) = credentials(&sidecar, &registry.host).await;
        assert_eq!(status, 403, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(reason), "{name}: {body}");
        assert!(body.get("password").is_none(), "{name}: {body}");
        assert!(
            !body.to_string().contains(bad.as_str()),
            "{name}: the token was echoed"
        );
        assert_eq!(exchange.requests() > before, reaches_exchange, "{name}");
    }
}
