//! Upstream faults at the broker level: a failing upstream is not hammered, a slow one
//! times out, a credential stays servable until its real expiry while refresh fails, and
//! recovery is automatic. (Each provider's own faults — 500s, throttling, resets,
//! malformed answers — are tested against fakes in its crate.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Answer, TestServer};
use regbroker_provider::Error;

#[tokio::test]
async fn failing_upstream_is_not_hammered_and_recovers_by_itself() {
    let srv = TestServer::builder()
        .config("[cache]\nfailure_backoff = \"2s\"\nmax_failure_backoff = \"8s\"\n")
        .start()
        .await;
    for _ in 0..3 {
        srv.fake.then(Answer::Fail(Error::throttled));
    }
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(srv.fake.calls(), 1);

    // Fifty more requests inside the pause: answered at once, upstream untouched.
    for _ in 0..50 {
        let (status, body) = srv.credentials("a.fake.test").await;
        assert_eq!(status, 503);
        assert_eq!(body["error"]["code"], "upstream_throttled");
    }
    assert_eq!(srv.fake.calls(), 1);

    // After the pause (at most 2 s for the first failure) one request goes upstream...
    srv.clock.advance(Duration::from_secs(2));
    assert_eq!(srv.credentials("a.fake.test").await.0, 503);
    assert_eq!(srv.fake.calls(), 2);
    // ...and the second consecutive failure pauses longer: 2-4 s.
    srv.clock.advance(Duration::from_millis(1900));
    assert_eq!(srv.credentials("a.fake.test").await.0, 503);
    assert_eq!(srv.fake.calls(), 2, "still within the doubled pause");
    srv.clock.advance(Duration::from_millis(2100));
    assert_eq!(srv.credentials("a.fake.test").await.0, 503);
    assert_eq!(srv.fake.calls(), 3);

    // The upstream heals: after the pause the next request succeeds and the slate is clean.
    srv.clock.advance(Duration::from_secs(8));
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(srv.fake.calls(), 4);
    let (status, _) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(srv.fake.calls(), 4, "served from the cache");
}

#[tokio::test]
async fn a_failing_key_does_not_hold_back_other_keys() {
    let srv = TestServer::builder()
        .config("[[rule]]\nmatch = \"other.example.com\"\nsource = \"fake\"\noptions = { scope = \"other\" }\n")
        .start()
        .await;
    srv.fake.then(Answer::Fail(Error::unavailable));
    assert_eq!(srv.credentials("a.fake.test").await.0, 503);
    assert_eq!(srv.credentials("other.example.com").await.0, 200);
    assert_eq!(srv.fake.calls(), 2);
}

#[tokio::test]
async fn slow_upstream_times_out_with_504_and_no_secret() {
    let srv = TestServer::builder()
        .config("[cache]\nfetch_timeout = \"200ms\"\n")
        .start()
        .await;
    srv.fake.set_delay(Duration::from_secs(30));
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "upstream_timeout");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("200ms"),
        "{body}"
    );
}

#[tokio::test]
async fn refresh_failures_serve_the_cached_credential_until_its_real_expiry() {
    let srv = TestServer::builder().start().await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(3600))));
    assert_eq!(
        srv.credentials("a.fake.test").await.1["password"],
        "fake-secret-1"
    );
    for _ in 0..100 {
        srv.fake.then(Answer::Fail(Error::unavailable));
    }
    // Past the refresh point (0.8 of 3570 s = 2856 s): every refresh fails, but the
    // credential is still valid and keeps being served, without hammering upstream.
    srv.clock.advance(Duration::from_secs(2900));
    for _ in 0..20 {
        let (status, body) = srv.credentials("a.fake.test").await;
        assert_eq!(status, 200);
        assert_eq!(body["password"], "fake-secret-1");
    }
    assert_eq!(srv.fake.calls(), 2, "one refresh attempt, then the pause");
    // The background refresh is counted as started and as failed, never as ok.
    common::eventually("the failed refresh is counted", async || {
        srv.metrics
            .encode()
            .contains("regbroker_cache_refreshes_total{result=\"failed\"} 1")
    })
    .await;
    let metrics = srv.metrics.encode();
    assert!(
        metrics.contains("regbroker_cache_refreshes_total{result=\"started\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("regbroker_cache_refreshes_total{result=\"ok\"} 1"),
        "{metrics}"
    );
    // Past the stale point (3570 s) it is never served.
    srv.clock.advance(Duration::from_secs(700));
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 503, "{body}");
}

#[tokio::test]
async fn credential_expiring_in_seconds_is_served_once_and_refetched() {
    let srv = TestServer::builder().start().await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(5))));
    assert_eq!(
        srv.credentials("a.fake.test").await.1["password"],
        "fake-secret-1"
    );
    srv.clock.advance(Duration::from_secs(5));
    assert_eq!(
        srv.credentials("a.fake.test").await.1["password"],
        "fake-secret-2"
    );
}

#[tokio::test]
async fn an_upstream_hanging_at_the_refresh_point_keeps_no_request_waiting() {
    let srv = TestServer::builder().start().await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(3600))));
    assert_eq!(
        srv.credentials("a.fake.test").await.1["password"],
        "fake-secret-1"
    );
    // Past the refresh point (2856 s), upstream hangs: every request is still answered
    // with the cached credential while the one refresh is stuck upstream.
    srv.clock.advance(Duration::from_secs(2900));
    srv.fake.close_gate();
    let answers =
        futures_util::future::join_all((0..10).map(|_| srv.credentials("a.fake.test"))).await;
    for (status, body) in answers {
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["password"], "fake-secret-1");
    }
    assert_eq!(
        srv.fake.in_flight(),
        1,
        "all ten were answered while the single refresh still hangs"
    );
    assert_eq!(srv.fake.calls(), 2);
    let metrics = srv.metrics.encode();
    assert!(
        metrics.contains("regbroker_cache_refreshes_total{result=\"started\"} 1"),
        "{metrics}"
    );
    // Healed: the refresh lands and replaces the credential, nobody having waited.
    srv.fake.open_gate();
    common::eventually("the refreshed credential is served", async || {
        srv.credentials("a.fake.test").await.1["password"] == "fake-secret-2"
    })
    .await;
    assert!(
        srv.metrics
            .encode()
            .contains("regbroker_cache_refreshes_total{result=\"ok\"} 1")
    );
}

#[tokio::test]
async fn a_full_fetch_queue_answers_503_overloaded_at_once() {
    let srv = TestServer::builder()
        .config("[cache]\nmax_concurrent_fetches = 1\nmax_queued_fetches = 0\n")
        .start()
        .await;
    srv.fake.close_gate();
    let base = srv.base.clone();
    let client = srv.client.clone();
    let stuck = tokio::spawn(async move {
        client
            .get(format!("{base}/v1/credentials?registry=a.fake.test"))
            .send()
            .await
    });
    common::eventually("the first fetch holds the only slot", async || {
        srv.fake.in_flight() == 1
    })
    .await;
    let (status, body) = srv.credentials("b.own-scope.fake.test").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(srv.fake.calls(), 1, "the refused key never went upstream");
    assert!(
        srv.metrics
            .encode()
            .contains("regbroker_fetches_dropped_total{result=\"overloaded\"} 1")
    );
    srv.fake.open_gate();
    assert_eq!(stuck.await.unwrap().unwrap().status(), 200);
}
