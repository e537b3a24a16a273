//! A bounded soak: many concurrent keep-alive connections on loopback for a while, mixed
//! cache hits and misses, with the upstream failing every second call. Cache hits must
//! never see a server error; nothing may panic; memory is reported before and after.
//!
//! Ignored by default (it takes minutes); `scripts/soak.sh` runs it in release mode:
//! `SOAK_SECS` (default 120) and `SOAK_CONNS` (default 5000) bound it. The server and the
//! load generator share this process, so the RSS figures cover both.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    hit_ok: AtomicU64,
    hit_bad: AtomicU64,
    miss_ok: AtomicU64,
    miss_503: AtomicU64,
    miss_other: AtomicU64,
    io_errors: AtomicU64,
    /// Unexpected statuses and I/O errors, for the report.
    odd: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Counts {
    fn odd(&self, what: String) {
        *self.odd.lock().unwrap().entry(what).or_default() += 1;
    }
}

/// Sends one GET on a keep-alive connection and returns the status code.
async fn get(stream: &mut BufReader<tokio::net::TcpStream>, path: &str) -> std::io::Result<u16> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: soak\r\n\r\n");
    stream.get_mut().write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let b = stream.read_u8().await?;
        head.push(b);
        if head.len() > 16 * 1024 {
            return Err(std::io::Error::other("response head too large"));
        }
    }
    let head = String::from_utf8_lossy(&head);
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Ok(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "soak: minutes long; run scripts/soak.sh"]
async fn soak_mixed_hits_and_failing_misses() {
    let secs = env_or("SOAK_SECS", 120);
    let conns = env_or("SOAK_CONNS", 5000);
    let srv = TestServer::builder()
        .config(
            "[cache]\nfailure_backoff = \"1s\"\nmax_failure_backoff = \"1s\"\ncapacity = 100000\n",
        )
        .start()
        .await;
    srv.fake.set_flaky(true);
    // Warm the hit key (call 1 succeeds).
    assert_eq!(srv.credentials("hit.fake.test").await.0, 200);
    let rss_before = rss_kib();

    let addr = srv.base.trim_start_matches("http://").to_string();
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let miss_seq = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (addr, counts, miss_seq) = (addr.clone(), counts.clone(), miss_seq.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(stream) = tokio::net::TcpStream::connect(&addr).await else {
                counts.io_errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut stream = BufReader::new(stream);
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                // One request in ten is a miss on a key never seen before.
                let miss = (c + i).is_multiple_of(10);
                let path = if miss {
                    let n = miss_seq.fetch_add(1, Ordering::Relaxed);
                    format!("/v1/credentials?registry=k{n}.own-scope.fake.test")
                } else {
                    "/v1/credentials?registry=hit.fake.test".to_string()
                };
                match get(&mut stream, &path).await {
                    Ok(200) if miss => counts.miss_ok.fetch_add(1, Ordering::Relaxed),
                    Ok(503) if miss => counts.miss_503.fetch_add(1, Ordering::Relaxed),
                    Ok(s) if miss => {
                        counts.odd(format!("miss {s}"));
                        counts.miss_other.fetch_add(1, Ordering::Relaxed)
                    }
                    Ok(200) => counts.hit_ok.fetch_add(1, Ordering::Relaxed),
                    Ok(s) => {
                        counts.odd(format!("hit {s}"));
                        counts.hit_bad.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(e) => {
                        counts.odd(format!("io {:?}", e.kind()));
                        counts.io_errors.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                };
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client task panicked");
    }
    let rss_after = rss_kib();
    let c = &counts;
    let line = format!(
        "soak: {secs}s, {conns} connections: hits ok {} bad {}; misses ok {} 503 {} other {}; io errors {}; upstream calls {}; cached {}; RSS {} KiB before, {} KiB after; unexpected: {:?}",
        c.hit_ok.load(Ordering::Relaxed),
        c.hit_bad.load(Ordering::Relaxed),
        c.miss_ok.load(Ordering::Relaxed),
        c.miss_503.load(Ordering::Relaxed),
        c.miss_other.load(Ordering::Relaxed),
        c.io_errors.load(Ordering::Relaxed),
        srv.fake.calls(),
        srv.broker.cache().len(),
        rss_before,
        rss_after,
        c.odd.lock().unwrap(),
    );
    println!("{line}");
    assert_eq!(
        c.hit_bad.load(Ordering::Relaxed),
        0,
        "a cache hit saw an error: {line}"
    );
    assert_eq!(
        c.miss_other.load(Ordering::Relaxed),
        0,
        "a miss got neither 200 nor 503: {line}"
    );
    assert_eq!(
        c.io_errors.load(Ordering::Relaxed),
        0,
        "connections failed: {line}"
    );
    assert!(
        c.hit_ok.load(Ordering::Relaxed) > 0 && c.miss_503.load(Ordering::Relaxed) > 0,
        "{line}"
    );
    // Still alive and serving.
    assert_eq!(srv.credentials("hit.fake.test").await.0, 200);
}
