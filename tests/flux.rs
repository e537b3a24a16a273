//! Flux pulls a Helm chart with the Secret `regbroker serve --sync-secret` keeps fresh,
//! from a registry whose password is a cloud access token, across a token rotation.
//!
//! Peers, none written here: kube-apiserver + etcd (tests/control_plane), Flux's
//! source-controller v1.9.6 and its CRDs and the Helm CLI (all built by scripts/peers.sh),
//! the distribution registry with htpasswd auth (tests/registry_peer), and gcplocal's GCE
//! metadata emulator (PyPI; tests/flux_support explains the one view it overrides so its
//! token can rotate). The chain:
//!
//! gcplocal hands out an access token; `regbroker serve` (gcp provider, routed there by a
//! config rule, acting as the ServiceAccount `deploy/standalone/rbac.yaml` grants) writes
//! it as `oauth2accesstoken:<token>` into the Secret `regbroker-pull`; the registry's
//! htpasswd accepts exactly that; source-controller reads the Secret through the
//! `secretRef` of an OCI `HelmRepository` (for its `HelmChart`) and of an `OCIRepository`,
//! and stores the chart as their artifact.
//!
//! Every wait is bounded and prints the object's status and source-controller's log when
//! it runs out; every process is on loopback and ends with the test binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;
mod flux_support;
mod registry_peer;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::ServeProcess;
use control_plane::ControlPlane;
use flux_support::{
    GCP_USER, GCPLOCAL_TOKEN, Helm, Metadata, SourceController, WAIT, auth_for, docker_config, get,
    handled, observed, ready_status, ready_with_artifact, request_reconcile, secret_docker_config,
    wait_for,
};
use registry_peer::Registry;
use sha2::{Digest, Sha256};

const SECRET: &str = "regbroker-pull";
/// The chart this repository ships, and its version (deploy/chart/regbroker/Chart.yaml).
const CHART_VERSION: &str = "0.1.0";
/// The kinds under test, as kubectl names them.
const HELM_CHART: &str = "helmchart.source.toolkit.fluxcd.io";
const OCI_REPOSITORY: &str = "ocirepository.source.toolkit.fluxcd.io";
const HELM_REPOSITORY: &str = "helmrepository.source.toolkit.fluxcd.io";

/// Everything one test runs against.
struct Stack {
    cp: &'static ControlPlane,
    sc: &'static SourceController,
    metadata: Metadata,
    registry: Registry,
    /// Where the Secret and the Flux objects live.
    apps: String,
    regbroker: ServeProcess,
    /// The chart as pushed.
    tgz: PathBuf,
    _dir: tempfile::TempDir,
    helm: Helm,
}

/// deploy/standalone/rbac.yaml with its namespaces renamed to fresh ones, as
/// tests/kube_secret_sync.rs applies it; returns (apps, regbroker).
async fn deployed_rbac(cp: &ControlPlane) -> (String, String) {
    let apps = cp.namespace("flux-apps").await;
    let regbroker = cp.namespace("regbroker").await;
    let yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/standalone/rbac.yaml"),
    )
    .unwrap();
    assert!(yaml.contains("namespace: apps") && yaml.contains("namespace: regbroker"));
    assert!(yaml.contains(&format!("resourceNames: [\"{SECRET}\"]")));
    cp.apply(
        &yaml
            .replace("namespace: apps", &format!("namespace: {apps}"))
            .replace("namespace: regbroker", &format!("namespace: {regbroker}")),
    );
    (apps, regbroker)
}

/// regbroker's config: the loopback registry is a GCP registry, and cached tokens are
/// refreshed every 5 s (gcplocal's live an hour), so a rotation reaches the Secret in
/// test time.
fn regbroker_config(dir: &Path, registry: &str) -> PathBuf {
    let path = dir.join("regbroker.toml");
    std::fs::write(
        &path,
        format!(
            "[cache]\nmin_refresh = \"1s\"\nmax_refresh = \"5s\"\n\n\
             [[rule]]\nmatch = \"{registry}\"\nsource = \"gcp\"\n"
        ),
    )
    .unwrap();
    path
}

