//! The chart as users install it from a registry: `helm package deploy/chart/regbroker`,
//! `helm push` of the package to an OCI registry, then `helm install --dry-run=server` of
//! the `oci://` reference against a real API server. This is the chart half of the
//! release workflow (.github/workflows/release.yml), which cannot run here.
//!
//! Peers, none written here: the Helm CLI, etcd and kube-apiserver (built by
//! `scripts/peers.sh`, the control plane of tests/control_plane), and the distribution
//! registry (Debian `docker-registry`), anonymous on loopback and reached over plain HTTP
//! (`--plain-http`). Every helm run has a cleared environment with HOME and helm's
//! directories in the test's temporary directory, so nothing reads or writes the real
//! user's configuration, and no chart can come from a cache: helm must pull it.
//!
//! `#[ignore]`d with the peers it needs: plain `cargo test` lists it as ignored,
//! `scripts/test.sh` runs it, and a missing peer is then a failure naming it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod registry_peer;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::process::{PEER_CLIENT_BOUND, run_bounded};
use control_plane::ControlPlane;
use registry_peer::Registry;
use sha2::Digest as _;

/// The Helm chart's OCI layer media type (helm.sh/helm/v4/pkg/registry).
const CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/chart/regbroker")
}

/// A top-level `key: value` of deploy/chart/regbroker/Chart.yaml, unquoted.
fn chart_field(key: &str) -> String {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("Chart.yaml has no {key}"))
        .trim()
        .trim_matches('"')
        .to_string()
}

/// What one helm run did.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok: {}\n--- stdout\n{}--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

/// helm with a private HOME and helm directories under `dir`, nothing else from the
/// environment but PATH.
struct Helm {
    bin: PathBuf,
    home: PathBuf,
}

