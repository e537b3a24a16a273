//! No secret of a scenario (access token, refresh token, ServiceAccount token, client
//! secret) reaches the logs, with every library at TRACE, through the real
//! `azure_identity` code against the in-process fakes (see `fake/mod.rs`).
//!
//! It is this binary's only test, so it captures with a global subscriber. Nothing needs
//! installing.

#![allow(clippy::unwrap_used)]

mod fake;

use std::io::Write;
use std::sync::{Arc, Mutex};

use fake::scenario::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_never_reach_logs() {
    let logs = Captured::default();
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
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    assert!(
        text.contains("Exchanging Entra ID token at ACR"),
        "the capture works: {text}"
    );
    assert_no_secret(&s, &text);
    assert_no_secret(&s2, &text);
}