/// Waits until Secret `namespace/regbroker-pull` gives `registry` the password `token`;
/// returns the Secret's docker config document.
fn wait_for_secret_token(
    cp: &ControlPlane,
    regbroker: &ServeProcess,
    namespace: &str,
    registry: &str,
    token: &str,
) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    let want = format!("{GCP_USER}:{token}");
    loop {
        let doc = secret_docker_config(cp, namespace, SECRET);
        if let Some(doc) = &doc
            && auth_for(doc, registry).as_deref() == Some(want.as_str())
        {
            return doc.clone();
        }
        if Instant::now() > deadline {
            let log: Vec<String> = regbroker.log.try_iter().collect();
            panic!(
                "Secret {namespace}/{SECRET} does not hold the token {token} for {registry} \
                 after {} s; it holds {:?}; regbroker's log:\n{}",
                WAIT.as_secs(),
                doc.as_ref().and_then(|d| auth_for(d, registry)),
                log.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Which chart versions the Flux objects ask for.
#[derive(Clone, Copy)]
enum Wanted {
    /// Exactly [`CHART_VERSION`] (the HelmChart's `version`, the OCIRepository's
    /// `ref.tag`).
    Exact,
    /// The newest `0.1.x` (`version: 0.1.x`, `ref.semver: 0.1.x`): Flux then lists the
    /// repository's tags at every reconcile.
    Newest,
}

/// An OCI `HelmRepository` and a `HelmChart` from it, and an `OCIRepository` of the same
/// chart, all named `regbroker`, all authenticating with Secret `regbroker-pull`.
fn flux_objects(namespace: &str, registry: &str, wanted: Wanted) -> String {
    let (version, oci_ref) = match wanted {
        Wanted::Exact => (
            CHART_VERSION.to_string(),
            format!("tag: \"{CHART_VERSION}\""),
        ),
        Wanted::Newest => ("0.1.x".to_string(), "semver: \"0.1.x\"".to_string()),
    };
    format!(
        r#"apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata:
  name: regbroker
  namespace: {namespace}
spec:
  type: oci
  url: oci://{registry}/charts
  insecure: true
  interval: 5s
  provider: generic
  secretRef:
    name: {SECRET}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmChart
metadata:
  name: regbroker
  namespace: {namespace}
spec:
  chart: regbroker
  version: "{version}"
  interval: 5s
  sourceRef:
    kind: HelmRepository
    name: regbroker
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: OCIRepository
metadata:
  name: regbroker
  namespace: {namespace}
spec:
  url: oci://{registry}/charts/regbroker
  ref:
    {oci_ref}
  insecure: true
  interval: 5s
  provider: generic
  secretRef:
    name: {SECRET}
  # The chart layer as it is (the default would unpack it).
  layerSelector:
    mediaType: application/vnd.cncf.helm.chart.content.v1.tar+gzip
    operation: copy
"#
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The artifact source-controller serves at the object's `status.artifact.url`.
async fn artifact_bytes(obj: &serde_json::Value) -> Vec<u8> {
    let url = obj["status"]["artifact"]["url"].as_str().unwrap();
    let res = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(res.status().as_u16(), 200, "GET {url}");
    res.bytes().await.unwrap().to_vec()
}

/// Starts the chain up to the Flux objects in `apps`, with the chart pushed.
async fn stack(wanted: Wanted) -> Stack {
    let cp = ControlPlane::shared();
    let sc = SourceController::shared(cp);
    let metadata = Metadata::start();
    let registry = Registry::start_with(Some((GCP_USER, GCPLOCAL_TOKEN)));
    let (apps, regbroker_ns) = deployed_rbac(cp).await;
    let kubeconfig = cp
        .service_account_kubeconfig(&regbroker_ns, "regbroker")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let config = regbroker_config(dir.path(), &registry.host);
    let regbroker = ServeProcess::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--sync-secret",
            &format!("{apps}/{SECRET}"),
            "--sink-registry",
            &registry.host,
        ],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("GCE_METADATA_HOST", &metadata.addr),
        ],
    );
    let doc = wait_for_secret_token(cp, &regbroker, &apps, &registry.host, GCPLOCAL_TOKEN);

    // The chart goes in with the very document regbroker wrote into the Secret.
    let mut helm = Helm::new(cp);
    let tgz = helm.package_chart(CHART_VERSION);
    helm.push(&tgz, &registry.host, "charts", &doc.to_string());
    cp.apply(&flux_objects(&apps, &registry.host, wanted));
    Stack {
        cp,
        sc,
        metadata,
        registry,
        apps,
        regbroker,
        tgz,
        _dir: dir,
        helm,
    }
}

/// Waits until `kind` (the HelmChart or the OCIRepository) in `namespace` is Ready with
/// chart `version` (the file `tgz`) as its artifact, and `also` holds; returns it. The
/// artifact's digest and the bytes source-controller serves are the pushed chart's.
async fn wait_for_the_chart(
    s: &Stack,
    namespace: &str,
    kind: &str,
    tgz: &Path,
    version: &str,
    what: &str,
    also: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let pushed = std::fs::read(tgz).unwrap();
    let digest = format!("sha256:{}", hex(&Sha256::digest(&pushed)));
    let obj = wait_for(s.cp, s.sc, namespace, kind, "regbroker", what, |o| {
        ready_with_artifact(o) && revision_is(o, version) && also(o)
    });
    let artifact = &obj["status"]["artifact"];
    assert_eq!(
        artifact["digest"],
        digest.as_str(),
        "the pushed chart: {artifact}"
    );
    assert!(
        artifact_bytes(&obj).await == pushed,
        "{kind}'s artifact is not the pushed chart"
    );
    obj
}

/// The artifact is chart `version`: the HelmChart's revision is the chart version, the
/// OCIRepository's is `TAG@sha256:MANIFEST`.
fn revision_is(obj: &serde_json::Value, version: &str) -> bool {
    let revision = obj["status"]["artifact"]["revision"].as_str().unwrap_or("");
    revision == version || revision.starts_with(&format!("{version}@sha256:"))
}

/// Flux gets the chart through the Secret regbroker keeps, both ways Flux pulls charts
/// from OCI: an OCI `HelmRepository` with a `HelmChart`, and an `OCIRepository`.
#[tokio::test]
#[ignore = "needs etcd, kube-apiserver, kubectl, source-controller, helm from scripts/peers.sh, gcplocal, docker-registry and htpasswd: run scripts/test.sh"]
async fn flux_helm_chart_and_oci_repository_are_ready_through_the_regbroker_secret() {
    let started = Instant::now();
    let s = stack(Wanted::Exact).await;
    for kind in [HELM_CHART, OCI_REPOSITORY] {
        let obj = wait_for_the_chart(
            &s,
            &s.apps,
            kind,
            &s.tgz,
            CHART_VERSION,
            "Ready with the chart",
            |_| true,
        )
        .await;
        let ready = flux_support::condition(&obj, "Ready").unwrap();
        eprintln!("flux: {kind}: {} {}", ready["reason"], ready["message"]);
    }

    // An OCI HelmRepository is a static object: accepted, never reconciled into a status
    // of its own; the HelmChart above is what used its URL and Secret.
    let repo = get(s.cp, &s.apps, HELM_REPOSITORY, "regbroker").unwrap();
    assert_eq!(repo["spec"]["type"], "oci");
    assert_eq!(repo["spec"]["secretRef"]["name"], SECRET);

    // The Secret is regbroker's: created with its label, of the type Flux reads.
    let secret = get(s.cp, &s.apps, "secret", SECRET).unwrap();
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    assert_eq!(
        secret["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "regbroker"
    );
    eprintln!(
        "flux: ready with the chart in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The cloud token rotates and the registry accepts only the new one: regbroker refreshes
/// the Secret in place, and Flux's next reconcile finds the chart version pushed after the
/// rotation, with nothing restarted. The same objects reading a Secret that holds the old
/// token (written here, not by regbroker) now fail to authenticate: regbroker is what
/// keeps Flux working.
///
/// The objects ask for the newest 0.1.x, so every reconcile lists the repository's tags
/// with the Secret's credentials. (A HelmChart pinned to one version whose artifact is
/// already in storage does not contact the registry again: with the old token it stays
/// Ready, so it would prove nothing.)
#[tokio::test]
#[ignore = "needs etcd, kube-apiserver, kubectl, source-controller, helm from scripts/peers.sh, gcplocal, docker-registry and htpasswd: run scripts/test.sh"]
async fn flux_keeps_pulling_after_the_cloud_token_rotates_and_a_hand_written_secret_does_not() {
    let started = Instant::now();
    let mut s = stack(Wanted::Newest).await;
    let cp = s.cp;
    // The negative control: the same objects, with a Secret of the same name holding the
    // same (current) token, written by hand.
    let stale = cp.namespace("flux-stale").await;
    cp.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {SECRET}\n  namespace: {stale}\n\
         type: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{}'\n",
        docker_config(&s.registry.host, GCP_USER, GCPLOCAL_TOKEN)
    ));
    cp.apply(&flux_objects(&stale, &s.registry.host, Wanted::Newest));
    for ns in [&s.apps, &stale] {
        for kind in [HELM_CHART, OCI_REPOSITORY] {
            let what = "Ready with the chart before the rotation";
            wait_for_the_chart(&s, ns, kind, &s.tgz, CHART_VERSION, what, |_| true).await;
        }
    }
    let secret_before = get(cp, &s.apps, "secret", SECRET).unwrap();

    // Rotate: the metadata server hands out a new token, the registry takes only that.
    let rotated_at = Instant::now();
    let token = format!(
        "ya29.rotated-{}",
        (0..24)
            .map(|_| fastrand::alphanumeric())
            .collect::<String>()
    );
    s.metadata.rotate(&token);
    s.registry.set_password(GCP_USER, &token);

    // regbroker notices at its next refresh and rewrites its Secret in place.
    let doc = wait_for_secret_token(cp, &s.regbroker, &s.apps, &s.registry.host, &token);
    let refreshed_in = rotated_at.elapsed();
    let secret_after = get(cp, &s.apps, "secret", SECRET).unwrap();
    assert_eq!(
        secret_after["metadata"]["uid"], secret_before["metadata"]["uid"],
        "updated in place"
    );
    let stale_doc = secret_docker_config(cp, &stale, SECRET).unwrap();
    assert_eq!(
        auth_for(&stale_doc, &s.registry.host).unwrap(),
        format!("{GCP_USER}:{GCPLOCAL_TOKEN}"),
        "regbroker never touches the hand-written Secret"
    );

    // A new chart version, pushed with the refreshed Secret's document (the old token
    // no longer works for anyone).
    let newer = "0.1.1";
    let tgz = s.helm.package_chart(newer);
    s.helm
        .push(&tgz, &s.registry.host, "charts", &doc.to_string());

    // Flux's next reconcile of each object, asked for now (any new value asks).
    let at = format!(
        "rotation-{}",
        (0..12)
            .map(|_| fastrand::alphanumeric())
            .collect::<String>()
    );
    for ns in [&s.apps, &stale] {
        for kind in [HELM_CHART, OCI_REPOSITORY] {
            request_reconcile(cp, ns, kind, "regbroker", &at);
        }
    }
    for kind in [HELM_CHART, OCI_REPOSITORY] {
        let what = "reconciled to the new chart with the new token";
        wait_for_the_chart(&s, &s.apps, kind, &tgz, newer, what, |o| handled(o, &at)).await;
        let failed = wait_for(
            cp,
            s.sc,
            &stale,
            kind,
            "regbroker",
            "failing with the old token",
            |o| handled(o, &at) && observed(o) && ready_status(o) == "False",
        );
        let ready = flux_support::condition(&failed, "Ready").unwrap();
        let message = ready["message"].as_str().unwrap_or("").to_lowercase();
        assert!(
            ["401", "unauthorized", "authentication"]
                .iter()
                .any(|w| message.contains(w)),
            "{kind} with the old token fails, but not to authenticate: {ready}"
        );
        assert!(
            revision_is(&failed, CHART_VERSION),
            "{kind} with the old token keeps its old artifact: {}",
            failed["status"]
        );
        eprintln!(
            "flux: {kind} with the old token: {} {}",
            ready["reason"], ready["message"]
        );
    }

    // Nothing was restarted: the same source-controller and regbroker (the registry and
    // the metadata server were never stopped either).
    assert!(s.sc.running(), "source-controller exited");
    assert!(
        s.regbroker.child.try_wait().unwrap().is_none(),
        "regbroker exited"
    );
    eprintln!(
        "flux: Secret refreshed {:.1} s after the rotation; whole test {:.1} s",
        refreshed_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
