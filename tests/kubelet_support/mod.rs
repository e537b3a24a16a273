//! A kubelet's image credential providers as the kubelet runs them, for the tests of
//! kubelet mode (`kubelet_plugin.rs`, `kubelet_plugin_federated.rs`): a
//! `CredentialProviderConfig` (a shipped one, edited only by asserted replacements), a
//! plugin bin dir of symlinks to this build's `regbroker` under the config's names, and
//! `kubelet-credential-harness` (built by `scripts/peers.sh` from the kubelet's own
//! plugin package) run over it, with what it reports; and the pods and ServiceAccounts
//! the lookups are for, on the real API server of `control_plane`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use serde_json::Value;

use crate::common::process::{PEER_CLIENT_BOUND, run_bounded};
use crate::control_plane::{ControlPlane, Peers};

pub const BIN: &str = env!("CARGO_BIN_EXE_regbroker");
/// The cache directory the shipped cloud configs name.
pub const SHIPPED_CACHE: &str = "/var/lib/kubelet/regbroker-cache";

/// A kubelet's credential-provider set-up: its config file, its plugin bin dir, the
/// environment it runs with (which plugins inherit) and its API server.
pub struct Kubelet {
    pub dir: tempfile::TempDir,
    pub config: String,
    env: Vec<(String, String)>,
    kubeconfig: Option<PathBuf>,
}

impl Kubelet {
    /// The config shipped at `path` (relative to the repository), its cache directory
    /// moved into a temporary one (`dir/cache`).
    pub fn shipped(path: &str) -> Kubelet {
        let k = Kubelet::shipped_as_is(path);
        let cache = k.cache_dir();
        k.replace(SHIPPED_CACHE, &cache.display().to_string())
    }

    /// The config shipped at `path`, unchanged: a test edits it with [`Kubelet::replace`].
    pub fn shipped_as_is(path: &str) -> Kubelet {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        Kubelet {
            dir,
            config: text,
            env: Vec::new(),
            kubeconfig: None,
        }
    }

    /// A private (0700) directory of this set-up's, for a `REGBROKER_CACHE_DIR`.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// Replaces every `from` in the config with `to`; panics when there is none, so a test
    /// never silently runs a config it did not mean to.
    pub fn replace(mut self, from: &str, to: &str) -> Kubelet {
        assert!(self.config.contains(from), "no `{from}` in the config");
        self.config = self.config.replace(from, to);
        self
    }

    /// Appends a provider entry: YAML of one `providers` item, starting `- name: NAME`
    /// and indented as in the shipped files (two spaces).
    pub fn with_provider(mut self, entry: &str) -> Kubelet {
        self.config.push_str(entry);
        self
    }

    /// Writes `text` to a file named `name` in the set-up's directory (a regbroker config
    /// for a provider entry's `REGBROKER_CONFIG`, say); returns its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Sets `name=value` in the kubelet's environment.
    pub fn env(mut self, name: &str, value: &str) -> Kubelet {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The kubelet talks to `cp` (as its admin).
    pub fn api_server(mut self, cp: &ControlPlane) -> Kubelet {
        self.kubeconfig = Some(cp.admin_kubeconfig.clone());
        self
    }

    /// The provider names of the config (`  - name: X` lines).
    pub fn provider_names(&self) -> Vec<String> {
        self.config
            .lines()
            .filter_map(|l| l.strip_prefix("  - name: "))
            .map(|n| n.trim().to_string())
            .collect()
    }

    /// Runs the harness for `lookups` (`IMAGE` or `NAMESPACE/POD=IMAGE`) in one process,
    /// so the kubelet's cache carries from one to the next.
    pub async fn run(&self, lookups: &[String]) -> Harness {
        let config = self.file("credential-provider-config.yaml", &self.config);
        let bin_dir = self.dir.path().join("bin");
        if !bin_dir.exists() {
            std::fs::create_dir(&bin_dir).unwrap();
        }
        for name in self.provider_names() {
            let link = bin_dir.join(&name);
            if !link.exists() {
                std::os::unix::fs::symlink(BIN, &link).unwrap();
            }
        }
        let harness = Peers::find()
            .get("kubelet-credential-harness")
            .to_path_buf();
        let mut cmd = Command::new(harness);
        cmd.arg(format!("--config={}", config.display()))
            .arg(format!("--bin-dir={}", bin_dir.display()))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(k) = &self.kubeconfig {
            cmd.arg(format!("--kubeconfig={}", k.display()));
        }
        cmd.args(lookups);
        let out =
            tokio::task::spawn_blocking(move || run_bounded(&mut cmd, None, PEER_CLIENT_BOUND))
                .await
                .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let report = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("harness printed no JSON ({e}): {stdout}\n{stderr}"));
        Harness {
            ok: out.status.success(),
            report,
            stderr,
        }
    }
}

/// What the harness reported.
pub struct Harness {
    pub ok: bool,
    pub report: Value,
    pub stderr: String,
}

impl Harness {
    /// Lookup `i`, after checking the kubelet started.
    pub fn lookup(&self, i: usize) -> &Value {
        assert!(self.ok, "the kubelet refused its config: {}", self.report);
        &self.report["lookups"][i]
    }

    /// The passwords lookup `i` found, in the kubelet's order.
    pub fn passwords(&self, i: usize) -> Vec<String> {
        self.credentials(i).into_iter().map(|c| c.1).collect()
    }

    /// (username, password, ServiceAccount "ns/name" the kubelet tracks it to) of lookup `i`.
    pub fn credentials(&self, i: usize) -> Vec<(String, String, String)> {
        self.lookup(i)["credentials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let sa = &c["serviceAccount"];
                (
                    c["username"].as_str().unwrap().to_string(),
                    c["password"].as_str().unwrap().to_string(),
                    format!(
                        "{}/{}",
                        sa["Namespace"].as_str().unwrap_or(""),
                        sa["Name"].as_str().unwrap_or("")
                    ),
                )
            })
            .collect()
    }

    /// The errors the kubelet logged during lookup `i`.
    pub fn errors(&self, i: usize) -> String {
        self.lookup(i)["errors"].to_string()
    }
}

/// `ns/pod=image`, a lookup for `pod`.
pub fn for_pod(ns: &str, pod: &str, image: &str) -> String {
    format!("{ns}/{pod}={image}")
}

/// Creates ServiceAccount `ns/puller` with `annotations` and a pod `pod` running as it
/// (the kubelet binds its token to the pod, so the pod must exist); returns the
/// ServiceAccount's UID.
pub async fn workload(
    cp: &ControlPlane,
    ns: &str,
    pod: &str,
    annotations: &[(&str, &str)],
) -> String {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("puller".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    let sa = Api::<ServiceAccount>::namespaced(cp.admin(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    pod_of(cp, ns, pod, "puller").await;
    sa.metadata.uid.unwrap()
}

/// Creates pod `ns/pod` running as ServiceAccount `service_account` (which must exist
/// for the kubelet to get a token bound to the pod).
pub async fn pod_of(cp: &ControlPlane, ns: &str, pod: &str, service_account: &str) {
    let p = Pod {
        metadata: ObjectMeta {
            name: Some(pod.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            service_account_name: Some(service_account.into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.invalid/app:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Pod>::namespaced(cp.admin(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
}

/// What the kubelet handed regbroker must never show: no part of `token` in the
/// harness's stderr (the kubelet's log and the plugins' error output).
pub fn assert_token_unlogged(run: &Harness, token: &str) {
    for part in token.split('.').filter(|p| p.len() > 8) {
        assert!(
            !run.stderr.contains(part),
            "token in the log: {}",
            run.stderr
        );
    }
}
