//! The docker config sink keeps a config.json with fresh credentials (injected clock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use base64::Engine as _;
use common::{Answer, TestServer, docker_config};
use regbroker::sinks::docker_config::{Config, Sink};
use regbroker_provider::Registry;

fn auth_of(path: &std::path::Path, registry: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let auth = v["auths"][registry]["auth"].as_str()?;
    Some(
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(auth)
                .unwrap(),
        )
        .unwrap(),
    )
}

#[tokio::test]
async fn sink_writes_static_rule_and_named_registries_and_refreshes_before_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let statics = common::write_static(dir.path());
    let srv = TestServer::builder()
        .docker_config(&statics)
        .config(
            "[[rule]]\nmatch = \"proxy.example.com\"\nsource = \"fake\"\noptions = { scope = \"proxy\" }\n\
             [[rule]]\nmatch = \"*.glob.example.com\"\nsource = \"fake\"\n",
        )
        .start()
        .await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(1000))));
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(1000))));
    let path = dir.path().join("out").join("config.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let config = Config {
        path: path.clone(),
        extra: vec![Registry::parse("named.fake.test").unwrap()],
    };
    let mut sink = Sink::start(srv.broker.clone(), config).await.unwrap();

    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(auth_of(&path, "static.example.com").unwrap(), "s-user:s-pw");
    let proxy = auth_of(&path, "proxy.example.com").unwrap();
    let named = auth_of(&path, "named.fake.test").unwrap();
    assert!(proxy.starts_with("fake-user:fake-secret-"), "{proxy}");
    assert!(named.starts_with("fake-user:fake-secret-"), "{named}");
    // Globs cannot be enumerated: nothing for them.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["auths"].as_object().unwrap().len(), 3, "{v}");
    assert_eq!(srv.fake.calls(), 2, "one fetch per scope");
    // The next pass is due at the refresh point: 0.8 of the 970 s usable life.
    assert_eq!(
        sink.next_pass_in(),
        Duration::from_secs(60),
        "clamped to the longest sleep"
    );

    // Before the refresh point the file keeps its credentials; after it, they are replaced.
    // The cache moves each refresh point earlier by a random part, up to a tenth of the
    // time until it (`refresh_jitter`): 776 s may be as early as 698.4 s, so "before" is
    // 650 s (700 s failed about one run in 25).
    srv.clock.advance(Duration::from_secs(650));
    sink.refresh().await;
    assert_eq!(auth_of(&path, "proxy.example.com").unwrap(), proxy);
    assert_eq!(srv.fake.calls(), 2);
    srv.clock.advance(Duration::from_secs(150)); // 800 s > 776 s
    sink.refresh().await;
    assert_ne!(
        auth_of(&path, "proxy.example.com").unwrap(),
        proxy,
        "refreshed before expiry"
    );
    assert_eq!(srv.fake.calls(), 4);

    // A static entry removed from its source disappears from the file.
    std::fs::write(&statics, docker_config(&[])).unwrap();
    srv.statics.reload().unwrap();
    sink.refresh().await;
    assert!(auth_of(&path, "static.example.com").is_none());
}

#[tokio::test]
async fn a_credential_whose_refresh_fails_leaves_the_file_once_stale() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::builder()
        .config("[[rule]]\nmatch = \"proxy.example.com\"\nsource = \"fake\"\n")
        .start()
        .await;
    // 1000 s of life: refresh at 776 s, stale at 970 s. Every refresh fails.
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(1000))));
    for _ in 0..10 {
        srv.fake
            .then(Answer::Fail(regbroker_provider::Error::unavailable));
    }
    let path = dir.path().join("config.json");
    let config = Config {
        path: path.clone(),
        extra: vec![],
    };
    let mut sink = Sink::start(srv.broker.clone(), config).await.unwrap();
    let written = auth_of(&path, "proxy.example.com").unwrap();
    // Past the refresh point, before the stale point: the cached one is still written.
    srv.clock.advance(Duration::from_secs(800));
    sink.refresh().await;
    assert_eq!(auth_of(&path, "proxy.example.com").unwrap(), written);
    // Past the stale point: gone from the file, not kept because the fetch failed.
    srv.clock.advance(Duration::from_secs(180));
    sink.refresh().await;
    assert_eq!(auth_of(&path, "proxy.example.com"), None);
}

