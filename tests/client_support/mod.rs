//! Real registry clients run the way a user runs them, each in a private HOME: skopeo
//! (Debian), crane (go-containerregistry, built by `scripts/peers.sh`), the Helm CLI
//! (built by `scripts/peers.sh`) and the oras Python client (PyPI `oras`, in the venv
//! `scripts/test.sh` puts first on PATH). A [`ClientHome`] holds a docker config, either
//! naming `regbroker` as the credential helper for some hosts (the helper, a symlink named
//! `docker-credential-regbroker` to the binary, first on PATH: the documented install) or
//! a document as it is (a synced Secret's `.dockerconfigjson`), and runs each client with
//! a cleared environment pointing at it.
//!
//! Shared by `tests/federated.rs`, `tests/federated_clients.rs` and
//! `tests/kube_federated.rs`: `mod common; mod control_plane; mod client_support;`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::common::process::{PEER_CLIENT_BOUND, run_bounded};
use crate::control_plane::Peers;

const BIN: &str = env!("CARGO_BIN_EXE_regbroker");

/// A client's private HOME, with its docker config and the helper on PATH.
pub struct ClientHome {
    dir: tempfile::TempDir,
    /// Holds `docker-credential-regbroker`.
    bin: PathBuf,
    /// `HOME/.docker/config.json`: what every client here reads.
    pub docker_config: PathBuf,
}

impl ClientHome {
    /// A HOME whose docker config names `regbroker` as the credential helper of `hosts`.
    pub fn cred_helpers(hosts: &[&str]) -> ClientHome {
        let helpers: serde_json::Map<String, serde_json::Value> = hosts
            .iter()
            .map(|h| (h.to_string(), "regbroker".into()))
            .collect();
        ClientHome::with_docker_config(
            serde_json::json!({"credHelpers": helpers})
                .to_string()
                .as_bytes(),
        )
    }