impl Helm {
    fn new(bin: &Path, dir: &Path) -> Helm {
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        Helm {
            bin: bin.to_path_buf(),
            home,
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        let home = &self.home;
        let out = run_bounded(
            Command::new(&self.bin)
                .args(args)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", home)
                .env("TMPDIR", std::env::temp_dir())
                .env("XDG_CONFIG_HOME", home.join(".config"))
                .env("XDG_CACHE_HOME", home.join(".cache"))
                .env("XDG_DATA_HOME", home.join(".local/share"))
                .env("HELM_CONFIG_HOME", home.join(".config/helm"))
                .env("HELM_CACHE_HOME", home.join(".cache/helm"))
                .env("HELM_DATA_HOME", home.join(".local/share/helm")),
            None,
            PEER_CLIENT_BOUND,
        );
        Run {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The `sha256:...` after `Digest:` in helm's output (push and pull print it).
fn printed_digest(run: &Run) -> Option<String> {
    format!("{}{}", run.stdout, run.stderr)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Digest: "))
        .map(|d| d.trim().to_string())
        .filter(|d| d.starts_with("sha256:") && d.len() == 71)
}

/// `GET /v2/NAME/manifests/REFERENCE` with the OCI manifest media type accepted: the
/// registry's `Docker-Content-Digest` header and the manifest.
fn registry_manifest(host: &str, name: &str, reference: &str) -> (String, serde_json::Value) {
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET /v2/{name}/manifests/{reference} HTTP/1.0\r\nHost: {host}\r\n\
         Accept: application/vnd.oci.image.manifest.v1+json\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"));
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    let digest = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("docker-content-digest")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Docker-Content-Digest: {head}"));
    (digest, serde_json::from_str(body).unwrap())
}

/// `(kind, metadata.name)` of every document in a rendered manifest (helm's output: each
/// document starts with `# Source:`, then `apiVersion`, `kind` and `metadata` at column 0).
fn objects(manifest: &str) -> Vec<(String, String)> {
    manifest
        .split("\n---\n")
        .filter_map(|doc| {
            let kind = doc.lines().find_map(|l| l.strip_prefix("kind: "))?;
            let meta = doc.split_once("\nmetadata:\n")?.1;
            let name = meta
                .lines()
                .take_while(|l| l.starts_with(' '))
                .find_map(|l| l.strip_prefix("  name: "))?;
            Some((kind.trim().to_string(), name.trim().to_string()))
        })
        .collect()
}

/// A new namespace on the API server, as the admin.
fn create_namespace(cp: &ControlPlane, prefix: &str) -> String {
    let name = format!("{prefix}-{}", std::process::id());
    let (ok, _, err) = cp.kubectl(&["create", "namespace", &name], "");
    assert!(ok, "{err}");
    name
}

#[test]
#[ignore = "needs helm, etcd, kube-apiserver and kubectl from scripts/peers.sh, docker-registry: run scripts/test.sh"]
fn chart_pushed_to_an_oci_registry_installs_from_there_with_a_server_side_dry_run() {
    let cp = ControlPlane::shared();
    let dir = tempfile::tempdir().unwrap();
    let helm = Helm::new(cp.peers.get("helm"), dir.path());
    let reg = Registry::start(true);
    let version = chart_field("version");
    let app_version = chart_field("appVersion");
    let kubeconfig = cp.admin_kubeconfig.to_str().unwrap();

    // helm package, as the release workflow runs it.
    let packaged = dir.path().join("package");
    let run = helm.run(&[
        "package",
        chart_dir().to_str().unwrap(),
        "-d",
        packaged.to_str().unwrap(),
    ]);
    assert!(run.ok, "helm package: {run}");
    let tgz = packaged.join(format!("regbroker-{version}.tgz"));
    let tgz_bytes = std::fs::read(&tgz).unwrap();

    // helm push: the registry now holds a chart manifest whose one chart layer is exactly
    // these bytes, under the digest helm printed.
    let run = helm.run(&[
        "push",
        tgz.to_str().unwrap(),
        &format!("oci://{}/charts", reg.host),
        "--plain-http",
    ]);
    assert!(run.ok, "helm push: {run}");
    let pushed =
        printed_digest(&run).unwrap_or_else(|| panic!("helm push printed no digest: {run}"));
    let (served, manifest) = registry_manifest(&reg.host, "charts/regbroker", &version);
    assert_eq!(
        served, pushed,
        "the registry serves another manifest than helm pushed"
    );
    let layers: Vec<&serde_json::Value> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["mediaType"] == CHART_LAYER)
        .collect();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(
        layers[0]["digest"],
        format!("sha256:{:x}", sha2::Sha256::digest(&tgz_bytes)).as_str(),
        "the chart layer is not the packaged .tgz"
    );

    // helm install --dry-run=server from the oci:// reference: helm pulls the chart (no
    // repository, no cache), renders it with the API server's version and API list, and
    // checks every object against the cluster.
    let ns = create_namespace(cp, "helm-oci");
    let reference = format!("oci://{}/charts/regbroker", reg.host);
    let install = |version: &str| {
        helm.run(&[
            "install",
            "regbroker",
            &reference,
            "--version",
            version,
            "--plain-http",
            "--dry-run=server",
            "--namespace",
            &ns,
            "--kubeconfig",
            kubeconfig,
        ])
    };
    let run = install(&version);
    assert!(run.ok, "helm install --dry-run=server: {run}");
    assert_eq!(
        printed_digest(&run).as_deref(),
        Some(pushed.as_str()),
        "helm installed another chart than the one pushed: {run}"
    );
    assert!(
        run.stdout.contains(&format!("NAMESPACE: {ns}\n"))
            && run.stdout.contains("STATUS: pending-install\n"),
        "{run}"
    );
    let rendered = run
        .stdout
        .split_once("\nMANIFEST:\n")
        .unwrap_or_else(|| panic!("no MANIFEST in the dry run's output: {run}"))
        .1;
    // The chart's NOTES.txt follows the objects.
    let rendered = rendered
        .split_once("\nNOTES:\n")
        .map_or(rendered, |(m, _)| m);
    let objects = objects(rendered);
    for want in [("Deployment", "regbroker"), ("ServiceAccount", "regbroker")] {
        assert!(
            objects
                .iter()
                .any(|(k, n)| (k.as_str(), n.as_str()) == want),
            "no {want:?} in {objects:?}"
        );
    }
    // Helm's server dry run checks ownership and names, not the objects' fields: the API
    // server judges those (strictly: an unknown field is refused, not dropped).
    let (ok, out, err) = cp.kubectl(
        &[
            "apply",
            "--dry-run=server",
            "--server-side",
            "--field-manager=helm-oci-install-test",
            "--namespace",
            &ns,
            "-f",
            "-",
        ],
        rendered,
    );
    assert!(
        ok,
        "the API server refused the installed chart's objects:\n{err}\n{out}"
    );
    assert_eq!(
        out.matches("(server dry run)").count(),
        objects.len(),
        "{out}"
    );
    // The chart's default image is the release's own, tagged with its appVersion.
    let images: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("image: "))
        .collect();
    assert_eq!(
        images,
        [format!(
            "image: \"ghcr.io/regbroker/regbroker:{app_version}\""
        )],
        "the Deployment's image"
    );

    // A version that was never pushed: helm finds no such tag and installs nothing.
    let run = install("9.9.9");
    assert!(!run.ok, "installing an unpushed version: {run}");
    assert!(
        run.stderr.contains("9.9.9") && run.stderr.contains("not found"),
        "{run}"
    );
    assert!(!run.stdout.contains("MANIFEST:"), "{run}");

    // The dry run really asks the API server: an object of the chart that already exists
    // and that Helm does not own makes it fail, as the real install would.
    let (ok, _, err) = cp.kubectl(&["-n", &ns, "create", "serviceaccount", "regbroker"], "");
    assert!(ok, "{err}");
    let run = install(&version);
    assert!(!run.ok, "dry run over a foreign ServiceAccount: {run}");
    assert!(
        run.stderr.contains("ServiceAccount") && run.stderr.contains("regbroker"),
        "{run}"
    );
}
