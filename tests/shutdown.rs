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
    while srv.fake.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    srv.shutdown();
    let task = srv.task.take().unwrap();
    // The server must wait for the in-flight request rather than stop.
    tokio::time::sleep(Duration::from_millis(200)).await;
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
