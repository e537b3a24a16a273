//! The Kubernetes Secret sync against an in-process fake API server, for the faults a
//! real API server cannot be made to produce on demand: 500s, an update that loses a
//! race with another writer at a chosen moment. Everything a real server can show (created
//! with the label, refreshed in place, restored, repaired, foreign Secrets left alone,
//! the deployed RBAC) is tested against kube-apiserver in tests/kube_secret_sync.rs.
//!
//! `FakeApi` (axum on 127.0.0.1:0) speaks the
//! three Secret endpoints regbroker uses, `GET`/`PUT /api/v1/namespaces/{ns}/secrets/{name}`
//! and `POST /api/v1/namespaces/{ns}/secrets`, with the API server's rules that matter
//! here: 404/409 `Status` bodies, `resourceVersion` bumped on every write and checked on
//! `PUT` (a stale one is a 409 Conflict). It records every request, and can be told to
//! fail the next requests or to let another writer win the next update. kube's client is
//! pointed at it with an explicit `kube::Config`; time is the harness's manual clock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use base64::Engine as _;
use common::{Answer, ServeProcess, server_with_static};
use regbroker::sinks::secret_sync::{Config, Outcome, SecretRef, SecretSync};
use regbroker_provider::{Error, Registry};
use serde_json::{Value, json};

#[derive(Default)]
struct ApiState {
    secrets: BTreeMap<(String, String), Value>,
    resource_version: u64,
    log: Vec<String>,
    fail_next: VecDeque<u16>,
    /// The next write (`POST` or `PUT`) fails with this status and reason.
    fail_next_write: Option<(u16, &'static str)>,
    lose_next_update: bool,
}

type Shared = Arc<Mutex<ApiState>>;

fn status(code: StatusCode, reason: &str, message: &str) -> (StatusCode, Json<Value>) {
    (
        code,
        Json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
        })),
    )
}

/// Records the request; answers an injected failure if one is queued.
fn enter(s: &mut ApiState, line: String) -> Option<(StatusCode, Json<Value>)> {
    if !line.starts_with("GET")
        && let Some((code, reason)) = s.fail_next_write.take()
    {
        s.log.push(line);
        return Some(status(
            StatusCode::from_u16(code).unwrap(),
            reason,
            "injected failure",
        ));
    }
    s.log.push(line);
    let code = s.fail_next.pop_front()?;
    Some(status(
        StatusCode::from_u16(code).unwrap(),
        "InternalError",
        "injected failure",
    ))
}

fn store(s: &mut ApiState, ns: &str, mut obj: Value) -> Value {
    s.resource_version += 1;
    obj["metadata"]["resourceVersion"] = json!(s.resource_version.to_string());
    obj["metadata"]["namespace"] = json!(ns);
    obj["kind"] = json!("Secret");
    obj["apiVersion"] = json!("v1");
    let name = obj["metadata"]["name"].as_str().unwrap().to_string();
    s.secrets.insert((ns.to_string(), name), obj.clone());
    obj
}

async fn get_secret(
    State(st): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
) -> (StatusCode, Json<Value>) {
    let mut s = st.lock().unwrap();
    if let Some(err) = enter(&mut s, format!("GET {ns}/{name}")) {
        return err;
    }
    match s.secrets.get(&(ns, name.clone())) {
        Some(obj) => (StatusCode::OK, Json(obj.clone())),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("secrets \"{name}\" not found"),
        ),
    }
}

async fn create_secret(
    State(st): State<Shared>,
    Path(ns): Path<String>,
    Json(obj): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut s = st.lock().unwrap();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(err) = enter(&mut s, format!("POST {ns}/{name}")) {
        return err;
    }
    if s.secrets.contains_key(&(ns.clone(), name.clone())) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("secrets \"{name}\" already exists"),
        );
    }
    assert!(
        obj["metadata"].get("resourceVersion").is_none(),
        "create must not carry a resourceVersion: {obj}"
    );
    (StatusCode::CREATED, Json(store(&mut s, &ns, obj)))
}

async fn replace_secret(
    State(st): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    Json(obj): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut s = st.lock().unwrap();
    if let Some(err) = enter(&mut s, format!("PUT {ns}/{name}")) {
        return err;
    }
    if s.lose_next_update {
        // Another writer updates it first: our resourceVersion is now stale.
        s.lose_next_update = false;
        let mut other = s.secrets[&(ns.clone(), name.clone())].clone();
        other["metadata"]["annotations"] = json!({"other-writer": "was here"});
        store(&mut s, &ns, other);
    }
    let Some(current) = s.secrets.get(&(ns.clone(), name.clone())) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "not found");
    };
    if obj["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    (StatusCode::OK, Json(store(&mut s, &ns, obj)))
}

