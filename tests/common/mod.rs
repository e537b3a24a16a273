//! Shared test harness: a counting fake provider and an in-process server on
//! `127.0.0.1:0`.
//!
//! The fake provider stands in for a cloud token service, which cannot run here; it is
//! only used by tests of the broker's own behaviour (routing, precedence, caching,
//! status mapping). Providers are tested against their own peers in their crates.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod process;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use regbroker::broker::Broker;
use regbroker::broker::providers::Providers;
use regbroker::broker::static_secret;
use regbroker::metrics::Metrics;
use regbroker::server::{self, AppState, Bound, Listen};
use regbroker_provider::{
    BoxFuture, Credential, Error, ManualClock, Options, Provider, Registry, SharedClock, Target,
};

/// Polls `check` (every 5 ms) until it holds, failing the test after 10 s: for effects
/// that land in a background task (a refresh ahead of expiry), without a bare sleep.
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What the fake provider answers on its next calls.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A credential living this long from "now" (by the shared clock); `None`: no expiry.
    Credential(Option<Duration>),
    /// An error of this kind.
    Fail(fn(String) -> Error),
}

/// A provider that recognises hosts ending in `.fake.test`, counts its fetches and hands
/// out `fake-secret-N` (N = call number), optionally waiting on a gate first.
#[derive(Debug)]
pub struct FakeProvider {
    pub calls: AtomicUsize,
    /// Fetches running now, and the most ever running at once.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// The scope of every fetch, in call order.
    scopes: Mutex<Vec<String>>,
    answers: Mutex<VecDeque<Answer>>,
    default: Answer,
    clock: SharedClock,
    gate: tokio::sync::Semaphore,
    gated: AtomicBool,
    delay: Mutex<Duration>,
    flaky: AtomicBool,
}

impl FakeProvider {
    pub fn new(clock: SharedClock) -> Arc<FakeProvider> {
        Arc::new(FakeProvider {
            calls: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            scopes: Mutex::new(Vec::new()),
            answers: Mutex::new(VecDeque::new()),
            default: Answer::Credential(Some(Duration::from_secs(3600))),
            clock,
            gate: tokio::sync::Semaphore::new(0),
            gated: AtomicBool::new(false),
            delay: Mutex::new(Duration::ZERO),
            flaky: AtomicBool::new(false),
        })
    }

    /// Queue answers for the next calls; after they run out, the default applies.
    pub fn then(&self, answer: Answer) -> &Self {
        self.answers.lock().unwrap().push_back(answer);
        self
    }

    /// Make every fetch wait until `open` is called.
    pub fn close_gate(&self) {
        self.gated.store(true, Ordering::SeqCst);
    }

    pub fn open_gate(&self) {
        self.gated.store(false, Ordering::SeqCst);
        self.gate.add_permits(10_000);
    }

    /// Make every fetch take this long (real time).
    pub fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }

    /// Make every second fetch fail (unavailable), for soak tests.
    pub fn set_flaky(&self, on: bool) {
        self.flaky.store(on, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Fetches running now (started and not yet returned).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The most fetches that ever ran at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// How many fetches were made for `scope`.
    pub fn calls_for(&self, scope: &str) -> usize {
        self.scopes
            .lock()
            .unwrap()
            .iter()
            .filter(|s| *s == scope)
            .count()
    }

    async fn fetch_inner(&self, target: &Target) -> Result<Credential, Error> {
        self.scopes.lock().unwrap().push(target.scope().to_string());
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        // Decrements however the fetch ends, including when it is dropped.
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.in_flight);
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.gated.load(Ordering::SeqCst) {
            let _ = self.gate.acquire().await.unwrap();
        }
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.flaky.load(Ordering::SeqCst) && n.is_multiple_of(2) {
            return Err(Error::unavailable(format!("flaky upstream, call {n}")));
        }
        let answer = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(self.default.clone());
        match answer {
            Answer::Credential(life) => Ok(Credential::new(
                "fake-user",
                format!("fake-secret-{n}"),
                life.map(|d| self.clock.now() + d),
            )),
            Answer::Fail(make) => Err(make(format!("fake upstream failure on call {n}"))),
        }
    }
}

