//! Graceful shutdown finishes in-flight requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestServer;

#[tokio::test]
async fn graceful_shutdown_completes_an_in_flight_request() {
    let mut srv = TestServer::builder().start().await;
    srv.fake.close_gate();
    let client = srv.client.clone();
    let url = format!("{}/v1/credentials?registry=slow.fake.test", srv.base);
    let request = tokio::spawn(async move { client.get(url).send().await });
    let fake = srv.fake.clone();
    common::eventually("the request reached the upstream", async || {
        fake.calls() == 1
    })
    .await;

    srv.shutdown();
    let task = srv.task.take().unwrap();
    // The server has taken the shutdown once its listener is closed. This test runs on a
    // single-threaded runtime, so the serve task is not running while we look: had it
    // stopped without waiting for the in-flight request, it would have finished in the
    // same poll that closed the listener.
    let addr = srv.base.trim_start_matches("http://").to_string();
    common::eventually("the listener closes", async || {
        tokio::net::TcpStream::connect(&addr).await.is_err()
    })
    .await;
    assert!(
        !task.is_finished(),
        "server stopped with a request in flight"
    );

    srv.fake.open_gate();
    let res = request.await.unwrap().unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["password"], "fake-secret-1");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("server did not stop after the request finished")
        .unwrap()
        .unwrap();

    // New connections are refused once it has stopped.
    assert!(
        srv.client
            .get(format!("{}/healthz", srv.base))
            .send()
            .await
            .is_err()
    );
}
