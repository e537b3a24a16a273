//! `DELETE /v1/credentials?registry=HOST`: a client reports that its registry refused the
//! credential it got. In-process, with the fake provider (tests/common) counting its
//! fetches and a manual clock: the end-to-end checks against a real registry are in
//! tests/registry_check.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{TestServer, write_static};

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
