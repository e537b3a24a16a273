#!/usr/bin/env python3
"""Checks the per-cloud setup documents against the shipped manifests (called by deploy/check.sh).

deploy/clouds/ holds what the guides docs/src/guides/{eks,aks,gke}.md paste into a shell
(a heredoc expands their `${VAR}` placeholders): IAM trust and permission policies, the
Azure federated credential, the GCP bindings, the ServiceAccount each way needs, and the
Flux sources. `shape-sidecar.env` and `shape-standalone.env` name, for each shape, the
namespace, ServiceAccount, Deployment, files and Secret the guides work with.

This script renders every document with each shape's variables (plus example cloud values)
and checks what a user would otherwise find out from a refused token or a 401:

- each shape file names the ServiceAccount the shipped pod runs as (deploy/flux/ merged
  into the source-controller stand-in; deploy/standalone/), its Deployment and files, and
  a Secret that shape's `--sync-secret` writes;
- the IRSA trust policy's `sub` is `system:serviceaccount:NS:SA` of that ServiceAccount and
  its `aud` is sts.amazonaws.com; the Pod Identity trust policy trusts
  pods.eks.amazonaws.com with sts:AssumeRole and sts:TagSession, for that namespace and
  ServiceAccount; the ECR policy grants ecr:GetAuthorizationToken on * and the pull
  actions on repositories; the federated credential's subject is that ServiceAccount and
  its audience api://AzureADTokenExchange; the GCP members name that ServiceAccount;
- the ServiceAccount documents are that ServiceAccount, with the annotation of their way;
- the Flux sources are in the Secret's namespace and name that Secret in secretRef;
- the AKS guide's sed that uncomments the pod label, run on the shipped files, puts it
  where the webhook reads it (the pod template) and changes nothing else;
- the guides include only files that exist, every file here is included (written through
  a heredoc, whose text must hold nothing the shell would expand but `${NAME}`), every
  variable a file uses is set by the guide (or the shape), every shell block parses
  (`bash -n`, includes filled in), and every ServiceAccount a guide names
  (in `system:serviceaccount:`, `svc.id.goog[NS/SA]`, `/ns/NS/sa/SA`) is a shipped one.

tests/kube_deploy.rs also passes the rendered Flux sources and ServiceAccounts through a
server-side dry run on a real kube-apiserver with Flux's CRDs.
"""

import json
import pathlib
import re
import subprocess
import sys

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_manifests import docs, merge, sync_secrets  # noqa: E402

DEPLOY = pathlib.Path(__file__).resolve().parent
ROOT = DEPLOY.parent
CLOUDS = DEPLOY / "clouds"
GUIDES = ROOT / "docs" / "src" / "guides"
SHAPES = {"sidecar": DEPLOY / "flux", "standalone": DEPLOY / "standalone"}
SHAPE_KEYS = {
    "NAMESPACE", "SERVICE_ACCOUNT", "DEPLOYMENT", "DEPLOYMENT_FILE", "SERVICE_ACCOUNT_FILE",
    "SECRET_NAMESPACE", "SECRET_NAME",
}
# What each guide's variables would hold; every placeholder needs one.
EXAMPLES = {
    "ACCOUNT_ID": "123456789012",
    "REGION": "eu-west-1",
    "CLUSTER": "demo",
    "OIDC_PROVIDER": "oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE",
    "ROLE_NAME": "regbroker-ecr-pull",
    "REPOSITORY_PREFIX": "flux",
    "REGISTRY": "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
    "AKS_OIDC_ISSUER": "https://westeurope.oic.prod-aks.azure.com/00000000-0000-0000-0000-000000000000/11111111-1111-1111-1111-111111111111/",
    "IDENTITY_CLIENT_ID": "22222222-2222-2222-2222-222222222222",
    "PROJECT_ID": "my-project",
    "PROJECT_NUMBER": "123456789",
    "GSA_NAME": "regbroker",
}
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# The annotation each ServiceAccount document must carry (and no other).
SA_ANNOTATIONS = {
    "aws/serviceaccount-irsa.yaml": {"eks.amazonaws.com/role-arn"},
    "aws/serviceaccount-pod-identity.yaml": set(),
    "azure/serviceaccount.yaml": {"azure.workload.identity/client-id"},
    "gcp/serviceaccount-direct.yaml": set(),
    "gcp/serviceaccount-impersonation.yaml": {"iam.gke.io/gcp-service-account"},
}
AZURE_LABEL = "azure.workload.identity/use"

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}")


