//! Secrets stay out of logs, errors and Debug output.
//!
//! Its own test binary with one test, so that it can install a global tracing subscriber
//! (a thread-local one misses events when other tests race on callsite registration).
//! Uses the in-process fakes of the STS and IAM Credentials (Google services cannot run
//! here).

#![allow(clippy::unwrap_used)]

mod common;

use common::federation::Scenario;
use common::{credentials_provider, fetch};
use regbroker_provider::ManualClock;
use regbroker_provider::test_util::LogCapture;

// ---------------------------------------------------------------------------------------
// Secrets stay out of logs, errors and Debug
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn secrets_never_reach_logs_errors_or_debug() {
    let logs = LogCapture::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let s = Scenario::start("eyJ.subject-secret", true).await;
    let clock = ManualClock::fixed();
    let p = credentials_provider(&s.creds, &clock);
    let cred = fetch(&p, "gcr.io").await.unwrap();
    let shown = format!("{cred:?} {p:?}");

    // A failure path too: the subject token is refused by IAM after STS.
    std::fs::write(&s.token_file, "not-a-jwt-secret").unwrap();
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    let error_text = format!("{e} {} {e:?}", e.chain());

    let logs = logs.text();
    assert!(
        logs.contains("Fetched Google access token"),
        "logging was captured: {logs}"
    );
    for secret in [
        "ya29.sts-1",
        "ya29.impersonated",
        "subject-secret",
        "not-a-jwt-secret",
    ] {
        assert!(!logs.contains(secret), "{secret} in logs: {logs}");
        assert!(!shown.contains(secret), "{secret} in Debug: {shown}");
        assert!(
            !error_text.contains(secret),
            "{secret} in error: {error_text}"
        );
    }
}
