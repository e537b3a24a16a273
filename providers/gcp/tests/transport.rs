//! How the token calls' transport failures become errors and retries: a refused
//! connection, an answer whose body stalls or breaks off, a connection dropped before any
//! answer, an error body over the size cap. No real server produces these on demand, so
//! each comes from a raw TCP server in the test (faked in-process, as TESTING.md allows
//! for faults). Every server answers any request the same way.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::{closed_port, fetch, provider};
use regbroker_provider::{ErrorKind, ManualClock};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// A server on loopback that reads each request's head and then writes `answer`; with
/// `hold`, it keeps the connection open afterwards (a stalled answer), else it closes it.
async fn raw_server(answer: Vec<u8>, hold: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = conn.write_all(&answer).await;
                if hold {
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    addr
}

/// Debug log lines written while the test's future runs on this thread.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn kind_at(metadata_host: &str) -> (ErrorKind, String) {
    let clock = ManualClock::fixed();
    let p = provider(&[("GCE_METADATA_HOST", metadata_host)], &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    (e.kind(), e.chain())
}

/// `kind_at`, counting the retries it logged (on this thread: the test's runtime must be
/// single-threaded).
async fn kind_and_retries_at(metadata_host: &str) -> (ErrorKind, String, usize) {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let (kind, chain) = {
        let _guard = tracing::subscriber::set_default(subscriber);
        kind_at(metadata_host).await
    };
    let log = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    (
        kind,
        chain,
        log.matches("Token call failed, retrying").count(),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_connection_is_retried_then_reported_as_no_identity() {
    // A metadata server may still be starting when a pod starts: a refused connection is
    // worth another try (3 attempts in the tests' settings).
    let (kind, chain, retries) = kind_and_retries_at(&format!("127.0.0.1:{}", closed_port())).await;
    assert_eq!(kind, ErrorKind::IdentityMissing, "{chain}");
    assert_eq!(retries, 2, "{chain}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_refusal_is_not_retried_but_a_server_error_is() {
    let forbidden = raw_server(
        b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        false,
    )
    .await;
    let (kind, chain, retries) = kind_and_retries_at(&forbidden).await;
    assert_eq!(kind, ErrorKind::IdentityRejected, "{chain}");
    assert_eq!(retries, 0, "{chain}");
    let unavailable = raw_server(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
        false,
    )
    .await;
    let (kind, chain, retries) = kind_and_retries_at(&unavailable).await;
    assert_eq!(kind, ErrorKind::Unavailable, "{chain}");
    assert_eq!(retries, 2, "{chain}");
}

#[tokio::test]
async fn a_token_answer_may_be_64_kib_and_not_a_byte_more() {
    let cap = regbroker_provider::MAX_UPSTREAM_BODY;
    // With its length announced, and read to the end of the connection.
    for announced in [true, false] {
        let answer = |len: usize| {
            let head = if announced {
                format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n")
            } else {
                "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_string()
            };
            let mut a = head.into_bytes();
            a.extend(std::iter::repeat_n(b' ', len));
            a
        };
        // At the cap: read, then refused as not a token (all blanks), not as too large.
        let (kind, chain) = kind_at(&raw_server(answer(cap), false).await).await;
        assert_eq!(kind, ErrorKind::BadResponse, "{chain}");
        assert!(
            !chain.contains("larger than"),
            "announced {announced}: {chain}"
        );
        let (kind, chain) = kind_at(&raw_server(answer(cap + 1), false).await).await;
        assert_eq!(kind, ErrorKind::BadResponse, "{chain}");
        assert!(
            chain.contains("larger than"),
            "announced {announced}: {chain}"
        );
    }
}

#[tokio::test]
async fn an_answer_whose_body_stalls_is_a_timeout() {
    // Headers, then 1 byte of the 100 announced, then nothing: the read times out (3 s).
    let addr = raw_server(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"
            .to_vec(),
        true,
    )
    .await;
    let (kind, chain) = kind_at(&addr).await;
    assert_eq!(kind, ErrorKind::TimedOut, "{chain}");
}

#[tokio::test]
async fn an_answer_whose_body_breaks_off_is_a_failed_call_not_a_timeout() {
    let addr = raw_server(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"
            .to_vec(),
        false,
    )
    .await;
    let (kind, chain) = kind_at(&addr).await;
    assert_eq!(kind, ErrorKind::Unavailable, "{chain}");
    assert!(chain.contains("failed"), "{chain}");
}

#[tokio::test]
async fn a_connection_dropped_before_any_answer_is_a_failed_call_not_a_timeout() {
    let addr = raw_server(Vec::new(), false).await;
    let (kind, chain) = kind_at(&addr).await;
    assert_eq!(kind, ErrorKind::Unavailable, "{chain}");
    assert!(chain.contains("failed"), "{chain}");
}

#[tokio::test]
async fn an_error_answer_over_the_size_cap_still_counts_by_its_status() {
    // A 500 whose body is larger than the cap: the body is not read, the status decides.
    let len = regbroker_provider::MAX_UPSTREAM_BODY + 1;
    let mut answer =
        format!("HTTP/1.1 500 Internal Server Error\r\ncontent-length: {len}\r\n\r\n").into_bytes();
    answer.extend(std::iter::repeat_n(b'x', len));
    let addr = raw_server(answer, false).await;
    let (kind, chain) = kind_at(&addr).await;
    assert_eq!(kind, ErrorKind::Unavailable, "{chain}");
    assert!(chain.contains("HTTP 500"), "{chain}");
}

#[tokio::test]
async fn an_unreachable_token_endpoint_is_unavailable_not_a_missing_identity() {
    // Only the metadata server out of reach means "no identity here"; a key file's
    // token endpoint out of reach is the upstream being unavailable.
    let dir = tempfile::tempdir().unwrap();
    let key = common::test_key();
    let token_uri = format!("http://127.0.0.1:{}/token", closed_port());
    let path = common::service_account_key(&dir, &key, "sa@p.iam.gserviceaccount.com", &token_uri);
    let clock = ManualClock::fixed();
    let p = common::credentials_provider(&path, &clock);
    let e = fetch(&p, "gcr.io").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert!(
        e.message().contains("could not be reached"),
        "{}",
        e.chain()
    );
}

#[tokio::test]
async fn an_unreadable_token_answer_is_named_by_what_is_wrong_with_it() {
    for (body, what) in [
        (
            &br#"{"access_token": "ya29.x", "expires_in""#[..],
            "truncated JSON",
        ),
        (&br#"{"access_token": 12}"#[..], "missing or mistyped field"),
        (&b"{not json}"[..], "invalid JSON"),
    ] {
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        // A key file's token endpoint: its answer is the first one read.
        let addr = raw_server(answer, false).await;
        let dir = tempfile::tempdir().unwrap();
        let key = common::test_key();
        let path = common::service_account_key(
            &dir,
            &key,
            "sa@p.iam.gserviceaccount.com",
            &format!("http://{addr}/token"),
        );
        let p = common::credentials_provider(&path, &ManualClock::fixed());
        let e = fetch(&p, "gcr.io").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadResponse, "{}", e.chain());
        assert!(e.chain().contains(what), "{what}: {}", e.chain());
    }
}