def read_env(path):
    """`export NAME=value` lines of a shape file."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"export ([A-Z_][A-Z0-9_]*)=([A-Za-z0-9_./-]+)", line)
        if not m:
            fail(f"{path.relative_to(ROOT)}:{n}: expected `export NAME=value`, got {line!r}")
            continue
        out[m[1]] = m[2]
    if set(out) != SHAPE_KEYS:
        fail(f"{path.relative_to(ROOT)}: sets {sorted(out)}; expected {sorted(SHAPE_KEYS)}")
    return out


def render(rel, values):
    """The file's text with its placeholders replaced, as the guides' heredocs do."""
    text = (CLOUDS / rel).read_text()
    missing = sorted({m for m in PLACEHOLDER.findall(text) if m not in values})
    if missing:
        fail(f"deploy/clouds/{rel}: placeholders with no value: {missing}")
    return PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), text)


def regbroker_container(dep):
    return next((c for c in dep["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "regbroker"), None)


def shipped_shapes():
    """For each shape: the Deployment as deployed, its ServiceAccount object, its Secrets."""
    stand_in = {d["kind"]: d for d in docs(DEPLOY / "flux" / "testdata" / "source-controller.yaml")}
    sidecar_patch = docs(DEPLOY / "flux" / "source-controller-patch.yaml")[0]
    sa_patch = docs(DEPLOY / "flux" / "serviceaccount-patch.yaml")[0]
    sidecar_dep = merge(stand_in["Deployment"], sidecar_patch)
    standalone = {d["kind"]: d for p in sorted(SHAPES["standalone"].glob("*.yaml")) for d in docs(p)}
    return {
        "sidecar": (sidecar_dep, merge(stand_in["ServiceAccount"], sa_patch)),
        "standalone": (standalone["Deployment"], standalone["ServiceAccount"]),
    }


def check_shape(shape, env, dep, sa, sed):
    where = f"deploy/clouds/shape-{shape}.env"
    ns = dep["metadata"]["namespace"]
    pod_sa = dep["spec"]["template"]["spec"].get("serviceAccountName", "default")
    if (env.get("NAMESPACE"), env.get("SERVICE_ACCOUNT")) != (ns, pod_sa):
        fail(f"{where}: NAMESPACE/SERVICE_ACCOUNT {env.get('NAMESPACE')}/{env.get('SERVICE_ACCOUNT')}"
             f" is not the ServiceAccount the shipped pod runs as ({ns}/{pod_sa})")
    if (sa["metadata"]["namespace"], sa["metadata"]["name"]) != (ns, pod_sa):
        fail(f"{where}: the shipped ServiceAccount is {sa['metadata']['namespace']}/"
             f"{sa['metadata']['name']}, not the pod's {ns}/{pod_sa}")
    if env.get("DEPLOYMENT") != dep["metadata"]["name"]:
        fail(f"{where}: DEPLOYMENT {env.get('DEPLOYMENT')} is not {dep['metadata']['name']}")
    if regbroker_container(dep) is None:
        fail(f"{where}: the shipped Deployment has no container regbroker (the guides exec into it)")
    secret = f"{env.get('SECRET_NAMESPACE')}/{env.get('SECRET_NAME')}"
    if secret not in sync_secrets(dep):
        fail(f"{where}: Secret {secret} is not one the shipped --sync-secret writes ({sync_secrets(dep)})")
    dep_file = SHAPES[shape] / env.get("DEPLOYMENT_FILE", "?")
    if not dep_file.is_file():
        fail(f"{where}: DEPLOYMENT_FILE {dep_file.name} is not a file of {SHAPES[shape].relative_to(ROOT)}")
    else:
        # The guides set the registry with sed on the one --sink-registry= line.
        n = dep_file.read_text().count("- --sink-registry=")
        if n != 1:
            fail(f"{dep_file.relative_to(ROOT)}: the guides' sed expects one `- --sink-registry=` line, found {n}")
        n = dep_file.read_text().count("image: ghcr.io/regbroker/regbroker:")
        if n != 1:
            fail(f"{dep_file.relative_to(ROOT)}: the guides' sed expects one `image: ghcr.io/regbroker/regbroker:` line, found {n}")
        check_azure_label(dep_file, sed)
    sa_file = SHAPES[shape] / env.get("SERVICE_ACCOUNT_FILE", "?")
    objs = docs(sa_file) if sa_file.is_file() else []
    if [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs] != [
            ("ServiceAccount", ns, pod_sa)]:
        fail(f"{where}: SERVICE_ACCOUNT_FILE {sa_file.name} is not the ServiceAccount {ns}/{pod_sa} alone"
             " (the guides replace that file)")


# The AKS guide uncomments the pod label with `sed -i -E 's,PATTERN,REPLACEMENT,' "$DEPLOYMENT_FILE"`.
AKS_SED = re.compile(r"sed -i -E 's,([^,]+),([^,]+),' \"\$DEPLOYMENT_FILE\"")


def aks_label_sed():
    """The AKS guide's sed that uncomments the pod label, as (pattern, replacement)."""
    page = GUIDES / "aks.md"
    found = AKS_SED.findall(page.read_text()) if page.is_file() else []
    if len(found) != 1:
        fail(f"docs/src/guides/aks.md: expected one `sed -i -E 's,...,...,' \"$DEPLOYMENT_FILE\"` that"
             f" uncomments the pod label {AZURE_LABEL}, found {len(found)}")
        return None
    pattern, repl = found[0]
    return re.compile(pattern), repl


