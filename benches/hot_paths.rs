//! Criterion benches of the in-process hot paths: registry parsing, glob matching, the
//! cache hit path, and a whole request through the router (`tower::ServiceExt::oneshot`,
//! no socket). Run with `cargo bench --bench hot_paths`; `bench/run.sh` runs the
//! process-level and HTTP benchmarks and writes BENCHMARKS.md.
//!
//! The provider is the test harness's counting fake: after the first fetch every
//! request here is a cache hit, which the benches assert.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use criterion::{Criterion, criterion_group, criterion_main};
use regbroker::broker::Broker;
use regbroker::broker::cache::{Cache, Key, Need};
use regbroker::broker::providers::Providers;
use regbroker::broker::routing::Pattern;
use regbroker::broker::static_secret;
use regbroker::metrics::Metrics;
use regbroker::server::{self, AppState};
use regbroker_provider::{Credential, ManualClock, Provider, Registry, SharedClock};
use tower::ServiceExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn registry_parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("registry_parse");
    for (name, input) in [
        ("host", "123456789012.dkr.ecr.us-east-1.amazonaws.com"),
        ("url", "https://Registry.Example.com:5000/v2/"),
        (
            "image_ref",
            "europe-west1-docker.pkg.dev/project/repo/image:tag",
        ),
        ("docker_hub_alias", "https://index.docker.io/v1/"),
    ] {
        g.bench_function(name, |b| b.iter(|| Registry::parse(black_box(input))));
    }
    g.finish();
}

fn glob_matching(c: &mut Criterion) {
    let pattern = Pattern::parse("*.dkr.ecr.*.amazonaws.com").unwrap();
    let hit = Registry::parse("123456789012.dkr.ecr.us-east-1.amazonaws.com").unwrap();
    let miss = Registry::parse("123456789012.dkr.ecr.us-east-1.example.com").unwrap();
    assert!(pattern.matches(&hit) && !pattern.matches(&miss));
    let mut g = c.benchmark_group("glob_match");
    g.bench_function("match", |b| b.iter(|| pattern.matches(black_box(&hit))));
    g.bench_function("no_match", |b| b.iter(|| pattern.matches(black_box(&miss))));
    g.finish();
}

fn cache_hit(c: &mut Criterion) {
    let rt = runtime();
    let clock: SharedClock = Arc::new(ManualClock::fixed());
    let cache = Cache::new(regbroker::broker::cache::Config::default(), clock.clone());
    let key = Key {
        provider: "fake",
        scope: "identity/us-east-1".into(),
    };
    let fresh = {
        let clock = clock.clone();
        move || -> regbroker_provider::BoxFuture<'static, _> {
            let expires = clock.now() + std::time::Duration::from_secs(12 * 3600);
            Box::pin(async move { Ok(Credential::new("AWS", "token", Some(expires))) })
        }
    };
    rt.block_on(cache.get_or_fetch(&key, Need::Servable, fresh.clone()))
        .unwrap();
    let (_, outcome) = rt
        .block_on(cache.get_or_fetch(&key, Need::Servable, fresh.clone()))
        .unwrap();
    assert_eq!(outcome, regbroker::broker::cache::Outcome::Hit);
    c.bench_function("cache_hit", |b| {
        b.to_async(&rt)
            .iter(|| cache.get_or_fetch(black_box(&key), Need::Servable, fresh.clone()))
    });
}

fn router_with(
    docker_config: &std::path::Path,
) -> (server::App, Arc<Broker>, Arc<common::FakeProvider>) {
    let clock: SharedClock = Arc::new(ManualClock::fixed());
    let fake = common::FakeProvider::new(clock.clone());
    let providers = Providers::new(vec![fake.clone() as Arc<dyn Provider>]);
    let config = regbroker::broker::config::parse("", &providers).unwrap();
    let metrics = Arc::new(Metrics::new());
    let statics = Arc::new(
        static_secret::Store::open(vec![docker_config.to_path_buf()], metrics.clone()).unwrap(),
    );
    let broker = Arc::new(Broker::new(
        statics,
        config.router,
        providers,
        config.cache,
        metrics.clone(),
        clock,
    ));
    let app = server::app(AppState {
        broker: broker.clone(),
        metrics,
        ready: Arc::new(AtomicBool::new(true)),
    });
    (app, broker, fake)
}

async fn request(app: &server::App, registry: &str) -> StatusCode {
    let req = Request::get(format!("/v1/credentials?registry={registry}"))
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    axum::body::to_bytes(res.into_body(), 64 * 1024)
        .await
        .unwrap();
    status
}

fn request_handling(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        common::docker_config(&[("registry.example.com", "demo-user", "demo-password")]),
    )
    .unwrap();
    let (app, broker, fake) = rt.block_on(async { router_with(&path) });
    rt.block_on(async {
        assert_eq!(request(&app, "registry.example.com").await, StatusCode::OK);
        assert_eq!(request(&app, "cached.fake.test").await, StatusCode::OK);
        assert_eq!(
            request(&app, "nothing.example.org").await,
            StatusCode::NOT_FOUND
        );
    });
    // After one request each, the two credentials' answers are kept (broker::memo): the
    // benches below measure a hit as the sidecar answers it.
    assert_eq!(broker.cache().memo().len(), 2, "the answers were not kept");
    let mut g = c.benchmark_group("router_oneshot");
    for (name, registry) in [
        ("static", "registry.example.com"),
        ("provider_cached", "cached.fake.test"),
        ("not_configured", "nothing.example.org"),
    ] {
        g.bench_function(name, |b| b.to_async(&rt).iter(|| request(&app, registry)));
    }
    g.finish();
    assert_eq!(
        fake.calls(),
        1,
        "every provider request after the first hit the cache"
    );
}

criterion_group!(
    benches,
    registry_parsing,
    glob_matching,
    cache_hit,
    request_handling
);
criterion_main!(benches);
