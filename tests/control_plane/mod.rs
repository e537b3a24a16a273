//! A real Kubernetes control plane for the tests: etcd and kube-apiserver built from
//! source by `scripts/peers.sh`, started once per test binary on loopback, like
//! controller-runtime's envtest `Environment`.
//!
//! - kube-apiserver serves TLS with a certificate from a CA made here (rcgen), authorises
//!   with RBAC, and knows one admin (a static token in group `system:masters`);
//! - a service-account issuer and signing key, so TokenRequest and TokenReview work;
//! - [`ControlPlane::shared`] runs no controller-manager: namespaces are never deleted,
//!   nothing is garbage collected and aggregated ClusterRoles (`view`, `edit`, `admin`)
//!   stay empty, so every test works in namespaces of its own
//!   ([`ControlPlane::namespace`]) and the whole store lives in a temporary directory;
//! - [`ControlPlane::shared_with_controllers`] is the same plus kube-controller-manager
//!   running only the garbage collector, the namespace controller and ClusterRole
//!   aggregation (`--controllers=garbagecollector,namespace,clusterrole-aggregation`), as
//!   the admin, without leader election. It is ready once a dependent object the
//!   collector had to delete is gone;
//! - [`ControlPlane::shared_with_audit`] is [`ControlPlane::shared`] plus the API
//!   server's audit log of every write request and every read of a Lease (metadata
//!   only: never a body), read by [`ControlPlane::audited`], so a test can tell which
//!   client wrote what, even clients acting as one ServiceAccount (by source address).
//!
//! A test binary uses one of the three: each is a control plane of its own.
//!
//! Peers come from `REGBROKER_PEERS_FILE` (the `NAME=PATH` lines `scripts/peers.sh`
//! prints; `scripts/test.sh` sets it), else from running `scripts/peers.sh`, which builds
//! what its cache lacks. The tests using this fixture are `#[ignore]`d, so plain
//! `cargo test` lists them as ignored; `scripts/test.sh` runs them, and a missing peer is
//! then a failure, never a silent pass.
//!
//! The processes are tethered to the test binary: each runs under a small shell that
//! kills it when its stdin (a pipe this process holds until it exits) reaches EOF, so no
//! etcd, kube-apiserver or kube-controller-manager outlives the tests, whichever way they
//! end.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::process::{run_bounded, wait_output_bounded};
use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams};

/// The test peers, by the names `scripts/peers.sh` prints.
#[derive(Debug, Clone)]
pub struct Peers(BTreeMap<String, PathBuf>);

impl Peers {
    /// Reads `REGBROKER_PEERS_FILE`, or runs `scripts/peers.sh` (building what is missing).
    pub fn find() -> Peers {
        let text = match std::env::var_os("REGBROKER_PEERS_FILE") {
            Some(file) => std::fs::read_to_string(&file).unwrap_or_else(|e| {
                panic!("REGBROKER_PEERS_FILE={}: {e}", Path::new(&file).display())
            }),
            None => {
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/peers.sh");
                // Its progress (stderr) shows as it goes. Building every peer from source
                // takes long on a small machine, but not forever.
                let child = Command::new("bash")
                    .arg(&script)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("cannot run scripts/peers.sh");
                let out = wait_output_bounded(child, "bash scripts/peers.sh", PEERS_BUILD_BOUND);
                assert!(
                    out.status.success(),
                    "scripts/peers.sh failed ({}); see its message above",
                    out.status
                );
                String::from_utf8(out.stdout).unwrap()
            }
        };
        Peers(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim().to_string(), PathBuf::from(v.trim())))
                .collect(),
        )
    }

    /// The path of peer `name`; panics naming it when it is missing.
    pub fn get(&self, name: &str) -> &Path {
        let p = self.0.get(name).unwrap_or_else(|| {
            panic!("test peer `{name}` is not in scripts/peers.sh's output: {self:?}")
        });
        assert!(
            p.exists(),
            "test peer `{name}` at {} is missing",
            p.display()
        );
        p
    }
}