def check_azure_label(path, sed):
    """The AKS guide's sed, run on the shipped file, puts the label in the pod template."""
    if sed is None:
        return
    pattern, repl = sed
    text = path.read_text()
    lines = text.splitlines()
    edited = [pattern.sub(repl, l) for l in lines]
    if edited == lines:
        fail(f"{path.relative_to(ROOT)}: the AKS guide's sed changes nothing (no commented {AZURE_LABEL} label)")
        return
    try:
        (obj,) = [d for d in yaml.safe_load_all("\n".join(edited)) if d]
    except (yaml.YAMLError, ValueError) as e:
        fail(f"{path.relative_to(ROOT)}: after the AKS guide's sed it is not one YAML object: {e}")
        return
    before = [d for d in yaml.safe_load_all(text) if d][0]
    labels = obj["spec"]["template"].get("metadata", {}).get("labels", {})
    if labels.get(AZURE_LABEL) != "true":
        fail(f"{path.relative_to(ROOT)}: after the AKS guide's sed, {AZURE_LABEL} is not a pod template label")
    obj["spec"]["template"]["metadata"]["labels"].pop(AZURE_LABEL, None)
    if not obj["spec"]["template"]["metadata"]["labels"]:
        obj["spec"]["template"]["metadata"].pop("labels")
    if not obj["spec"]["template"]["metadata"]:
        obj["spec"]["template"].pop("metadata")
    if obj != before:
        fail(f"{path.relative_to(ROOT)}: the AKS guide's sed changes more than the pod label")


def statements(policy, where):
    st = policy.get("Statement")
    if policy.get("Version") != "2012-10-17" or not isinstance(st, list) or not st:
        fail(f"{where}: expected Version 2012-10-17 and a list of statements")
        return []
    return st


def actions(st):
    a = st.get("Action", [])
    return {a} if isinstance(a, str) else set(a)