impl Provider for FakeProvider {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn recognise(&self, registry: &Registry) -> Option<Target> {
        if registry.port().is_some() {
            return None;
        }
        // `*.own-scope.fake.test`: one credential per host (distinct cache keys).
        if registry.host().ends_with(".own-scope.fake.test") {
            return Some(Target::new(registry.clone(), registry.host()));
        }
        registry
            .host()
            .ends_with(".fake.test")
            .then(|| Target::new(registry.clone(), "fake-identity"))
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        regbroker_provider::check_known_options("fake", options, &["scope"])
    }

    /// Option `scope`: the cache scope; the value `{host}` gives each host its own.
    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error> {
        let scope = match options.get("scope").map(String::as_str) {
            Some("{host}") => registry.as_str().to_string(),
            Some(s) => s.to_string(),
            None => "fake-identity".into(),
        };
        Ok(Target::new(registry.clone(), scope))
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_inner(target))
    }
}

/// A test server and everything behind it.
pub struct TestServer {
    pub base: String,
    pub clock: ManualClock,
    pub fake: Arc<FakeProvider>,
    pub broker: Arc<Broker>,
    pub statics: Arc<static_secret::Store>,
    pub metrics: Arc<Metrics>,
    pub client: reqwest::Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// Builds a test server.
#[derive(Default)]
pub struct TestServerBuilder {
    docker_configs: Vec<PathBuf>,
    config_toml: String,
}

impl TestServerBuilder {
    pub fn docker_config(mut self, path: impl Into<PathBuf>) -> Self {
        self.docker_configs.push(path.into());
        self
    }

    pub fn config(mut self, toml: &str) -> Self {
        self.config_toml = toml.to_string();
        self
    }