/// A running etcd + kube-apiserver pair, with kube-controller-manager when started by
/// [`ControlPlane::shared_with_controllers`] or [`ControlPlane::start_with_controllers`].
pub struct ControlPlane {
    /// Where the store, certificates, kubeconfigs and logs live.
    pub dir: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// The CA that signed the API server's certificate.
    pub ca_pem: String,
    /// The admin's kubeconfig (token in `system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The service-account token issuer.
    pub issuer: String,
    /// The audit log ([`ControlPlane::shared_with_audit`]).
    pub audit_log: Option<PathBuf>,
    /// How long start-up took, from spawning etcd to `/readyz` answering ok.
    pub started_in: Duration,
    /// With kube-controller-manager: how long it took to work, from spawning it to its
    /// garbage collector deleting a probe object.
    pub controllers_started_in: Option<Duration>,
    pub peers: Peers,
    admin_token: String,
    _etcd: Tethered,
    _apiserver: Tethered,
    _controller_manager: Option<Tethered>,
}

/// The bound for one kubectl call: above the `--timeout=60s` of the `kubectl wait`s.
const KUBECTL_BOUND: Duration = Duration::from_secs(180);

/// The bound for `scripts/peers.sh` when it builds every peer from source (Go builds of
/// kube-apiserver and friends on a small machine); a cached peer costs seconds.
const PEERS_BUILD_BOUND: Duration = Duration::from_secs(60 * 60);

/// The bound for kube-controller-manager to work: `/healthz`, then its garbage collector
/// syncing every resource's informer and deleting the probe.
const CONTROLLERS_READY_BOUND: Duration = Duration::from_secs(120);

/// What `ControlPlane::shared_with_controllers` runs (aliases of
/// `garbage-collector-controller`, `namespace-controller` and
/// `clusterrole-aggregation-controller`, the names in the Kubernetes docs).
const CONTROLLERS: &str = "garbagecollector,namespace,clusterrole-aggregation";

static SHARED: OnceLock<ControlPlane> = OnceLock::new();
static SHARED_WITH_CONTROLLERS: OnceLock<ControlPlane> = OnceLock::new();
static SHARED_WITH_AUDIT: OnceLock<ControlPlane> = OnceLock::new();

/// What the audit log records: every request that may write, and the reads of Leases (a
/// leader-election candidate's rounds), not the other reads, which are most of the
/// traffic; at level Metadata (who, what, the answer; no body, so no Secret data), once
/// the response is complete.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: Metadata
    verbs: ["get"]
    resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
  - level: None
"#;
static NAMES: AtomicUsize = AtomicUsize::new(0);