def check_aws(env, subject):
    values = {**EXAMPLES, **env}
    where = "deploy/clouds/aws/trust-policy-irsa.json"
    oidc = values["OIDC_PROVIDER"]
    for st in statements(json.loads(render("aws/trust-policy-irsa.json", values)), where):
        if st.get("Principal") != {"Federated": f"arn:aws:iam::{values['ACCOUNT_ID']}:oidc-provider/{oidc}"}:
            fail(f"{where}: the principal must be the cluster's IAM OIDC provider, got {st.get('Principal')}")
        if actions(st) != {"sts:AssumeRoleWithWebIdentity"}:
            fail(f"{where}: Action must be sts:AssumeRoleWithWebIdentity, got {st.get('Action')}")
        eq = st.get("Condition", {}).get("StringEquals", {})
        if eq.get(f"{oidc}:sub") != subject:
            fail(f"{where}: {oidc}:sub is {eq.get(f'{oidc}:sub')!r}; the pod's ServiceAccount is {subject}")
        if eq.get(f"{oidc}:aud") != "sts.amazonaws.com":
            fail(f"{where}: {oidc}:aud must be sts.amazonaws.com, got {eq.get(f'{oidc}:aud')!r}")

    where = "deploy/clouds/aws/trust-policy-pod-identity.json"
    for st in statements(json.loads(render("aws/trust-policy-pod-identity.json", values)), where):
        if st.get("Principal") != {"Service": "pods.eks.amazonaws.com"}:
            fail(f"{where}: the principal must be the service pods.eks.amazonaws.com")
        if actions(st) != {"sts:AssumeRole", "sts:TagSession"}:
            fail(f"{where}: Action must be sts:AssumeRole and sts:TagSession, got {st.get('Action')}")
        eq = st.get("Condition", {}).get("StringEquals", {})
        got = (eq.get("aws:RequestTag/kubernetes-namespace"), eq.get("aws:RequestTag/kubernetes-service-account"))
        if got != (env["NAMESPACE"], env["SERVICE_ACCOUNT"]):
            fail(f"{where}: the session-tag conditions name {got}; the pod's ServiceAccount is {subject}")

    where = "deploy/clouds/aws/ecr-pull-policy.json"
    sts = statements(json.loads(render("aws/ecr-pull-policy.json", values)), where)
    if not any(st.get("Effect") == "Allow" and "ecr:GetAuthorizationToken" in actions(st)
               and st.get("Resource") == "*" for st in sts):
        fail(f"{where}: must allow ecr:GetAuthorizationToken on * (regbroker's one call)")
    pull = {"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
    repo = f"arn:aws:ecr:{values['REGION']}:{values['ACCOUNT_ID']}:repository/"
    if not any(st.get("Effect") == "Allow" and pull <= actions(st)
               and str(st.get("Resource", "")).startswith(repo) for st in sts):
        fail(f"{where}: must allow {sorted(pull)} on repositories ({repo}...), for the pulls the token makes")


def check_azure(env, subject):
    values = {**EXAMPLES, **env}
    where = "deploy/clouds/azure/federated-credential.json"
    props = json.loads(render("azure/federated-credential.json", values)).get("properties", {})
    if props.get("subject") != subject:
        fail(f"{where}: subject is {props.get('subject')!r}; the pod's ServiceAccount is {subject}")
    if props.get("audiences") != ["api://AzureADTokenExchange"]:
        fail(f"{where}: audiences must be [api://AzureADTokenExchange], got {props.get('audiences')}")
    if props.get("issuer") != values["AKS_OIDC_ISSUER"]:
        fail(f"{where}: issuer must be the cluster's OIDC issuer (AKS_OIDC_ISSUER)")


def check_gcp(env):
    values = {**EXAMPLES, **env}
    where = "deploy/clouds/gcp/bindings.yaml"
    b = yaml.safe_load(render("gcp/bindings.yaml", values))
    ns, sa, project = env["NAMESPACE"], env["SERVICE_ACCOUNT"], values["PROJECT_ID"]
    principal = (f"principal://iam.googleapis.com/projects/{values['PROJECT_NUMBER']}/locations/global/"
                 f"workloadIdentityPools/{project}.svc.id.goog/subject/ns/{ns}/sa/{sa}")
    want = {
        "direct": [("artifact-registry-repository", "roles/artifactregistry.reader", principal)],
        "impersonation": [
            ("artifact-registry-repository", "roles/artifactregistry.reader",
             f"serviceAccount:{values['GSA_NAME']}@{project}.iam.gserviceaccount.com"),
            ("google-service-account", "roles/iam.workloadIdentityUser",
             f"serviceAccount:{project}.svc.id.goog[{ns}/{sa}]"),
        ],
    }
    for way, expected in want.items():
        got = [(e.get("resource"), e.get("role"), e.get("member")) for e in b.get(way, [])]
        if got != expected:
            fail(f"{where}: {way} grants {got}; for {ns}/{sa} expected {expected}")


def check_serviceaccounts(env):
    values = {**EXAMPLES, **env}
    for rel, keys in SA_ANNOTATIONS.items():
        where = f"deploy/clouds/{rel}"
        objs = [d for d in yaml.safe_load_all(render(rel, values)) if d]
        if len(objs) != 1 or objs[0].get("kind") != "ServiceAccount" or objs[0].get("apiVersion") != "v1":
            fail(f"{where}: expected one v1 ServiceAccount")
            continue
        meta = objs[0]["metadata"]
        if (meta.get("namespace"), meta.get("name")) != (env["NAMESPACE"], env["SERVICE_ACCOUNT"]):
            fail(f"{where}: names {meta.get('namespace')}/{meta.get('name')}, not the pod's ServiceAccount")
        if set(meta.get("annotations") or {}) != keys:
            fail(f"{where}: annotations {sorted(meta.get('annotations') or {})}; expected {sorted(keys)}")


def check_flux(env, dep):
    values = {**EXAMPLES, **env}
    where = "deploy/clouds/flux-sources.yaml"
    objs = [d for d in yaml.safe_load_all(render("flux-sources.yaml", values)) if d]
    kinds = sorted(o["kind"] for o in objs)
    if kinds != ["HelmChart", "HelmRepository", "OCIRepository"]:
        fail(f"{where}: expected a HelmRepository, a HelmChart and an OCIRepository, got {kinds}")
    repos = {}
    for o in objs:
        meta, spec = o["metadata"], o.get("spec", {})
        if o.get("apiVersion") != "source.toolkit.fluxcd.io/v1":
            fail(f"{where}: {o['kind']} apiVersion must be source.toolkit.fluxcd.io/v1")
        if meta.get("namespace") != env["SECRET_NAMESPACE"]:
            fail(f"{where}: {o['kind']} is in {meta.get('namespace')}; a secretRef reaches only its own"
                 f" namespace, {env['SECRET_NAMESPACE']}")
        if o["kind"] == "HelmChart":
            ref = spec.get("sourceRef", {})
            if ref.get("kind") != "HelmRepository":
                fail(f"{where}: the HelmChart's sourceRef must be a HelmRepository")
            repos.setdefault("chart", ref.get("name"))
            continue
        secret = f"{meta.get('namespace')}/{spec.get('secretRef', {}).get('name')}"
        if secret not in sync_secrets(dep):
            fail(f"{where}: {o['kind']} secretRef {secret} is not a Secret the shape writes ({sync_secrets(dep)})")
        if spec.get("provider", "generic") != "generic":
            fail(f"{where}: {o['kind']} provider must stay generic (the Secret is the credential)")
        url = str(spec.get("url", ""))
        if not url.startswith(f"oci://{values['REGISTRY']}/"):
            fail(f"{where}: {o['kind']} url {url} is not on the registry regbroker syncs (REGISTRY)")
        if o["kind"] == "HelmRepository":
            if spec.get("type") != "oci":
                fail(f"{where}: the HelmRepository must be of type oci")
            repos["repo"] = meta.get("name")
    if repos.get("chart") != repos.get("repo"):
        fail(f"{where}: the HelmChart's sourceRef {repos.get('chart')} is not the HelmRepository {repos.get('repo')}")


# Where a guide names a ServiceAccount.
SA_MENTIONS = [
    re.compile(r"system:serviceaccount:([^:\s\"'`]+):([^\s\"'`]+)"),
    re.compile(r"svc\.id\.goog\[([^/\]]+)/([^\]]+)\]"),
    re.compile(r"/subject/ns/([^/\s]+)/sa/([^\s\"'`]+)"),
]
ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Z_][A-Z0-9_]*)=", re.M)
INCLUDE = re.compile(r"\{\{#include ([^}\s]+)\}\}")
# A file pasted into a shell heredoc (`cat > FILE <<EOF`, the include, `EOF`): the shell
# expands `${NAME}` in it, and would also run `$(...)` and backticks and eat backslashes.
HEREDOC_INCLUDE = re.compile(r"<<EOF\n\{\{#include ([^}\s]+)\}\}\nEOF\n")
SHELL_SPECIAL = re.compile(r"`|\\|\$(?!\{[A-Za-z_][A-Za-z0-9_]*\})")


