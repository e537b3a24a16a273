//! `serve --probe-listen`: health, readiness and metrics on a second address, so the
//! kubelet can probe a sidecar whose credential endpoint stays on loopback; credentials
//! are never served there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{ServeProcess, docker_config};

#[tokio::test]
async fn probe_address_serves_health_but_never_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let statics = dir.path().join("static.json");
    std::fs::write(
        &statics,
        docker_config(&[("static.example.com", "u", "pw")]),
    )
    .unwrap();
    // A free port (released just before regbroker binds it).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let probe = format!("127.0.0.1:{port}");
    let mut proc = ServeProcess::start(
        &[
            "--docker-config",
            statics.to_str().unwrap(),
            "--probe-listen",
            &probe,
        ],
        &[],
    );
    let get = |path: &'static str| {
        let url = format!("http://{probe}{path}");
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    assert_eq!(get("/healthz").await, 200);
    // The readiness latch flips just after the "Listening" line: allow it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while get("/readyz").await != 200 {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(get("/metrics").await, 200);
    assert_eq!(
        get("/v1/credentials?registry=static.example.com").await,
        404,
        "no credentials on the probe address"
    );
    // The main address still serves them.
    let main = reqwest::get(format!(
        "http://{}/v1/credentials?registry=static.example.com",
        proc.addr
    ))
    .await
    .unwrap();
    assert_eq!(main.status(), 200);
    assert!(proc.stop().success());
}
