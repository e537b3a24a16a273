//! Static secrets reload when Kubernetes swaps a mounted Secret's `..data` symlink.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{TestServer, docker_config};

/// Lays out a directory the way the kubelet mounts a Secret:
/// `dir/..<ts>/.dockerconfigjson`, `dir/..data -> ..<ts>`,
/// `dir/.dockerconfigjson -> ..data/.dockerconfigjson`.
fn write_secret_version(dir: &Path, version: &str, contents: &str) {
    let ts = dir.join(format!("..{version}"));
    std::fs::create_dir(&ts).unwrap();
    std::fs::write(ts.join(".dockerconfigjson"), contents).unwrap();
    // Atomic swap, as the kubelet does it: a new symlink renamed over ..data.
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let key = dir.join(".dockerconfigjson");
    if std::fs::symlink_metadata(&key).is_err() {
        std::os::unix::fs::symlink("..data/.dockerconfigjson", &key).unwrap();
    }
}

async fn wait_for(mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

#[tokio::test]
async fn data_symlink_swap_reloads_and_a_broken_version_keeps_the_last_good() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    write_secret_version(
        &secret,
        "v1",
        &docker_config(&[("r.example.com", "u", "password-v1")]),
    );

    let srv = TestServer::builder().docker_config(&secret).start().await;
    let _watcher = regbroker::broker::static_secret::watch(srv.statics.clone()).unwrap();
    assert_eq!(
        srv.credentials("r.example.com").await.1["password"],
        "password-v1"
    );

    write_secret_version(
        &secret,
        "v2",
        &docker_config(&[("r.example.com", "u", "password-v2")]),
    );
    assert!(
        wait_for(async || srv.credentials("r.example.com").await.1["password"] == "password-v2")
            .await,
        "the new Secret version was not picked up"
    );

    // A broken version: the last good one stays, the failure is counted.
    write_secret_version(&secret, "v3", "{ not json");
    assert!(
        wait_for(async || srv
            .get("/metrics")
            .await
            .1
            .contains(r#"regbroker_static_reloads_total{result="error"} 1"#))
        .await,
        "the failed reload was not counted"
    );
    let (status, body) = srv.credentials("r.example.com").await;
    assert_eq!(status, 200);
    assert_eq!(body["password"], "password-v2");

    // And it recovers when a good version arrives.
    write_secret_version(
        &secret,
        "v4",
        &docker_config(&[("r2.example.com", "u", "password-v4")]),
    );
    assert!(wait_for(async || srv.credentials("r2.example.com").await.0 == 200).await);
    assert_eq!(
        srv.credentials("r.example.com").await.0,
        404,
        "entries removed from the Secret are gone"
    );
}

#[tokio::test]
async fn plain_file_rewritten_in_place_or_replaced_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    std::fs::write(&file, docker_config(&[("r.example.com", "u", "one")])).unwrap();
    let srv = TestServer::builder().docker_config(&file).start().await;
    let _watcher = regbroker::broker::static_secret::watch(srv.statics.clone()).unwrap();

    std::fs::write(&file, docker_config(&[("r.example.com", "u", "two")])).unwrap();
    assert!(wait_for(async || srv.credentials("r.example.com").await.1["password"] == "two").await);

    // Replaced by rename, as editors and config management do.
    let tmp = dir.path().join("config.json.tmp");
    std::fs::write(&tmp, docker_config(&[("r.example.com", "u", "three")])).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    assert!(
        wait_for(async || srv.credentials("r.example.com").await.1["password"] == "three").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_never_seen_half_done_and_never_drops_a_request() {
    // Twenty entries, all of one version per file; reloaded 100 times while readers
    // take snapshots and requests run.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let version = |v: usize| {
        let entries: Vec<(String, String)> = (0..20)
            .map(|i| (format!("r{i}.example.com"), format!("pw-v{v}")))
            .collect();
        let refs: Vec<(&str, &str, &str)> = entries
            .iter()
            .map(|(h, p)| (h.as_str(), "u", p.as_str()))
            .collect();
        docker_config(&refs)
    };
    std::fs::write(&path, version(0)).unwrap();
    let srv = std::sync::Arc::new(TestServer::builder().docker_config(&path).start().await);
    let registries: Vec<regbroker_provider::Registry> = (0..20)
        .map(|i| regbroker_provider::Registry::parse(&format!("r{i}.example.com")).unwrap())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (srv, stop) = (srv.clone(), stop.clone());
        std::thread::spawn(move || {
            use regbroker_provider::ExposeSecret;
            let mut seen = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let snap = srv.statics.snapshot();
                let secrets: std::collections::BTreeSet<String> = registries
                    .iter()
                    .map(|r| snap.get(r).unwrap().secret().expose_secret().to_string())
                    .collect();
                assert_eq!(secrets.len(), 1, "a snapshot mixed versions: {secrets:?}");
                seen += 1;
            }
            seen
        })
    };
    let requests = {
        let (srv, stop) = (srv.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (status, body) = srv.credentials(&format!("r{}.example.com", n % 20)).await;
                assert_eq!(status, 200, "a request during a reload: {body}");
                assert!(body["password"].as_str().unwrap().starts_with("pw-v"));
                n += 1;
            }
            n
        })
    };
    for v in 1..=100 {
        regbroker::sinks::docker_config::write_atomic(&path, version(v).as_bytes()).unwrap();
        srv.statics.reload().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let snapshots = reader.join().unwrap();
    let served = tokio::time::timeout(Duration::from_secs(10), requests)
        .await
        .unwrap()
        .unwrap();
    assert!(
        snapshots > 0 && served > 0,
        "{snapshots} snapshots, {served} requests"
    );
    assert_eq!(
        srv.credentials("r0.example.com").await.1["password"],
        "pw-v100"
    );
}

#[tokio::test]
async fn one_change_reloads_once_and_reading_the_file_does_not_reload_it_again() {
    // Reading the file (as each reload does) is an access event on the watched
    // directory; taken for a change, one edit started a reload every debounce period
    // forever.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, docker_config(&[("r.example.com", "u", "p1")])).unwrap();
    let srv = TestServer::builder().docker_config(&path).start().await;
    let _watcher = regbroker::broker::static_secret::watch(srv.statics.clone()).unwrap();
    let reloads = async || {
        srv.get("/metrics")
            .await
            .1
            .lines()
            .find_map(|l| l.strip_prefix(r#"regbroker_static_reloads_total{result="ok"} "#))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    std::fs::write(&path, docker_config(&[("r.example.com", "u", "p2")])).unwrap();
    assert!(wait_for(async || srv.credentials("r.example.com").await.1["password"] == "p2").await);
    // Twenty debounce periods: a loop would reload about twenty more times.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = reloads().await;
    assert!((1..=2).contains(&n), "{n} reloads after one change");
    // Reading the file from outside is not a change either.
    let _ = std::fs::read(&path).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(reloads().await, n);
}
