//! No secret of a scenario (access token, refresh token, ServiceAccount token, client
//! secret) reaches the logs, with every library at TRACE, through the real
//! `azure_identity` code against the in-process fakes (see `fake/mod.rs`).
//!
//! It is this binary's only test, so it captures with a global subscriber. Nothing needs
//! installing.

#![allow(clippy::unwrap_used)]

mod fake;

use fake::scenario::*;
use regbroker_provider::test_util::LogCapture;

#[tokio::test]
async fn secrets_never_reach_logs() {
    let logs = LogCapture::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The only test in this binary, so the subscriber can be the global default: a
    // thread-local one (set_default) missed the provider's own events now and then
    // while other tests' threads hit the same callsites with no subscriber.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let s = scenario(false).await;
    fetch(&s).await.expect("credential");
    s.running.fake.script_exchange(
        401,
        r#"{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}"#,
    );
    let _ = fetch(&s).await.unwrap_err();
    let s2 = scenario(true).await;
    fetch(&s2).await.expect("credential");
    let text = logs.text();
    assert!(
        text.contains("Exchanging Entra ID token at ACR"),
        "the capture works: {text}"
    );
    assert_no_secret(&s, &text);
    assert_no_secret(&s2, &text);
}