def norm(s):
    """`$VAR` and `${VAR}` alike."""
    return re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", r"${\1}", s.replace("${", "$").replace("}", ""))


def check_guides(shipped_sas, shape_envs):
    pages = sorted(GUIDES.glob("*.md"))
    if [p.name for p in pages] != ["aks.md", "eks.md", "gke.md"]:
        fail(f"docs/src/guides/: expected aks.md, eks.md and gke.md, found {[p.name for p in pages]}")
    included = set()
    heredoc = set()
    shape_vars = set().union(*shape_envs.values())
    placeholders = {f"${{{k}}}" for k in shape_vars} | {"${NAMESPACE}", "${SERVICE_ACCOUNT}"}
    gcp_members = set()
    gcp_roles = set()
    raw = yaml.safe_load((CLOUDS / "gcp" / "bindings.yaml").read_text())
    for entries in raw.values():
        for e in entries:
            gcp_members.add(norm(e["member"]))
            gcp_roles.add(e["role"])
    for page in pages:
        rel = page.relative_to(ROOT)
        text = page.read_text()
        assigned = set(ASSIGNMENT.findall(text))
        for inc in INCLUDE.findall(text):
            target = (page.parent / inc.split(":")[0]).resolve()
            if not target.is_file():
                fail(f"{rel}: {{{{#include {inc}}}}} names no file")
                continue
            included.add(target)
            if CLOUDS in target.parents:
                used = set(PLACEHOLDER.findall(target.read_text()))
                unset = sorted(used - assigned - shape_vars)
                if unset:
                    fail(f"{rel}: includes {target.relative_to(ROOT)}, whose {unset} the page never sets")
        for inc in HEREDOC_INCLUDE.findall(text):
            target = (page.parent / inc).resolve()
            if target.is_file():
                heredoc.add(target)
                for n, line in enumerate(target.read_text().splitlines(), 1):
                    if SHELL_SPECIAL.search(line):
                        fail(f"{target.relative_to(ROOT)}:{n}: {rel} pastes it into a heredoc, where the"
                             f" shell would expand or drop part of {line.strip()!r}")
        # Every shell block, with its includes filled in as mdBook does, parses.
        expanded = INCLUDE.sub(lambda m: (page.parent / m[1]).read_text().rstrip("\n")
                               if (page.parent / m[1]).is_file() else m[0], text)
        for n, block in enumerate(re.findall(r"^```bash\n(.*?)^```$", expanded, re.M | re.S), 1):
            r = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True)
            if r.returncode != 0:
                fail(f"{rel}: bash block {n} does not parse: {r.stderr.strip()}")
        for pattern in SA_MENTIONS:
            for m in pattern.finditer(text):
                ns, sa = m[1], m[2].rstrip(".,;)")
                if (ns, sa) in shipped_sas or {ns, sa} <= placeholders | {"$NAMESPACE", "$SERVICE_ACCOUNT"}:
                    continue
                fail(f"{rel}: names ServiceAccount {ns}/{sa} in {m[0]!r}; the shipped ones are"
                     f" {sorted(shipped_sas)}")
        if page.name == "gke.md":
            for m in re.finditer(r"--member[= ]\"?([^\"\s]+)\"?", text):
                if norm(m[1]) not in gcp_members:
                    fail(f"{rel}: --member {m[1]} is not a member of deploy/clouds/gcp/bindings.yaml")
            for m in re.finditer(r"--role[= ]\"?([^\"\s]+)\"?", text):
                if m[1] not in gcp_roles:
                    fail(f"{rel}: --role {m[1]} is not a role of deploy/clouds/gcp/bindings.yaml")
    for f in sorted(CLOUDS.rglob("*")):
        if f.is_file() and f.resolve() not in included:
            fail(f"{f.relative_to(ROOT)}: no guide includes it")
        # Everything but the shape files and the bindings (shown for reference) is written
        # by the user through a heredoc.
        elif f.is_file() and f.suffix != ".env" and f.name != "bindings.yaml" and f.resolve() not in heredoc:
            fail(f"{f.relative_to(ROOT)}: no guide writes it with `cat > FILE <<EOF`")


def main():
    shapes = shipped_shapes()
    envs = {}
    shipped_sas = set()
    sed = aks_label_sed()
    for shape, (dep, sa) in shapes.items():
        env = read_env(CLOUDS / f"shape-{shape}.env")
        envs[shape] = env
        shipped_sas.add((dep["metadata"]["namespace"], dep["spec"]["template"]["spec"]["serviceAccountName"]))
        print(f"  shape {shape}: {env.get('NAMESPACE')}/{env.get('SERVICE_ACCOUNT')},"
              f" Secret {env.get('SECRET_NAMESPACE')}/{env.get('SECRET_NAME')}")
        check_shape(shape, env, dep, sa, sed)
        if failures:
            continue
        subject = f"system:serviceaccount:{env['NAMESPACE']}:{env['SERVICE_ACCOUNT']}"
        check_aws(env, subject)
        check_azure(env, subject)
        check_gcp(env)
        check_serviceaccounts(env)
        check_flux(env, dep)
    check_guides(shipped_sas, envs)
    if failures:
        print(f"{len(failures)} cloud guide check(s) failed")
        return 1
    print("cloud guides ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
