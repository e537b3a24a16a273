//! What `/metrics` counts, and what it never carries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Answer, TestServer, docker_config};
use regbroker_provider::Error;

/// The value of the sample `name{labels}`, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A repeated request is answered from the answer kept for it (broker::memo), and
/// counted exactly as the first decided one was.
#[tokio::test]
async fn repeated_requests_are_counted_as_hits_and_served_as_the_first_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, docker_config(&[("static.example.com", "u", "p")])).unwrap();
    let srv = TestServer::builder().docker_config(&path).start().await;
    for _ in 0..4 {
        assert_eq!(srv.credentials("a.fake.test").await.0, 200);
        assert_eq!(srv.credentials("static.example.com").await.0, 200);
    }
    assert_eq!(srv.fake.calls(), 1);
    assert_eq!(
        srv.broker.cache().memo().len(),
        2,
        "the answers were not kept"
    );
    let (_, text) = srv.get("/metrics").await;
    for (series, expected) in [
        (r#"regbroker_cache_lookups_total{result="miss"}"#, 1.0),
        (r#"regbroker_cache_lookups_total{result="hit"}"#, 3.0),
        (r#"regbroker_credentials_served_total{source="fake"}"#, 4.0),
        (
            r#"regbroker_credentials_served_total{source="static"}"#,
            4.0,
        ),
    ] {
        let value = sample(&text, series).unwrap_or(0.0);
        assert_eq!(value, expected, "{series}\n{text}");
    }
}

#[tokio::test]
async fn a_stale_served_lookup_is_counted_as_stale_not_as_a_hit() {
    // A failure pause of at least 30 min, so the request after the failed refresh is
    // answered from the cache as stale (not by a new fetch).
    let srv = TestServer::builder()
        .config("[cache]\nfailure_backoff = \"1h\"\nmax_failure_backoff = \"1h\"\n")
        .start()
        .await;
    assert_eq!(srv.credentials("a.fake.test").await.0, 200); // miss
    // Past the refresh point (2856 s of a 1 h credential): the background refresh fails.
    srv.fake.then(Answer::Fail(Error::unavailable));
    srv.clock.advance(Duration::from_secs(2900));
    assert_eq!(srv.credentials("a.fake.test").await.0, 200); // refresh_ahead
    let cache = srv.broker.cache().clone();
    common::eventually("the background refresh ended", async || {
        cache.fetches_in_progress() == 0
    })
    .await;
    assert_eq!(srv.fake.calls(), 2);
    let (status, body) = srv.credentials("a.fake.test").await; // stale
    assert_eq!(status, 200);
    assert_eq!(body["password"], "fake-secret-1");
    let (_, text) = srv.get("/metrics").await;
    let lookups = |result: &str| {
        sample(
            &text,
            &format!("regbroker_cache_lookups_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(lookups("miss"), 1.0, "{text}");
    assert_eq!(lookups("refresh_ahead"), 1.0, "{text}");
    assert_eq!(lookups("stale"), 1.0, "{text}");
    assert_eq!(
        lookups("hit"),
        0.0,
        "a stale answer counted as a hit: {text}"
    );
}

#[tokio::test]
async fn metrics_never_carry_a_registry_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("static.json");
    std::fs::write(
        &path,
        docker_config(&[("static-reg.example.com", "u", "static-pw")]),
    )
    .unwrap();
    let srv = TestServer::builder()
        .docker_config(&path)
        .config("[[rule]]\nmatch = \"ruled-reg.example.org\"\nsource = \"fake\"\n")
        .start()
        .await;
    let registries = [
        "static-reg.example.com",
        "ruled-reg.example.org",
        "auto-reg.fake.test",
        "unknown-reg.example.net",
    ];
    for r in registries {
        srv.credentials(r).await;
    }
    srv.fake.then(Answer::Fail(Error::unavailable));
    srv.credentials("failing-reg.own-scope.fake.test").await;
    srv.credentials("bad reg!").await;
    let (status, text) = srv.get("/metrics").await;
    assert_eq!(status, 200);
    // Positive control: the lookups above were counted.
    assert!(
        sample(
            &text,
            "regbroker_credentials_served_total{source=\"static\"}"
        )
        .is_some(),
        "{text}"
    );
    for needle in registries.into_iter().chain([
        "failing-reg",
        "own-scope",
        "fake.test",
        "example.",
        "bad reg",
    ]) {
        assert!(!text.contains(needle), "metrics name {needle:?}:\n{text}");
    }
    assert!(!text.contains("static-pw") && !text.contains("fake-secret"));
}