struct FakeApi {
    url: String,
    state: Shared,
}

impl FakeApi {
    async fn start() -> FakeApi {
        let state: Shared = Arc::default();
        let app = axum::Router::new()
            .route(
                "/api/v1/namespaces/{ns}/secrets/{name}",
                get(get_secret).put(replace_secret),
            )
            .route("/api/v1/namespaces/{ns}/secrets", post(create_secret))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeApi { url, state }
    }

    fn client(&self) -> kube::Client {
        kube::Client::try_from(kube::Config::new(self.url.parse().unwrap())).unwrap()
    }

    /// The requests since the last call.
    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().log)
    }

    fn secret(&self, ns: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .secrets
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    fn put(&self, ns: &str, obj: Value) {
        store(&mut self.state.lock().unwrap(), ns, obj);
    }

    fn fail_next_write(&self, code: u16, reason: &'static str) {
        self.state.lock().unwrap().fail_next_write = Some((code, reason));
    }

    fn fail_next(&self, codes: &[u16]) {
        self.state.lock().unwrap().fail_next.extend(codes);
    }

    /// Drops the failures still queued by [`FakeApi::fail_next`].
    fn stop_failing(&self) {
        self.state.lock().unwrap().fail_next.clear();
    }

    /// A kubeconfig in `dir` that points at this server, as a process outside a pod
    /// finds its API server.
    fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
                 current-context: fake\n",
                self.url
            ),
        )
        .unwrap();
        path
    }
}

/// The `user:password` the Secret's docker config holds for `registry`.
fn auth_in(secret: &Value, registry: &str) -> Option<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let doc = b64
        .decode(secret["data"][".dockerconfigjson"].as_str()?)
        .unwrap();
    let doc: Value = serde_json::from_slice(&doc).unwrap();
    let auth = doc["auths"][registry]["auth"].as_str()?;
    Some(String::from_utf8(b64.decode(auth).unwrap()).unwrap())
}

fn sref(s: &str) -> SecretRef {
    s.parse().unwrap()
}

fn config(secrets: &[&str]) -> Config {
    Config {
        secrets: secrets.iter().map(|s| sref(s)).collect(),
        entries: Vec::new(),
        extra: vec![Registry::parse("named.fake.test").unwrap()],
    }
}

#[tokio::test]
async fn api_errors_are_retried_with_backoff_then_succeed() {
    let (srv, _dir) = server_with_static().await;
    let api = FakeApi::start().await;
    // 500s reach regbroker (kube-client itself retries 429, 503 and 504).
    api.fail_next(&[500, 500]);
    let mut sync = SecretSync::start(srv.broker.clone(), config(&["ns/creds"]), api.client()).await;
    assert!(
        matches!(&sync.outcomes()[0].1, Some(Outcome::Failed(m)) if m.contains("injected failure")),
        "{:?}",
        sync.outcomes()
    );
    assert_eq!(sync.next_pass_in(), Duration::from_secs(5));
    assert!(api.secret("ns", "creds").is_none());

    sync.refresh().await;
    assert_eq!(
        sync.next_pass_in(),
        Duration::from_secs(10),
        "backoff doubles"
    );

    sync.refresh().await;
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Created));
    assert!(api.secret("ns", "creds").is_some());
    assert_eq!(
        api.take_log(),
        [
            "GET ns/creds",
            "GET ns/creds",
            "GET ns/creds",
            "POST ns/creds"
        ]
    );
    assert_eq!(
        sync.next_pass_in(),
        Duration::from_secs(60),
        "back to normal"
    );
}

#[tokio::test]
async fn update_conflicts_are_retried_on_the_latest_version() {
    let (srv, _dir) = server_with_static().await;
    let api = FakeApi::start().await;
    api.put("ns", ours_empty("creds"));
    api.state.lock().unwrap().lose_next_update = true;
    let sync = SecretSync::start(srv.broker.clone(), config(&["ns/creds"]), api.client()).await;

    assert_eq!(
        api.take_log(),
        [
            "GET ns/creds",
            "PUT ns/creds",
            "GET ns/creds",
            "PUT ns/creds"
        ]
    );
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Updated));
    let s = api.secret("ns", "creds").unwrap();
    assert_eq!(auth_in(&s, "static.example.com").unwrap(), "s-user:s-pw");
    assert_eq!(
        s["metadata"]["annotations"]["other-writer"], "was here",
        "the other writer's change is kept"
    );
}

