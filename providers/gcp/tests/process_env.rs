//! `GcpProvider::from_env()` reads the real process environment.
//!
//! Setting env vars inside a multi-threaded test binary is a race (and `unsafe` in edition
//! 2024), so the test re-runs this binary as a child process with the variables set by
//! `Command::env`, and the child does the fetch. The metadata server is an in-process
//! fake (axum on 127.0.0.1:0) in the parent: a GCE metadata server cannot run here.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use regbroker_gcp::GcpProvider;
use regbroker_provider::{ExposeSecret, Provider, Registry};

const CHILD_MARKER: &str = "REGBROKER_GCP_TEST_CHILD";

#[tokio::test]
async fn from_env_reads_gce_metadata_host_from_the_process_environment() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let router = Router::new().route(
        "/computeMetadata/v1/instance/service-accounts/default/token",
        get(move |headers: HeaderMap| {
            let counter = counter.clone();
            async move {
                if headers.get("metadata-flavor").is_none() {
                    return StatusCode::FORBIDDEN.into_response();
                }
                counter.fetch_add(1, Ordering::SeqCst);
                axum::Json(serde_json::json!({"access_token": "ya29.from-env", "expires_in": 3600}))
                    .into_response()
            }
        }),
    );
    let fake = common::Fake::start(router).await;
    // Bounded, and killed at the bound (`kill_on_drop`: the timeout drops the future).
    let bound = Duration::from_secs(60);
    let out = tokio::time::timeout(
        bound,
        tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "child_fetch",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_MARKER, "1")
            .env("GCE_METADATA_HOST", fake.addr.to_string())
            .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("child `child_fetch` of this test binary did not exit within {bound:?}: killed it")
    })
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}");
    assert!(stdout.contains("CHILD-OK"), "child did not run: {stdout}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// Runs only as the child of the test above.
#[tokio::test]
#[ignore = "run by from_env_reads_gce_metadata_host_from_the_process_environment"]
async fn child_fetch() {
    // Run by hand without its parent it fails, rather than passing having tested nothing.
    assert!(
        std::env::var(CHILD_MARKER).is_ok(),
        "only meaningful as the child of from_env_reads_gce_metadata_host_from_the_process_environment, which sets {CHILD_MARKER}"
    );
    let p = GcpProvider::from_env().unwrap();
    let target = p.recognise(&Registry::parse("gcr.io").unwrap()).unwrap();
    let cred = p.fetch(&target).await.unwrap();
    assert_eq!(cred.secret().expose_secret(), "ya29.from-env");
    println!("CHILD-OK");
}
