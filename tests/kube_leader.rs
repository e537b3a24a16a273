//! Leader election among real `regbroker serve --leader-elect` processes (2 and 3
//! replicas) against a real kube-apiserver (tests/control_plane), each replica acting as
//! the ServiceAccount `deploy/standalone/rbac.yaml` grants (applied from that file) and
//! reaching the API server through a TCP proxy this test can cut.
//!
//! The credential is a Google access token from gcplocal's GCE metadata emulator (PyPI),
//! its token view replaced so each fetch hands out a new token `tok-<issued unix ms>`
//! living [`TOKEN_LIFE`]: the Secret is rewritten at every refresh point, and the test can
//! tell when the token it holds expires.
//!
//! The test watches the Lease and the Secret (admin client) and records every version.
//! Both live in one etcd, so their resourceVersions order all writes: each Secret write's
//! author (the annotation `regbroker/written-by`) must be the Lease's holder at that
//! version, which is "exactly one writer at any time". Waits are on those events or on
//! polls with bounded deadlines; none is a bare sleep standing in for an event.
//!
//! `REGBROKER_LEADER_ROUNDS=N` (default 1) repeats the SIGKILL and SIGTERM takeovers N
//! times and prints the medians; `REGBROKER_LEADER_STEADY_WRITES=N` (default 2) stretches
//! the steady state to N refresh points and prints the writes per refresh point
//! (BENCHMARKS.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod registry_peer;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use common::ServeProcess;
use control_plane::ControlPlane;
use futures_util::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, WatchEvent, WatchParams};
use regbroker_provider::{Clock as _, SystemClock};
use registry_peer::{Emulator, peer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

const SECRET: &str = "regbroker-pull";
const LEASE: &str = "regbroker";
const REGISTRY: &str = "registry.leader.test";
const AUTHOR: &str = "regbroker/written-by";
/// Short timings, in client-go's proportions (15/10/2 s by default).
const LEASE_DURATION: Duration = Duration::from_secs(4);
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// client-go's JitterFactor: a candidate retries after 1 to 2.2 retry periods.
const JITTER: f64 = 1.2;
/// How long each token lives, and the cache settings that refresh it at 0.4 of its
/// usable life (15 s − 1 s): every 5.6 s.
const TOKEN_LIFE: Duration = Duration::from_secs(15);
const REFRESH_EVERY: Duration = Duration::from_millis(5600);
/// Slack for a loaded 2-core machine on top of each bound.
const TOLERANCE: Duration = Duration::from_millis(1500);

/// Peer tests in this binary share one control plane and two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// gcplocal's app with the token view replaced: a new token per request, named after
/// its issue time in unix milliseconds, living argv[3] seconds.
const METADATA_WRAPPER: &str = r#"
import json, sys, time
from flask import Response
from gcplocal.server import create_app

host, port, life = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
app = create_app()

def token():
    body = {"access_token": "tok-%d" % int(time.time() * 1000), "expires_in": life,
            "token_type": "Bearer"}
    return Response(json.dumps(body), mimetype="application/json")

app.view_functions["fake_metadata_token"] = token
app.run(host=host, port=port, threaded=True)
"#;

fn now_wall() -> SystemTime {
    SystemClock.now()
}

/// The metadata emulator; killed when dropped.
struct Metadata {
    addr: String,
    _dir: tempfile::TempDir,
    _emulator: Emulator,
}

impl Metadata {
    fn start() -> Metadata {
        let gcplocal = peer("gcplocal", "pip install gcplocal");
        let python = std::fs::read_to_string(&gcplocal)
            .ok()
            .and_then(|s| {
                s.lines()
                    .next()
                    .and_then(|l| l.strip_prefix("#!"))
                    .map(|l| l.trim().to_string())
            })
            .filter(|p| Path::new(p).is_file())
            .unwrap_or_else(|| panic!("cannot find the Python that runs {}", gcplocal.display()));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("metadata.py");
        std::fs::write(&script, METADATA_WRAPPER).unwrap();
        let life = TOKEN_LIFE.as_secs().to_string();
        let emulator = Emulator::start(
            Path::new(&python),
            &[script.to_str().unwrap(), "127.0.0.1", "PORT", &life],
            "/computeMetadata/v1/instance/service-accounts/default/token",
            &[],
        );
        Metadata {
            addr: emulator.addr.clone(),
            _dir: dir,
            _emulator: emulator,
        }
    }
}

/// A TCP proxy in front of the API server. `cut` stops forwarding on every connection
/// and holds new ones open without forwarding (a partition: calls hang, nothing reaches
/// the server); `heal` closes the held connections and forwards again.
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(Proxy::carry(client, upstream, rx.clone()));
            }
        });
        Proxy { addr, cut, task }
    }

    async fn carry(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
        if !*cut.borrow() {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                _ = cut.wait_for(|c| *c) => {}
            }
        }
        // Cut: hold the client's connection, forwarding nothing, until healed.
        let _ = cut.wait_for(|c| !*c).await;
        drop(client);
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One recorded version of the Lease or the Secret, in resourceVersion order.
#[derive(Clone, Debug)]
enum Seen {
    Lease {
        rv: u64,
        holder: String,
    },
    Secret {
        rv: u64,
        at: Instant,
        author: String,
        /// When the token it holds for [`REGISTRY`] expires.
        expires: SystemTime,
    },
}