impl ControlPlane {
    /// The control plane of this test binary, started on first use.
    pub fn shared() -> &'static ControlPlane {
        SHARED.get_or_init(|| {
            let cp = ControlPlane::start(Peers::find());
            eprintln!(
                "control plane: etcd + kube-apiserver ready at {} in {:.1} s",
                cp.server,
                cp.started_in.as_secs_f64()
            );
            cp
        })
    }

    /// This test binary's control plane with kube-controller-manager (garbage collection,
    /// namespace deletion, ClusterRole aggregation), started on first use.
    pub fn shared_with_controllers() -> &'static ControlPlane {
        SHARED_WITH_CONTROLLERS.get_or_init(|| {
            let cp = ControlPlane::start_with_controllers(Peers::find());
            eprintln!(
                "control plane: etcd + kube-apiserver ready at {} in {:.1} s, \
                 kube-controller-manager ({CONTROLLERS}) working {:.1} s later",
                cp.server,
                cp.started_in.as_secs_f64(),
                cp.controllers_started_in.unwrap_or_default().as_secs_f64()
            );
            cp
        })
    }

    /// This test binary's control plane with an audit log of every write request and
    /// every read of a Lease ([`ControlPlane::audited`]), started on first use.
    pub fn shared_with_audit() -> &'static ControlPlane {
        SHARED_WITH_AUDIT.get_or_init(|| {
            let cp = ControlPlane::start_with_audit(Peers::find());
            eprintln!(
                "control plane: etcd + kube-apiserver (audited) ready at {} in {:.1} s",
                cp.server,
                cp.started_in.as_secs_f64()
            );
            cp
        })
    }

    /// [`ControlPlane::start`] with the API server writing an audit log ([`AUDIT_POLICY`]).
    pub fn start_with_audit(peers: Peers) -> ControlPlane {
        ControlPlane::start_retrying(peers, true)
    }

    /// [`ControlPlane::start`], then kube-controller-manager running [`CONTROLLERS`];
    /// returns once its garbage collector has deleted a probe object. A failed start
    /// (a port taken meanwhile, say) is retried.
    pub fn start_with_controllers(peers: Peers) -> ControlPlane {
        let mut cp = ControlPlane::start(peers);
        let mut last = String::new();
        for _ in 0..3 {
            match cp.try_start_controller_manager() {
                Ok(()) => return cp,
                Err(e) => {
                    eprintln!("control plane: kube-controller-manager failed, retrying: {e}");
                    last = e;
                }
            }
        }
        panic!("kube-controller-manager did not start: {last}");
    }

    /// Starts etcd and kube-apiserver in a new temporary directory and waits until the API
    /// server is ready. A port taken between choosing and binding it is retried.
    pub fn start(peers: Peers) -> ControlPlane {
        ControlPlane::start_retrying(peers, false)
    }

    fn start_retrying(peers: Peers, audit: bool) -> ControlPlane {
        let mut last = String::new();
        for _ in 0..3 {
            match ControlPlane::try_start(peers.clone(), audit) {
                Ok(cp) => return cp,
                Err(e) => {
                    eprintln!("control plane: start failed, retrying: {e}");
                    last = e;
                }
            }
        }
        panic!("control plane did not start: {last}");
    }

    fn try_start(peers: Peers, audit: bool) -> Result<ControlPlane, String> {
        let dir = tempfile::Builder::new()
            .prefix("regbroker-control-plane-")
            .tempdir()
            .unwrap()
            .keep();
        let started = Instant::now();
        let [client_port, peer_port, api_port] = free_ports();
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = Tethered::spawn(
            "etcd",
            Command::new(peers.get("etcd"))
                .arg(format!("--data-dir={}", dir.join("etcd").display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=default={peer_url}"))
                .arg("--unsafe-no-fsync")
                .arg("--log-level=warn"),
            &dir,
            Some(&dir),
        );

        let pki = Pki::generate();
        let write = |name: &str, contents: &str| {
            let p = dir.join(name);
            std::fs::write(&p, contents).unwrap();
            p
        };
        let ca = write("ca.crt", &pki.ca_pem);
        let cert = write("apiserver.crt", &pki.server_cert_pem);
        let key = write("apiserver.key", &pki.server_key_pem);
        let sa_key = write("sa.key", &pki.sa_key_pem);
        let sa_pub = write("sa.pub", &pki.sa_pub_pem);
        let admin_token = random_token();
        let tokens = write(
            "tokens.csv",
            &format!(
                "{admin_token},regbroker-test-admin,regbroker-test-admin,\"system:masters\"\n"
            ),
        );
        let server = format!("https://127.0.0.1:{api_port}");
        let issuer = format!("{server}/regbroker-test");
        let audit_log = audit.then(|| dir.join("audit.log"));
        let mut apiserver_command = Command::new(peers.get("kube-apiserver"));
        if let Some(log) = &audit_log {
            let policy = write("audit-policy.yaml", AUDIT_POLICY);
            // The log backend's default mode, blocking: each event is in the file before
            // its response is sent.
            apiserver_command
                .arg(format!("--audit-policy-file={}", policy.display()))
                .arg(format!("--audit-log-path={}", log.display()))
                .arg("--audit-log-format=json")
                .arg("--audit-log-mode=blocking");
        }
        let mut apiserver = Tethered::spawn(
            "kube-apiserver",
            apiserver_command
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg("--bind-address=127.0.0.1")
                .arg("--advertise-address=127.0.0.1")
                .arg(format!("--secure-port={api_port}"))
                .arg(format!("--cert-dir={}", dir.join("certs").display()))
                .arg(format!("--tls-cert-file={}", cert.display()))
                .arg(format!("--tls-private-key-file={}", key.display()))
                .arg(format!("--client-ca-file={}", ca.display()))
                .arg(format!("--token-auth-file={}", tokens.display()))
                .arg(format!("--service-account-issuer={issuer}"))
                .arg(format!("--service-account-key-file={}", sa_pub.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    sa_key.display()
                ))
                .arg("--authorization-mode=RBAC")
                .arg("--service-cluster-ip-range=10.0.0.0/24")
                .arg("--disable-admission-plugins=ServiceAccount")
                // 1.37 refuses a loopback advertise address with the lease reconciler.
                .arg("--endpoint-reconciler-type=none")
                .arg("--allow-privileged=true")
                .arg("--v=0"),
            &dir,
            None,
        );
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(&admin_kubeconfig, &server, &pki.ca_pem, &admin_token);

        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            for p in [&mut etcd, &mut apiserver] {
                if let Some(status) = p.exited() {
                    return Err(format!(
                        "{} exited ({status}) before the API server was ready:\n{}",
                        p.name,
                        p.log_tail()
                    ));
                }
            }
            if health_ok(&server, "/readyz", &pki.ca_pem, &admin_token) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver not ready after 90 s:\n{}",
                    apiserver.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(ControlPlane {
            dir,
            server,
            ca_pem: pki.ca_pem,
            admin_kubeconfig,
            issuer,
            audit_log,
            started_in: started.elapsed(),
            controllers_started_in: None,
            peers,
            admin_token,
            _etcd: etcd,
            _apiserver: apiserver,
            _controller_manager: None,
        })
    }

    /// Starts kube-controller-manager as the admin and waits until it answers `/healthz`
    /// and its garbage collector has deleted a probe: a ConfigMap in `kube-system` owned
    /// by one deleted here. `/healthz` alone answers ok before any controller runs, and the
    /// collector acts only once the informers of every resource it tracks have synced.
    fn try_start_controller_manager(&mut self) -> Result<(), String> {
        let started = Instant::now();
        let [port] = free_ports();
        let kubeconfig = self.admin_kubeconfig.display().to_string();
        let mut kcm = Tethered::spawn(
            "kube-controller-manager",
            Command::new(self.peers.get("kube-controller-manager"))
                .arg(format!("--kubeconfig={kubeconfig}"))
                // Who may call its own endpoints: tokens checked through this API
                // server (TokenReview, SubjectAccessReview), as in a cluster. No lookup of
                // the client CAs: this API server has no request-header CA, and the
                // controller-manager logs an error for it over and over.
                .arg(format!("--authentication-kubeconfig={kubeconfig}"))
                .arg("--authentication-skip-lookup")
                .arg(format!("--authorization-kubeconfig={kubeconfig}"))
                .arg(format!("--controllers={CONTROLLERS}"))
                // Every controller acts as the admin: no ServiceAccount per controller,
                // hence no token requests and no RBAC of their own to wait for.
                .arg("--use-service-account-credentials=false")
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                // The API server's certificate names 127.0.0.1 and comes from the test CA,
                // so `/healthz` is checked with the same trust as the API server.
                .arg(format!(
                    "--tls-cert-file={}",
                    self.dir.join("apiserver.crt").display()
                ))
                .arg(format!(
                    "--tls-private-key-file={}",
                    self.dir.join("apiserver.key").display()
                ))
                .arg("--v=1"),
            &self.dir,
            None,
        );
        let deadline = started + CONTROLLERS_READY_BOUND;
        on_own_runtime(self.until_controllers_work(&mut kcm, port, deadline))
            .unwrap_or_else(|_| Err("waiting for kube-controller-manager panicked".into()))?;
        self.controllers_started_in = Some(started.elapsed());
        self._controller_manager = Some(kcm);
        Ok(())
    }

    /// Waits until kube-controller-manager (`kcm`, its secure port `port`) answers
    /// `/healthz`, then until its garbage collector deletes a probe, or fails at
    /// `deadline` or when it exits, quoting its log.
    async fn until_controllers_work(
        &self,
        kcm: &mut Tethered,
        port: u16,
        deadline: Instant,
    ) -> Result<(), String> {
        let healthz = client(
            &format!("https://127.0.0.1:{port}"),
            &self.ca_pem,
            &self.admin_token,
        );
        while !answers_ok(&healthz, "/healthz").await {
            still_starting(kcm, "/healthz answered ok", deadline)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let api = Api::<ConfigMap>::namespaced(self.admin(), "kube-system");
        let probe = format!(
            "regbroker-gc-probe-{}-{}",
            std::process::id(),
            NAMES.fetch_add(1, Ordering::Relaxed)
        );
        let dependent = format!("{probe}-dependent");
        let owner = api
            .create(&PostParams::default(), &named_config_map(&probe, None))
            .await
            .map_err(|e| format!("creating the probe's owner: {e}"))?;
        let owned_by = OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: probe.clone(),
            uid: owner.metadata.uid.unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        api.create(
            &PostParams::default(),
            &named_config_map(&dependent, Some(owned_by)),
        )
        .await
        .map_err(|e| format!("creating the probe's dependent: {e}"))?;
        api.delete(&probe, &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting the probe's owner: {e}"))?;
        while !matches!(api.get_opt(&dependent).await, Ok(None)) {
            still_starting(kcm, "garbage collection of the probe", deadline)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// The last lines kube-controller-manager logged (`None` without it), for a test's
    /// failure message: the control plane's directory is gone once the tests end.
    pub fn controller_manager_log_tail(&self) -> Option<String> {
        self._controller_manager.as_ref().map(Tethered::log_tail)
    }

    /// A client acting as the admin.
    pub fn admin(&self) -> kube::Client {
        client(&self.server, &self.ca_pem, &self.admin_token)
    }

    /// Creates a namespace named `prefix-N` (unique in this binary and run) and returns
    /// its name.
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NAMES.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.admin())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        name
    }

    /// Creates ServiceAccount `namespace/name` (if absent) and returns a token for it from
    /// TokenRequest, valid for an hour, for `audiences` (the API server's when empty).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        audiences: &[&str],
    ) -> String {
        let api = Api::<ServiceAccount>::namespaced(self.admin(), namespace);
        if api.get_opt(name).await.unwrap().is_none() {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &sa).await.unwrap();
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audiences.iter().map(|a| a.to_string()).collect(),
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap()
            .status
            .expect("TokenRequest answered without a status")
            .token
    }

    /// A kubeconfig file (and a client) for ServiceAccount `namespace/name`, as a pod
    /// running as it would authenticate.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.service_account_token(namespace, name, &[]).await;
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        write_kubeconfig(&path, &self.server, &self.ca_pem, &token);
        path
    }

    /// A client acting as ServiceAccount `namespace/name`.
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> kube::Client {
        let token = self.service_account_token(namespace, name, &[]).await;
        client(&self.server, &self.ca_pem, &token)
    }

    /// Runs the peer `kubectl` as the admin with `args`, `stdin` piped in; returns
    /// (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        let out = run_bounded(
            Command::new(self.peers.get("kubectl"))
                .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
                .args(args),
            Some(stdin.as_bytes()),
            KUBECTL_BOUND,
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Every request the audit log holds so far (writes, and reads of Leases), in the
    /// order their responses completed ([`ControlPlane::shared_with_audit`] only).
    pub fn audited(&self) -> Vec<Audited> {
        let path = self
            .audit_log
            .as_ref()
            .expect("no audit log: use ControlPlane::shared_with_audit");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        // A line being written as we read is incomplete: only whole lines count.
        let whole = text.rfind('\n').map_or("", |i| &text[..i]);
        whole
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .map(|e| Audited::from_event(&e))
            .collect()
    }

    /// Applies `yaml` (server-side apply, as the admin); panics with kubectl's message on
    /// failure.
    pub fn apply(&self, yaml: &str) {
        let (ok, out, err) = self.kubectl(
            &[
                "apply",
                "--server-side",
                "--field-manager=regbroker-test",
                "-f",
                "-",
            ],
            yaml,
        );
        assert!(ok, "kubectl apply failed:\n{err}\n{out}\n---\n{yaml}");
    }
}

/// One request from the audit log.
#[derive(Clone, Debug)]
pub struct Audited {
    /// The client's address (the TCP peer: nothing here sets X-Forwarded-For).
    pub source: String,
    pub user: String,
    pub verb: String,
    /// `secrets`, `leases`, `events`, `registrycredentials`...
    pub resource: String,
    /// `status`, `token`, or empty.
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The HTTP status answered.
    pub code: u16,
    /// When the API server received it, and when it answered.
    pub received: std::time::SystemTime,
    pub completed: std::time::SystemTime,
}

impl Audited {
    fn from_event(e: &serde_json::Value) -> Audited {
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let time = |v: &serde_json::Value| {
            let t: k8s_openapi::jiff::Timestamp = serde_json::from_value(v.clone())
                .unwrap_or_else(|err| panic!("audit event time {v}: {err}"));
            std::time::SystemTime::from(t)
        };
        let o = &e["objectRef"];
        Audited {
            source: s(&e["sourceIPs"][0]),
            user: s(&e["user"]["username"]),
            verb: s(&e["verb"]),
            resource: s(&o["resource"]),
            subresource: s(&o["subresource"]),
            namespace: s(&o["namespace"]),
            name: s(&o["name"]),
            code: e["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
            received: time(&e["requestReceivedTimestamp"]),
            completed: time(&e["stageTimestamp"]),
        }
    }

    /// Whether it was answered with success (2xx).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// Whether it may write (not a read).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// Writes a kubeconfig for `server` that trusts `ca_pem` and presents `token`.
fn write_kubeconfig(path: &Path, server: &str, ca_pem: &str, token: &str) {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "test", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    });
    // JSON is YAML: kubectl, kube-rs and client-go all read it.
    std::fs::write(path, doc.to_string()).unwrap();
}

fn client(server: &str, ca_pem: &str, token: &str) -> kube::Client {
    let mut config = kube::Config::new(server.parse().unwrap());
    config.root_cert = Some(vec![pem_to_der(ca_pem)]);
    config.auth_info.token = Some(token.to_string().into());
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(config).unwrap()
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .concat();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// Runs `future` to completion on a runtime of its own, in a thread of its own (the
/// fixture may start inside or outside a test's runtime); `Err` if it panicked.
fn on_own_runtime<T: Send>(future: impl Future<Output = T> + Send) -> std::thread::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(future)
            })
            .join()
    })
}

