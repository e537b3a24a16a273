#!/usr/bin/env python3
"""Checks every manifest under deploy/ (called by deploy/check.sh).

The current Kubernetes (1.37) judges these objects itself: tests/kube_deploy.rs passes every
kustomize output and chart rendering through a server-side dry run on a real kube-apiserver
(strict field validation, Flux's CRDs installed). What that cannot judge is the oldest
release the chart supports, so core kinds are also validated strictly (no unknown fields)
by kubernetes-validate against the JSON schemas it ships (offline), for each version in
K8S_VERSIONS: the oldest supported, kept offline because no such API server is built. Kinds it
has no schema for are never passed to it silently (it only warns and exits 0 for them):
Kustomization, Flux's HelmRepository and the kubelet's CredentialProviderConfig get the
field checks below, and any other kind fails the check.

The Flux patches are partial objects, so they are merged into a stand-in for Flux's
source-controller (deploy/flux/testdata/) with the strategic-merge rules the patches use
(maps merged; containers, ports and volumes merged by name), and the results are
validated. kustomize itself is not installed here.

Every Deployment's containers must carry the hardening the project promises.

The Helm chart (deploy/chart/, Go templates, not YAML) is skipped in that walk; deploy/check.sh
renders it with helm and passes the output here: `--render SHAPE FILE` (SHAPE standalone,
sidecar or sidecar-patch) validates each rendered object like the manifests above, checks
the shape renders only its own kinds, and merges sidecar-patch output into the
source-controller stand-in; `--same-as-shipped SHAPE FILE` also requires a rendering with
the kustomize manifests' example values to match deploy/standalone/ or deploy/flux/.

The chart's monitoring objects are checked in every rendering that has them: the metrics
Service exposes only the probe port and selects the pods that serve it (regbroker's, or
source-controller's stand-in), the ServiceMonitor scrapes that Service as the job the
alert rules expect, the PrometheusRule holds exactly the rule groups of
deploy/monitoring/alerts.yaml except the two expressions the chart sets from values, and
the dashboard ConfigMap holds deploy/monitoring/dashboard.json. `--prometheus-rule MARGIN
JOB FILE` pins those two expressions to the values the rendering was given (with 600 and
regbroker, the PrometheusRule equals the file's groups exactly), and `--no-monitoring-api
SHAPE FILE` requires a rendering for a cluster without the Prometheus Operator's API to
hold no monitoring.coreos.com object and no metrics Service. deploy/monitoring/ itself holds
no Kubernetes objects (a Prometheus rule file and a Grafana dashboard), so the walk skips it.
"""

import argparse
import copy
import json
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

# 1.37 is checked by the real API server (tests/kube_deploy.rs), not offline.
K8S_VERSIONS = ["1.32.0"]
DEPLOY = pathlib.Path(__file__).resolve().parent
CHART = DEPLOY / "chart"
CLOUDS = DEPLOY / "clouds"
MONITORING = DEPLOY / "monitoring"
FLUX_OWN_FILES = {"gotk-components.yaml", "gotk-sync.yaml"}
# The kinds each chart shape may render; anything else means a template leaked into the
# wrong shape.
CHART_KINDS = {
    "standalone": {
        "Deployment", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "ConfigMap",
        "PodDisruptionBudget",
        # registryCredentials.enabled: the CRD, the controller's and the tenants' roles.
        "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
        # serviceMonitor, prometheusRule (grafanaDashboard is a ConfigMap).
        "Service", "ServiceMonitor", "PrometheusRule",
    },
    # serviceMonitor (with sidecarNetworkPolicy) and prometheusRule.
    "sidecar": {"Role", "RoleBinding", "ConfigMap", "Service", "ServiceMonitor", "PrometheusRule",
                "NetworkPolicy"},
    "sidecar-patch": {"Deployment", "ServiceAccount"},
}
CORE_GROUPS = {
    "v1", "apps/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1", "policy/v1",
}
# The Prometheus Operator's: kubernetes-validate has no schema for them (the API server
# judges them in tests/kube_deploy.rs, with the operator's CRDs); field checks here.
MONITORING_GROUP = "monitoring.coreos.com/v1"
# The port regbroker serves /metrics (and the probes) on, and the credential endpoint's.
PROBE_PORT, CREDENTIAL_PORT = 8478, 8477
# The two expressions of deploy/monitoring/alerts.yaml the chart sets from values, as
# (the file's text, a pattern of what the chart writes, how the chart writes it).
EXPIRING_SOON, TARGET_MISSING = "RegbrokerCredentialExpiringSoon", "RegbrokerTargetMissing"
CHART_EXPRS = {
    EXPIRING_SOON: (
        "regbroker_credential_expiry_timestamp_seconds - time() < 600",
        re.compile(r"regbroker_credential_expiry_timestamp_seconds - time\(\) < ([0-9]+)"),
        lambda margin, job: f"regbroker_credential_expiry_timestamp_seconds - time() < {margin}",
    ),
    TARGET_MISSING: (
        'absent(up{job="regbroker"} == 1)',
        re.compile(r'absent\(up\{job="([^"]+)"\} == 1\)'),
        lambda margin, job: f'absent(up{{job="{job}"}} == 1)',
    ),
}

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


