//! Runs a scenario with every log at TRACE captured (ours and the libraries': axum,
//! hyper, tower, moka, notify) and fails if a secret appears in a log line, an error
//! body, the metrics or a Debug print.
//!
//! One test in this binary: it installs the global subscriber.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{Answer, TestServer};
use regbroker_provider::Error;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_logs_errors_metrics_or_debug_at_trace() {
    let capture = Capture::default();
    let writer = capture.clone();
    {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(move || writer.clone())
                    .with_ansi(false)
                    .with_filter(regbroker::cli::log_filter("trace")),
            )
            .init();
    }

    const STATIC_PASSWORD: &str = "static-PASSWORD-do-not-log";
    const IDENTITY_TOKEN: &str = "identity-TOKEN-do-not-log";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let auth = base64_encode(&format!("alice:{STATIC_PASSWORD}"));
    std::fs::write(
        &path,
        format!(
            r#"{{"auths": {{"r.example.com": {{"auth": "{auth}"}}, "t.example.com": {{"identitytoken": "{IDENTITY_TOKEN}"}}}}}}"#
        ),
    )
    .unwrap();
    let srv = TestServer::builder()
        .docker_config(&path)
        .config("[[rule]]\nmatch = \"fail.example.com\"\nsource = \"fake\"\noptions = { scope = \"other\" }\n")
        .start()
        .await;
    let _watcher = regbroker::broker::static_secret::watch(srv.statics.clone()).unwrap();

    let mut outputs = Vec::new();
    // Static, identity token, provider miss then hit, provider failure, bad input.
    for registry in [
        "r.example.com",
        "t.example.com",
        "a.fake.test",
        "a.fake.test",
    ] {
        let (status, body) = srv.credentials(registry).await;
        assert_eq!(status, 200, "{body}");
        outputs.push(format!(
            "{:?}",
            srv.broker.decide(&registry.parse().unwrap())
        ));
    }
    srv.fake.then(Answer::Fail(Error::unavailable));
    let (status, body) = srv.credentials("fail.example.com").await;
    assert_eq!(status, 503, "{body}");
    outputs.push(body.to_string());
    let (status, body) = srv
        .credentials(&format!("alice:{STATIC_PASSWORD}@r.example.com"))
        .await;
    assert_eq!(status, 400);
    outputs.push(body.to_string());

    // A malformed reload must not quote the document.
    std::fs::write(
        &path,
        format!(r#"{{"auths": {{"r.example.com": {{"auth": "{STATIC_PASSWORD}"}}}}}}"#),
    )
    .unwrap();
    let err = srv.statics.reload().unwrap_err();
    outputs.push(err.to_string());
    outputs.push(format!("{err:?}"));
    outputs.push(format!("{:?}", srv.broker));
    outputs.push(srv.get("/metrics").await.1);
    // Every provider's identity kind, last fetch and patterns: never a secret.
    let (status, providers) = srv.get("/v1/providers").await;
    assert_eq!(status, 200, "{providers}");
    assert!(providers.contains("\"lastFetch\":{"), "{providers}");
    outputs.push(providers);

    // The one-shot modes, in-process: the credential helper (get and list), the kubelet
    // provider, with the disk cache on; and the docker config sink.
    let good = dir.path().join("good.json");
    std::fs::write(
        &good,
        format!(r#"{{"auths": {{"r.example.com": {{"auth": "{auth}"}}}}}}"#),
    )
    .unwrap();
    let settings = regbroker::oneshot::backend::Settings {
        docker_config: vec![good.clone()],
        cache_dir: Some(dir.path().join("cache")),
        ..Default::default()
    };
    let s2 = settings.clone();
    let (helper_out, kubelet_err) = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let code = regbroker::oneshot::helper::run("get", || Ok(s2.clone()), &mut &b"r.example.com\n"[..], &mut out);
        assert_eq!(code, 0);
        let code = regbroker::oneshot::helper::run("list", || Ok(s2.clone()), &mut &b""[..], &mut out);
        assert_eq!(code, 0);
        let code = regbroker::oneshot::helper::run("get", || Ok(s2.clone()), &mut &b"user:pw@x\n"[..], &mut out);
        assert_eq!(code, 1);
        let (mut kout, mut kerr) = (Vec::new(), Vec::new());
        let req = br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"r.example.com/x:1"}"#;
        let code = regbroker::oneshot::kubelet::run(|| Ok(s2.clone()), &mut &req[..], &mut kout, &mut kerr);
        assert_eq!(code, 0);
        // Only the protocol answers themselves may carry the secret; stderr never.
        (String::from_utf8(out).unwrap(), String::from_utf8(kerr).unwrap())
    })
    .await
    .unwrap();
    assert!(
        helper_out.contains(STATIC_PASSWORD),
        "the helper answered the credential"
    );
    outputs.push(kubelet_err);
    let sink_path = dir.path().join("sink.json");
    let sink = regbroker::sinks::docker_config::Sink::start(
        srv.broker.clone(),
        regbroker::sinks::docker_config::Config {
            path: sink_path,
            extra: vec!["a.fake.test".parse().unwrap()],
        },
    )
    .await
    .unwrap();
    outputs.push(format!("{sink:?}"));
    outputs.push(format!("{settings:?}"));

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("TRACE") || logs.contains("DEBUG"),
        "the capture saw no verbose logs:\n{logs}"
    );
    assert!(
        logs.contains("Serving credential"),
        "the capture missed our own logs:\n{logs}"
    );
    let fetched_secret = "fake-secret-1";
    for secret in [STATIC_PASSWORD, IDENTITY_TOKEN, fetched_secret, &auth] {
        assert!(!logs.contains(secret), "secret {secret:?} in logs:\n{logs}");
        for out in &outputs {
            assert!(!out.contains(secret), "secret {secret:?} in output:\n{out}");
        }
    }
}

fn base64_encode(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}
