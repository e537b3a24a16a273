#!/usr/bin/env python3
"""Checks every manifest under deploy/ (called by deploy/check.sh).

Core Kubernetes kinds are validated strictly (no unknown fields) by kubernetes-validate
against the JSON schemas it ships (offline), for each version in K8S_VERSIONS. Kinds it
has no schema for are never passed to it silently (it only warns and exits 0 for them):
Kustomization, Flux's HelmRepository and the kubelet's CredentialProviderConfig get the
field checks below, and any other kind fails the check.

The Flux patches are partial objects, so they are merged into a stand-in for Flux's
source-controller (deploy/flux/testdata/) with the strategic-merge rules the patches use
(maps merged; containers, ports and volumes merged by name), and the results are
validated. kustomize itself is not installed here.

Every Deployment's containers must carry the hardening the project promises.
"""

import copy
import pathlib
import subprocess
import sys
import tempfile

import yaml

K8S_VERSIONS = ["1.32.0", "1.37.0"]
DEPLOY = pathlib.Path(__file__).resolve().parent
FLUX_OWN_FILES = {"gotk-components.yaml", "gotk-sync.yaml"}
CORE_GROUPS = {"v1", "apps/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1"}

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}")


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def merge(base, patch):
    """Strategic merge for the shapes the patches use."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(
        isinstance(x, dict) and "name" in x for x in base + patch
    ):
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            idx = next((i for i, x in enumerate(out) if x["name"] == item["name"]), None)
            if idx is None:
                out.append(copy.deepcopy(item))
            else:
                out[idx] = merge(out[idx], item)
        return out
    return copy.deepcopy(patch)


def check_hardening(obj, where):
    pod = obj["spec"]["template"]["spec"]
    pod_sc = pod.get("securityContext", {})
    for c in pod.get("containers", []):
        name = f"{where}: container {c['name']}"
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            fail(f"{name}: allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            fail(f"{name}: readOnlyRootFilesystem must be true")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            fail(f"{name}: capabilities must drop ALL")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            fail(f"{name}: runAsNonRoot must be true")
        seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
        if seccomp.get("type") != "RuntimeDefault":
            fail(f"{name}: seccompProfile must be RuntimeDefault")
        if c["name"] == "regbroker":
            res = c.get("resources", {})
            if not (res.get("requests") and res.get("limits")):
                fail(f"{name}: needs resource requests and limits")
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                if c.get(probe, {}).get("httpGet", {}).get("path") != path:
                    fail(f"{name}: {probe} must GET {path}")
            args = c.get("args", [])
            if "--listen=127.0.0.1:8477" not in args:
                fail(f"{name}: the credential endpoint must stay on loopback")


def sync_secrets(obj):
    out = []
    for c in obj["spec"]["template"]["spec"]["containers"]:
        for a in c.get("args", []):
            if a.startswith("--sync-secret="):
                out.append(a.split("=", 1)[1])
    return out


def check_kustomization(path, k):
    known = {"apiVersion", "kind", "resources", "patches", "namespace", "labels", "images"}
    for key in k:
        if key not in known:
            fail(f"{path}: unexpected Kustomization key {key!r}")
    for res in k.get("resources", []):
        if res in FLUX_OWN_FILES:
            print(f"  {path.name}: {res} is Flux's own file (flux bootstrap writes it); not here")
        elif not (path.parent / res).exists():
            fail(f"{path}: resource {res} does not exist")
    for p in k.get("patches", []):
        if not (path.parent / p["path"]).exists():
            fail(f"{path}: patch {p['path']} does not exist")
        if set(p.get("target", {})) - {"kind", "name", "namespace", "group", "version"}:
            fail(f"{path}: unexpected patch target keys {p['target']}")


def check_helmrepository(path, h, flux_secrets):
    if h["apiVersion"] != "source.toolkit.fluxcd.io/v1":
        fail(f"{path}: HelmRepository apiVersion must be source.toolkit.fluxcd.io/v1")
    spec = h.get("spec", {})
    if spec.get("type") != "oci" or not str(spec.get("url", "")).startswith("oci://"):
        fail(f"{path}: expected type oci with an oci:// url")
    ref = f"{h['metadata']['namespace']}/{spec.get('secretRef', {}).get('name')}"
    if ref not in flux_secrets:
        fail(f"{path}: secretRef {ref} is not a Secret the sidecar syncs ({flux_secrets})")


def check_credential_provider_config(path, c):
    if c["apiVersion"] != "kubelet.config.k8s.io/v1":
        fail(f"{path}: apiVersion must be kubelet.config.k8s.io/v1")
    for p in c.get("providers", []):
        if p.get("apiVersion") != "credentialprovider.kubelet.k8s.io/v1":
            fail(f"{path}: provider apiVersion must be credentialprovider.kubelet.k8s.io/v1")
        if p.get("args") != ["kubelet-credential-provider"]:
            fail(f"{path}: provider args must be [kubelet-credential-provider]")
        if not p.get("matchImages") or not p.get("defaultCacheDuration") or not p.get("name"):
            fail(f"{path}: provider needs name, matchImages and defaultCacheDuration")
    if not c.get("providers"):
        fail(f"{path}: no providers")


def main():
    out = pathlib.Path(tempfile.mkdtemp(prefix="regbroker-manifests-"))
    to_validate = []
    others = []
    testdata = DEPLOY / "flux" / "testdata"
    patches = {
        DEPLOY / "flux" / "source-controller-patch.yaml",
        DEPLOY / "flux" / "serviceaccount-patch.yaml",
    }
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if testdata in path.parents or path in patches:
            continue
        for i, d in enumerate(docs(path)):
            if d["apiVersion"] in CORE_GROUPS:
                f = out / f"{path.parent.name}-{path.stem}-{i}.yaml"
                f.write_text(yaml.safe_dump(d))
                to_validate.append(f)
                if d["kind"] == "Deployment":
                    check_hardening(d, path.relative_to(DEPLOY))
            else:
                others.append((path, d))

    # The Flux sidecar: merge the patches into the stand-in, then validate the result.
    base = {d["kind"]: d for d in docs(testdata / "source-controller.yaml")}
    for patch_path in sorted(patches):
        (patch,) = docs(patch_path)
        merged = merge(base[patch["kind"]], patch)
        f = out / f"flux-merged-{patch['kind'].lower()}.yaml"
        f.write_text(yaml.safe_dump(merged))
        to_validate.append(f)
        base[patch["kind"]] = merged
    check_hardening(base["Deployment"], "flux/source-controller-patch.yaml (merged)")
    flux_secrets = sync_secrets(base["Deployment"])

    for path, d in others:
        rel = path.relative_to(DEPLOY)
        kind = d["kind"]
        print(f"  {rel}: {kind} ({d['apiVersion']}) has no schema in kubernetes-validate; field checks")
        if kind == "Kustomization":
            check_kustomization(path, d)
        elif kind == "HelmRepository":
            check_helmrepository(path, d, flux_secrets)
        elif kind == "CredentialProviderConfig":
            check_credential_provider_config(path, d)
        else:
            fail(f"{rel}: no check for kind {kind}")

    for version in K8S_VERSIONS:
        print(f"  kubernetes-validate --strict -k {version}: {len(to_validate)} objects")
        r = subprocess.run(
            ["kubernetes-validate", "--strict", "--quiet", "-k", version]
            + [str(f) for f in to_validate]
        )
        if r.returncode != 0:
            fail(f"kubernetes-validate {version}")

    if failures:
        print(f"{len(failures)} manifest check(s) failed")
        return 1
    print("manifests ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