def check_sidecar_readiness(obj, name):
    """The sidecar's readiness is its host pod's: never tied to the sinks (a cloud outage
    would take source-controller's artifact server out of its Service)."""
    for c in obj["spec"]["template"]["spec"]["containers"]:
        for a in c.get("args", []):
            if a.split("=", 1)[0] == "--ready-requires-sinks":
                fail(f"{name}: the sidecar must not set --ready-requires-sinks")
        for e in c.get("env", []):
            if e.get("name") == "REGBROKER_READY_REQUIRES_SINKS":
                fail(f"{name}: the sidecar must not set REGBROKER_READY_REQUIRES_SINKS")


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


def check_crd(path, c):
    # Generated by `regbroker crd` (tests/cli.rs keeps this copy equal to it; the tests
    # apply it to a real API server): here only what the manifests around it rely on.
    if c["metadata"]["name"] != "registrycredentials.regbroker.dev":
        fail(f"{path}: expected the RegistryCredential CRD")
    versions = c["spec"]["versions"]
    if [v["name"] for v in versions] != ["v1alpha1"] or "status" not in versions[0].get("subresources", {}):
        fail(f"{path}: expected v1alpha1 with the status subresource")


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
        t = p.get("tokenAttributes")
        federated = any(e.get("name") == "REGBROKER_CONFIG" for e in p.get("env", []))
        if t is not None and federated:
            check_federated_token_attributes(f"{path}: provider {p.get('name')}", t)
        elif t is not None:
            check_token_attributes(f"{path}: provider {p.get('name')}", t)
    names = [p.get("name") for p in c.get("providers", [])]
    if len(names) != len(set(names)):
        fail(f"{path}: provider names must be unique (each is an executable): {names}")
    if not c.get("providers"):
        fail(f"{path}: no providers")


# KEP-4412's tokenAttributes (kubelet 1.34+): the audience each cloud's token exchange
# accepts, and the annotation keys regbroker reads for it.
TOKEN_AUDIENCES = {
    "sts.amazonaws.com": {"eks.amazonaws.com/ecr-role-arn", "eks.amazonaws.com/role-arn"},
    "api://AzureADTokenExchange": {
        "kubernetes.azure.com/acr-client-id",
        "kubernetes.azure.com/acr-tenant-id",
        "azure.workload.identity/client-id",
        "azure.workload.identity/tenant-id",
    },
}


# Google's STS: the audience is the workload identity provider's full name.
GCP_AUDIENCE = re.compile(
    r"//iam\.googleapis\.com/projects/[0-9]+/locations/global/workloadIdentityPools/"
    r"[a-z0-9-]{4,32}/providers/[a-z0-9-]{4,32}"
)
GCP_KEYS = {"gcp.auth.fluxcd.io/workload-identity-provider", "iam.gke.io/gcp-service-account"}


