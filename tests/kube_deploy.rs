//! Everything `deploy/` ships is accepted by a real kube-apiserver (tests/control_plane)
//! with a server-side dry run, Flux's CRDs installed: every kustomize output
//! (`kubectl kustomize`) and every rendering of the Helm chart (`helm template` with its
//! defaults, each `ci/` values file, and the sidecar shape). The API server applies its
//! own validation, defaulting and admission, which no offline schema check reproduces.
//! The per-cloud guides' Kubernetes documents (`deploy/clouds/`: the Flux sources and the
//! ServiceAccounts), rendered for each shape as the guides' heredocs render them, get the
//! same dry run; deploy/check_clouds.py checks what they name against the manifests.
//!
//! Needs kube-apiserver, etcd, kubectl, helm and the source-controller CRDs from
//! scripts/peers.sh: ignored by plain `cargo test`, run by scripts/test.sh.

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

#[test]
#[ignore = "needs etcd, kube-apiserver, kubectl, helm and Flux's CRDs from scripts/peers.sh; run scripts/test.sh"]
fn every_manifest_and_chart_rendering_passes_a_server_side_dry_run() {
    let cp = ControlPlane::shared();
    install_flux_crds(cp);
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

    // The Helm chart: defaults, the sidecar shape, and every ci/ values file.
    let helm = cp.peers.get("helm").to_path_buf();
    let chart = deploy().join("chart/regbroker");
    let chart = chart.to_str().unwrap();
    let mut renderings: Vec<(String, Vec<String>)> = vec![
        ("chart defaults".into(), vec![]),
        (
            "chart sidecar shape".into(),
            vec!["--set".into(), "mode=sourceControllerSidecar".into()],
        ),
    ];
    for entry in std::fs::read_dir(deploy().join("chart/regbroker/ci")).unwrap() {
        let p = entry.unwrap().path();
        renderings.push((
            format!("chart with {}", p.file_name().unwrap().to_string_lossy()),
            vec!["-f".into(), p.to_str().unwrap().into()],
        ));
    }
    assert!(renderings.len() >= 4, "ci/ values files are missing");
    for (what, extra) in &renderings {
        let mut args = vec!["template", "regbroker", chart, "--namespace", "regbroker"];
        args.extend(extra.iter().map(String::as_str));
        let rendered = run(&helm, &args);
        accepted += dry_run(cp, what, &rendered);
    }
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
