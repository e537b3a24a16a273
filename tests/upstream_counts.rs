//! Upstream call counts under load: counts, not timings, so noise cannot change them.
//!
//! - 1,000 concurrent requests for one cold key make exactly one upstream call.
//! - 1,000 concurrent requests for distinct keys never run more upstream calls at once
//!   than `cache.max_concurrent_fetches`.
//! - A simulated day of steady traffic (one request a minute, injected clock) with 12 h
//!   ECR-like tokens makes at most 3 upstream calls per identity and region; the same
//!   traffic through a cache that caps lifetime at 1 h (the in-process Flux cache) makes 24.
//!
//! The requests go through the real router (`tower::ServiceExt::oneshot`, the whole
//! handler: query parsing, broker, cache, JSON) on a single-threaded runtime with paused
//! time: the runtime only advances its clock once every task is parked, so "all requests
//! are waiting on the upstream" is a fact the test can wait for rather than a guess about
//! timing. The upstream is the harness's counting fake (a cloud token service cannot run
//! here). BENCHMARKS.md quotes these figures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Answer, TestServer};
use regbroker::server::{self, AppState};
use tower::ServiceExt;

const N: usize = 1_000;

fn router(srv: &TestServer) -> server::App {
    server::app(AppState {
        broker: srv.broker.clone(),
        metrics: srv.metrics.clone(),
        ready: Arc::new(AtomicBool::new(true)),
    })
}

/// Sends `GET /v1/credentials?registry=HOST` through the router; status and JSON body.
async fn get(app: server::App, host: String) -> (StatusCode, serde_json::Value) {
    let req = Request::get(format!("/v1/credentials?registry={host}"))
        .body(Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), 64 * 1024)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

/// Returns once every other task on this (paused, single-threaded) runtime is parked.
async fn all_parked() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn thousand_concurrent_requests_for_one_cold_key_make_one_upstream_call() {
    let srv = TestServer::builder().start().await;
    srv.fake.close_gate();
    let app = router(&srv);

    let requests: Vec<_> = (0..N)
        .map(|_| tokio::spawn(get(app.clone(), "cold.fake.test".into())))
        .collect();
    all_parked().await;
    // Every request is now waiting; the upstream has been called once.
    assert_eq!(srv.fake.calls(), 1);
    assert_eq!(srv.fake.in_flight(), 1);

    srv.fake.open_gate();
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["password"], "fake-secret-1");
    }
    assert_eq!(srv.fake.calls(), 1);
    assert!(
        srv.metrics.encode().contains(&format!(
            "regbroker_cache_lookups_total{{result=\"miss\"}} {N}"
        )),
        "every waiter is counted as a miss served by the one fetch"
    );
}

async fn distinct_keys_stay_within(config: &str, bound: usize) {
    let srv = TestServer::builder().config(config).start().await;
    srv.fake.close_gate();
    let app = router(&srv);

    let requests: Vec<_> = (0..N)
        .map(|i| tokio::spawn(get(app.clone(), format!("r{i}.distinct.test"))))
        .collect();
    all_parked().await;
    // The bound is reached and not passed; the others queue for a permit.
    assert_eq!(srv.fake.in_flight(), bound);
    assert_eq!(srv.fake.calls(), bound);

    srv.fake.open_gate();
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(srv.fake.calls(), N, "one upstream call per distinct key");
    assert_eq!(srv.fake.max_in_flight(), bound);
    assert_eq!(srv.fake.in_flight(), 0);
}

const DISTINCT_RULE: &str = r#"
[[rule]]
match = "*.distinct.test"
source = "fake"
options = { scope = "{host}" }
"#;

#[tokio::test(start_paused = true)]
async fn thousand_distinct_keys_keep_upstream_concurrency_within_the_configured_bound() {
    let config = format!("[cache]\nmax_concurrent_fetches = 8\n{DISTINCT_RULE}");
    distinct_keys_stay_within(&config, 8).await;
}

#[tokio::test(start_paused = true)]
async fn thousand_distinct_keys_keep_upstream_concurrency_within_the_default_bound() {
    distinct_keys_stay_within(DISTINCT_RULE, 32).await;
}

/// Two ECR-like regions of one identity; two hosts (accounts' registries) in the first.
const REGIONS: &str = r#"
[[rule]]
match = "*.us-east-1.fake.test"
source = "fake"
options = { scope = "identity/us-east-1" }

[[rule]]
match = "*.eu-west-1.fake.test"
source = "fake"
options = { scope = "identity/eu-west-1" }
"#;

const HOSTS: [&str; 3] = [
    "111111111111.us-east-1.fake.test",
    "prod.us-east-1.fake.test",
    "111111111111.eu-west-1.fake.test",
];

/// Drives one request per host every minute of a simulated day against upstream tokens
/// that live 12 h, checking every answer is unexpired; returns the fake for counting.
async fn simulated_day(extra_config: &str) -> Arc<common::FakeProvider> {
    let srv = TestServer::builder()
        .config(&format!("{extra_config}\n{REGIONS}"))
        .start()
        .await;
    for _ in 0..200 {
        srv.fake
            .then(Answer::Credential(Some(Duration::from_secs(12 * 3600))));
    }
    let app = router(&srv);
    for _minute in 0..24 * 60 {
        for host in HOSTS {
            let (status, body) = get(app.clone(), host.to_string()).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let expires = humantime::parse_rfc3339(body["expiresAt"].as_str().unwrap()).unwrap();
            assert!(
                expires > regbroker_provider::Clock::now(&srv.clock) + Duration::from_secs(30),
                "served a credential that expires within the margin"
            );
        }
        // A refresh due this minute runs in the background: let it land before the
        // simulated clock moves on, as it would within real seconds.
        common::eventually("background refreshes finish", async || {
            srv.broker.cache().fetches_in_progress() == 0
        })
        .await;
        srv.clock.advance(Duration::from_secs(60));
    }
    srv.fake.clone()
}

#[tokio::test]
async fn a_simulated_day_of_steady_traffic_makes_three_calls_per_identity_and_region() {
    let fake = simulated_day("").await;
    // 12 h tokens, refreshed after 0.8 of (12 h - 30 s): at 0, 9h36m and 19h12m.
    assert_eq!(fake.calls_for("identity/us-east-1"), 3);
    assert_eq!(fake.calls_for("identity/eu-west-1"), 3);
    assert_eq!(fake.calls(), 6);
}

#[tokio::test]
async fn the_same_day_through_a_one_hour_cap_makes_twenty_four_calls() {
    // The reference: the in-process Flux cache keeps a credential at most 1 h (exactly:
    // no refresh jitter, which would make it 24 to 27).
    let fake = simulated_day("[cache]\nmax_refresh = \"1h\"\nrefresh_jitter = 0.0\n").await;
    assert_eq!(fake.calls_for("identity/us-east-1"), 24);
    assert_eq!(fake.calls_for("identity/eu-west-1"), 24);
}