def check_token_attributes(where, t):
    keys = set(t) - {
        "serviceAccountTokenAudience",
        "cacheType",
        "requireServiceAccount",
        "requiredServiceAccountAnnotationKeys",
        "optionalServiceAccountAnnotationKeys",
    }
    if keys:
        fail(f"{where}: unknown tokenAttributes keys {sorted(keys)}")
    audience = t.get("serviceAccountTokenAudience")
    keys_for = TOKEN_AUDIENCES.get(audience)
    if keys_for is None and GCP_AUDIENCE.fullmatch(str(audience)):
        keys_for = GCP_KEYS
    if keys_for is None:
        fail(f"{where}: serviceAccountTokenAudience {audience!r} is not one regbroker exchanges")
        return
    # Token would let the kubelet share one answer between every pod holding the same
    # token; a workload's credential must be cached per ServiceAccount.
    if t.get("cacheType") != "ServiceAccount":
        fail(f"{where}: cacheType must be ServiceAccount (required since 1.34)")
    listed = set(t.get("requiredServiceAccountAnnotationKeys", [])) | set(
        t.get("optionalServiceAccountAnnotationKeys", [])
    )
    if listed != keys_for:
        fail(f"{where}: annotation keys {sorted(listed)} are not the ones regbroker reads for "
             f"{audience}: {sorted(keys_for)}")


def check_federated_token_attributes(where, t):
    # A federated entry (its rules in REGBROKER_CONFIG): the audience is the one its
    # registry trusts, no annotation is read, and the pass-through provider needs
    # cacheType Token (the kubelet drops a ServiceAccount token as password otherwise).
    if not t.get("serviceAccountTokenAudience"):
        fail(f"{where}: a federated entry needs serviceAccountTokenAudience (the rule's audience)")
    if t.get("cacheType") not in ("ServiceAccount", "Token"):
        fail(f"{where}: cacheType must be ServiceAccount (exchanges) or Token (pass-through)")
    if t.get("requiredServiceAccountAnnotationKeys") or t.get("optionalServiceAccountAnnotationKeys"):
        fail(f"{where}: federated providers read no ServiceAccount annotation")


def by_kind(objs, kind):
    return [d for d in objs if d["kind"] == kind]


def check_chart_render(shape, path, objs, stand_in, out, to_validate):
    """Validates one rendered chart file; sidecar-patch output is merged into the stand-in."""
    where = f"chart render {path.name} ({shape})"
    if not objs:
        fail(f"{where}: renders nothing")
    for i, d in enumerate(objs):
        kind = d.get("kind")
        if kind not in CHART_KINDS[shape]:
            fail(f"{where}: renders a {kind}, which the {shape} shape must not")
            continue
        if kind == "CustomResourceDefinition":
            check_crd(path, d)
            continue
        if d["apiVersion"] == MONITORING_GROUP and kind in ("ServiceMonitor", "PrometheusRule"):
            continue  # check_monitoring
        if d["apiVersion"] not in CORE_GROUPS:
            fail(f"{where}: {kind} has apiVersion {d['apiVersion']}, not a core group")
            continue
        if shape == "sidecar-patch":
            if kind == "Deployment" and "selector" in d.get("spec", {}):
                fail(f"{where}: the Deployment patch must not carry a selector (it is a patch)")
            d = merge(stand_in[kind], d)
            if kind == "Deployment":
                check_hardening(d, f"{where} (merged)")
        elif kind == "Deployment":
            check_hardening(d, where)
        f = out / f"chart-{path.parent.name}-{path.stem}-{i}.yaml"
        f.write_text(yaml.safe_dump(d))
        to_validate.append(f)
    if shape == "standalone" and len(by_kind(objs, "Deployment")) != 1:
        fail(f"{where}: expected exactly one Deployment")
    if shape == "sidecar-patch" and len(by_kind(objs, "Deployment")) > 1:
        fail(f"{where}: expected one Deployment patch at most")
    if shape != "sidecar-patch":
        check_monitoring(shape, where, objs, stand_in)


def alert_groups():
    """The rule groups of deploy/monitoring/alerts.yaml."""
    (rules,) = docs(MONITORING / "alerts.yaml")
    if set(rules) != {"groups"}:
        fail(f"monitoring/alerts.yaml: a Prometheus rule file has only `groups`, not {sorted(rules)}")
    return rules.get("groups", [])


def rules_by_alert(groups):
    return {r["alert"]: r for g in groups for r in g.get("rules", []) if "alert" in r}