#[tokio::test]
async fn a_named_registry_that_loses_its_source_leaves_the_file_at_once() {
    let (srv, dir) = common::server_with_static().await;
    let statics = dir.path().join("static.json");
    let path = dir.path().join("config.json");
    // Named as well, so it stays wanted when its static entry goes.
    let config = Config {
        path: path.clone(),
        extra: vec![Registry::parse("static.example.com").unwrap()],
    };
    let mut sink = Sink::start(srv.broker.clone(), config).await.unwrap();
    assert_eq!(auth_of(&path, "static.example.com").unwrap(), "s-user:s-pw");
    std::fs::write(&statics, docker_config(&[])).unwrap();
    srv.statics.reload().unwrap();
    sink.refresh().await;
    assert_eq!(auth_of(&path, "static.example.com"), None);
}

fn inode(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[tokio::test]
async fn an_unchanged_docker_config_file_is_not_rewritten() {
    let (srv, dir) = common::server_with_static().await;
    let path = dir.path().join("config.json");
    let config = Config {
        path: path.clone(),
        extra: vec![],
    };
    let mut sink = Sink::start(srv.broker.clone(), config).await.unwrap();
    // Every write is a new file renamed into place: a new inode. A hard link keeps the
    // written one alive, so its inode number cannot be reused by a rewrite.
    let seen = dir.path().join("seen");
    std::fs::hard_link(&path, &seen).unwrap();
    let written = inode(&seen);
    sink.refresh().await;
    sink.refresh().await;
    assert_eq!(inode(&path), written, "rewritten although nothing changed");
    // Control: a change is written.
    std::fs::write(
        dir.path().join("static.json"),
        docker_config(&[("static.example.com", "s-user", "new-pw")]),
    )
    .unwrap();
    srv.statics.reload().unwrap();
    sink.refresh().await;
    assert_ne!(inode(&path), written);
    assert_eq!(
        auth_of(&path, "static.example.com").unwrap(),
        "s-user:new-pw"
    );
}

/// A sink's first pass over one 100 s credential (a `proxy.example.com` rule), with
/// `cache` settings first in the config: when its next pass is due, and the fetches made.
async fn first_pass_over_a_100_s_credential(cache: &str) -> (Duration, usize) {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::builder()
        .config(&format!(
            "{cache}\n[[rule]]\nmatch = \"proxy.example.com\"\nsource = \"fake\"\n"
        ))
        .start()
        .await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(100))));
    let config = Config {
        path: dir.path().join("config.json"),
        extra: vec![],
    };
    let sink = Sink::start(srv.broker.clone(), config).await.unwrap();
    (sink.next_pass_in(), srv.fake.calls())
}

#[tokio::test]
async fn the_next_pass_is_due_at_the_earliest_refresh_point_not_the_stale_point() {
    // 100 s of life: usable 70 s (30 s margin), refresh at 0.8 of that, 56 s; both
    // inside the [5 s, 60 s] clamp, so the clamp cannot hide which one was used. The
    // pass follows the cache's own refresh point, so its jitter is off here.
    assert_eq!(
        first_pass_over_a_100_s_credential("[cache]\nrefresh_jitter = 0.0\n").await,
        (Duration::from_secs(56), 1)
    );
}

#[tokio::test]
async fn the_next_pass_follows_the_configured_refresh_fraction() {
    // 70 s usable: refresh at half of that, 35 s (the default is 56 s).
    assert_eq!(
        first_pass_over_a_100_s_credential(
            "[cache]\nrefresh_fraction = 0.5\nrefresh_jitter = 0.0\n"
        )
        .await,
        (Duration::from_secs(35), 1)
    );
}

#[tokio::test]
async fn a_change_of_static_sources_wakes_the_sink_before_its_next_pass() {
    let (srv, dir) = common::server_with_static().await;
    let path = dir.path().join("config.json");
    let config = Config {
        path: path.clone(),
        extra: vec![],
    };
    let sink = Sink::start(srv.broker.clone(), config).await.unwrap();
    assert_eq!(
        sink.next_pass_in(),
        Duration::from_secs(60),
        "static entries only: the longest sleep"
    );
    let task = tokio::spawn(sink.run());
    // On this single-threaded runtime, one yield runs the sink up to its wait, which
    // notes the current static snapshot; the change below must come after that.
    tokio::task::yield_now().await;
    std::fs::write(
        dir.path().join("static.json"),
        docker_config(&[
            ("static.example.com", "s-user", "s-pw"),
            ("new.example.com", "n-user", "n-pw"),
        ]),
    )
    .unwrap();
    srv.statics.reload().unwrap();
    // eventually() gives up after 10 s, well before the 60 s pass.
    common::eventually("the sink wrote the new entry", async || {
        std::fs::read(&path).is_ok_and(|_| auth_of(&path, "new.example.com").is_some())
    })
    .await;
    task.abort();
}