/// The Secret's last outcome is the API server's 403, not a retry's "conflicts".
fn assert_forbidden(sync: &SecretSync) {
    assert!(
        matches!(&sync.outcomes()[0].1, Some(Outcome::Failed(m)) if m.contains("Forbidden")),
        "{:?}",
        sync.outcomes()
    );
}

/// A Secret regbroker made (its label), holding an empty docker config.
fn ours_empty(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "regbroker"}},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": "e30="},
    })
}

#[tokio::test]
async fn a_create_that_loses_a_race_reads_again_and_another_refusal_is_an_error() {
    let (srv, _dir) = server_with_static().await;
    let api = FakeApi::start().await;
    // Someone created it between our read and our write: read again, then write.
    api.fail_next_write(409, "AlreadyExists");
    let sync = SecretSync::start(srv.broker.clone(), config(&["ns/creds"]), api.client()).await;
    assert_eq!(
        api.take_log(),
        [
            "GET ns/creds",
            "POST ns/creds",
            "GET ns/creds",
            "POST ns/creds"
        ]
    );
    assert_eq!(sync.outcomes()[0].1, Some(Outcome::Created));
    // Any other refusal of the create is an error at once, not a retry.
    let api = FakeApi::start().await;
    api.fail_next_write(403, "Forbidden");
    let sync = SecretSync::start(srv.broker.clone(), config(&["ns/creds"]), api.client()).await;
    assert_eq!(api.take_log(), ["GET ns/creds", "POST ns/creds"]);
    assert_forbidden(&sync);
}

#[tokio::test]
async fn a_refused_update_is_an_error_at_once_not_a_retry() {
    let (srv, _dir) = server_with_static().await;
    let api = FakeApi::start().await;
    api.put("ns", ours_empty("creds"));
    api.fail_next_write(403, "Forbidden");
    let sync = SecretSync::start(srv.broker.clone(), config(&["ns/creds"]), api.client()).await;
    assert_eq!(api.take_log(), ["GET ns/creds", "PUT ns/creds"]);
    assert_forbidden(&sync);
}

#[tokio::test]
async fn failed_fetch_keeps_the_entry_the_secret_already_holds() {
    // As after a restart during a cloud outage: the Secret holds a credential from
    // before, and this process cannot fetch a new one.
    let (srv, _dir) = server_with_static().await;
    srv.fake.then(Answer::Fail(Error::unavailable));
    let api = FakeApi::start().await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let old_doc = json!({"auths": {
        "named.fake.test": {"auth": b64.encode("old-user:old-pw")},
        "gone.example.com": {"auth": b64.encode("gone:gone")},
    }});
    api.put(
        "ns",
        json!({
            "metadata": {"name": "creds", "labels": {"app.kubernetes.io/managed-by": "regbroker"}},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": b64.encode(old_doc.to_string())},
        }),
    );
    let mut sync = SecretSync::start(srv.broker.clone(), config(&["ns/creds"]), api.client()).await;
    let s = api.secret("ns", "creds").unwrap();
    assert_eq!(auth_in(&s, "static.example.com").unwrap(), "s-user:s-pw");
    assert_eq!(
        auth_in(&s, "named.fake.test").unwrap(),
        "old-user:old-pw",
        "kept while the fetch fails"
    );
    assert!(
        auth_in(&s, "gone.example.com").is_none(),
        "registries no longer wanted are dropped"
    );

    // The next successful fetch, once the failure pause is over, replaces it.
    srv.clock.advance(std::time::Duration::from_secs(30));
    sync.refresh().await;
    let s = api.secret("ns", "creds").unwrap();
    assert_eq!(
        auth_in(&s, "named.fake.test").unwrap(),
        "fake-user:fake-secret-2"
    );
}

