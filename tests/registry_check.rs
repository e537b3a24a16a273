//! The registry check (issue 26) against real peers: before a sink writes a credential
//! fresh from its provider, `regbroker serve` logs in to the registry with it, and a
//! credential the registry refuses is never written; `DELETE /v1/credentials` makes the
//! next `GET` fetch anew, once.
//!
//! Peers, none written here: the distribution registry (Debian `docker-registry`) with
//! htpasswd or token auth (tests/registry_peer), distribution's own token server
//! (`registry-token-server`, built by scripts/peers.sh), gcplocal's GCE metadata emulator
//! with a token that rotates (tests/flux_support), kube-apiserver + etcd
//! (tests/control_plane). The credential is the real gcp provider's: gcplocal's access
//! token as `oauth2accesstoken:<token>`, routed to the loopback registry by a rule.
//!
//! - [`a_secret_never_gets_a_token_the_registry_refuses_and_gets_it_once_accepted`]:
//!   `--sync-secret` into a real kube-apiserver, htpasswd registry (a Basic challenge).
//! - [`a_token_refused_at_the_token_server_never_reaches_the_docker_config`]: the same
//!   through a real Bearer handshake (the token server refuses the rotated password),
//!   with the `--write-docker-config` sink.
//! - [`delete_makes_the_next_gets_fetch_once_and_a_second_delete_is_429`]: the sidecar
//!   endpoint, 8 clients reporting at once, 8 clients fetching at once.
//! - [`a_token_realm_on_another_host_never_receives_the_credential`]: a registry whose
//!   challenge names a realm on another host (an adversary listener here).
//! - [`a_registry_that_refuses_does_not_keep_the_credential_from_one_that_accepts_it`]:
//!   two registries served one credential, one refusing it: the other still gets it.
//!
//! Every wait is bounded ([`WAIT`], generous: the test machines are shared) and prints
//! regbroker's log when it runs out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::ServeProcess;
use control_plane::{ControlPlane, Peers};
use flux_support::{GCP_USER, GCPLOCAL_TOKEN, Metadata, auth_for};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use registry_peer::{Registry, TOKEN_SERVICE, TokenServer, token_signing_key};

/// Bound on every wait for regbroker, the registry or the API server.
const WAIT: Duration = Duration::from_secs(120);
/// The token gcplocal's metadata server hands out after [`Metadata::rotate`].
const ROTATED: &str = "tok-2";
/// Refusals of the rotated token (sink passes, every 5 s) during which the sink must keep
/// the previous token.
const REFUSED_ROUNDS: f64 = 4.0;
/// Refresh every 1-2 s (gcplocal's tokens live an hour): every sink pass (every 5 s)
/// fetches anew, so a rotation reaches the sink at its next pass.
const FAST_CACHE: &str = "[cache]\nmin_refresh = \"1s\"\nmax_refresh = \"2s\"\n";

/// A `regbroker serve` process and what it logged so far (JSON lines).
struct Watched {
    serve: ServeProcess,
    lines: Vec<serde_json::Value>,
    base: String,
    client: reqwest::Client,
}