def expected_alert_groups(margin, job):
    """alerts.yaml's groups as the chart renders them for MARGIN and JOB: the file's own
    text for the two expressions the chart sets must be what the chart writes for 600 and
    `regbroker` (else the template and the file have drifted apart)."""
    groups = copy.deepcopy(alert_groups())
    rules = rules_by_alert(groups)
    for alert, (text, _, chart) in CHART_EXPRS.items():
        rule = rules.get(alert)
        if rule is None:
            fail(f"monitoring/alerts.yaml: no alert {alert}, whose expression the chart sets")
            continue
        if rule["expr"] != text or chart(600, "regbroker") != text:
            fail(f"monitoring/alerts.yaml: {alert}'s expr is {rule['expr']!r}; the chart "
                 f"(templates/prometheusrule.yaml) writes {chart(600, 'regbroker')!r} for the "
                 "defaults: change both together (and this check's CHART_EXPRS)")
        rule["expr"] = chart(margin, job)
    return groups


def differences(a, b, at=""):
    """The paths at which two parsed YAML values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(a.keys() | b.keys(), key=str)
                for p in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at or '.'}: chart {a!r}, alerts.yaml {b!r}"]


def check_prometheus_rule(where, rule, margin=None, job=None):
    """RULE's spec.groups are alerts.yaml's with the chart's two expressions, for MARGIN and
    JOB, or (None) for whatever values they were rendered with. Returns the job."""
    groups = rule.get("spec", {}).get("groups", [])
    rendered = rules_by_alert(groups)
    found = {}
    for alert, (_, pattern, _) in CHART_EXPRS.items():
        m = pattern.fullmatch(str(rendered.get(alert, {}).get("expr")))
        if not m:
            fail(f"{where}: PrometheusRule {alert} expr {rendered.get(alert, {}).get('expr')!r} "
                 f"is not of the form {pattern.pattern}")
            return None
        found[alert] = m.group(1)
    if margin is not None and found[EXPIRING_SOON] != str(margin):
        fail(f"{where}: {EXPIRING_SOON}'s margin is {found[EXPIRING_SOON]}, not {margin}")
    if job is not None and found[TARGET_MISSING] != job:
        fail(f"{where}: {TARGET_MISSING}'s job is {found[TARGET_MISSING]!r}, not {job!r}")
    expected = expected_alert_groups(int(found[EXPIRING_SOON]), found[TARGET_MISSING])
    diff = differences(groups, expected, "spec.groups")
    if diff:
        fail(f"{where}: the PrometheusRule is not deploy/monitoring/alerts.yaml's groups "
             "(but for the two expressions the chart sets):\n    " + "\n    ".join(diff))
    return found[TARGET_MISSING]


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def metrics_services(objs):
    return [d for d in by_kind(objs, "Service")
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "metrics"]


def check_monitoring(shape, where, objs, stand_in):
    """The Service, ServiceMonitor, NetworkPolicy, PrometheusRule and dashboard ConfigMap
    of serviceMonitor, prometheusRule and grafanaDashboard, where rendered."""
    services = metrics_services(objs)
    monitors = by_kind(objs, "ServiceMonitor")
    if len(by_kind(objs, "Service")) != len(services):
        fail(f"{where}: the only Service the chart renders is the metrics Service")
    if len(services) != len(monitors) or len(monitors) > 1:
        fail(f"{where}: expected the metrics Service with its ServiceMonitor, found "
             f"{len(services)} and {len(monitors)}")
        return
    job = None
    for svc, sm in zip(services, monitors):
        spec = svc["spec"]
        ports = spec.get("ports", [])
        if [(p.get("port"), p.get("name")) for p in ports] != [(PROBE_PORT, "metrics")]:
            fail(f"{where}: the metrics Service must expose the probe port {PROBE_PORT} only: {ports}")
        if CREDENTIAL_PORT in [p.get(k) for p in ports for k in ("port", "targetPort")]:
            fail(f"{where}: the metrics Service exposes the credential endpoint's port")
        # The pods it selects, and the name of their probe port.
        if shape == "standalone":
            if len(by_kind(objs, "Deployment")) != 1:
                return  # failed above
            dep = by_kind(objs, "Deployment")[0]
            pod, pod_namespace = dep["spec"]["template"], dep["metadata"]["namespace"]
            if spec.get("selector") != dep["spec"]["selector"]["matchLabels"]:
                fail(f"{where}: the metrics Service's selector {spec.get('selector')} is not the "
                     f"Deployment's {dep['spec']['selector']['matchLabels']}")
        else:
            # source-controller's stand-in with the sidecar patched in; its namespace is the
            # one of the ServiceAccount the RoleBindings bind.
            pod = merge(stand_in["Deployment"],
                        docs(DEPLOY / "flux" / "source-controller-patch.yaml")[0])["spec"]["template"]
            bindings = by_kind(objs, "RoleBinding")
            if not bindings:
                fail(f"{where}: no RoleBinding for source-controller's ServiceAccount")
                return
            pod_namespace = bindings[0]["subjects"][0]["namespace"]
        if svc["metadata"]["namespace"] != pod_namespace:
            fail(f"{where}: the metrics Service is in {svc['metadata']['namespace']}, not with the "
                 f"pods in {pod_namespace}")
        if not matches(spec.get("selector"), pod["metadata"]["labels"]):
            fail(f"{where}: the metrics Service's selector {spec.get('selector')} does not select "
                 f"the pods ({pod['metadata']['labels']})")
        probe = [p["name"] for c in pod["spec"]["containers"] if c["name"] == "regbroker"
                 for p in c.get("ports", []) if p["containerPort"] == PROBE_PORT]
        if [p.get("targetPort") for p in ports] != probe[:1]:
            fail(f"{where}: the metrics Service's targetPort is not the regbroker container's "
                 f"probe port {probe}")
        # The ServiceMonitor: that Service, in its namespace, as the job the rules expect.
        labels = svc["metadata"].get("labels", {})
        mspec = sm["spec"]
        if sm["metadata"]["namespace"] != svc["metadata"]["namespace"] or "namespaceSelector" in mspec:
            fail(f"{where}: the ServiceMonitor must be in the metrics Service's namespace")
        if not matches(mspec.get("selector", {}).get("matchLabels"), labels):
            fail(f"{where}: the ServiceMonitor's selector does not select the metrics Service")
        if [e.get("port") for e in mspec.get("endpoints", [])] != [p.get("name") for p in ports]:
            fail(f"{where}: the ServiceMonitor must scrape the metrics Service's port")
        job = labels.get(mspec.get("jobLabel"))
        if not job:
            fail(f"{where}: the ServiceMonitor's jobLabel {mspec.get('jobLabel')!r} is not a label "
                 "of the metrics Service: Prometheus' job would be the Service's name")
    # sidecarNetworkPolicy: the probe port of the pods the metrics Service selects, nothing else.
    for np in by_kind(objs, "NetworkPolicy") if shape == "sidecar" else []:
        ports = [p["port"] for rule in np["spec"].get("ingress", []) for p in rule.get("ports", [])]
        if not services or ports != [PROBE_PORT] or \
                np["spec"]["podSelector"].get("matchLabels") != services[0]["spec"].get("selector"):
            fail(f"{where}: the sidecar's NetworkPolicy must admit only the probe port of the "
                 f"pods the metrics Service selects: {np['spec']}")
    if shape == "standalone" and len(by_kind(objs, "NetworkPolicy")) > 1:
        fail(f"{where}: sidecarNetworkPolicy must change nothing in the standalone shape")
    for rule in by_kind(objs, "PrometheusRule"):
        rule_job = check_prometheus_rule(where, rule)
        if job is not None and rule_job is not None and rule_job != job:
            fail(f"{where}: {TARGET_MISSING} expects job {rule_job!r}, but the ServiceMonitor's "
                 f"targets get job {job!r}")
    for cm in by_kind(objs, "ConfigMap"):
        if "regbroker.json" in cm.get("data", {}):
            dashboard = (MONITORING / "dashboard.json").read_text()
            if cm["data"]["regbroker.json"] != dashboard:
                fail(f"{where}: the dashboard ConfigMap's regbroker.json is not "
                     "deploy/monitoring/dashboard.json")
            json.loads(dashboard)


def check_without_monitoring_api(shape, path, objs):
    """Rendered for a cluster without monitoring.coreos.com: nothing of it, nor the Service
    only the ServiceMonitor needs."""
    where = f"chart render {path.name} ({shape}, no monitoring.coreos.com API)"
    for d in objs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            fail(f"{where}: renders a {d['kind']} although the cluster does not serve it")
    if metrics_services(objs):
        fail(f"{where}: renders the metrics Service without its ServiceMonitor")


def regbroker_container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next((c for c in containers if c["name"] == "regbroker"), None)


def one(objs, kind, where):
    found = by_kind(objs, kind)
    if len(found) != 1:
        fail(f"{where}: expected one {kind}, found {len(found)}")
        return None
    return found[0]


def same(where, what, rendered, shipped):
    if rendered == shipped:
        return
    if isinstance(rendered, dict) and isinstance(shipped, dict):
        keys = sorted(k for k in rendered.keys() | shipped.keys() if rendered.get(k) != shipped.get(k))
        diff = "".join(f"\n    {k}: chart {rendered.get(k)!r}, shipped {shipped.get(k)!r}" for k in keys)
    else:
        diff = f"\n    chart {rendered!r}, shipped {shipped!r}"
    fail(f"{where}: {what} differs from the kustomize manifests:{diff}")


def check_same_as_shipped(shape, path, objs):
    """The chart, given the kustomize manifests' example values, renders what they say."""
    where = f"chart render {path.name} ({shape}, example values)"
    if shape == "sidecar-patch":
        shipped = docs(DEPLOY / "flux" / "source-controller-patch.yaml")[0]
        for patch in by_kind(objs, "Deployment"):
            same(where, "regbroker container", regbroker_container(patch), regbroker_container(shipped))
        shipped = docs(DEPLOY / "flux" / "serviceaccount-patch.yaml")[0]
        for sa in by_kind(objs, "ServiceAccount"):
            same(where, "ServiceAccount patch", sa, shipped)
        return
    rbac_dir = "flux" if shape == "sidecar" else "standalone"
    shipped_docs = [d for p in sorted((DEPLOY / rbac_dir).glob("*.yaml")) for d in docs(p)]
    shipped = {d["kind"]: d for d in shipped_docs}
    # Roles and RoleBindings by name (the standalone shape has one for the Secrets and one
    # for the leader election Lease).
    for kind in ("Role", "RoleBinding"):
        ours = {d["metadata"]["name"]: d for d in by_kind(objs, kind)}
        theirs = {d["metadata"]["name"]: d for d in by_kind(shipped_docs, kind)}
        same(where, f"{kind} names", sorted(ours), sorted(theirs))
        for name in sorted(ours.keys() & theirs.keys()):
            a, b = ours[name], theirs[name]
            same(where, f"{kind} {name} namespace", a["metadata"]["namespace"], b["metadata"]["namespace"])
            key = "rules" if kind == "Role" else "subjects"
            same(where, f"{kind} {name} {key}", a[key], b[key])
    if shape == "sidecar":
        return
    dep = one(objs, "Deployment", where)
    if dep:
        pod, shipped_pod = dep["spec"]["template"]["spec"], shipped["Deployment"]["spec"]["template"]["spec"]
        same(where, "regbroker container", regbroker_container(dep),
             regbroker_container(shipped["Deployment"]))
        for key in ("securityContext", "serviceAccountName"):
            same(where, f"pod {key}", pod.get(key), shipped_pod.get(key))
        same(where, "replicas", dep["spec"].get("replicas"), shipped["Deployment"]["spec"]["replicas"])
        # The chart's selectors also have app.kubernetes.io/instance.
        same(where, "pod anti-affinity topology",
             [t["podAffinityTerm"]["topologyKey"] for t in
              pod.get("affinity", {}).get("podAntiAffinity", {})
              .get("preferredDuringSchedulingIgnoredDuringExecution", [])],
             [t["podAffinityTerm"]["topologyKey"] for t in
              shipped_pod.get("affinity", {}).get("podAntiAffinity", {})
              .get("preferredDuringSchedulingIgnoredDuringExecution", [])])
    pdb = one(objs, "PodDisruptionBudget", where)
    if pdb:
        same(where, "PodDisruptionBudget minAvailable", pdb["spec"].get("minAvailable"),
             shipped["PodDisruptionBudget"]["spec"].get("minAvailable"))
    np = one(objs, "NetworkPolicy", where)
    if np:
        # The chart's podSelector also has app.kubernetes.io/instance.
        rules = {k: v for k, v in np["spec"].items() if k != "podSelector"}
        shipped_rules = {k: v for k, v in shipped["NetworkPolicy"]["spec"].items() if k != "podSelector"}
        same(where, "NetworkPolicy rules", rules, shipped_rules)
    sa = one(objs, "ServiceAccount", where)
    if sa:
        for key in ("name", "namespace", "annotations"):
            same(where, f"ServiceAccount {key}", sa["metadata"].get(key),
                 shipped["ServiceAccount"]["metadata"].get(key))
        same(where, "automountServiceAccountToken", sa.get("automountServiceAccountToken"),
             shipped["ServiceAccount"].get("automountServiceAccountToken"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shapes = sorted(CHART_KINDS)
    parser.add_argument(
        "--render", nargs=2, action="append", default=[], metavar=("SHAPE", "FILE"),
        help=f"helm template output of the chart; SHAPE: {', '.join(shapes)}",
    )
    parser.add_argument(
        "--same-as-shipped", nargs=2, action="append", default=[], metavar=("SHAPE", "FILE"),
        help="a rendering with the kustomize manifests' example values; must match them",
    )
    parser.add_argument(
        "--prometheus-rule", nargs=3, action="append", default=[], metavar=("MARGIN", "JOB", "FILE"),
        help="a rendering whose PrometheusRule must be alerts.yaml's with this margin and job",
    )
    parser.add_argument(
        "--no-monitoring-api", nargs=2, action="append", default=[], metavar=("SHAPE", "FILE"),
        help="a rendering for a cluster without monitoring.coreos.com: none of it may render",
    )
    args = parser.parse_args()
    for shape, _ in args.render + args.same_as_shipped + args.no_monitoring_api:
        if shape not in CHART_KINDS:
            parser.error(f"unknown shape {shape!r} (one of {', '.join(shapes)})")

    out = pathlib.Path(tempfile.mkdtemp(prefix="regbroker-manifests-"))
    to_validate = []
    others = []
    testdata = DEPLOY / "flux" / "testdata"
    patches = {
        DEPLOY / "flux" / "source-controller-patch.yaml",
        DEPLOY / "flux" / "serviceaccount-patch.yaml",
    }
    # A JSON patch, which kustomize applies (kubectl kustomize in tests/kube_deploy.rs).
    json_patches = {DEPLOY / "registry-credentials" / "deployment-patch.yaml"}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        # The chart's templates are not YAML; its renderings come in through --render.
        # deploy/clouds/ holds templates with ${VAR} placeholders: check_clouds.py.
        # deploy/monitoring/ holds a Prometheus rule file: the PrometheusRule checks use it.
        if (testdata in path.parents or path in patches or path in json_patches
                or CHART in path.parents or CLOUDS in path.parents or MONITORING in path.parents):
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
    check_sidecar_readiness(base["Deployment"], "flux/source-controller-patch.yaml (merged)")
    flux_secrets = sync_secrets(base["Deployment"])

    stand_in = {d["kind"]: d for d in docs(testdata / "source-controller.yaml")}
    for shape, file in args.render:
        path = pathlib.Path(file)
        objs = docs(path)
        print(f"  chart render {path.name} ({shape}): {len(objs)} objects")
        check_chart_render(shape, path, objs, stand_in, out, to_validate)
    for shape, file in args.same_as_shipped:
        path = pathlib.Path(file)
        print(f"  chart render {path.name} ({shape}) against the kustomize manifests")
        check_same_as_shipped(shape, path, docs(path))
    for margin, job, file in args.prometheus_rule:
        path = pathlib.Path(file)
        print(f"  chart render {path.name}: PrometheusRule against monitoring/alerts.yaml "
              f"(margin {margin}, job {job})")
        where = f"chart render {path.name}"
        rules = by_kind(docs(path), "PrometheusRule")
        if len(rules) != 1:
            fail(f"{where}: expected one PrometheusRule, found {len(rules)}")
        for rule in rules:
            check_prometheus_rule(where, rule, int(margin), job)
            if (int(margin), job) == (600, "regbroker") and rule["spec"]["groups"] != alert_groups():
                fail(f"{where}: with the defaults, the PrometheusRule's groups must be alerts.yaml's")
    for shape, file in args.no_monitoring_api:
        path = pathlib.Path(file)
        print(f"  chart render {path.name} ({shape}) without the monitoring.coreos.com API")
        check_without_monitoring_api(shape, path, docs(path))

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
        elif kind == "CustomResourceDefinition":
            check_crd(path, d)
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
