//! `GET /v1/providers`: the answer's shape, the last fetch's outcome and time, the
//! patterns rules and auto-detection serve, the bearer token, and that no field carries
//! a secret, a token or an upstream message.
//!
//! The broker here has the counting fake provider of `common` (a cloud token service
//! cannot run here), so `aws`, `azure` and `gcp` appear as known but not compiled in.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::body::Body;
use axum::http::{Request, header};
use common::{Answer, TestServer};
use regbroker::server::{self, AppState};
use regbroker_provider::Error;
use tower::ServiceExt as _;

const CONFIG: &str = "[[rule]]\nmatch = \"proxy.example.com\"\nsource = \"fake\"\noptions = { scope = \"proxy\" }\n\n[[rule]]\nmatch = \"*.internal.example\"\nsource = \"none\"\n";

async fn providers(srv: &TestServer) -> serde_json::Value {
    let (status, body) = srv.get("/v1/providers").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn entry<'a>(body: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    body["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

#[tokio::test]
async fn answer_names_every_provider_with_identity_patterns_and_last_fetch() {
    let srv = TestServer::builder().config(CONFIG).start().await;
    let body = providers(&srv).await;
    let names: Vec<&str> = body["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    // Every known provider is listed, compiled in or not (this server has only `fake`).
    let known = [
        "aws",
        "azure",
        "gcp",
        "quay",
        "artifactory",
        "cloudsmith",
        "oidc",
    ];
    assert_eq!(names[..known.len()], known, "{body}");
    assert_eq!(names[known.len()..], ["fake"], "{body}");
    for cloud in known {
        let p = entry(&body, cloud);
        assert_eq!(p["compiledIn"], false, "{body}");
        assert!(p["identity"].is_null(), "{body}");
        assert!(p["lastFetch"].is_null(), "{body}");
    }
    let fake = entry(&body, "fake");
    assert_eq!(fake["compiledIn"], true);
    assert_eq!(fake["identity"], "none", "the trait's default");
    assert!(fake["lastFetch"].is_null(), "no fetch yet: {body}");
    assert_eq!(
        fake["registries"]["rules"],
        serde_json::json!(["proxy.example.com"]),
        "only the rules that send hosts to it: {body}"
    );
    assert!(fake["registries"]["autoDetected"].is_array(), "{body}");

    // A fetch: its outcome and the broker clock's time.
    let (status, _) = srv.credentials("a.fake.test").await;
    assert_eq!(status, 200);
    let body = providers(&srv).await;
    let last = &entry(&body, "fake")["lastFetch"];
    assert_eq!(last["outcome"], "ok", "{body}");
    assert_eq!(last["at"], "2026-01-01T00:00:00Z", "{body}");

    // A failed fetch: only its code, never its message.
    srv.clock.advance(std::time::Duration::from_secs(30));
    srv.fake.then(Answer::Fail(Error::unavailable));
    let (status, _) = srv.credentials("proxy.example.com").await;
    assert_eq!(status, 503);
    let (_, raw) = srv.get("/v1/providers").await;
    let body: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let last = &entry(&body, "fake")["lastFetch"];
    assert_eq!(last["outcome"], "upstream_unavailable", "{body}");
    assert_eq!(last["at"], "2026-01-01T00:00:30Z", "{body}");
    for leak in ["fake upstream failure", "fake-secret-", "fake-user"] {
        assert!(!raw.contains(leak), "{leak:?} in {raw}");
    }
}

#[tokio::test]
async fn providers_needs_the_bearer_token_like_credentials() {
    let srv = TestServer::builder().start().await;
    let token = "providers-bearer-token-0123456789";
    let app = server::app_with(
        AppState {
            broker: srv.broker.clone(),
            metrics: srv.metrics.clone(),
            ready: Arc::new(AtomicBool::new(true)),
        },
        server::Options {
            bearer_token: Some(Arc::new(token.to_string().into())),
            ..Default::default()
        },
    );
    let ask = |auth: Option<String>| {
        let mut req = Request::get("/v1/providers");
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        app.clone().oneshot(req.body(Body::empty()).unwrap())
    };
    let res = ask(None).await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers()[header::WWW_AUTHENTICATE], "Bearer");
    let res = ask(Some("Bearer wrong-token-wrong-token-xx".into()))
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let res = ask(Some(format!("Bearer {token}"))).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()[header::CACHE_CONTROL], "no-store");
}