impl Watched {
    /// Starts `regbroker serve ARGS` with gcplocal's metadata server as the GCE metadata
    /// host and HOME in `dir` (no gcloud configuration of the machine is read).
    fn start(args: &[String], metadata: &Metadata, dir: &Path, extra_env: &[(&str, &str)]) -> Self {
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env = vec![
            ("GCE_METADATA_HOST", metadata.addr.as_str()),
            ("HOME", home.to_str().unwrap()),
            ("REGBROKER_LOG", "info"),
        ];
        env.extend_from_slice(extra_env);
        let serve = tokio::task::block_in_place(|| ServeProcess::start(&args, &env));
        let base = format!("http://{}", serve.addr);
        Watched {
            serve,
            lines: Vec::new(),
            base,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    /// Everything logged so far.
    fn log(&mut self) -> &[serde_json::Value] {
        for line in self.serve.log.try_iter() {
            self.lines
                .push(serde_json::from_str(&line).unwrap_or(serde_json::Value::String(line)));
        }
        &self.lines
    }

    /// The lines whose message starts with `message`, about `registry`.
    fn logged(&mut self, message: &str, registry: &str) -> Vec<serde_json::Value> {
        self.log()
            .iter()
            .filter(|v| {
                v["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(message))
                    && v["registry"] == registry
            })
            .cloned()
            .collect()
    }

    /// The log, for a failure message.
    fn dump(&mut self) -> String {
        self.log()
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `/metrics` (Prometheus text).
    async fn metrics(&self) -> String {
        let res = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        res.text().await.unwrap()
    }

    /// `regbroker_registry_checks_total{result}` (0 before the first such check).
    async fn checks(&self, result: &str) -> f64 {
        sample(
            &self.metrics().await,
            "regbroker_registry_checks_total",
            &[("result", result)],
        )
    }

    /// `regbroker_upstream_requests_total{provider="gcp",outcome="ok"}`: the gcp
    /// provider's successful token fetches.
    async fn gcp_fetches(&self) -> f64 {
        sample(
            &self.metrics().await,
            "regbroker_upstream_requests_total",
            &[("provider", "gcp"), ("outcome", "ok")],
        )
    }

    /// `GET /v1/credentials?registry=HOST`: the password served (panics on another status).
    async fn password(&self, registry: &str) -> String {
        let res = self
            .client
            .get(format!("{}/v1/credentials", self.base))
            .query(&[("registry", registry)])
            .send()
            .await
            .unwrap();
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(status, 200, "GET /v1/credentials: {body}");
        assert_eq!(body["username"], GCP_USER, "{body}");
        assert_eq!(body["provider"], "gcp", "{body}");
        body["password"].as_str().unwrap().to_string()
    }
}

/// The value of the series `name{labels...}` in a Prometheus text exposition: the sum
/// of every series with at least these labels, 0 when there is none.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut total = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((set, value)) => (set, value),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        if labels
            .iter()
            .all(|(k, v)| set.split(',').any(|p| p == format!("{k}=\"{v}\"")))
        {
            total += value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("unreadable sample: {line}"));
        }
    }
    total
}

/// regbroker's config: `registry` is a GCP registry (rule `extra` lines appended to it).
fn write_config(dir: &Path, cache: &str, registry: &str, extra: &str) -> PathBuf {
    let path = dir.join("regbroker.toml");
    std::fs::write(
        &path,
        format!("{cache}\n[[rule]]\nmatch = \"{registry}\"\nsource = \"gcp\"\n{extra}"),
    )
    .unwrap();
    path
}

/// `user:password` the docker config document at `path` holds for `registry`, if any.
fn file_auth(path: &Path, registry: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let doc: serde_json::Value = serde_json::from_str(&text).ok()?;
    auth_for(&doc, registry)
}

/// `user:password` Secret `pull` of `secrets` holds for `registry`, if any.
async fn secret_auth(secrets: &Api<Secret>, registry: &str) -> Option<String> {
    let secret = secrets.get_opt("pull").await.unwrap()?;
    let data = secret.data?;
    let doc: serde_json::Value = serde_json::from_slice(&data.get(".dockerconfigjson")?.0).ok()?;
    auth_for(&doc, registry)
}

/// The status of `GET /v2/` on a Basic-auth registry with `user`:`password`.
async fn basic_login(registry: &str, password: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://{registry}/v2/"))
        .basic_auth(GCP_USER, Some(password))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The scenario of the first two tests, for a sink read by `held` (`user:password` it
/// holds for `registry`): the sink gets gcplocal's token, which the registry accepts;
/// once the metadata server hands out [`ROTATED`], which the registry (or its token
/// server) refuses, the sink keeps the previous token through [`REFUSED_ROUNDS`]
/// refusals, logged with `status`; once `accept_rotated` makes the registry take
/// [`ROTATED`], the sink gets it.
async fn refused_then_accepted(
    w: &mut Watched,
    registry: &str,
    metadata: &Metadata,
    status: u64,
    mut held: impl AsyncFnMut() -> Option<String>,
    accept_rotated: impl FnOnce(),
) {
    let first = format!("{GCP_USER}:{GCPLOCAL_TOKEN}");
    let rotated = format!("{GCP_USER}:{ROTATED}");

    // Accepted: written, and the log says the registry accepted it. (The docker config
    // sink's first pass runs before `Listening`, which `ServeProcess::start` waits for
    // and drops the lines before: the next pass, 5 s on, logs its check again.)
    let deadline = Instant::now() + WAIT;
    while held().await.as_deref() != Some(first.as_str())
        || !w
            .logged("The registry accepted the credential", registry)
            .iter()
            .any(|v| v["status"].as_u64() == Some(200) && v["level"] == "INFO")
    {
        assert!(
            Instant::now() < deadline,
            "the sink never got gcplocal's token with an acceptance (status 200) logged; \
             regbroker's log:\n{}",
            w.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(w.checks("accepted").await >= 1.0);
    assert_eq!(w.checks("refused").await, 0.0);

    // The issuer rotates; the registry still wants the old password. Every pass fetches
    // the rotated token, and the registry refuses it: the sink keeps the previous token
    // (valid for an hour) and never holds the rotated one.
    metadata.rotate(ROTATED);
    let deadline = Instant::now() + WAIT;
    let mut polls = 0u32;
    loop {
        let now = held().await;
        assert_eq!(
            now.as_deref(),
            Some(first.as_str()),
            "the sink no longer holds the accepted token (the registry refused {ROTATED}); \
             regbroker's log:\n{}",
            w.dump()
        );
        polls += 1;
        if w.checks("refused").await >= REFUSED_ROUNDS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than {REFUSED_ROUNDS} refusals within {WAIT:?}; regbroker's log:\n{}",
            w.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Read once more after the last refusal counted.
    assert_eq!(held().await.as_deref(), Some(first.as_str()));
    assert!(polls > 10, "the sink was read {polls} times only");
    let refusals = w.logged("The registry refused the credential", registry);
    assert!(
        refusals.len() >= REFUSED_ROUNDS as usize
            && refusals
                .iter()
                .all(|v| v["status"].as_u64() == Some(status) && v["level"] == "WARN"),
        "want at least {REFUSED_ROUNDS} refusals with status {status} for {registry}; \
         regbroker's log:\n{}",
        w.dump()
    );
    // The log never holds a token.
    let log = w.dump();
    assert!(
        !log.contains(ROTATED) && !log.contains(GCPLOCAL_TOKEN),
        "a token is logged"
    );

    // The registry takes the rotated password: the next check accepts it, and the sink
    // writes it (the failure pause after the last refusal is at most 30 s).
    accept_rotated();
    let deadline = Instant::now() + WAIT;
    loop {
        let now = held().await;
        if now.as_deref() == Some(rotated.as_str()) {
            break;
        }
        assert_eq!(now.as_deref(), Some(first.as_str()));
        assert!(
            Instant::now() < deadline,
            "the sink never got {ROTATED} once the registry accepts it; regbroker's log:\n{}",
            w.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(w.checks("accepted").await >= 2.0);
    // Every check had a verdict: none was skipped.
    assert_eq!(w.checks("skipped").await, 0.0, "{}", w.metrics().await);
}

/// Issue 26 with `--sync-secret` into a real kube-apiserver, against an htpasswd registry
/// (401 with `WWW-Authenticate: Basic`): the Secret gets gcplocal's token; after the
/// metadata server rotates to a token the registry refuses, four refusals (logged with
/// status 401, counted in `regbroker_registry_checks_total{result="refused"}`) leave the
/// Secret with the accepted token, never the refused one; once the registry's htpasswd
/// takes the new token, the Secret gets it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs etcd, kube-apiserver and kubectl from scripts/peers.sh, docker-registry, htpasswd and gcplocal: run scripts/test.sh"]
async fn a_secret_never_gets_a_token_the_registry_refuses_and_gets_it_once_accepted() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("registry-check").await;
    let metadata = tokio::task::block_in_place(Metadata::start);
    let registry =
        tokio::task::block_in_place(|| Registry::start_with(Some((GCP_USER, GCPLOCAL_TOKEN))));
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), FAST_CACHE, &registry.host, "");
    let args = [
        format!("--config={}", config.display()),
        format!("--sync-secret={ns}/pull"),
        format!("--sink-registry={}", registry.host),
    ];
    let mut w = Watched::start(
        &args,
        &metadata,
        dir.path(),
        &[
            ("KUBECONFIG", cp.admin_kubeconfig.to_str().unwrap()),
            ("POD_NAME", "regbroker-0"),
        ],
    );
    let secrets: Api<Secret> = Api::namespaced(cp.admin(), &ns);
    let host = registry.host.clone();
    refused_then_accepted(
        &mut w,
        &registry.host,
        &metadata,
        401,
        async || secret_auth(&secrets, &host).await,
        || registry.set_password(GCP_USER, ROTATED),
    )
    .await;
}

/// The same with token auth: the registry answers `/v2/` with a Bearer challenge whose
/// realm is distribution's token server on the same host (another port), which hands a
/// token to `oauth2accesstoken` with the right password only. The token server refuses
/// the rotated token (401, `error authenticating user` in its log), so the docker config
/// file (`--write-docker-config`) keeps the accepted one; once the token server's
/// htpasswd takes the new token, the file gets it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs registry-token-server from scripts/peers.sh, docker-registry, htpasswd, openssl and gcplocal: run scripts/test.sh"]
async fn a_token_refused_at_the_token_server_never_reaches_the_docker_config() {
    let bin = Peers::find().get("registry-token-server").to_path_buf();
    let metadata = tokio::task::block_in_place(Metadata::start);
    let tokens = tokio::task::block_in_place(|| TokenServer::start(&bin, GCP_USER, GCPLOCAL_TOKEN));
    let registry =
        tokio::task::block_in_place(|| Registry::start_token(&tokens.realm(), &tokens.cert));
    // The registry names that realm and asks for a token.
    let res = reqwest::get(format!("http://{}/v2/", registry.host))
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);
    assert_eq!(
        res.headers()["www-authenticate"],
        format!(
            "Bearer realm=\"{}\",service=\"{TOKEN_SERVICE}\"",
            tokens.realm()
        )
        .as_str()
    );

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), FAST_CACHE, &registry.host, "");
    let file = dir.path().join("config.json");
    let args = [
        format!("--config={}", config.display()),
        format!("--write-docker-config={}", file.display()),
        format!("--sink-registry={}", registry.host),
    ];
    let mut w = Watched::start(&args, &metadata, dir.path(), &[]);
    refused_then_accepted(
        &mut w,
        &registry.host,
        &metadata,
        401,
        async || file_auth(&file, &registry.host),
        || tokens.set_password(GCP_USER, ROTATED),
    )
    .await;
    // The token server saw both: tokens handed out to the user, and refused passwords.
    let log = tokens.log();
    assert!(
        log.contains("get token complete") && log.contains("acctSubject=oauth2accesstoken"),
        "the token server handed out no token:\n{log}"
    );
    assert!(
        log.contains("error authenticating user \\\"oauth2accesstoken\\\""),
        "the token server refused no password:\n{log}"
    );
}

/// `DELETE /v1/credentials` end to end, on the sidecar endpoint of a `serve` process of
/// its own with the default cache (gcplocal's hour-long token is refreshed after about
/// 45 minutes; the fast cache of the tests above would replace the token within 2 s
/// without any report, so "still cached" could not be shown there) and the default
/// `refetch_interval` (30 s).
///
/// `GET` serves token T, which the registry takes. The metadata server and the registry
/// both move to T2: the registry refuses T, but `GET` still serves T (cached, no fetch).
/// Eight clients report at once: exactly one `204` (the first report takes the interval;
/// `Checks::refetch` decides under one lock), seven `429` with `Retry-After` within the
/// interval. Eight clients then ask at once: all get T2, from exactly one fetch. A second
/// report within the interval is `429` and fetches nothing.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs docker-registry, htpasswd and gcplocal: run scripts/test.sh"]
async fn delete_makes_the_next_gets_fetch_once_and_a_second_delete_is_429() {
    const T2: &str = "tok-3";
    const CLIENTS: usize = 8;
    let metadata = tokio::task::block_in_place(Metadata::start);
    let registry =
        tokio::task::block_in_place(|| Registry::start_with(Some((GCP_USER, GCPLOCAL_TOKEN))));
    let host = registry.host.clone();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", &host, "");
    let mut w = Watched::start(
        &[format!("--config={}", config.display())],
        &metadata,
        dir.path(),
        &[],
    );

    assert_eq!(w.password(&host).await, GCPLOCAL_TOKEN);
    assert_eq!(basic_login(&host, GCPLOCAL_TOKEN).await, 200);
    let fetched = w.gcp_fetches().await;
    assert!(fetched >= 1.0, "{}", w.metrics().await);

    // T is revoked: the issuer hands out T2, the registry takes T2 only.
    metadata.rotate(T2);
    registry.set_password(GCP_USER, T2);
    assert_eq!(basic_login(&host, GCPLOCAL_TOKEN).await, 401);
    assert_eq!(basic_login(&host, T2).await, 200);
    // Without a report, the cached T is served, and nothing is fetched.
    for _ in 0..5 {
        assert_eq!(w.password(&host).await, GCPLOCAL_TOKEN);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(w.gcp_fetches().await, fetched);

    // Eight clients, each on its own connection, report at once.
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let reports: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let barrier = barrier.clone();
            let url = format!("{}/v1/credentials?registry={host}", w.base);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                barrier.wait().await;
                let res = client
                    .delete(url)
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .unwrap();
                let status = res.status().as_u16();
                let retry = res
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string());
                let body = res.text().await.unwrap();
                (status, retry, body)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for r in reports {
        answers.push(r.await.unwrap());
    }
    let taken = answers.iter().filter(|(s, _, _)| *s == 204).count();
    assert_eq!(taken, 1, "exactly one report is taken: {answers:?}");
    for (status, retry, body) in answers.iter().filter(|(s, _, _)| *s != 204) {
        assert_eq!(*status, 429, "{answers:?}");
        let retry: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
        assert!((1..=30).contains(&retry), "Retry-After {retry}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "refetch_too_soon", "{body}");
    }
    let reported = w.log().iter().filter(|v| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("A client reported the credential refused"))
    });
    assert_eq!(reported.count(), 1, "{}", w.dump());
    assert_eq!(
        w.gcp_fetches().await,
        fetched,
        "a report itself fetches nothing"
    );

    // Eight clients ask at once: T2 for all, from one fetch.
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let gets: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let barrier = barrier.clone();
            let url = format!("{}/v1/credentials?registry={host}", w.base);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                barrier.wait().await;
                let res = client
                    .get(url)
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status().as_u16(), 200);
                let body: serde_json::Value = res.json().await.unwrap();
                body["password"].as_str().unwrap().to_string()
            })
        })
        .collect();
    for g in gets {
        assert_eq!(g.await.unwrap(), T2);
    }
    assert_eq!(
        w.gcp_fetches().await,
        fetched + 1.0,
        "one fetch for every client after the report"
    );
    assert_eq!(basic_login(&host, &w.password(&host).await).await, 200);

    // A second report within refetch_interval: 429, and no fetch.
    let res = w
        .client
        .delete(format!("{}/v1/credentials", w.base))
        .query(&[("registry", host.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 429);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "Retry-After {retry}");
    assert_eq!(w.password(&host).await, T2);
    assert_eq!(w.gcp_fetches().await, fetched + 1.0);
}

