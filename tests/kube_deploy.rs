//! Everything `deploy/` ships is accepted by a real kube-apiserver (tests/control_plane)
//! with a server-side dry run, Flux's and the Prometheus Operator's CRDs installed: every
//! kustomize output (`kubectl kustomize`) and every rendering of the Helm chart (`helm
//! template` with its defaults, each `ci/` values file, the sidecar shape, and the
//! monitoring objects in both shapes). The API server applies its own validation,
//! defaulting and admission, which no offline schema check reproduces.
//! The per-cloud guides' Kubernetes documents (`deploy/clouds/`: the Flux sources and the
//! ServiceAccounts), rendered for each shape as the guides' heredocs render them, get the
//! same dry run; deploy/check_clouds.py checks what they name against the manifests.
//!
//! Needs kube-apiserver, etcd, kubectl, helm, the source-controller CRDs and the
//! Prometheus Operator's CRDs from scripts/peers.sh: ignored by plain `cargo test`, run by
//! scripts/test.sh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod control_plane;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::process::{CLI_BOUND, run_bounded};
use control_plane::ControlPlane;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn run(program: &Path, args: &[&str]) -> String {
    let out = run_bounded(Command::new(program).args(args), None, CLI_BOUND);
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Server-side dry run of `yaml` as the admin; panics with the API server's answer. A
/// dry run creates no namespace, so the namespaces `yaml` names are created for real.
fn dry_run(cp: &ControlPlane, what: &str, yaml: &str) -> usize {
    let namespaces: std::collections::BTreeSet<&str> = yaml
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("namespace: "))
        .map(|n| n.trim().trim_matches('"'))
        .collect();
    for ns in namespaces {
        let (ok, _, err) = cp.kubectl(&["create", "namespace", ns], "");
        assert!(ok || err.contains("AlreadyExists"), "{err}");
    }
    let (ok, out, err) = cp.kubectl(
        &[
            "apply",
            "--dry-run=server",
            "--server-side",
            "--field-manager=regbroker-test",
            "-f",
            "-",
        ],
        yaml,
    );
    assert!(ok, "{what}: the API server refused it:\n{err}\n{out}");
    let accepted = out
        .lines()
        .filter(|l| l.contains("(server dry run)"))
        .count();
    assert!(accepted > 0, "{what}: nothing applied:\n{out}");
    accepted
}

