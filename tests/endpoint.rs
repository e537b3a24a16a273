//! The sidecar endpoint contract, against the real server on 127.0.0.1:0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Answer, TestServer, docker_config};
use regbroker_provider::Error;

#[tokio::test]
async fn static_credential_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        docker_config(&[("registry.example.com:5000", "alice", "s3cret")]),
    )
    .unwrap();
    let srv = TestServer::builder().docker_config(&path).start().await;

    let (status, body) = srv
        .credentials("https://Registry.Example.com:5000/v2/")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["registry"], "registry.example.com:5000");
    assert_eq!(body["username"], "alice");
    assert_eq!(body["password"], "s3cret");
    assert_eq!(body["provider"], "static");
    assert!(body["expiresAt"].is_null());

    // The same host without the port is a different registry.
    let (status, body) = srv.credentials("registry.example.com").await;
    assert_eq!(status, 404, "{body}");
}

/// The answer's exact bytes and headers: clients parse it with their own JSON readers, so
/// the field set, names and order, and `null` for an unknown expiry are part of the contract.
#[tokio::test]
async fn credential_answer_is_exact_json_marked_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        docker_config(&[("registry.example.com", "alice", "s3\"cr\\et")]),
    )
    .unwrap();
    let srv = TestServer::builder().docker_config(&path).start().await;

    // The first answer is decided; the repeats are the kept answer (broker::memo).
    for _ in 0..3 {
        let res = srv
            .client
            .get(format!(
                "{}/v1/credentials?registry=registry.example.com",
                srv.base
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        assert_eq!(res.headers()["content-type"], "application/json");
        assert_eq!(res.headers()["cache-control"], "no-store");
        assert_eq!(
            res.text().await.unwrap(),
            r#"{"expiresAt":null,"password":"s3\"cr\\et","provider":"static","registry":"registry.example.com","username":"alice"}"#
        );
    }
    assert_eq!(
        srv.broker.cache().memo().len(),
        1,
        "the answer was not kept"
    );
}

#[tokio::test]
async fn static_beats_a_provider_for_the_same_host() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        docker_config(&[("pinned.fake.test", "static-user", "static-pw")]),
    )
    .unwrap();
    let srv = TestServer::builder()
        .docker_config(&path)
        .config("[[rule]]\nmatch = \"pinned.fake.test\"\nsource = \"fake\"\n")
        .start()
        .await;

    let (status, body) = srv.credentials("pinned.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(body["provider"], "static");
    assert_eq!(body["password"], "static-pw");
    // A neighbour without a static entry goes to the provider.
    let (status, body) = srv.credentials("other.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(body["provider"], "fake");
    assert_eq!(srv.fake.calls(), 1);
}

#[tokio::test]
async fn unknown_registry_is_404_with_a_json_error() {
    let srv = TestServer::builder().start().await;
    let (status, body) = srv.credentials("registry.example.com").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "not_configured");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("registry.example.com")
    );
    assert_eq!(srv.fake.calls(), 0);
}

#[tokio::test]
async fn rule_none_disables_auto_detection() {
    let srv = TestServer::builder()
        .config("[[rule]]\nmatch = \"*.fake.test\"\nsource = \"none\"\n")
        .start()
        .await;
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("rule 1")
    );
    assert_eq!(srv.fake.calls(), 0);
}

#[tokio::test]
async fn explicit_rule_routes_a_custom_domain_to_a_provider() {
    let srv = TestServer::builder()
        .config("[[rule]]\nmatch = \"proxy.example.com\"\nsource = \"fake\"\noptions = { scope = \"proxy\" }\n")
        .start()
        .await;
    let (status, body) = srv.credentials("proxy.example.com").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["provider"], "fake");
}