impl Seen {
    fn rv(&self) -> u64 {
        match self {
            Seen::Lease { rv, .. } | Seen::Secret { rv, .. } => *rv,
        }
    }
}

/// Watches of the Lease and the Secret, recording every version.
struct Recorder {
    seen: Arc<Mutex<BTreeMap<u64, Seen>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn rv_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap().parse().unwrap()
}

/// The token's expiry, from its name `tok-<issued ms>` and [`TOKEN_LIFE`].
fn token_expiry(secret: &Secret) -> SystemTime {
    let doc = &secret.data.as_ref().unwrap()[".dockerconfigjson"].0;
    let doc: serde_json::Value = serde_json::from_slice(doc).unwrap();
    let auth = doc["auths"][REGISTRY]["auth"].as_str().unwrap();
    let pair = base64::engine::general_purpose::STANDARD
        .decode(auth)
        .unwrap();
    let pair = String::from_utf8(pair).unwrap();
    let ms: u64 = pair
        .strip_prefix("oauth2accesstoken:tok-")
        .unwrap_or_else(|| panic!("not an emulator token: {pair}"))
        .parse()
        .unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms) + TOKEN_LIFE
}

async fn watch_one<K>(
    api: Api<K>,
    name: &'static str,
    seen: Arc<Mutex<BTreeMap<u64, Seen>>>,
    record: fn(&K) -> Seen,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut from = "0".to_string();
    loop {
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(60);
        let Ok(stream) = api.watch(&params, &from).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                    let s = record(&o);
                    from = s.rv().to_string();
                    seen.lock().unwrap().entry(s.rv()).or_insert(s);
                }
                Ok(WatchEvent::Bookmark(b)) => from = b.metadata.resource_version,
                Ok(WatchEvent::Deleted(_)) => {}
                Ok(WatchEvent::Error(_)) | Err(_) => break,
            }
        }
    }
}

