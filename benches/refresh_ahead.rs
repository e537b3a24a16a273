//! The refresh-ahead promise, measured: while the upstream hangs at a credential's
//! refresh point, no request waits. One run, two phases through the same in-process
//! router (`tower::ServiceExt::oneshot`, no socket), side by side:
//!
//! 1. cache hits before the refresh point: their p50, p99 and max;
//! 2. past the refresh point with every fetch hanging (the fake's gate closed): every
//!    request's latency, the slowest one compared with phase 1's p99.
//!
//! Run with `cargo bench --bench refresh_ahead` (`REFRESH_BENCH_REQUESTS`, default
//! 20000 per phase). Before refresh-ahead, phase 2's first request waited for the hanging
//! fetch until `cache.fetch_timeout` (30 s).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::static_secret;
use regbroker::metrics::Metrics;
use regbroker::server::{self, AppState};
use regbroker_provider::{ManualClock, Provider, SharedClock};
use tower::ServiceExt;

async fn request(app: &regbroker::server::App) -> Duration {
    let started = Instant::now();
    let req = Request::get("/v1/credentials?registry=a.fake.test")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    axum::body::to_bytes(res.into_body(), 64 * 1024)
        .await
        .unwrap();
    started.elapsed()
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo test --benches` runs bench binaries with no `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n: usize = std::env::var("REFRESH_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let manual = ManualClock::fixed();
        let clock: SharedClock = Arc::new(manual.clone());
        let fake = common::FakeProvider::new(clock.clone());
        let providers = Providers::new(vec![fake.clone() as Arc<dyn Provider>]);
        let config = regbroker::broker::config::parse("", &providers).unwrap();
        let metrics = Arc::new(Metrics::new());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, common::docker_config(&[])).unwrap();
        let statics = Arc::new(static_secret::Store::open(vec![path], metrics.clone()).unwrap());
        let broker = Arc::new(Broker::new(
            statics,
            config.router,
            providers,
            config.cache,
            metrics.clone(),
            clock,
        ));
        let app = server::app(AppState {
            broker,
            metrics,
            ready: Arc::new(AtomicBool::new(true)),
        });
        // One-hour credential: refresh point at 2856 s, stale point at 3570 s.
        fake.then(common::Answer::Credential(Some(Duration::from_secs(3600))));
        request(&app).await;

        let mut hits: Vec<Duration> = Vec::with_capacity(n);
        for _ in 0..n {
            hits.push(request(&app).await);
        }
        manual.advance(Duration::from_secs(2900));
        fake.close_gate();
        let mut during: Vec<Duration> = Vec::with_capacity(n);
        for _ in 0..n {
            during.push(request(&app).await);
        }
        assert_eq!(fake.calls(), 2, "one refresh, hanging all along");
        assert_eq!(fake.in_flight(), 1, "the refresh was still hanging at the end");
        let first = during[0];
        hits.sort();
        during.sort();
        let p99 = quantile(&hits, 0.99);
        let worst = *during.last().unwrap();
        println!("refresh_ahead: {n} requests per phase, upstream hanging in phase 2");
        println!(
            "  cache hits:              p50 {}  p99 {}  max {}",
            micros(quantile(&hits, 0.5)),
            micros(p99),
            micros(*hits.last().unwrap())
        );
        println!(
            "  during hanging refresh:  p50 {}  p99 {}  max {}  (first request, which started the refresh: {})",
            micros(quantile(&during, 0.5)),
            micros(quantile(&during, 0.99)),
            micros(worst),
            micros(first)
        );
        println!(
            "  slowest request during the refresh / cache-hit p99: {:.2}",
            worst.as_secs_f64() / p99.as_secs_f64()
        );
        fake.open_gate();
    });
}