/// Flux's CRDs, from the source-controller module scripts/peers.sh built, installed and
/// established (server-side apply: every test of this binary may call it).
fn install_flux_crds(cp: &ControlPlane) {
    let crds = cp.peers.get("source-controller-crds").to_path_buf();
    let (ok, _, err) = cp.kubectl(
        &[
            "apply",
            "--server-side",
            "-f",
            crds.to_str().unwrap(),
            "--selector=",
        ],
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

/// The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs, from the
/// directory scripts/peers.sh extracted them to, installed and established.
fn install_prometheus_operator_crds(cp: &ControlPlane) {
    let crds = cp.peers.get("prometheus-operator-crds").to_path_buf();
    let (ok, _, err) = cp.kubectl(
        &["apply", "--server-side", "-f", crds.to_str().unwrap()],
        "",
    );
    assert!(ok, "installing the Prometheus Operator's CRDs: {err}");
    let (ok, _, err) = cp.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
        "",
    );
    assert!(ok, "the Prometheus Operator's CRDs not established: {err}");
}

/// What `helm template` needs to render the chart's ServiceMonitor and PrometheusRule: the
/// kinds a cluster with the Prometheus Operator's CRDs serves (`helm template` knows none).
const MONITORING_APIS: [&str; 4] = [
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PrometheusRule",
];

/// The chart's monitoring objects, all on.
const MONITORING_ON: [&str; 6] = [
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "grafanaDashboard.enabled=true",
];

/// How many documents of `yaml` are of kind `kind`.
fn count_kind(yaml: &str, kind: &str) -> usize {
    yaml.lines()
        .filter(|l| *l == format!("kind: {kind}"))
        .count()
}

/// One `helm template` of the chart: what it is, its arguments, and whether its
/// ServiceMonitor and PrometheusRule must be there (`None`: whatever the values say).
struct Rendering {
    what: String,
    args: Vec<String>,
    monitoring: Option<bool>,
}

impl Rendering {
    fn new(what: &str, args: &[&[&str]], monitoring: Option<bool>) -> Rendering {
        Rendering {
            what: what.into(),
            args: args.concat().iter().map(|a| a.to_string()).collect(),
            monitoring,
        }
    }
}

#[test]
#[ignore = "needs etcd, kube-apiserver, kubectl, helm, Flux's and the Prometheus Operator's CRDs from scripts/peers.sh; run scripts/test.sh"]
fn every_manifest_and_chart_rendering_passes_a_server_side_dry_run() {
    let cp = ControlPlane::shared();
    install_flux_crds(cp);
    install_prometheus_operator_crds(cp);
    // deploy/standalone's consumer namespace, which its README says must exist.
    let (ok, _, err) = cp.kubectl(&["create", "namespace", "apps"], "");
    assert!(ok || err.contains("AlreadyExists"), "{err}");

    let kubectl = cp.peers.get("kubectl").to_path_buf();
    let mut accepted = 0;

    // The dry run is strict: an unknown field (a typo in a manifest) is refused, not
    // dropped, so an accepted object really is what the API server understands.
    let runner = std::fs::read_to_string(deploy().join("e2e/runner.yaml")).unwrap();
    let typo = runner.replacen("serviceAccountName:", "serviceAcountName:", 1);
    assert_ne!(typo, runner, "runner.yaml names a serviceAccountName");
    let (ok, _, err) = cp.kubectl(
        &["apply", "--dry-run=server", "--server-side", "-f", "-"],
        &typo,
    );
    assert!(
        !ok && err.contains("serviceAcountName"),
        "an unknown field must be refused: {err}"
    );

    // The standalone kustomization, as users apply it.
    let standalone = run(
        &kubectl,
        &["kustomize", deploy().join("standalone").to_str().unwrap()],
    );
    accepted += dry_run(cp, "deploy/standalone", &standalone);

    // The Flux sidecar kustomization, with the trimmed source-controller stand-in in
    // place of Flux's own gotk-components.yaml (which a user's bootstrap provides).
    let flux = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(deploy().join("flux")).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, flux.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(
        deploy().join("flux/testdata/source-controller.yaml"),
        flux.path().join("gotk-components.yaml"),
    )
    .unwrap();
    std::fs::write(flux.path().join("gotk-sync.yaml"), "").unwrap();
    let flux_out = run(&kubectl, &["kustomize", flux.path().to_str().unwrap()]);
    assert!(flux_out.contains("kind: HelmRepository"), "{flux_out}");
    accepted += dry_run(cp, "deploy/flux", &flux_out);

    // The e2e runner pod.
    accepted += dry_run(cp, "deploy/e2e/runner.yaml", &runner);

    // The Helm chart: defaults, the sidecar shape, every ci/ values file, and the
    // monitoring objects in both shapes, for a cluster serving the Prometheus Operator's
    // kinds (as this one does) and for one that does not.
    let helm = cp.peers.get("helm").to_path_buf();
    let chart = deploy().join("chart/regbroker");
    let chart = chart.to_str().unwrap();
    let sidecar: &[&str] = &["--set", "mode=sourceControllerSidecar"];
    let mut renderings = vec![
        Rendering::new("chart defaults", &[&MONITORING_APIS], Some(false)),
        Rendering::new(
            "chart sidecar shape",
            &[sidecar, &MONITORING_APIS],
            Some(false),
        ),
        Rendering::new(
            "chart with monitoring",
            &[&MONITORING_ON, &MONITORING_APIS],
            Some(true),
        ),
        Rendering::new(
            "chart sidecar shape with monitoring",
            &[
                sidecar,
                &MONITORING_ON,
                &["--set", "serviceMonitor.sidecarNetworkPolicy=true"],
                &MONITORING_APIS,
            ],
            Some(true),
        ),
        // No monitoring.coreos.com API: the chart leaves its kinds out (and the Service
        // only the ServiceMonitor needs); the dashboard ConfigMap needs no API of its own.
        Rendering::new(
            "chart with monitoring, no monitoring API",
            &[&MONITORING_ON],
            Some(false),
        ),
        Rendering::new(
            "chart sidecar shape with monitoring, no monitoring API",
            &[sidecar, &MONITORING_ON],
            Some(false),
        ),
    ];
    for entry in std::fs::read_dir(deploy().join("chart/regbroker/ci")).unwrap() {
        let p = entry.unwrap().path();
        renderings.push(Rendering::new(
            &format!("chart with {}", p.file_name().unwrap().to_string_lossy()),
            &[&["-f", p.to_str().unwrap()], &MONITORING_APIS],
            None,
        ));
    }
    assert!(renderings.len() >= 8, "ci/ values files are missing");
    let mut monitoring_objects = 0;
    for Rendering {
        what,
        args: extra,
        monitoring,
    } in &renderings
    {
        let mut args = vec!["template", "regbroker", chart, "--namespace", "regbroker"];
        args.extend(extra.iter().map(String::as_str));
        let rendered = run(&helm, &args);
        let monitors = count_kind(&rendered, "ServiceMonitor");
        let rules = count_kind(&rendered, "PrometheusRule");
        match monitoring {
            Some(true) => assert!(
                monitors == 1 && rules == 1 && count_kind(&rendered, "Service") == 1,
                "{what}: expected a ServiceMonitor, its Service and a PrometheusRule:\n{rendered}"
            ),
            Some(false) => assert!(
                !rendered.contains("apiVersion: monitoring.coreos.com/")
                    && count_kind(&rendered, "Service") == 0,
                "{what}: rendered monitoring.coreos.com objects or their Service:\n{rendered}"
            ),
            None => {}
        }
        if extra.iter().any(|a| a == "grafanaDashboard.enabled=true") {
            assert!(
                rendered.contains("  regbroker.json: |"),
                "{what}: no dashboard ConfigMap:\n{rendered}"
            );
        }
        monitoring_objects += monitors + rules;
        accepted += dry_run(cp, what, &rendered);
    }
    // The ci/ values files turn them on too: 2 renderings above, 2 ci files.
    assert!(
        monitoring_objects >= 8,
        "only {monitoring_objects} ServiceMonitors and PrometheusRules were rendered"
    );
    eprintln!("server-side dry run accepted {accepted} objects");
}

/// `export NAME=value` lines of a `deploy/clouds/shape-*.env` file.
fn shape_env(shape: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy().join(format!("clouds/shape-{shape}.env"))).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// `text` with every `${NAME}` replaced, as a shell heredoc would; panics on one left over.
fn render(what: &str, text: &str, values: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (k, v) in values {
        out = out.replace(&format!("${{{k}}}"), v);
    }
    assert!(
        !out.contains("${"),
        "{what}: a placeholder has no value here:\n{out}"
    );
    out
}

#[test]
#[ignore = "needs etcd, kube-apiserver, kubectl and Flux's CRDs from scripts/peers.sh; run scripts/test.sh"]
fn cloud_guides_flux_sources_and_service_accounts_pass_a_server_side_dry_run() {
    let cp = ControlPlane::shared();
    install_flux_crds(cp);
    // What the guides' variables would hold (deploy/check_clouds.py has the same examples).
    let examples = [
        ("ACCOUNT_ID", "123456789012"),
        ("ROLE_NAME", "regbroker-ecr-pull"),
        ("REGISTRY", "123456789012.dkr.ecr.eu-west-1.amazonaws.com"),
        ("REPOSITORY_PREFIX", "flux"),
        ("IDENTITY_CLIENT_ID", "22222222-2222-2222-2222-222222222222"),
        ("PROJECT_ID", "my-project"),
        ("GSA_NAME", "regbroker"),
    ];
    let documents = [
        "flux-sources.yaml",
        "aws/serviceaccount-irsa.yaml",
        "aws/serviceaccount-pod-identity.yaml",
        "azure/serviceaccount.yaml",
        "gcp/serviceaccount-direct.yaml",
        "gcp/serviceaccount-impersonation.yaml",
    ];
    let mut accepted = 0;
    for shape in ["sidecar", "standalone"] {
        let mut values = shape_env(shape);
        assert!(
            values.iter().any(|(k, _)| k == "SECRET_NAME"),
            "{shape}: {values:?}"
        );
        values.extend(examples.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        for doc in documents {
            let what = format!("deploy/clouds/{doc} ({shape})");
            let text = std::fs::read_to_string(deploy().join("clouds").join(doc)).unwrap();
            let yaml = render(&what, &text, &values);
            let n = dry_run(cp, &what, &yaml);
            if doc == "flux-sources.yaml" {
                assert_eq!(n, 3, "{what}: HelmRepository, HelmChart and OCIRepository");
            }
            accepted += n;
        }
    }
    eprintln!("server-side dry run accepted {accepted} objects of the cloud guides");
}
