//! The sidecar process's stop: SIGTERM and SIGINT, and `--shutdown-grace` bounding the
//! wait for a request that does not finish (the real GCP provider asking an in-test
//! metadata server that never answers).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{FakeMetadata, ServeProcess, docker_config, wait_exit};

fn signal(p: &ServeProcess, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn sigint_stops_the_sidecar_like_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let dc = dir.path().join("config.json");
    std::fs::write(&dc, docker_config(&[("r.example.com", "u", "pw")])).unwrap();
    let mut p = ServeProcess::start(&["--docker-config", dc.to_str().unwrap()], &[]);
    p.wait_healthy();
    signal(&p, "-INT");
    let status = wait_exit(&mut p.child, Duration::from_secs(10)).expect("SIGINT ignored");
    assert!(status.success(), "{status:?}");
}

#[test]
fn shutdown_grace_bounds_the_wait_for_a_hanging_request() {
    let meta = FakeMetadata::start(3600, true);
    let mut p = ServeProcess::start(
        &["--shutdown-grace", "1s"],
        &[
            ("GCE_METADATA_HOST", meta.addr.as_str()),
            ("REGBROKER_LOG", "info"),
        ],
    );
    let addr = p.addr.clone();
    let request = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(b"GET /v1/credentials?registry=gcr.io HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        answer
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while meta.calls() == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached upstream"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let stopping = Instant::now();
    signal(&p, "-TERM");
    // The provider would give up after about 30 s and the default grace is 10 s: an
    // exit within 5 s is the 1 s grace at work.
    let status = wait_exit(&mut p.child, Duration::from_secs(5))
        .expect("still running 5 s after SIGTERM with --shutdown-grace 1s");
    let took = stopping.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "stopped after {took:?}, before the grace"
    );
    assert!(status.success(), "{status:?}");
    let logs: Vec<String> = p.log.try_iter().collect();
    assert!(
        logs.iter().any(|l| l.contains("Grace period over")),
        "{logs:#?}"
    );
    assert!(
        request.join().unwrap().is_empty(),
        "the hanging request was cut, not answered"
    );
}