#[tokio::test]
async fn malformed_requests_are_400_without_upstream_work() {
    let srv = TestServer::builder().start().await;
    for bad in [
        "",
        "user:pw@a.fake.test",
        "a.fake.test:99999",
        "a..fake.test",
        "a.fake.test\n",
        "ftp://a.fake.test",
        "ä.fake.test",
        // Paths that break the distribution grammar are refused, not reduced to a host.
        "a.fake.test/../../etc/passwd",
        "oci://a.fake.test/org//charts",
        "a.fake.test/./repo",
    ] {
        let (status, body) = srv.credentials(bad).await;
        assert_eq!(status, 400, "{bad:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_registry", "{bad:?}");
        assert!(!body.to_string().contains("pw@"), "{body}");
    }
    for query in [
        "",
        "?other=x",
        "?registry=a.fake.test&registry=b.fake.test",
        "?registry=%ZZ",
    ] {
        let (status, body) = srv.get(&format!("/v1/credentials{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
    }
    // A trailing slash, as in Flux's `oci://ghcr.io/my-org/charts/`, stays accepted.
    let (status, body) = srv.credentials("oci://a.fake.test/my-org/charts/").await;
    assert_eq!(status, 200, "{body}");
    let long = format!("?registry={}", "a".repeat(5000));
    assert_eq!(srv.get(&format!("/v1/credentials{long}")).await.0, 400);
    assert_eq!(
        srv.fake.calls(),
        1,
        "only the well-formed reference went upstream"
    );
}

#[tokio::test]
async fn upstream_failures_map_to_statuses() {
    type MakeError = fn(String) -> Error;
    let cases: [(MakeError, u16, &str); 6] = [
        (Error::unavailable, 503, "upstream_unavailable"),
        (Error::throttled, 503, "upstream_throttled"),
        (Error::timed_out, 504, "upstream_timeout"),
        (Error::bad_response, 502, "upstream_bad_response"),
        (Error::identity_missing, 403, "identity_missing"),
        (Error::identity_rejected, 403, "identity_rejected"),
    ];
    for (make, status, code) in cases {
        let srv = TestServer::builder().start().await;
        srv.fake.then(Answer::Fail(make));
        let (got, body) = srv.credentials("a.fake.test").await;
        assert_eq!(got, status, "{body}");
        assert_eq!(body["error"]["code"], code);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("fake: "), "{message}");
        // An identity failure says what to run next, once; no other failure does.
        let hints = message.matches("regbroker doctor").count();
        let want = usize::from(status == 403);
        assert_eq!(hints, want, "{code}: {message}");
        // The failure is remembered briefly so the upstream is not hammered...
        let (got, _) = srv.credentials("a.fake.test").await;
        assert_eq!(got, status);
        assert_eq!(srv.fake.calls(), 1);
        // ...and recovery is automatic once the pause is over.
        srv.clock.advance(Duration::from_secs(30));
        let (got, body) = srv.credentials("a.fake.test").await;
        assert_eq!(got, 200, "{body}");
    }
}

#[tokio::test]
async fn concurrent_cold_requests_make_exactly_one_upstream_call() {
    let srv = TestServer::builder().start().await;
    srv.fake.close_gate();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let client = srv.client.clone();
        let url = format!("{}/v1/credentials?registry=cold.fake.test", srv.base);
        tasks.push(tokio::spawn(async move {
            let res = client.get(url).send().await.unwrap();
            (
                res.status().as_u16(),
                res.json::<serde_json::Value>().await.unwrap(),
            )
        }));
    }
    // Every request has joined the one fetch before the upstream answers.
    let cache = srv.broker.cache().clone();
    let key = regbroker::broker::cache::Key {
        provider: "fake",
        scope: "fake-identity".into(),
    };
    common::eventually("all 100 requests wait on the fetch", async || {
        cache.waiting_for(&key).await == 100
    })
    .await;
    srv.fake.open_gate();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body["password"], "fake-secret-1");
    }
    assert_eq!(srv.fake.calls(), 1);
}

#[tokio::test]
async fn hosts_sharing_a_scope_share_one_credential() {
    let srv = TestServer::builder().start().await;
    for host in ["a.fake.test", "b.fake.test", "c.fake.test"] {
        let (status, body) = srv.credentials(host).await;
        assert_eq!(status, 200);
        assert_eq!(body["registry"], host);
        assert_eq!(body["password"], "fake-secret-1");
    }
    assert_eq!(srv.fake.calls(), 1);
}

