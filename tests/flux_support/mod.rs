//! Flux's source-controller and rotating cloud credentials for `tests/flux.rs` and
//! `tests/flux_registry_credential.rs`.
//!
//! - [`SourceController`]: the real source-controller (v1.9.6, built by `scripts/peers.sh`)
//!   run outside a cluster against the test control plane (tests/control_plane), as the
//!   admin, watching every namespace, its artifact server on loopback; Flux's CRDs are
//!   installed from the same module first. Started once per test binary and tethered to
//!   it like etcd and kube-apiserver, so it never outlives the tests.
//! - [`Metadata`]: gcplocal's GCE metadata emulator (PyPI), whose token can be rotated.
//!   gcplocal itself always hands out the constant `ya29.gcplocal-mock-token` with
//!   `expires_in: 3600` (`gcplocal/server.py`, `fake_metadata_token`), so it cannot
//!   rotate. [`Metadata`] runs gcplocal's own Flask app (`gcplocal.server.create_app`)
//!   with that one view replaced: it answers gcplocal's own reply until
//!   [`Metadata::rotate`] writes a token file, then that token (same shape, same
//!   lifetime), as a real metadata server does when it renews the instance's token.
//! - [`Ecr`]: moto (PyPI) with its ECR `GetAuthorizationToken` view replaced, for
//!   `tests/flux_registry_credential.rs`: moto's token expired on 2015-01-01 and never
//!   changes; [`Ecr`]'s lives twelve hours, as ECR's do, and [`Ecr::rotate`] changes it.
//! - [`Helm`]: the Helm CLI with a private HOME, to package and push the chart.
//! - Reading Flux objects' status with kubectl, and bounded waits that print the
//!   conditions and source-controller's log when they time out.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::control_plane::{ControlPlane, Tethered};
use crate::registry_peer::{Emulator, free_port, http_status, peer};

/// The token gcplocal's metadata server hands out, whatever is asked.
pub const GCPLOCAL_TOKEN: &str = "ya29.gcplocal-mock-token";
/// The user name GCP registries take with an access token.
pub const GCP_USER: &str = "oauth2accesstoken";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// source-controller, running against the shared control plane.
pub struct SourceController {
    /// `127.0.0.1:PORT` of its artifact server.
    pub storage_addr: String,
    /// `127.0.0.1:PORT` of its health probes.
    pub health_addr: String,
    process: Mutex<Tethered>,
}

static SOURCE_CONTROLLER: OnceLock<SourceController> = OnceLock::new();

