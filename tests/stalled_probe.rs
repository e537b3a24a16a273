//! The real binary's probe port under clients that never read (issue 30, finding 2): the
//! probe address (`/healthz`, `/metrics`, no token) listens on the pod IP in every shipped
//! manifest, so anyone on the pod network can pipeline `/metrics` requests and never
//! read. `/healthz` must keep answering meanwhile, and the default write timeout (10 s)
//! must reset those connections. Raw sockets on 127.0.0.1; every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod stalled_support;

use std::io::BufRead;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use tokio::time::Instant;

use stalled_support::{get_once, reset_within, stalled_client};

/// Clients that never read. Each must ask for more than a loopback send buffer holds
/// (about 2.6 MB): some 6,700 pipelined requests for the 467-byte `/metrics` of a fresh
/// process, which the debug binary answers at about 8,000 per second on a busy 2-core
/// machine; ten keep the test near 20 s (fifty would take some 40 s just to fill theirs).
const STALLED: usize = 10;
/// Bytes of answers each stalled client asks for: more than the server's send buffer,
/// the client's receive buffer and hyper's own together.
const ASKED: usize = 3 << 20;
/// The default write timeout.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The message logged when a connection is given up on.
const CLOSED: &str = "Connection closed: its answer waited unread for the write timeout";

/// `regbroker serve` with a probe address, killed when dropped.
struct Serve {
    child: std::process::Child,
    log: mpsc::Receiver<serde_json::Value>,
}

impl Serve {
    /// Starts it on 127.0.0.1:0 with the probe on 127.0.0.1:0 and returns the probe
    /// address, read from its log.
    fn start(dir: &std::path::Path) -> (Serve, SocketAddr) {
        let statics = dir.join("static.json");
        std::fs::write(&statics, r#"{"auths": {}}"#).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_regbroker"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--probe-listen", "127.0.0.1:0"])
            .arg("--docker-config")
            .arg(&statics)
            .env("REGBROKER_LOG_FORMAT", "json")
            .env("REGBROKER_LOG", "info,regbroker::server=debug")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let v = serde_json::from_str(&line).unwrap_or(serde_json::Value::Null);
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let serve = Serve { child, log };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let probe = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let v = serve
                .log
                .recv_timeout(left)
                .expect("regbroker exited or hung before listening");
            if v["message"] == "Probe endpoint listening" {
                break v["listen"].as_str().unwrap().parse().unwrap();
            }
        };
        (serve, probe)
    }

    /// How many connections it logged as given up on, waiting up to `within`
    /// for `want` of them.
    fn closed_stalled(&self, want: usize, within: Duration) -> usize {
        let deadline = std::time::Instant::now() + within;
        let mut seen = 0;
        while seen < want {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.log.recv_timeout(left) {
                Ok(v) if v["message"] == CLOSED => seen += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        seen
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_port_stays_alive_and_resets_clients_that_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, probe) = Serve::start(dir.path());
    let metrics = get_once(probe, "/metrics", Duration::from_secs(5))
        .await
        .expect("no /metrics answer");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let count = ASKED / metrics.len() + 1;

    let started = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        stalled.push(stalled_client(probe, "/metrics", count, Duration::from_secs(10)).await);
    }

    // The liveness probe answers, each time within 2 s, until past the write timeout.
    let mut probes = 0;
    while started.elapsed() < WRITE_TIMEOUT + Duration::from_secs(2) {
        let asked = Instant::now();
        let answer = get_once(probe, "/healthz", Duration::from_secs(2))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "/healthz unanswered within 2 s, {:?} into the stall",
                    started.elapsed()
                )
            });
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        probes += 1;
        tokio::time::sleep_until(asked + Duration::from_millis(500)).await;
    }
    assert!(probes >= 10, "only {probes} probes");

    // Every stalled client was reset, looked at without reading (SO_ERROR): reading
    // would let the server make progress again.
    let deadline = started + WRITE_TIMEOUT + Duration::from_secs(25);
    for (i, s) in stalled.iter().enumerate() {
        let reset = reset_within(s, deadline.saturating_duration_since(Instant::now())).await;
        assert!(
            reset,
            "stalled client {i} not reset {:?} after the stall began",
            started.elapsed()
        );
    }
    let logged = serve.closed_stalled(STALLED, Duration::from_secs(5));
    assert_eq!(logged, STALLED, "connections logged as given up on");
}