#[tokio::test]
async fn credential_is_refreshed_after_the_configured_fraction_and_never_served_past_expiry() {
    // 1000 s credentials; min_remaining 100 s -> usable 900 s; refresh at 0.5 -> 450 s
    // (no jitter, so exactly there).
    let srv = TestServer::builder()
        .config("[cache]\nrefresh_fraction = 0.5\nrefresh_jitter = 0.0\nmin_refresh = \"1s\"\nmin_remaining = \"100s\"\n")
        .start()
        .await;
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(1000))));
    let (_, body) = srv.credentials("a.fake.test").await;
    assert_eq!(body["password"], "fake-secret-1");
    let expected_expiry = regbroker::rfc3339(srv.clock_now() + Duration::from_secs(1000));
    assert_eq!(body["expiresAt"], expected_expiry.as_str());

    srv.clock.advance(Duration::from_secs(449));
    let (_, body) = srv.credentials("a.fake.test").await;
    assert_eq!(
        body["password"], "fake-secret-1",
        "served from cache before the refresh point"
    );
    assert_eq!(srv.fake.calls(), 1);

    srv.clock.advance(Duration::from_secs(2)); // 451 s
    srv.fake
        .then(Answer::Credential(Some(Duration::from_secs(1000))));
    let (_, body) = srv.credentials("a.fake.test").await;
    assert_eq!(
        body["password"], "fake-secret-1",
        "past the refresh point the cached credential is answered at once"
    );
    // ...while the refresh runs in the background and replaces it.
    common::eventually(
        "the background refresh replaces the credential",
        async || srv.credentials("a.fake.test").await.1["password"] == "fake-secret-2",
    )
    .await;
    assert_eq!(srv.fake.calls(), 2);

    // From here every refresh fails. Between the refresh point and the stale point the
    // cached credential keeps being served; past it, never.
    for _ in 0..10 {
        srv.fake.then(Answer::Fail(Error::unavailable));
    }
    srv.clock.advance(Duration::from_secs(500)); // 500 s into credential 2: due for refresh
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["password"], "fake-secret-2",
        "refresh due; still valid, still served"
    );
    common::eventually("the background refresh is tried", async || {
        srv.fake.calls() == 3
    })
    .await;
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["password"], "fake-secret-2",
        "refresh failed; still valid, still served"
    );
    assert_eq!(
        srv.fake.calls(),
        3,
        "the failure pause holds further refreshes"
    );

    srv.clock.advance(Duration::from_secs(401)); // 901 s: within min_remaining of expiry
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 503, "a stale credential must not be served: {body}");
    assert!(!body.to_string().contains("fake-secret"));
}

#[tokio::test]
async fn credential_with_expiry_in_the_past_is_served_but_not_trusted() {
    // Like moto's ECR tokens, dated 2015: serve it, keep it only for fallback_ttl (60 s).
    let srv = TestServer::builder().start().await;
    srv.fake.then(Answer::Credential(Some(Duration::ZERO)));
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(body["password"], "fake-secret-1");
    assert!(
        body["expiresAt"].is_null(),
        "a past expiry is not reported as valid: {body}"
    );
    srv.clock.advance(Duration::from_secs(59));
    assert_eq!(
        srv.credentials("a.fake.test").await.1["password"],
        "fake-secret-1"
    );
    srv.clock.advance(Duration::from_secs(2));
    assert_eq!(
        srv.credentials("a.fake.test").await.1["password"],
        "fake-secret-2"
    );
}

#[tokio::test]
async fn health_ready_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        docker_config(&[("r.example.com", "u", "metrics-secret")]),
    )
    .unwrap();
    let srv = TestServer::builder().docker_config(&path).start().await;
    assert_eq!(srv.get("/healthz").await.0, 200);
    assert_eq!(srv.get("/readyz").await.0, 200);
    srv.credentials("r.example.com").await;
    srv.credentials("a.fake.test").await;
    srv.credentials("a.fake.test").await;
    srv.credentials("nope.example.com").await;
    let (status, text) = srv.get("/metrics").await;
    assert_eq!(status, 200);
    for line in [
        r#"regbroker_http_requests_total{route="/v1/credentials",status="200"} 3"#,
        r#"regbroker_http_requests_total{route="/v1/credentials",status="404"} 1"#,
        r#"regbroker_cache_lookups_total{result="miss"} 1"#,
        r#"regbroker_cache_lookups_total{result="hit"} 1"#,
        r#"regbroker_credentials_served_total{source="static"} 1"#,
        r#"regbroker_upstream_requests_total{provider="fake",outcome="ok"} 1"#,
        r#"regbroker_upstream_request_duration_seconds_count{provider="fake"} 1"#,
        "regbroker_static_entries 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(!text.contains("metrics-secret"));
    assert!(!text.contains("fake-secret"));
    let (status, _) = srv.get("/no/such/path").await;
    assert_eq!(status, 404);
}