impl SourceController {
    /// The source-controller of this test binary, started (CRDs first) on first use.
    pub fn shared(cp: &'static ControlPlane) -> &'static SourceController {
        SOURCE_CONTROLLER.get_or_init(|| {
            let started = Instant::now();
            install_crds(cp);
            let sc = SourceController::start(cp);
            eprintln!(
                "flux: CRDs installed and source-controller ready in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            sc
        })
    }

    fn start(cp: &ControlPlane) -> SourceController {
        let bin = cp.peers.get("source-controller");
        let dir = tempfile::Builder::new()
            .prefix("regbroker-source-controller-")
            .tempdir()
            .unwrap()
            .keep();
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        let [storage_port, metrics_port, health_port] = [free_port(), free_port(), free_port()];
        let storage_addr = format!("127.0.0.1:{storage_port}");
        let health_addr = format!("127.0.0.1:{health_port}");
        // Tethered runs the program with its arguments only: `env` carries the environment.
        let mut process = Tethered::spawn(
            "source-controller",
            Command::new("env")
                .arg(format!("KUBECONFIG={}", cp.admin_kubeconfig.display()))
                // Where it would run in a cluster; with --watch-all-namespaces only used
                // for leader election (off) and its own events.
                .arg("RUNTIME_NAMESPACE=flux-system")
                .arg(bin)
                .arg(format!("--storage-path={}", storage.display()))
                .arg(format!("--storage-addr={storage_addr}"))
                .arg(format!("--storage-adv-addr={storage_addr}"))
                .arg("--enable-leader-election=false")
                .arg("--watch-all-namespaces=true")
                .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
                .arg(format!("--health-addr={health_addr}"))
                .arg("--events-addr=")
                // A failing object is retried after at most 5 s, not 15 min.
                .arg("--max-retry-delay=5s")
                .arg("--log-encoding=console"),
            &dir,
            Some(&dir),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = process.exited() {
                panic!(
                    "source-controller exited ({status}) before it was ready:\n{}",
                    process.log_tail()
                );
            }
            if http_status(&health_addr, "/readyz") == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "source-controller not ready after 60 s:\n{}",
                process.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        SourceController {
            storage_addr,
            health_addr,
            process: Mutex::new(process),
        }
    }

    /// Whether the process still runs (it was never restarted: it is started only once).
    pub fn running(&self) -> bool {
        self.process.lock().unwrap().exited().is_none()
    }

    /// The last lines source-controller logged.
    pub fn log_tail(&self) -> String {
        self.process.lock().unwrap().log_tail()
    }
}

/// Installs Flux's source CRDs from the module scripts/peers.sh built them from, and
/// waits until the API server serves them.
fn install_crds(cp: &ControlPlane) {
    let crds = cp.peers.get("source-controller-crds").to_path_buf();
    let (ok, _, err) = cp.kubectl(
        &["apply", "--server-side", "-f", crds.to_str().unwrap()],
        "",
    );
    assert!(ok, "installing Flux's CRDs: {err}");
    let (ok, _, err) = cp.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/helmrepositories.source.toolkit.fluxcd.io",
            "crd/helmcharts.source.toolkit.fluxcd.io",
            "crd/ocirepositories.source.toolkit.fluxcd.io",
        ],
        "",
    );
    assert!(ok, "Flux's CRDs not established: {err}");
}

/// gcplocal's app with a metadata token that [`Metadata::rotate`] can change.
const METADATA_WRAPPER: &str = r#"
import json, sys
from flask import Response
from gcplocal.server import create_app

host, port, token_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
app = create_app()
gcplocal_token = app.view_functions["fake_metadata_token"]

def token():
    try:
        with open(token_file) as f:
            access_token = f.read().strip()
    except FileNotFoundError:
        return gcplocal_token()
    body = {"access_token": access_token, "expires_in": 3600, "token_type": "Bearer"}
    return Response(json.dumps(body), mimetype="application/json")

app.view_functions["fake_metadata_token"] = token
app.run(host=host, port=port, threaded=True)
"#;

/// gcplocal's GCE metadata server, with a token that can rotate. Killed when dropped.
pub struct Metadata {
    /// `127.0.0.1:PORT`, for `GCE_METADATA_HOST`.
    pub addr: String,
    token_file: PathBuf,
    _dir: tempfile::TempDir,
    _emulator: Emulator,
}

impl Metadata {
    /// Starts it, handing out gcplocal's own token ([`GCPLOCAL_TOKEN`]).
    pub fn start() -> Metadata {
        let python = interpreter_of(&peer("gcplocal", "pip install gcplocal"));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("metadata.py");
        std::fs::write(&script, METADATA_WRAPPER).unwrap();
        let token_file = dir.path().join("access_token");
        let emulator = Emulator::start(
            Path::new(&python),
            &[
                script.to_str().unwrap(),
                "127.0.0.1",
                "PORT",
                token_file.to_str().unwrap(),
            ],
            METADATA_TOKEN_PATH,
            &[],
        );
        Metadata {
            addr: emulator.addr.clone(),
            token_file,
            _dir: dir,
            _emulator: emulator,
        }
    }

    /// From now on the metadata server hands out `token`.
    pub fn rotate(&self, token: &str) {
        let next = self.token_file.with_extension("next");
        std::fs::write(&next, token).unwrap();
        std::fs::rename(&next, &self.token_file).unwrap();
    }
}

/// The Python interpreter a PyPI peer's script is installed for (its shebang).
fn interpreter_of(script: &Path) -> PathBuf {
    std::fs::read_to_string(script)
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.strip_prefix("#!"))
                .map(|l| PathBuf::from(l.trim()))
        })
        .filter(|p| p.is_file())
        .unwrap_or_else(|| panic!("cannot find the Python that runs {}", script.display()))
}

/// moto's server with ECR's `GetAuthorizationToken` answering as ECR does: a token for
/// twelve hours (moto's own expired on 2015-01-01, which regbroker would refresh every
/// minute), and a password that [`Ecr::rotate`] changes.
const ECR_WRAPPER: &str = r#"
import sys, time
from base64 import b64encode
from moto.core.responses import ActionResult
from moto.ecr.responses import ECRResponse
from moto.server import main

suffix_file = sys.argv.pop(1)