#[tokio::test]
async fn serve_syncs_the_secret_and_keeps_serving_through_api_errors() {
    let api = FakeApi::start().await;
    api.fail_next(&[500]);
    let dir = tempfile::tempdir().unwrap();
    let statics = common::write_static(dir.path());
    // The binary finds the API server the way it would outside a pod: a kubeconfig.
    let kubeconfig = api.kubeconfig(dir.path());
    let mut proc = ServeProcess::start(
        &[
            "--docker-config",
            statics.to_str().unwrap(),
            "--sync-secret",
            "flux-system/regbroker",
        ],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            // Every library at TRACE: the Secret's data must still stay out of the log.
            ("REGBROKER_LOG", "trace"),
        ],
    );
    let http = reqwest::Client::new();
    // Serving while the first pass fails.
    let healthz = http
        .get(format!("http://{}/healthz", proc.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(healthz.status(), 200);

    // A later pass (the 5 s retry, or sooner if the static file watch fires) creates it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let secret = loop {
        if let Some(s) = api.secret("flux-system", "regbroker") {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Secret not created; API requests: {:?}",
            api.take_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        auth_in(&secret, "static.example.com").unwrap(),
        "s-user:s-pw"
    );
    let log = api.take_log();
    assert_eq!(
        log[..3],
        [
            "GET flux-system/regbroker",
            "GET flux-system/regbroker",
            "POST flux-system/regbroker"
        ]
    );
    let creds = http
        .get(format!(
            "http://{}/v1/credentials?registry=static.example.com",
            proc.addr
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(creds.status(), 200);
    assert!(proc.stop().success());
    let lines: Vec<String> = proc.log.iter().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Cannot sync Secret; retrying")),
        "{lines:#?}"
    );
    let data = secret["data"][".dockerconfigjson"].as_str().unwrap();
    for line in &lines {
        assert!(
            !line.contains("s-pw") && !line.contains("cy11c2VyOnMtcHc") && !line.contains(data),
            "secret in the log: {line}"
        );
    }
}

/// The one sink `/v1/providers` of `addr` reports.
async fn only_sink(addr: &str) -> Value {
    let body: Value = reqwest::get(format!("http://{addr}/v1/providers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sinks = body["sinks"].as_array().expect("a sinks list");
    assert_eq!(sinks.len(), 1, "{body}");
    sinks[0].clone()
}

/// Waits (bounded) until the one sink of `addr` is in `state`.
async fn wait_sink_state(addr: &str, state: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let sink = only_sink(addr).await;
        if sink["state"] == state {
            return sink;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sink never {state}: {sink}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get_text(addr: &str, path: &str) -> (u16, String) {
    let res = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

#[tokio::test]
async fn a_secret_never_written_is_visible_and_holds_readiness_when_required() {
    let api = FakeApi::start().await;
    // Every API request fails until the test says otherwise.
    api.fail_next(&[500; 10_000]);
    let dir = tempfile::tempdir().unwrap();
    let statics = common::write_static(dir.path());
    let kubeconfig = api.kubeconfig(dir.path());
    let mut proc = ServeProcess::start(
        &[
            "--docker-config",
            statics.to_str().unwrap(),
            "--sync-secret",
            "flux-system/regbroker",
            "--ready-requires-sinks",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let addr = proc.addr.clone();
    let sink = wait_sink_state(&addr, "never_written").await;
    assert_eq!(sink["name"], "secret/flux-system/regbroker");
    assert_eq!(sink["kind"], "secret");
    assert_eq!(sink["writeError"], "kubernetes_api_error");
    assert_eq!(
        sink["registries"],
        json!([{"registry": "static.example.com", "outcome": "ok"}])
    );
    let expected = "[+]startup ok\n\
         [-]sink/secret/flux-system/regbroker failed: never written since start: write failed (kubernetes_api_error)\n\
         readyz check failed\n";
    assert_eq!(
        get_text(&addr, "/readyz?verbose").await,
        (503, expected.to_string())
    );
    let never = "regbroker_sink_never_written{sink=\"secret/flux-system/regbroker\"}";
    let (_, metrics) = get_text(&addr, "/metrics").await;
    assert!(metrics.contains(&format!("{never} 1\n")), "{metrics}");

    // The API server recovers: the retry (5 s later) writes the Secret.
    api.stop_failing();
    let sink = wait_sink_state(&addr, "written").await;
    assert!(sink["writeError"].is_null(), "{sink}");
    assert!(api.secret("flux-system", "regbroker").is_some());
    assert_eq!(get_text(&addr, "/readyz").await, (200, "ok\n".to_string()));
    let (_, metrics) = get_text(&addr, "/metrics").await;
    assert!(metrics.contains(&format!("{never} 0\n")), "{metrics}");
    for path in ["/readyz?verbose", "/metrics", "/v1/providers"] {
        let body = get_text(&addr, path).await.1;
        assert!(
            !body.contains("s-pw") && !body.contains("cy11c2VyOnMtcHc"),
            "a secret in {path}: {body}"
        );
    }
    assert!(proc.stop().success());
}

#[test]
fn bad_sync_secret_is_a_usage_error() {
    let err = common::usage_error(&["serve", "--sync-secret", "NoSlash"]);
    assert!(err.contains("NAMESPACE/NAME"), "{err}");
}