/// A stand-in adversary: a TCP listener on 127.0.0.2 (another loopback address, so
/// another host than the registry's 127.0.0.1) that records every connection and every
/// request head, and answers 503. A registry's Bearer challenge naming it as the token
/// realm must not make regbroker send it anything.
struct Adversary {
    /// `127.0.0.2:PORT`.
    addr: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Adversary {
    fn start() -> Adversary {
        let listener = std::net::TcpListener::bind("127.0.0.2:0")
            .expect("cannot listen on 127.0.0.2 (Linux routes 127.0.0.0/8 to loopback)");
        let addr = listener.local_addr().unwrap().to_string();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (count, seen) = (connections.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = stream.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        Adversary {
            addr,
            connections,
            requests,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// A token-auth registry whose challenge names a realm on another host
/// (`http://127.0.0.2:PORT/token/`, an [`Adversary`]): the check is skipped (logged as
/// such, counted `skipped`), the docker config is written anyway, and the adversary
/// never sees a connection, let alone an `Authorization` header. Then, as a control that
/// the adversary would have noticed: with the realm's host listed in the rule's
/// `check_realms`, the same setup sends it the credential with Basic auth.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs docker-registry, openssl and gcplocal: run scripts/test.sh"]
async fn a_token_realm_on_another_host_never_receives_the_credential() {
    let adversary = Adversary::start();
    let metadata = tokio::task::block_in_place(Metadata::start);
    let keys = tempfile::tempdir().unwrap();
    let (_, cert) = token_signing_key(keys.path());
    let realm = format!("http://{}/token/", adversary.addr);
    let registry = tokio::task::block_in_place(|| Registry::start_token(&realm, &cert));
    let host = registry.host.clone();
    let res = reqwest::get(format!("http://{host}/v2/")).await.unwrap();
    assert_eq!(res.status().as_u16(), 401);
    assert_eq!(
        res.headers()["www-authenticate"],
        format!("Bearer realm=\"{realm}\",service=\"{TOKEN_SERVICE}\"").as_str()
    );

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), FAST_CACHE, &host, "");
    let file = dir.path().join("config.json");
    let args = [
        format!("--config={}", config.display()),
        format!("--write-docker-config={}", file.display()),
        format!("--sink-registry={host}"),
    ];
    let mut w = Watched::start(&args, &metadata, dir.path(), &[]);
    let written = format!("{GCP_USER}:{GCPLOCAL_TOKEN}");
    // Two passes, two checks (each pass fetches anew), both skipped.
    let deadline = Instant::now() + WAIT;
    while file_auth(&file, &host).as_deref() != Some(written.as_str())
        || w.checks("skipped").await < 2.0
    {
        assert!(
            Instant::now() < deadline,
            "not written with two skipped checks within {WAIT:?}; regbroker's log:\n{}",
            w.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        adversary.connections(),
        0,
        "the realm on another host was contacted: {:?}",
        adversary.requests()
    );
    let skipped = w.logged("Registry check skipped", &host);
    assert!(
        !skipped.is_empty()
            && skipped.iter().all(|v| v["level"] == "WARN"
                && v["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("127.0.0.2"))),
        "no skip naming the realm's host logged; regbroker's log:\n{}",
        w.dump()
    );
    assert_eq!(w.checks("accepted").await, 0.0);
    assert_eq!(w.checks("refused").await, 0.0);
    assert!(w.serve.stop().success());

    // Control: the adversary does see what is sent to it. With its host:port in
    // `check_realms`, the check asks it for a token with the credential.
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        FAST_CACHE,
        &host,
        &format!("check_realms = [\"{}\"]\n", adversary.addr),
    );
    let file = dir.path().join("config.json");
    let args = [
        format!("--config={}", config.display()),
        format!("--write-docker-config={}", file.display()),
        format!("--sink-registry={host}"),
    ];
    let mut w = Watched::start(&args, &metadata, dir.path(), &[]);
    let deadline = Instant::now() + WAIT;
    while adversary.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the allowed realm was never asked; regbroker's log:\n{}",
            w.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&written)
    );
    let first = adversary.requests()[0].clone();
    assert!(
        first.starts_with("GET /token/?") && first.contains(&format!("service={TOKEN_SERVICE}")),
        "{first}"
    );
    assert!(
        first
            .lines()
            .any(|l| l
                .split_once(':')
                .is_some_and(|(name, value)| name.eq_ignore_ascii_case("authorization")
                    && value.trim() == basic)),
        "{first}"
    );
    drop(w);
}

/// A credential one registry refuses is still checked with, and written for, another
/// registry that accepts it, when both are served the same credential (one cache key:
/// here gcp's default identity for both rules).
///
/// A refusal once held the whole cache key in the failure pause, so the sink pass's next
/// registry got the refusal as its own fetch error and was never written; a refusal is
/// now per registry. The sink writes its registries in sorted order: the refusing
/// registry is `127.0.0.1:PORT`, the accepting one `localhost:PORT` (the same kind of
/// loopback registry), so the refusing one comes first in every pass.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs docker-registry, htpasswd and gcplocal: run scripts/test.sh"]
async fn a_registry_that_refuses_does_not_keep_the_credential_from_one_that_accepts_it() {
    let metadata = tokio::task::block_in_place(Metadata::start);
    let refusing =
        tokio::task::block_in_place(|| Registry::start_with(Some((GCP_USER, "not-the-gcp-token"))));
    let accepting =
        tokio::task::block_in_place(|| Registry::start_with(Some((GCP_USER, GCPLOCAL_TOKEN))));
    let accepting_host = accepting.host.replace("127.0.0.1", "localhost");
    assert!(
        refusing.host < accepting_host,
        "the refusing registry is written first"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "",
        &refusing.host,
        &format!("\n[[rule]]\nmatch = \"{accepting_host}\"\nsource = \"gcp\"\n"),
    );
    let file = dir.path().join("config.json");
    let args = [
        format!("--config={}", config.display()),
        format!("--write-docker-config={}", file.display()),
        format!("--sink-registry={}", refusing.host),
        format!("--sink-registry={accepting_host}"),
    ];
    let mut w = Watched::start(&args, &metadata, dir.path(), &[]);
    let written = format!("{GCP_USER}:{GCPLOCAL_TOKEN}");
    let deadline = Instant::now() + WAIT;
    while file_auth(&file, &accepting_host).as_deref() != Some(written.as_str())
        || w.logged("The registry refused the credential", &refusing.host)
            .is_empty()
    {
        assert!(
            file_auth(&file, &refusing.host).is_none(),
            "written for the registry that refuses it"
        );
        assert!(
            Instant::now() < deadline,
            "{accepting_host}, which accepts the token, never got it written within {WAIT:?} \
             ({} accepted checks, {} refused by {}); regbroker's log:\n{}",
            w.checks("accepted").await,
            w.checks("refused").await,
            refusing.host,
            w.dump()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(w.checks("accepted").await >= 1.0);
    assert!(file_auth(&file, &refusing.host).is_none());
}