def get_authorization_token(self):
    # moto's own (moto/ecr/responses.py), but for the lifetime and the suffix.
    try:
        with open(suffix_file) as f:
            suffix = f.read().strip()
    except FileNotFoundError:
        suffix = ""
    registry_ids = self._get_param("registryIds") or [self.current_account]
    auth_data = []
    for registry_id in registry_ids:
        password = f"{registry_id}-auth-token{suffix}"
        auth_data.append({
            "authorizationToken": b64encode(f"AWS:{password}".encode("ascii")).decode(),
            "expiresAt": time.time() + 12 * 3600,
            "proxyEndpoint": f"https://{registry_id}.dkr.ecr.{self.region}.amazonaws.com",
        })
    return ActionResult({"authorizationData": auth_data})

ECRResponse.get_authorization_token = get_authorization_token
sys.exit(main())
"#;

/// moto (STS, ECR) whose ECR tokens live twelve hours and can rotate. Killed when
/// dropped.
pub struct Ecr {
    /// `127.0.0.1:PORT`, moto's endpoint for every service.
    pub addr: String,
    suffix_file: PathBuf,
    _dir: tempfile::TempDir,
    _emulator: Emulator,
}

impl Ecr {
    /// Starts it; an account's password is moto's, `<account>-auth-token`.
    pub fn start() -> Ecr {
        let python = interpreter_of(&peer("moto_server", "pip install 'moto[server]'"));
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("ecr.py");
        std::fs::write(&script, ECR_WRAPPER).unwrap();
        let suffix_file = dir.path().join("suffix");
        let emulator = Emulator::start(
            &python,
            &[
                script.to_str().unwrap(),
                suffix_file.to_str().unwrap(),
                "-H",
                "127.0.0.1",
                "-p",
                "PORT",
            ],
            "/moto-api/data.json",
            &[("TZ", "UTC")],
        );
        Ecr {
            addr: emulator.addr.clone(),
            suffix_file,
            _dir: dir,
            _emulator: emulator,
        }
    }

    /// From now on an account's password is `<account>-auth-token<suffix>`, as ECR hands
    /// out a new token at every call.
    pub fn rotate(&self, suffix: &str) {
        let next = self.suffix_file.with_extension("next");
        std::fs::write(&next, suffix).unwrap();
        std::fs::rename(&next, &self.suffix_file).unwrap();
    }
}

/// The Helm CLI (peer `helm`) with a HOME of its own.
pub struct Helm {
    bin: PathBuf,
    dir: tempfile::TempDir,
    runs: usize,
}

impl Helm {
    pub fn new(cp: &ControlPlane) -> Helm {
        Helm {
            bin: cp.peers.get("helm").to_path_buf(),
            dir: tempfile::tempdir().unwrap(),
            runs: 0,
        }
    }