impl Recorder {
    fn start(cp: &ControlPlane, lease_ns: &str, secret_ns: &str) -> Recorder {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let leases = Api::<Lease>::namespaced(cp.admin(), lease_ns);
        let secrets = Api::<Secret>::namespaced(cp.admin(), secret_ns);
        let tasks = vec![
            tokio::spawn(watch_one(leases, LEASE, seen.clone(), |l: &Lease| {
                Seen::Lease {
                    rv: rv_of(&l.metadata),
                    holder: l
                        .spec
                        .as_ref()
                        .and_then(|s| s.holder_identity.clone())
                        .unwrap_or_default(),
                }
            })),
            tokio::spawn(watch_one(secrets, SECRET, seen.clone(), |s: &Secret| {
                Seen::Secret {
                    rv: rv_of(&s.metadata),
                    at: Instant::now(),
                    author: s
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(AUTHOR).cloned())
                        .unwrap_or_default(),
                    expires: token_expiry(s),
                }
            })),
        ];
        Recorder { seen, tasks }
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().values().cloned().collect()
    }

    /// Secret writes in order: (rv, when seen, author, token expiry).
    fn writes(&self) -> Vec<(u64, Instant, String, SystemTime)> {
        self.all()
            .into_iter()
            .filter_map(|s| match s {
                Seen::Secret {
                    rv,
                    at,
                    author,
                    expires,
                } => Some((rv, at, author, expires)),
                Seen::Lease { .. } => None,
            })
            .collect()
    }

    /// Waits (at most `limit`) for a Secret write satisfying `f`; returns it.
    async fn wait_write(
        &self,
        limit: Duration,
        what: &str,
        f: impl Fn(&(u64, Instant, String, SystemTime)) -> bool,
    ) -> (u64, Instant, String, SystemTime) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(w) = self.writes().into_iter().find(|w| f(w)) {
                return w;
            }
            assert!(
                Instant::now() < deadline,
                "no Secret write {what} within {limit:?}; seen: {:#?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The checks that hold over the whole run: every write is by the Lease holder at
    /// its version, writers never interleave, and the Secret never holds an expired
    /// token (each version's token outlives the next version, the last one `end`).
    fn check(&self, end: SystemTime) {
        let all = self.all();
        let mut holder = String::new();
        let mut authors: Vec<String> = Vec::new();
        let mut previous: Option<(u64, SystemTime)> = None;
        let started = Instant::now();
        let wall_now = now_wall();
        for s in &all {
            match s {
                Seen::Lease { holder: h, .. } => holder = h.clone(),
                Seen::Secret {
                    rv,
                    at,
                    author,
                    expires,
                } => {
                    assert!(!author.is_empty(), "write {rv} is unsigned: {all:#?}");
                    assert_eq!(
                        author, &holder,
                        "write {rv} by {author} while {holder:?} held the Lease: {all:#?}"
                    );
                    if authors.last() != Some(author) {
                        assert!(
                            !authors.contains(author),
                            "{author} wrote again (at {rv}) after another writer: {all:#?}"
                        );
                        authors.push(author.clone());
                    }
                    // When this version was seen, on the wall clock.
                    let seen_wall = wall_now - (started - *at);
                    if let Some((prv, pexp)) = previous {
                        assert!(
                            pexp > seen_wall,
                            "the Secret held an expired token from {pexp:?} until write {rv} (previous {prv})"
                        );
                    }
                    previous = Some((*rv, *expires));
                }
            }
        }
        let (last, expires) = previous.expect("no Secret write at all");
        assert!(
            expires > end,
            "the last token (write {last}) expired before the end"
        );
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// deploy/standalone/rbac.yaml with its namespaces renamed; returns (apps, regbroker).
async fn deployed_rbac(cp: &ControlPlane) -> (String, String) {
    let apps = cp.namespace("leader-apps").await;
    let regbroker = cp.namespace("leader-regbroker").await;
    let yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/standalone/rbac.yaml"),
    )
    .unwrap();
    assert!(yaml.contains(&format!("resourceNames: [\"{LEASE}\"]")));
    cp.apply(
        &yaml
            .replace("namespace: apps", &format!("namespace: {apps}"))
            .replace("namespace: regbroker", &format!("namespace: {regbroker}")),
    );
    (apps, regbroker)
}

/// Everything the replicas of one test share.
struct Cluster {
    cp: &'static ControlPlane,
    apps: String,
    regbroker: String,
    kubeconfig: serde_json::Value,
    metadata: Metadata,
    config: PathBuf,
    upstream: SocketAddr,
    next_name: usize,
    dir: tempfile::TempDir,
}

/// One `regbroker serve --leader-elect`, with its own proxy to the API server.
struct Replica {
    name: String,
    process: ServeProcess,
    proxy: Proxy,
}

impl Replica {
    /// Its holder identity is `NAME_<suffix>`.
    fn is(&self, identity: &str) -> bool {
        identity
            .strip_prefix(&self.name)
            .is_some_and(|rest| rest.starts_with('_'))
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let res = reqwest::Client::new()
            .get(format!("http://{}{path}", self.process.addr))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    }

    /// `regbroker_leader` from its /metrics.
    async fn leader_gauge(&self) -> i64 {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix("regbroker_leader "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.process.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Waits (bounded) for the process to exit after a signal.
    fn reap(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while self.process.child.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not exit",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Cluster {
    async fn new() -> Cluster {
        let cp = ControlPlane::shared();
        let (apps, regbroker) = deployed_rbac(cp).await;
        let path = cp.service_account_kubeconfig(&regbroker, "regbroker").await;
        let kubeconfig: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("regbroker.toml");
        std::fs::write(
            &config,
            format!(
                // No refresh jitter: it moves each refresh point earlier by up to a tenth
                // (0.56 s here), which this test's refresh-interval bounds would count as
                // a leader writing early (it once failed a run at 5.07 s of 5.6 s).
                "[cache]\nrefresh_fraction = 0.4\nrefresh_jitter = 0.0\nmin_refresh = \"1s\"\nmin_remaining = \"1s\"\n\n\
                 [[rule]]\nmatch = \"{REGISTRY}\"\nsource = \"gcp\"\n"
            ),
        )
        .unwrap();
        let upstream: SocketAddr = cp.server.strip_prefix("https://").unwrap().parse().unwrap();
        Cluster {
            cp,
            apps,
            regbroker,
            kubeconfig,
            metadata: Metadata::start(),
            config,
            upstream,
            next_name: 0,
            dir,
        }
    }

    /// Starts replica `replica-N` through a proxy of its own.
    async fn replica(&mut self) -> Replica {
        self.replica_with(&[]).await
    }

    /// Starts replica `replica-N` through a proxy of its own, with `extra` flags.
    async fn replica_with(&mut self, extra: &[&str]) -> Replica {
        let name = format!("replica-{}", self.next_name);
        self.next_name += 1;
        let proxy = Proxy::start(self.upstream).await;
        let mut kubeconfig = self.kubeconfig.clone();
        kubeconfig["clusters"][0]["cluster"]["server"] = format!("https://{}", proxy.addr).into();
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig.to_string()).unwrap();
        let secret = format!("{}/{SECRET}", self.apps);
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let args = [
            "--config".to_string(),
            self.config.to_str().unwrap().to_string(),
            "--sync-secret".to_string(),
            secret,
            "--leader-elect".to_string(),
            format!("--leader-elect-namespace={}", self.regbroker),
            format!("--leader-elect-lease-duration={}", secs(LEASE_DURATION)),
            format!("--leader-elect-renew-deadline={}", secs(RENEW_DEADLINE)),
            format!("--leader-elect-retry-period={}", secs(RETRY_PERIOD)),
        ];
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        let env = [
            ("KUBECONFIG", path.to_str().unwrap()),
            ("GCE_METADATA_HOST", self.metadata.addr.as_str()),
            ("POD_NAME", name.as_str()),
            ("REGBROKER_LOG", "info"),
        ];
        let process = tokio::task::block_in_place(|| ServeProcess::start(&args, &env));
        Replica {
            name,
            process,
            proxy,
        }
    }

    /// The Lease's holder now.
    async fn holder(&self) -> String {
        Api::<Lease>::namespaced(self.cp.admin(), &self.regbroker)
            .get(LEASE)
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .unwrap_or_default()
    }
}

fn signal_name(s: rustix::process::Signal) -> &'static str {
    if s == rustix::process::Signal::KILL {
        "SIGKILL"
    } else {
        "SIGTERM"
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Refresh-point writes to wait for in the steady state (`REGBROKER_LEADER_STEADY_WRITES`,
/// default 2).
fn steady_writes() -> usize {
    std::env::var("REGBROKER_LEADER_STEADY_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

fn rounds() -> usize {
    std::env::var("REGBROKER_LEADER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The worst case after SIGKILL: a follower saw the last renewal up to one jittered retry
/// after it, counts a lease duration from there, and tries again up to one jittered retry
/// later.
fn kill_bound() -> Duration {
    LEASE_DURATION + RETRY_PERIOD.mul_f64(2.0 * (1.0 + JITTER)) + TOLERANCE
}

/// After SIGTERM the Lease is released: the next follower's retry takes it.
fn term_bound() -> Duration {
    RETRY_PERIOD.mul_f64(1.0 + JITTER) + TOLERANCE
}

/// `n` replicas: one writes; SIGKILL of the leader, then SIGTERM of the next, each
/// answered by a takeover within its bound, with no second writer and no expired token.
async fn takeovers_with(n: usize) {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::new().await;
    let rec = Recorder::start(cluster.cp, &cluster.regbroker, &cluster.apps);
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(cluster.replica().await);
    }
    let first = rec
        .wait_write(Duration::from_secs(30), "at all", |_| true)
        .await;
    // Steady state: the same leader rewrites the Secret at each refresh point, once.
    let mut steady = first.clone();
    for _ in 0..steady_writes() {
        let after = steady.0;
        steady = rec
            .wait_write(
                REFRESH_EVERY + TOLERANCE * 2,
                "at the next refresh point",
                |w| w.0 > after,
            )
            .await;
        assert_eq!(steady.2, first.2, "no takeover in the steady state");
    }
    let span = steady.1 - first.1;
    let points = span.as_secs_f64() / REFRESH_EVERY.as_secs_f64();
    let writes = rec.writes().len() - 1;
    assert!(
        writes as f64 <= points.floor() + 1.0,
        "{writes} writes in {span:?}, over {points:.2} refresh points"
    );
    eprintln!(
        "{n} replicas, steady state: {writes} writes after the first in {:.1} s, {points:.2} refresh intervals of {:.1} s: {:.3} writes per refresh point, {:.0} writes per day at this token life",
        span.as_secs_f64(),
        REFRESH_EVERY.as_secs_f64(),
        writes as f64 / points,
        writes as f64 * 86400.0 / span.as_secs_f64()
    );
    rec.check(now_wall());
    for r in &replicas {
        assert_eq!(r.get("/readyz").await.0, 200, "{} is ready", r.name);
        let (status, _) = r.get(&format!("/v1/credentials?registry={REGISTRY}")).await;
        assert_eq!(status, 200, "{} serves credentials, leader or not", r.name);
    }
    let leaders: Vec<i64> =
        futures_util::future::join_all(replicas.iter().map(|r| r.leader_gauge())).await;
    assert_eq!(
        leaders.iter().sum::<i64>(),
        1,
        "one leader by the gauges: {leaders:?}"
    );

    let mut killed = Vec::new();
    let mut termed = Vec::new();
    for _ in 0..rounds() {
        for (signal, took) in [
            (rustix::process::Signal::KILL, &mut killed),
            (rustix::process::Signal::TERM, &mut termed),
        ] {
            let holder = cluster.holder().await;
            let i = replicas
                .iter()
                .position(|r| r.is(&holder))
                .unwrap_or_else(|| panic!("no replica is the holder {holder:?}"));
            let mut leader = replicas.remove(i);
            let last = rec.writes().last().unwrap().0;
            let at = Instant::now();
            leader.signal(signal);
            // A SIGTERM releases the Lease, so its takeover is held to about one retry
            // period. (About one in three once took the whole lease duration: `serve`
            // returned before releasing when its server finished first. Fixed there.)
            let bound = if signal == rustix::process::Signal::KILL {
                kill_bound()
            } else {
                term_bound()
            };
            let next = rec
                .wait_write(bound + Duration::from_secs(5), "by a new leader", |w| {
                    w.0 > last && w.2 != holder
                })
                .await;
            let t = next.1 - at;
            assert!(
                t <= bound,
                "{}: takeover took {t:?}, more than {bound:?}",
                signal_name(signal)
            );
            eprintln!(
                "leader {} with {n} replicas: first write by the new leader after {:.2} s",
                signal_name(signal),
                t.as_secs_f64()
            );
            took.push(t);
            rec.check(now_wall());
            leader.reap();
            if signal == rustix::process::Signal::TERM {
                assert!(
                    leader.process.child.try_wait().unwrap().unwrap().success(),
                    "SIGTERM: a clean exit"
                );
            }
            replicas.push(cluster.replica().await);
        }
    }
    // One more refresh point under the last leader, then the run's invariants.
    let last = rec.writes().last().unwrap().clone();
    rec.wait_write(REFRESH_EVERY + TOLERANCE * 2, "after the takeovers", |w| {
        w.0 > last.0 && w.2 == last.2
    })
    .await;
    rec.check(now_wall());

    // Writes per refresh point: between takeovers a leader writes once per refresh
    // point, never more. The gap is measured between the written tokens' expiries, i.e.
    // between the fetches that issued them (each token lives TOKEN_LIFE from its issue):
    // the time a write is seen adds the write's and the watch's latency, which on a
    // loaded machine once made two writes one refresh interval apart look 0.6 s closer.
    // A leader writing the same token twice shows as a zero gap.
    let writes = rec.writes();
    let mut gaps = Vec::new();
    for pair in writes.windows(2) {
        if pair[0].2 == pair[1].2 {
            gaps.push(pair[1].3.duration_since(pair[0].3).unwrap_or_default());
        }
    }
    let shortest = *gaps.iter().min().unwrap();
    assert!(
        shortest + Duration::from_millis(500) >= REFRESH_EVERY,
        "a leader wrote twice within {shortest:?}, less than the refresh interval {REFRESH_EVERY:?}: {writes:#?}"
    );
    let mean = gaps.iter().sum::<Duration>() / gaps.len() as u32;
    eprintln!(
        "{n} replicas: {} writes, {} takeovers; between refresh points of one leader: mean {:.2} s, shortest {:.2} s (refresh interval {:.1} s)",
        writes.len(),
        killed.len() + termed.len(),
        mean.as_secs_f64(),
        shortest.as_secs_f64(),
        REFRESH_EVERY.as_secs_f64()
    );
    eprintln!(
        "{n} replicas: takeover after SIGKILL median {:.2} s {killed:.2?}; after SIGTERM median {:.2} s {termed:.2?}",
        median(killed.clone()).as_secs_f64(),
        median(termed.clone()).as_secs_f64()
    );
    for mut r in replicas {
        r.signal(rustix::process::Signal::TERM);
        r.reap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh, gcplocal: run scripts/test.sh"]
async fn two_replicas_one_writer_takeover_after_sigkill_and_sigterm() {
    takeovers_with(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh, gcplocal: run scripts/test.sh"]
async fn three_replicas_one_writer_takeover_after_sigkill_and_sigterm() {
    takeovers_with(3).await;
}

/// A leader cut off from the API server stops writing (its gauge drops) before any
/// other replica can take the Lease, and writes nothing after the new leader's first
/// write, even once it can reach the API server again.
async fn partitioned_leader_with(n: usize) {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::new().await;
    let rec = Recorder::start(cluster.cp, &cluster.regbroker, &cluster.apps);
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(cluster.replica().await);
    }
    rec.wait_write(Duration::from_secs(30), "at all", |_| true)
        .await;
    let holder = cluster.holder().await;
    let old = replicas.iter().find(|r| r.is(&holder)).unwrap();
    rec.check(now_wall());
    assert_eq!(old.leader_gauge().await, 1);
    let last = rec.writes().last().unwrap().0;

    let cut = Instant::now();
    old.proxy.cut();
    // Its gauge drops within the renew deadline (plus the retry it may be waiting on).
    let deadline = cut + RENEW_DEADLINE + RETRY_PERIOD + TOLERANCE;
    while old.leader_gauge().await == 1 {
        assert!(Instant::now() < deadline, "the cut-off leader still leads");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stepped_down = Instant::now();
    assert_eq!(
        old.get("/readyz").await.0,
        200,
        "a cut-off replica stays ready"
    );
    let first_new = rec
        .wait_write(
            kill_bound() + Duration::from_secs(5),
            "by a new leader",
            |w| w.0 > last && w.2 != holder,
        )
        .await;
    assert!(
        stepped_down < first_new.1,
        "the old leader stepped down {:?} after the cut, the new leader wrote {:?} after it",
        stepped_down - cut,
        first_new.1 - cut
    );
    eprintln!(
        "partition with {n} replicas: old leader stopped after {:.2} s, new leader's first write after {:.2} s",
        (stepped_down - cut).as_secs_f64(),
        (first_new.1 - cut).as_secs_f64()
    );

    // Healed: the old leader follows; two refresh points by the new leader pass without
    // a write by the old one.
    old.proxy.heal();
    let new_author = first_new.2.clone();
    let mut after = first_new.0;
    for _ in 0..2 {
        let w = rec
            .wait_write(
                REFRESH_EVERY + TOLERANCE * 2,
                "by the new leader after healing",
                |w| w.0 > after && w.2 == new_author,
            )
            .await;
        after = w.0;
    }
    assert_eq!(old.leader_gauge().await, 0, "the old leader follows");
    for w in rec.writes() {
        assert!(
            !(w.0 > first_new.0 && w.2 == holder),
            "the old leader wrote {} after the new leader's first write {}",
            w.0,
            first_new.0
        );
    }
    rec.check(now_wall());
    for mut r in replicas {
        r.signal(rustix::process::Signal::TERM);
        r.reap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh, gcplocal: run scripts/test.sh"]
async fn three_replicas_partitioned_leader_stops_writing_before_takeover() {
    partitioned_leader_with(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh, gcplocal: run scripts/test.sh"]
async fn two_replicas_partitioned_leader_stops_writing_before_takeover() {
    partitioned_leader_with(2).await;
}

/// With `--ready-requires-sinks`, the replica that does not lead writes no Secret and
/// says so (`standby`), and is ready: never reported as a sink that failed. The leader's
/// Secret is `written`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh, gcplocal: run scripts/test.sh"]
async fn a_follower_is_on_standby_and_ready_while_the_leader_writes() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::new().await;
    let rec = Recorder::start(cluster.cp, &cluster.regbroker, &cluster.apps);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(cluster.replica_with(&["--ready-requires-sinks"]).await);
    }
    rec.wait_write(Duration::from_secs(30), "at all", |_| true)
        .await;
    let holder = cluster.holder().await;
    let sink = format!("secret/{}/{SECRET}", cluster.apps);
    let never = format!("regbroker_sink_never_written{{sink=\"{sink}\"}}");
    for r in &replicas {
        let (state, verbose) = if r.is(&holder) {
            (
                "written",
                format!("[+]startup ok\n[+]sink/{sink} ok\nreadyz check passed\n"),
            )
        } else {
            (
                "standby",
                format!(
                    "[+]startup ok\n[+]sink/{sink} ok: standby: not leading, another replica writes it\nreadyz check passed\n"
                ),
            )
        };
        // The leader records its pass just after the write the recorder saw.
        let deadline = Instant::now() + TOLERANCE * 4;
        let reported = loop {
            let (_, body) = r.get("/v1/providers").await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let reported = v["sinks"][0].clone();
            if reported["state"] == state || Instant::now() > deadline {
                break reported;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(reported["name"], sink.as_str(), "{}: {reported}", r.name);
        assert_eq!(reported["state"], state, "{}: {reported}", r.name);
        assert_eq!(
            r.get("/readyz").await,
            (200, "ok\n".to_string()),
            "{}",
            r.name
        );
        assert_eq!(r.get("/readyz?verbose").await, (200, verbose), "{}", r.name);
        let (_, metrics) = r.get("/metrics").await;
        assert!(
            metrics.contains(&format!("{never} 0\n")),
            "{}: {metrics}",
            r.name
        );
    }
    rec.check(now_wall());
    for mut r in replicas {
        r.signal(rustix::process::Signal::TERM);
        r.reap();
    }
}

#[tokio::test]
#[ignore = "needs etcd, kube-apiserver, kubectl from scripts/peers.sh, gcplocal: run scripts/test.sh"]
async fn deployed_rbac_grants_the_named_lease_and_no_other() {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::PostParams;
    let cp = ControlPlane::shared();
    let (_apps, regbroker) = deployed_rbac(cp).await;
    let elsewhere = cp.namespace("leader-elsewhere").await;
    let client = cp.service_account_client(&regbroker, "regbroker").await;
    let leases = Api::<Lease>::namespaced(client.clone(), &regbroker);
    let lease = |name: &str| Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("test".into()),
            ..Default::default()
        }),
    };
    let code = |e: kube::Error| match e {
        kube::Error::Api(s) => s.code,
        e => panic!("{e}"),
    };
    // The named Lease: create, get, update.
    assert!(leases.get_opt(LEASE).await.unwrap().is_none());
    let created = leases
        .create(&PostParams::default(), &lease(LEASE))
        .await
        .unwrap();
    let mut got = leases.get(LEASE).await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    got.spec.as_mut().unwrap().holder_identity = Some("other".into());
    leases
        .replace(LEASE, &PostParams::default(), &got)
        .await
        .unwrap();
    // Another Lease: `create` cannot be limited by name, but get and update are refused.
    let admin = Api::<Lease>::namespaced(cp.admin(), &regbroker);
    admin
        .create(&PostParams::default(), &lease("someone-elses"))
        .await
        .unwrap();
    assert_eq!(code(leases.get("someone-elses").await.unwrap_err()), 403);
    let theirs = admin.get("someone-elses").await.unwrap();
    let e = leases
        .replace("someone-elses", &PostParams::default(), &theirs)
        .await
        .unwrap_err();
    assert_eq!(code(e), 403);
    // Listing, and any Lease in another namespace: refused.
    assert_eq!(
        code(leases.list(&Default::default()).await.unwrap_err()),
        403
    );
    let there = Api::<Lease>::namespaced(client, &elsewhere);
    assert_eq!(
        code(
            there
                .create(&PostParams::default(), &lease(LEASE))
                .await
                .unwrap_err()
        ),
        403
    );
}