    pub async fn start(self) -> TestServer {
        let clock = ManualClock::fixed();
        let shared: SharedClock = Arc::new(clock.clone());
        let fake = FakeProvider::new(shared.clone());
        let providers = Providers::new(vec![fake.clone() as Arc<dyn Provider>]);
        let config =
            regbroker::broker::config::parse(&self.config_toml, &providers).expect("test config");
        let metrics = Arc::new(Metrics::new());
        let statics =
            Arc::new(static_secret::Store::open(self.docker_configs, metrics.clone()).unwrap());
        let broker = Arc::new(Broker::new(
            statics.clone(),
            config.router,
            providers,
            config.cache,
            metrics.clone(),
            shared,
        ));
        let bound = Bound::bind(&Listen::Tcp("127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let base = format!("http://{}", bound.local());
        let app = server::app(AppState {
            broker: broker.clone(),
            metrics: metrics.clone(),
            ready: Arc::new(AtomicBool::new(true)),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(bound.serve(app, async move {
            let _ = rx.await;
        }));
        TestServer {
            base,
            clock,
            fake,
            broker,
            statics,
            metrics,
            client: reqwest::Client::new(),
            shutdown: Some(tx),
            task: Some(task),
        }
    }
}

impl TestServer {
    pub fn builder() -> TestServerBuilder {
        TestServerBuilder::default()
    }

    /// GET /v1/credentials?registry=...; returns status and JSON body.
    pub async fn credentials(&self, registry: &str) -> (u16, serde_json::Value) {
        let res = self
            .client
            .get(format!("{}/v1/credentials", self.base))
            .query(&[("registry", registry)])
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let body = res.json().await.unwrap();
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let res = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// Starts graceful shutdown.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Writes `DIR/static.json`, a docker config with one static entry,
/// `static.example.com` = `s-user:s-pw`, and returns its path.
pub fn write_static(dir: &std::path::Path) -> PathBuf {
    let statics = dir.join("static.json");
    std::fs::write(
        &statics,
        docker_config(&[("static.example.com", "s-user", "s-pw")]),
    )
    .unwrap();
    statics
}

/// Runs `regbroker ARGS`, which must exit 64 (invalid configuration); returns its stderr.
pub fn usage_error(args: &[&str]) -> String {
    let out = process::run_bounded(
        std::process::Command::new(env!("CARGO_BIN_EXE_regbroker")).args(args),
        None,
        process::CLI_BOUND,
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "regbroker {args:?}: {err}");
    err
}

/// A test server whose docker config holds one static entry,
/// `static.example.com` = `s-user:s-pw`; the directory holds that file.
pub async fn server_with_static() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let statics = write_static(dir.path());
    let srv = TestServer::builder().docker_config(&statics).start().await;
    (srv, dir)
}

/// Writes a docker config with `username`/`password` entries.
pub fn docker_config(entries: &[(&str, &str, &str)]) -> String {
    let auths: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(host, user, pass)| {
            (
                host.to_string(),
                serde_json::json!({"username": user, "password": pass}),
            )
        })
        .collect();
    serde_json::json!({ "auths": auths }).to_string()
}

/// A `regbroker serve` process on 127.0.0.1:0, stopped (SIGTERM) when dropped.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub addr: String,
    pub log: std::sync::mpsc::Receiver<String>,
}

impl ServeProcess {
    /// Starts `regbroker serve --listen 127.0.0.1:0 ARGS...` with JSON logs and waits
    /// until it listens.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> ServeProcess {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_regbroker"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("REGBROKER_LOG_FORMAT", "json")
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let addr = loop {
            let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) else {
                // Not left running (and holding the suite's output) after the test fails.
                let _ = child.kill();
                let _ = child.wait();
                panic!("regbroker serve {args:?} exited or hung before listening (30 s)");
            };
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"] == "Listening" {
                break v["listen"].as_str().unwrap().to_string();
            }
        };
        ServeProcess {
            child,
            addr,
            log: rx,
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("regbroker did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A GCE metadata server on 127.0.0.1:0 (kept bound for the life of the test process):
/// answers `.../service-accounts/default/token` with `ya29.fake-N` (N = call number)
/// living `expires_in` seconds, or never answers when `hang`. It is what the real GCP
/// provider in a `regbroker` process reaches through `GCE_METADATA_HOST`, so tests of
/// the binary get a provider credential with a known expiry and a count of exchanges.
pub struct FakeMetadata {
    /// `host:port`, for `GCE_METADATA_HOST`.
    pub addr: String,
    calls: Arc<AtomicUsize>,
}

impl FakeMetadata {
    pub fn start(expires_in: u64, hang: bool) -> FakeMetadata {
        use axum::routing::get;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let app = axum::Router::new().route(
            "/computeMetadata/v1/instance/service-accounts/default/token",
            get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    axum::Json(serde_json::json!({
                        "access_token": format!("ya29.fake-{n}"),
                        "expires_in": expires_in,
                        "token_type": "Bearer",
                    }))
                }
            }),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let _ = axum::serve(listener, app).await;
            });
        });
        FakeMetadata { addr, calls }
    }

    /// Token requests received so far (exchanges).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// Waits (at most `bound`) for `child` to exit.
pub fn wait_exit(
    child: &mut std::process::Child,
    bound: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl ServeProcess {
    /// Waits (bounded) until `/healthz` answers 200. `Listening` is logged before the
    /// signal handlers are installed; an answered request means the server task, whose
    /// first poll installs them, has run.
    pub fn wait_healthy(&self) {
        use std::io::{Read, Write};
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let answered = std::net::TcpStream::connect(&self.addr).and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")?;
                let mut answer = String::new();
                s.read_to_string(&mut answer)?;
                Ok(answer.starts_with("HTTP/1.1 200"))
            });
            if answered.unwrap_or(false) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "/healthz never answered"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