trait ClockNow {
    fn clock_now(&self) -> std::time::SystemTime;
}

impl ClockNow for TestServer {
    fn clock_now(&self) -> std::time::SystemTime {
        regbroker_provider::Clock::now(&self.clock)
    }
}

#[tokio::test]
async fn expiry_in_the_year_10000_is_capped_not_a_panic() {
    // An upstream answering an expiry in the year 10000 or later (ECR `expiresAt`, an
    // ACR `exp`) once made RFC 3339 formatting panic, which aborts a release build.
    // The broker caps every fetched expiry at MAX_LIFETIME from now.
    let srv = TestServer::builder().start().await;
    let year_10000 = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_800);
    let far = year_10000.duration_since(srv.clock_now()).unwrap() + Duration::from_secs(86_400);
    srv.fake.then(Answer::Credential(Some(far)));
    let (status, body) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["password"], "fake-secret-1");
    let capped = regbroker::rfc3339(srv.clock_now() + regbroker_provider::MAX_LIFETIME);
    assert_eq!(body["expiresAt"], capped.as_str(), "{body}");
    // Cached like any 12 h credential: the next request is a hit.
    let (status, _) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200);
    assert_eq!(srv.fake.calls(), 1);
}

#[tokio::test]
async fn readyz_answers_503_until_start_up_work_is_done() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt as _;
    let srv = TestServer::builder().start().await;
    let ready = Arc::new(AtomicBool::new(false));
    let state = regbroker::server::AppState {
        broker: srv.broker.clone(),
        metrics: srv.metrics.clone(),
        ready: ready.clone(),
    };
    let status = |app: regbroker::server::App, path: &'static str| async move {
        let req = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        app.oneshot(req).await.unwrap().status().as_u16()
    };
    let app = regbroker::server::app(state.clone());
    let probe = regbroker::server::probe_app(state);
    assert_eq!(status(app.clone(), "/readyz").await, 503);
    assert_eq!(status(probe.clone(), "/readyz").await, 503);
    assert_eq!(
        status(app.clone(), "/healthz").await,
        200,
        "alive meanwhile"
    );
    ready.store(true, Ordering::Release);
    assert_eq!(status(app, "/readyz").await, 200);
    assert_eq!(status(probe, "/readyz").await, 200);
}

#[tokio::test]
async fn a_request_past_the_request_timeout_gets_504_and_the_default_is_60_s() {
    use tower::ServiceExt as _;
    assert_eq!(
        regbroker::server::Options::default().request_timeout,
        Duration::from_secs(60)
    );
    let srv = TestServer::builder().start().await;
    srv.fake.close_gate();
    let app = regbroker::server::app_with(
        regbroker::server::AppState {
            broker: srv.broker.clone(),
            metrics: srv.metrics.clone(),
            ready: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        },
        regbroker::server::Options {
            request_timeout: Duration::from_millis(200),
            ..regbroker::server::Options::default()
        },
    );
    let req = axum::http::Request::get("/v1/credentials?registry=a.fake.test")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), app.oneshot(req))
        .await
        .expect("the request timeout did not cut the request")
        .unwrap();
    assert_eq!(res.status().as_u16(), 504);
    let body = axum::body::to_bytes(res.into_body(), 4096).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout");
    srv.fake.open_gate();
}

#[tokio::test]
async fn a_wrong_method_gets_the_json_error_body_and_allow() {
    let srv = TestServer::builder().start().await;
    for (method, path) in [
        (
            reqwest::Method::POST,
            "/v1/credentials?registry=a.fake.test",
        ),
        (reqwest::Method::PUT, "/v1/credentials"),
        (reqwest::Method::PUT, "/v1/providers"),
        (reqwest::Method::POST, "/healthz"),
        (reqwest::Method::PATCH, "/metrics"),
    ] {
        let res = srv
            .client
            .request(method.clone(), format!("{}{path}", srv.base))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 405, "{method} {path}");
        let allow = res
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_string());
        assert!(
            allow.as_deref().is_some_and(|a| a.contains("GET")),
            "{method} {path}: Allow {allow:?}"
        );
        assert_eq!(
            res.headers().get("content-type").unwrap(),
            "application/json",
            "{method} {path}"
        );
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(method.as_str()),
            "{body}"
        );
    }
    assert_eq!(srv.fake.calls(), 0);
}
