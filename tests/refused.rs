//! `DELETE /v1/credentials?registry=HOST`: a client reports that its registry refused the
//! credential it got. In-process, with the fake provider (tests/common) counting its
//! fetches and a manual clock: the end-to-end checks against a real registry are in
//! tests/registry_check.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::IntoResponse as _;
use common::{TestServer, write_static};
use regbroker_provider::{ErrorKind, ExposeSecret as _, Registry};

async fn delete(srv: &TestServer, registry: &str) -> reqwest::Response {
    srv.client
        .delete(format!("{}/v1/credentials", srv.base))
        .query(&[("registry", registry)])
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_report_makes_the_next_gets_fetch_once_and_a_second_within_the_interval_is_429() {
    let srv = TestServer::builder().start().await;
    assert_eq!(srv.credentials("a.fake.test").await.0, 200);
    assert_eq!(srv.credentials("a.fake.test").await.0, 200);
    assert_eq!(srv.fake.calls(), 1, "cached");

    let res = delete(&srv, "a.fake.test").await;
    assert_eq!(res.status().as_u16(), 204);
    // Many clients ask at once after the report: one fetch serves them all.
    srv.fake.close_gate();
    let gets: Vec<_> = (0..16)
        .map(|_| {
            let client = srv.client.clone();
            let url = format!("{}/v1/credentials?registry=a.fake.test", srv.base);
            tokio::spawn(async move { client.get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    common::eventually("the clients wait on one fetch", async || {
        srv.fake.in_flight() == 1
    })
    .await;
    srv.fake.open_gate();
    for g in gets {
        assert_eq!(g.await.unwrap(), 200);
    }
    assert_eq!(
        srv.fake.calls(),
        2,
        "one fetch for all clients after the report"
    );

    // A second report within refetch_interval (30 s): 429, Retry-After, no fetch.
    srv.clock.advance(Duration::from_secs(10));
    let res = delete(&srv, "a.fake.test").await;
    assert_eq!(res.status().as_u16(), 429);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((19..=20).contains(&retry), "Retry-After {retry}");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "refetch_too_soon");
    assert_eq!(srv.credentials("a.fake.test").await.0, 200);
    assert_eq!(srv.fake.calls(), 2, "the refused report fetched nothing");

    // The interval is per credential: another host served by the same one is held back
    // too, a host with a credential of its own is not.
    assert_eq!(delete(&srv, "b.fake.test").await.status().as_u16(), 429);
    assert_eq!(srv.credentials("c.own-scope.fake.test").await.0, 200);
    assert_eq!(
        delete(&srv, "c.own-scope.fake.test")
            .await
            .status()
            .as_u16(),
        204
    );

    // After the interval, the next report is taken.
    srv.clock.advance(Duration::from_secs(21));
    assert_eq!(delete(&srv, "a.fake.test").await.status().as_u16(), 204);
    let before = srv.fake.calls();
    assert_eq!(srv.credentials("a.fake.test").await.0, 200);
    assert_eq!(srv.fake.calls(), before + 1);
}

#[tokio::test]
async fn the_interval_is_configurable() {
    let srv = TestServer::builder()
        .config("[cache]\nrefetch_interval = \"2m\"\n")
        .start()
        .await;
    assert_eq!(srv.credentials("a.fake.test").await.0, 200);
    assert_eq!(delete(&srv, "a.fake.test").await.status().as_u16(), 204);
    srv.clock.advance(Duration::from_secs(90));
    let res = delete(&srv, "a.fake.test").await;
    assert_eq!(res.status().as_u16(), 429);
    assert_eq!(res.headers()["retry-after"], "30");
}

#[tokio::test]
async fn a_static_entry_is_409_an_unserved_registry_404_and_a_malformed_one_400() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::builder()
        .docker_config(write_static(dir.path()))
        .start()
        .await;
    let res = delete(&srv, "static.example.com").await;
    assert_eq!(res.status().as_u16(), 409);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "static_credential");
    assert!(!body.to_string().contains("s-pw"), "{body}");
    // The static entry is still served.
    assert_eq!(srv.credentials("static.example.com").await.0, 200);

    let res = delete(&srv, "nobody.example.org").await;
    assert_eq!(res.status().as_u16(), 404);
    let res = delete(&srv, "not a host").await;
    assert_eq!(res.status().as_u16(), 400);
    let res = srv
        .client
        .delete(format!("{}/v1/credentials", srv.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 400, "no registry parameter");
    assert_eq!(srv.fake.calls(), 0);
}

/// A loopback stand-in for a registry that answers `/v2/` as the distribution registry
/// does with htpasswd (401 with a Basic challenge without the right password, 200 with
/// it) and counts the requests that present a credential: the real registry cannot tell
/// a test how often it was asked (tests/registry_check.rs checks the verdicts against it).
struct CountingRegistry {
    host: String,
    /// The password it accepts (`None`: none).
    accepts: Arc<Mutex<Option<String>>>,
    asked: Arc<AtomicUsize>,
}

impl CountingRegistry {
    async fn start() -> CountingRegistry {
        let accepts: Arc<Mutex<Option<String>>> = Arc::default();
        let asked = Arc::new(AtomicUsize::new(0));
        let (a, n) = (accepts.clone(), asked.clone());
        let app = axum::Router::new().route(
            "/v2/",
            axum::routing::get(move |headers: axum::http::HeaderMap| {
                let (a, n) = (a.clone(), n.clone());
                async move {
                    let presented = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Basic "))
                        .map(|b| {
                            use base64::Engine as _;
                            let raw = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
                            String::from_utf8(raw).unwrap()
                        });
                    if presented.is_some() {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    let want = a.lock().unwrap().clone();
                    match (presented, want) {
                        (Some(p), Some(w)) if p.split_once(':').map(|x| x.1) == Some(&*w) => {
                            axum::http::StatusCode::OK.into_response()
                        }
                        _ => (
                            axum::http::StatusCode::UNAUTHORIZED,
                            [("www-authenticate", "Basic realm=\"test\"")],
                        )
                            .into_response(),
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        CountingRegistry {
            host,
            accepts,
            asked,
        }
    }

    fn accept(&self, password: Option<&str>) {
        *self.accepts.lock().unwrap() = password.map(str::to_string);
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

/// `Broker::checked`, what every sink calls before it writes: one check per registry and
/// fetch, a refusal that stands for its pause without asking again, and a refused
/// credential dropped from the cache unless another registry let the same one through.
#[tokio::test]
async fn a_fetch_is_checked_once_per_registry_and_a_refusal_stands_for_its_pause() {
    let (a, b) = (
        CountingRegistry::start().await,
        CountingRegistry::start().await,
    );
    let srv = TestServer::builder()
        .config(&format!(
            "[[rule]]\nmatch = \"{}\"\nsource = \"fake\"\n\n[[rule]]\nmatch = \"{}\"\nsource = \"fake\"\n",
            a.host, b.host
        ))
        .start()
        .await;
    let (ra, rb) = (
        Registry::parse(&a.host).unwrap(),
        Registry::parse(&b.host).unwrap(),
    );
    let served = async |r: &Registry| srv.broker.fresh_credential(r).await.unwrap();

    // Accepted, then let through again without asking: one check per fetch.
    a.accept(Some("fake-secret-1"));
    for _ in 0..3 {
        let got = srv.broker.checked(served(&ra).await).await.unwrap();
        assert_eq!(got.credential.secret().expose_secret(), "fake-secret-1");
    }
    assert_eq!(a.asked(), 1, "asked once for one fetch");

    // b refuses the same credential: refused, and a's acceptance keeps it cached.
    let err = srv.broker.checked(served(&rb).await).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CredentialRejected);
    assert_eq!(b.asked(), 1);
    // The refusal stands for its pause (the failure backoff, 1 s at most at first): b
    // is not asked again, whatever is asked of the broker.
    for _ in 0..3 {
        let err = srv.broker.checked(served(&rb).await).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CredentialRejected);
    }
    assert_eq!(b.asked(), 1, "not asked again within the pause");
    assert_eq!(srv.fake.calls(), 1, "a let it through: it stays cached");

    // Past the pause, b is asked again, and accepts.
    srv.clock.advance(Duration::from_secs(2));
    b.accept(Some("fake-secret-1"));
    srv.broker.checked(served(&rb).await).await.unwrap();
    assert_eq!(b.asked(), 2);

    // A credential refused everywhere it was asked is dropped: the next fetch is new.
    let c = CountingRegistry::start().await;
    let srv = TestServer::builder()
        .config(&format!(
            "[[rule]]\nmatch = \"{}\"\nsource = \"fake\"\n",
            c.host
        ))
        .start()
        .await;
    let rc = Registry::parse(&c.host).unwrap();
    let first = srv.broker.fresh_credential(&rc).await.unwrap();
    let err = srv.broker.checked(first).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CredentialRejected);
    let again = srv.broker.fresh_credential(&rc).await.unwrap();
    assert_eq!(srv.fake.calls(), 2, "the refused credential left the cache");
    assert_eq!(again.credential.secret().expose_secret(), "fake-secret-2");
    // Within the pause even a new fetch is not checked: still refused, not asked.
    assert!(srv.broker.checked(again).await.is_err());
    assert_eq!(c.asked(), 1);
}