    /// A HOME whose docker config is `doc`, as it is.
    pub fn with_docker_config(doc: &[u8]) -> ClientHome {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(BIN, bin.join("docker-credential-regbroker")).unwrap();
        let docker = dir.path().join(".docker");
        std::fs::create_dir_all(&docker).unwrap();
        let docker_config = docker.join("config.json");
        std::fs::write(&docker_config, doc).unwrap();
        ClientHome {
            dir,
            bin,
            docker_config,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The helper as a client runs it.
    pub fn helper(&self) -> PathBuf {
        self.bin.join("docker-credential-regbroker")
    }

    /// Runs `program ARGS` with only HOME, TMPDIR, PATH (the helper first), the XDG,
    /// Helm and docker config directories in this HOME, and `env`; bounded.
    pub fn run(&self, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let home = self.path();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("HOME", home)
            .env("TMPDIR", std::env::temp_dir())
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("DOCKER_CONFIG", self.docker_config.parent().unwrap())
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("HELM_CONFIG_HOME", home.join(".config/helm"))
            .env("HELM_CACHE_HOME", home.join(".cache/helm"))
            .env("HELM_DATA_HOME", home.join(".local/share/helm"))
            .envs(env.iter().copied());
        // A client may call back into a stand-in served by this test's runtime: leave
        // it a worker while this one waits.
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| run_bounded(&mut cmd, None, PEER_CLIENT_BOUND))
            }
            _ => run_bounded(&mut cmd, None, PEER_CLIENT_BOUND),
        }
    }

    /// `skopeo copy` of `docker://IMAGE` (plain HTTP) into a new OCI layout; the output
    /// and that layout's directory.
    pub fn skopeo_pull(&self, image: &str, env: &[(&str, &str)]) -> (Output, PathBuf) {
        let out = self.fresh("skopeo-pulled");
        let run = self.run(
            &skopeo(),
            &[
                "--insecure-policy",
                "copy",
                "--authfile",
                self.docker_config.to_str().unwrap(),
                "--src-tls-verify=false",
                &format!("docker://{image}"),
                &format!("oci:{}:v1", out.display()),
            ],
            env,
        );
        (run, out)
    }

    /// `skopeo copy` of the OCI layout `layout` (tag `v1`) to `docker://IMAGE`.
    pub fn skopeo_push(&self, layout: &Path, image: &str, env: &[(&str, &str)]) -> Output {
        self.run(
            &skopeo(),
            &[
                "--insecure-policy",
                "copy",
                "--authfile",
                self.docker_config.to_str().unwrap(),
                "--dest-tls-verify=false",
                &format!("oci:{}:v1", layout.display()),
                &format!("docker://{image}"),
            ],
            env,
        )
    }

    /// `crane ARGS --insecure` (plain HTTP), reading this HOME's docker config.
    pub fn crane(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut all = args.to_vec();
        all.push("--insecure");
        self.run(peers().get("crane"), &all, env)
    }

    /// `crane pull --format oci IMAGE` into a new OCI layout; the output and that layout.
    pub fn crane_pull(&self, image: &str, env: &[(&str, &str)]) -> (Output, PathBuf) {
        let out = self.fresh("crane-pulled");
        let run = self.crane(
            &["pull", "--format", "oci", image, out.to_str().unwrap()],
            env,
        );
        (run, out)
    }

    /// `helm ARGS`, reading this HOME's docker config as its registry config.
    pub fn helm(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--registry-config", self.docker_config.to_str().unwrap()]);
        self.run(peers().get("helm"), &all, env)
    }

    /// `helm package` of this repository's chart (deploy/chart/regbroker); the `.tgz`.
    pub fn helm_package(&self) -> PathBuf {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/chart/regbroker");
        let dest = self.fresh_dir("package");
        let run = self.run(
            peers().get("helm"),
            &[
                "package",
                chart.to_str().unwrap(),
                "-d",
                dest.to_str().unwrap(),
            ],
            &[],
        );
        ok("helm package", &run);
        std::fs::read_dir(&dest)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "tgz"))
            .expect("helm package made no .tgz")
    }

    /// `helm pull oci://HOST/REPO/NAME --version V --plain-http` into a new directory;
    /// the output and the pulled `.tgz` (`NAME-V.tgz`).
    pub fn helm_pull(&self, chart: &str, version: &str, env: &[(&str, &str)]) -> (Output, PathBuf) {
        let out = self.fresh_dir("helm-pulled");
        let run = self.helm(
            &[
                "pull",
                &format!("oci://{chart}"),
                "--version",
                version,
                "--plain-http",
                "-d",
                out.to_str().unwrap(),
            ],
            env,
        );
        let name = chart.rsplit('/').next().unwrap();
        (run, out.join(format!("{name}-{version}.tgz")))
    }

    /// The oras Python client: with `push`, pushes the file `push` to `REFERENCE` first;
    /// then pulls `REFERENCE` (plain HTTP) and returns the output, whose stdout is the
    /// first pulled file's text. It reads this HOME's docker config (`credHelpers` run the
    /// helper). oras retries a 401 for minutes: a test asks the registry itself whether it
    /// wants credentials instead of letting oras find out.
    pub fn oras(&self, reference: &str, push: Option<&Path>, env: &[(&str, &str)]) -> Output {
        let script = r#"
import os, sys
import oras.client
reference, config, push, out = sys.argv[1:5]
host = reference.split("/")[0]
client = oras.client.OrasClient(hostname=host, insecure=True, auth_backend="basic")
if push:
    os.chdir(os.path.dirname(push))
    res = client.push(target=reference, files=[os.path.basename(push)], config_path=config)
    assert res.status_code in (200, 201), res.status_code
files = client.pull(target=reference, outdir=out, config_path=config)
print(open(files[0]).read())
"#;
        let out = self.fresh_dir("oras-pulled");
        self.run(
            &crate::registry_peer::python_with_oras(),
            &[
                "-c",
                script,
                reference,
                self.docker_config.to_str().unwrap(),
                push.map_or("", |p| p.to_str().unwrap()),
                out.to_str().unwrap(),
            ],
            env,
        )
    }

    /// A path in this HOME named after `what` that did not exist yet.
    fn fresh(&self, what: &str) -> PathBuf {
        (0..)
            .map(|n| self.path().join(format!("{what}-{n}")))
            .find(|p| !p.exists())
            .unwrap()
    }

    /// [`ClientHome::fresh`], created as an empty directory (helm wants its `-d` to exist).
    fn fresh_dir(&self, what: &str) -> PathBuf {
        let p = self.fresh(what);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

/// Asserts `out` succeeded, showing its output when not.
pub fn ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The test peers of `scripts/peers.sh`, read once per test binary.
pub fn peers() -> &'static Peers {
    static PEERS: OnceLock<Peers> = OnceLock::new();
    PEERS.get_or_init(Peers::find)
}

fn skopeo() -> PathBuf {
    crate::registry_peer::peer("skopeo", "apt-get install skopeo")
}