    /// Runs helm with a cleared environment (HOME and helm's directories in its own
    /// temporary directory); returns (success, stdout + stderr). Fails after two minutes.
    pub fn run(&mut self, args: &[&str]) -> (bool, String) {
        self.runs += 1;
        let home = self.dir.path().join("home");
        let out = self.dir.path().join(format!("helm-{}.out", self.runs));
        let mut child = Command::new(&self.bin)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .env("TMPDIR", std::env::temp_dir())
            .env("HELM_CONFIG_HOME", home.join(".config/helm"))
            .env("HELM_CACHE_HOME", home.join(".cache/helm"))
            .env("HELM_DATA_HOME", home.join(".local/share/helm"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&out).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("helm {args:?} did not finish in 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status.success(), std::fs::read_to_string(&out).unwrap())
    }

    /// `helm package deploy/chart/regbroker --version VERSION`; returns the .tgz.
    pub fn package_chart(&mut self, version: &str) -> PathBuf {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/chart/regbroker");
        let dest = self.dir.path().join("package");
        let (ok, out) = self.run(&[
            "package",
            chart.to_str().unwrap(),
            "--version",
            version,
            "-d",
            dest.to_str().unwrap(),
        ]);
        assert!(ok, "helm package: {out}");
        let tgz = dest.join(format!("regbroker-{version}.tgz"));
        assert!(
            tgz.is_file(),
            "helm package made no {}: {out}",
            tgz.display()
        );
        tgz
    }

    /// `helm push TGZ oci://HOST/REPO --plain-http` with `docker_config` (a docker config
    /// document) as its registry config.
    pub fn push(&mut self, tgz: &Path, host: &str, repo: &str, docker_config: &str) -> String {
        let config = self.dir.path().join(format!("registry-{}.json", self.runs));
        std::fs::write(&config, docker_config).unwrap();
        let (ok, out) = self.run(&[
            "push",
            tgz.to_str().unwrap(),
            &format!("oci://{host}/{repo}"),
            "--plain-http",
            "--registry-config",
            config.to_str().unwrap(),
        ]);
        assert!(ok, "helm push: {out}");
        out
    }
}

/// The object `kind/name` in `namespace` as JSON (kubectl, as the admin); `None` when
/// kubectl fails (not found yet).
pub fn get(
    cp: &ControlPlane,
    namespace: &str,
    kind: &str,
    name: &str,
) -> Option<serde_json::Value> {
    let (ok, out, _) = cp.kubectl(&["get", "-n", namespace, kind, name, "-o", "json"], "");
    ok.then(|| serde_json::from_str(&out).unwrap())
}

/// The object's condition `type`, if it has one.
pub fn condition<'a>(obj: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// `status` of condition Ready: `"True"`, `"False"`, `"Unknown"`, or `""` without one.
pub fn ready_status(obj: &serde_json::Value) -> String {
    condition(obj, "Ready")
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

/// The object's generation has been observed (its status is about its current spec).
pub fn observed(obj: &serde_json::Value) -> bool {
    obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
}

/// Ready=True for the current generation, with an artifact.
pub fn ready_with_artifact(obj: &serde_json::Value) -> bool {
    observed(obj) && ready_status(obj) == "True" && obj["status"]["artifact"]["digest"].is_string()
}

/// The reconcile asked for at `at` has been handled.
pub fn handled(obj: &serde_json::Value, at: &str) -> bool {
    obj["status"]["lastHandledReconcileAt"] == at
}

/// How long [`wait_for`] waits for one object.
pub const WAIT: Duration = Duration::from_secs(60);

/// Polls `kind/name` every 500 ms until `done` holds, for at most [`WAIT`]; returns the
/// object then. On timeout, panics with `what`, the object's status and the last lines of
/// source-controller's log.
pub fn wait_for(
    cp: &ControlPlane,
    sc: &SourceController,
    namespace: &str,
    kind: &str,
    name: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let obj = get(cp, namespace, kind, name);
        if let Some(obj) = &obj
            && done(obj)
        {
            return obj.clone();
        }
        if Instant::now() > deadline {
            let status = obj
                .map(|o| serde_json::to_string_pretty(&o["status"]).unwrap())
                .unwrap_or_else(|| "(object not found)".into());
            panic!(
                "{namespace}/{kind}/{name}: not {what} after {} s; status:\n{status}\n\
                 --- source-controller log (tail):\n{}",
                WAIT.as_secs(),
                sc.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Sets `reconcile.fluxcd.io/requestedAt` on `kind/name`, which asks Flux to reconcile
/// it now; `status.lastHandledReconcileAt` takes the same value once it has.
pub fn request_reconcile(cp: &ControlPlane, namespace: &str, kind: &str, name: &str, at: &str) {
    let (ok, out, err) = cp.kubectl(
        &[
            "annotate",
            "--overwrite",
            "-n",
            namespace,
            &format!("{kind}/{name}"),
            &format!("reconcile.fluxcd.io/requestedAt={at}"),
        ],
        "",
    );
    assert!(ok, "kubectl annotate {kind}/{name}: {err}{out}");
}

/// The `.dockerconfigjson` document of Secret `namespace/name`, if it exists.
pub fn secret_docker_config(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
) -> Option<serde_json::Value> {
    let secret = get(cp, namespace, "secret", name)?;
    let b64 = secret["data"][".dockerconfigjson"].as_str()?;
    let doc = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    Some(serde_json::from_slice(&doc).unwrap())
}

/// `user:password` for `registry` in a docker config document.
pub fn auth_for(doc: &serde_json::Value, registry: &str) -> Option<String> {
    let auth = doc["auths"][registry]["auth"].as_str()?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(auth)
        .unwrap();
    Some(String::from_utf8(raw).unwrap())
}

/// A docker config document with one entry, `registry` = `user:password`.
pub fn docker_config(registry: &str, user: &str, password: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    serde_json::json!({"auths": {registry: {"auth": auth}}}).to_string()
}