/// One `GET path` (`/readyz`, `/healthz`) at `server`: whether it answered `ok` within
/// 2 s.
fn health_ok(server: &str, path: &str, ca_pem: &str, token: &str) -> bool {
    on_own_runtime(async { answers_ok(&client(server, ca_pem, token), path).await })
        .unwrap_or(false)
}

/// Whether `GET path` through `c` answers `ok` within 2 s.
async fn answers_ok(c: &kube::Client, path: &str) -> bool {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    matches!(
        tokio::time::timeout(Duration::from_secs(2), c.request_text(req)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    )
}

/// `Err` quoting its log when kube-controller-manager has exited, or `deadline` has
/// passed, before `what`.
fn still_starting(kcm: &mut Tethered, what: &str, deadline: Instant) -> Result<(), String> {
    if let Some(status) = kcm.exited() {
        return Err(format!(
            "kube-controller-manager exited ({status}) before {what}:\n{}",
            kcm.log_tail()
        ));
    }
    if Instant::now() > deadline {
        return Err(format!(
            "kube-controller-manager: no {what} within {} s:\n{}",
            CONTROLLERS_READY_BOUND.as_secs(),
            kcm.log_tail()
        ));
    }
    Ok(())
}

/// An empty ConfigMap named `name`, owned by `owner` when given.
fn named_config_map(name: &str, owner: Option<OwnerReference>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn random_token() -> String {
    (0..32)
        .map(|_| fastrand::alphanumeric())
        .collect::<String>()
}

/// `N` distinct free loopback ports. Between choosing and binding another process may
/// take one; [`ControlPlane::start`] then retries with new ones.
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

/// The test CA, the API server's certificate and the service-account signing key.
struct Pki {
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
    sa_key_pem: String,
    sa_pub_pem: String,
}

impl Pki {
    fn generate() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "regbroker test control plane CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
        let sa_key = KeyPair::generate().unwrap();
        Pki {
            ca_pem: ca_cert.pem(),
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
            sa_key_pem: sa_key.serialize_pem(),
            sa_pub_pem: sa_key.public_key_pem(),
        }
    }
}

/// A peer process that dies with this test binary: it runs under `sh`, which waits for
/// EOF on its stdin (our end of a pipe, closed when this process exits for any reason)
/// and then kills it.
pub struct Tethered {
    pub name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Tethered {
    /// Starts `command` with its output in `dir/NAME.log`. With `cleanup`, that
    /// directory is removed once the process has been killed.
    pub fn spawn(
        name: &'static str,
        command: &mut Command,
        dir: &Path,
        cleanup: Option<&Path>,
    ) -> Tethered {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let program = command.get_program().to_owned();
        let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
        let child = Command::new("sh")
            .arg("-c")
            // A background list's stdin is /dev/null unless redirected: the watcher
            // reads the pipe through fd 3. When the peer exits first, so does `sh`.
            .arg(concat!(
                r#"exec 3<&0; "$@" </dev/null & child=$!; "#,
                r#"{ read -r _ <&3; kill -9 "$child"; [ -z "$CLEANUP" ] || rm -rf "$CLEANUP"; } & "#,
                r#"wait "$child""#
            ))
            .arg("tether")
            .arg(program)
            .args(args)
            .env("CLEANUP", cleanup.map(Path::as_os_str).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Tethered { name, child, log }
    }

    /// The exit status, once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines the process logged.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

/// Polls `check` until it returns `Some`, for at most `within`; panics with `what`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl ControlPlane {
    /// What the operator installs for the RegistryCredential controller, once per test
    /// binary: the CRD (`deploy/`'s copy of `regbroker crd`) and the controller's RBAC
    /// (`deploy/registry-credentials/rbac.yaml`) for a ServiceAccount `NS/regbroker`, NS
    /// a namespace of its own. Returns NS.
    pub async fn registry_credential_operator(&self) -> String {
        static NS: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
        NS.get_or_init(|| async {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/registry-credentials");
            self.apply(&std::fs::read_to_string(root.join("crd.yaml")).unwrap());
            let (ok, out, err) = self.kubectl(
                &[
                    "wait",
                    "--for=condition=Established",
                    "crd/registrycredentials.regbroker.dev",
                    "--timeout=60s",
                ],
                "",
            );
            assert!(ok, "{out}{err}");
            let ns = self.namespace("regbroker").await;
            let rbac = std::fs::read_to_string(root.join("rbac.yaml")).unwrap();
            assert!(rbac.contains("namespace: regbroker"));
            self.apply(&rbac.replace("namespace: regbroker", &format!("namespace: {ns}")));
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("regbroker".into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            Api::<ServiceAccount>::namespaced(self.admin(), &ns)
                .create(&PostParams::default(), &sa)
                .await
                .unwrap();
            ns
        })
        .await
        .clone()
    }
}
