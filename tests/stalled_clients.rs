//! Clients that stop reading (issue 30, finding 2). A client that pipelines requests and
//! never reads its answers fills the server's send buffer; before the write timeout,
//! hyper then waited on that write for ever, never read the next request head (so its
//! header read timeout never started) and the connection kept its slot of
//! `max_connections` for good. These tests use raw sockets (under rustls for TLS) on
//! 127.0.0.1 and bound every wait, so a regression fails instead of hanging.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod stalled_support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use regbroker::server::{Bound, ConnLimits, Listen};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout};

use stalled_support::{get_once, reset_within, stalled_client};

/// Bytes of one `/big` answer.
const BIG: usize = 256 * 1024;
/// Requests each stalled client pipelines: 8 MiB of answers, far more than a loopback
/// socket's send buffer (about 2.6 MB) and the client's tiny receive buffer.
const PIPELINED: usize = 32;

/// How long `/slow` takes to answer.
const SLOW: Duration = Duration::from_secs(3);

/// Serves `/big` (256 KiB), `/huge` (16 MiB), `/small` and `/slow` (answered after
/// [`SLOW`]) on 127.0.0.1 with `limits`.
async fn serve(limits: ConnLimits) -> SocketAddr {
    let app = Router::new()
        .route("/big", get(|| async { vec![b'x'; BIG] }))
        .route("/huge", get(|| async { vec![b'x'; 16 << 20] }))
        .route("/small", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(SLOW).await;
                "slow"
            }),
        );
    let bound = Bound::bind(&Listen::Tcp("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = bound.local().parse().unwrap();
    tokio::spawn(bound.serve_with(app, std::future::pending(), limits));
    addr
}

/// Reads until the server closes the connection (EOF or a reset), within `within`;
/// returns the bytes read, or None if the connection was still open then.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<usize> {
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(total),
            Ok(Ok(n)) => total += n,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_are_closed_and_free_their_slots() {
    let max = 4;
    let write_timeout = Duration::from_secs(1);
    let addr = serve(ConnLimits {
        max_connections: max,
        write_timeout,
        ..ConnLimits::default()
    })
    .await;
    let mut stalled = Vec::new();
    for _ in 0..max {
        stalled.push(stalled_client(addr, "/big", PIPELINED, Duration::from_secs(5)).await);
    }

    // Every slot is held by a client that does not read: a further client waits in the
    // accept queue until one is given up on.
    let started = Instant::now();
    let answer = get_once(addr, "/small", Duration::from_secs(15)).await;
    let waited = started.elapsed();
    let answer = answer.expect("no answer within 15 s: the stalled clients kept every slot");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        waited >= write_timeout / 2,
        "answered after {waited:?}: the stalled clients did not hold the slots, so this test proves nothing"
    );

    // The server reset each of them (dropping the answers it could not send), without
    // the client reading: reading would let the server make progress again.
    for (i, s) in stalled.iter().enumerate() {
        assert!(
            reset_within(s, Duration::from_secs(10)).await,
            "stalled client {i} was not reset within 10 s"
        );
    }
    for (i, mut s) in stalled.into_iter().enumerate() {
        let read = read_until_closed(&mut s, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("stalled client {i} could still read after its reset"));
        assert!(read < PIPELINED * BIG, "client {i} got all {read} bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_read_timeout() {
    let header_read_timeout = Duration::from_secs(1);
    let addr = serve(ConnLimits {
        header_read_timeout,
        ..ConnLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let answer = ask(&mut s, "/small", "ok").await;
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    let answered = Instant::now();

    // Kept alive, then closed once no next request head came within the timeout.
    let rest = read_until_closed(&mut s, Duration::from_secs(10))
        .await
        .expect("an idle keep-alive connection was still open after 10 s");
    let idle = answered.elapsed();
    assert_eq!(rest, 0, "nothing more was said");
    assert!(
        idle >= header_read_timeout / 2,
        "closed after {idle:?}: not kept alive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
    let write_timeout = Duration::from_secs(1);
    let addr = serve(ConnLimits {
        write_timeout,
        ..ConnLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /huge HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    // 16 MiB at about 2.5 MB/s: six write timeouts in all, so the server's writes stall
    // on a full send buffer many times, but each time the client frees a third of it
    // (the most Linux waits for) in well under one.
    let started = Instant::now();
    let mut buf = vec![0u8; 128 * 1024];
    let mut total = 0usize;
    let mut closed = false;
    for _ in 0..2_000 {
        let mut this_tick = 0;
        while this_tick < buf.len() {
            let n = timeout(Duration::from_secs(5), s.read(&mut buf[this_tick..]))
                .await
                .expect("the server sent nothing for 5 s")
                .expect("the connection was cut off");
            if n == 0 {
                closed = true;
                break;
            }
            this_tick += n;
        }
        total += this_tick;
        if closed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    assert!(closed, "the answer never ended");
    assert!(total > 16 << 20, "only {total} bytes before the close");
    assert!(
        took >= write_timeout * 3,
        "read in {took:?}: not slow enough to prove anything"
    );
}

/// A self-signed certificate for 127.0.0.1: (server acceptor, client connector).
fn tls_pair() -> (tokio_rustls::TlsAcceptor, tokio_rustls::TlsConnector) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = CertificateDer::from(made.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server)),
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(client)),
    )
}

/// The stream is watched below TLS, so a TLS client that never reads is given up on too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_that_never_read_are_closed_and_free_their_slots() {
    let max = 2;
    let write_timeout = Duration::from_secs(1);
    let (acceptor, connector) = tls_pair();
    let app = Router::new()
        .route("/big", get(|| async { vec![b'x'; BIG] }))
        .route("/small", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(SLOW).await;
                "slow"
            }),
        );
    let bound = Bound::bind(&Listen::Tcp("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr: SocketAddr = bound.local().parse().unwrap();
    let limits = ConnLimits {
        max_connections: max,
        write_timeout,
        ..ConnLimits::default()
    };
    tokio::spawn(bound.serve_tls(app, std::future::pending(), limits, Some(acceptor)));
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();

    let mut stalled = Vec::new();
    for _ in 0..max {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(1024).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let mut tls = timeout(Duration::from_secs(5), connector.connect(name.clone(), tcp))
            .await
            .expect("handshake timed out")
            .unwrap();
        let requests = "GET /big HTTP/1.1\r\nHost: t\r\n\r\n".repeat(PIPELINED);
        timeout(Duration::from_secs(5), async {
            tls.write_all(requests.as_bytes()).await?;
            tls.flush().await
        })
        .await
        .expect("sending the requests timed out")
        .unwrap();
        stalled.push(tls);
    }

    let started = Instant::now();
    let ask = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut tls = connector.connect(name.clone(), tcp).await.unwrap();
        tls.write_all(b"GET /small HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        // A TLS peer that closes without close_notify is an error; the answer is in.
        let _ = tls.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    };
    let answer = timeout(Duration::from_secs(15), ask)
        .await
        .expect("no answer within 15 s: the stalled TLS clients kept every slot");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let waited = started.elapsed();
    assert!(
        waited >= write_timeout / 2,
        "answered after {waited:?}: the stalled clients did not hold the slots"
    );
    for (i, s) in stalled.iter().enumerate() {
        assert!(
            reset_within(s.get_ref().0, Duration::from_secs(10)).await,
            "stalled TLS client {i} was not reset within 10 s"
        );
    }
}

/// Sends `GET path` on `s` and reads the whole answer (a body of `body`).
async fn ask(s: &mut TcpStream, path: &str, body: &str) -> Vec<u8> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    let end = format!("\r\n\r\n{body}");
    while !answer.ends_with(end.as_bytes()) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("no answer within 10 s")
            .unwrap();
        assert_ne!(n, 0, "closed before answering {path}");
        answer.extend_from_slice(&buf[..n]);
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_a_byte_at_a_time_must_still_end_within_the_header_read_timeout() {
    // Slowloris: every byte is progress, but the head never ends in time.
    let header_read_timeout = Duration::from_secs(1);
    let addr = serve(ConnLimits {
        header_read_timeout,
        ..ConnLimits::default()
    })
    .await;
    // After one request answered, so the wait that is cut is a keep-alive one.
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert!(
        ask(&mut s, "/small", "ok")
            .await
            .starts_with(b"HTTP/1.1 200")
    );
    let started = Instant::now();
    let head = b"GET /small HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed = false;
    for byte in head {
        if s.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    let took = started.elapsed();
    let rest = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(
        closed || rest.is_some(),
        "a head trickled for {took:?} was still being read"
    );
    assert_eq!(rest.unwrap_or(0), 0, "the trickled request was answered");
    assert!(took < Duration::from_secs(5), "trickled for {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_slower_than_the_header_read_timeout_is_waited_for_and_kept_alive() {
    // The wait for a head is not the wait for an answer: a request that takes three
    // header read timeouts (a fetch from a slow upstream) is answered, and the
    // connection is then kept alive for the next one.
    let header_read_timeout = Duration::from_secs(1);
    let addr = serve(ConnLimits {
        header_read_timeout,
        ..ConnLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let answer = ask(&mut s, "/slow", "slow").await;
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert!(started.elapsed() >= SLOW);
    // Requests every 0.6 timeouts, for four timeouts in all: never idle for one.
    for _ in 0..7 {
        tokio::time::sleep(header_read_timeout * 6 / 10).await;
        assert!(
            ask(&mut s, "/small", "ok")
                .await
                .starts_with(b"HTTP/1.1 200")
        );
    }
}
