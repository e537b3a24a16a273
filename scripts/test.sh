#!/usr/bin/env bash
# The test command: sets up every test peer it can, then runs the workspace's tests with
# the peer tests included and nothing silently skipped:
#
#   cargo test --workspace [CARGO_ARGS...] -- --include-ignored --skip e2e_real_cloud_ \
#     [--skip NAME...] [TEST_ARGS...]
#
# Peer tests are `#[ignore = "needs PEER, PEER: run scripts/test.sh"]`: plain `cargo test`
# (the fast unit loop) lists them as ignored; here they run, and a peer missing at that
# point is a test failure. Peers, in this order:
#   1. Debian packages docker-registry, apache2-utils (htpasswd), skopeo and
#      amazon-ecr-credential-helper (docker-credential-ecr-login); as root, also
#      ca-certificates, curl, g++ and shellcheck (the rest of .ci/run needs them), and
#      python3-venv when python3 cannot make a venv. As root with apt-get: one
#      `apt-get update` and an install of whatever `dpkg -s` says is missing (nothing when
#      all are there). Otherwise a missing peer package stops the script with the list of
#      packages to install, unless --skip-missing: then the tests needing them are left
#      out (`--skip NAME`) and listed, with why.
#   2. The Python peers (moto_server, gcplocal, oras) and deploy/check.sh's linters, in a
#      venv at ${REGBROKER_VENV:-.ci/.venv} (relative to the repository) from
#      .ci/requirements.txt; pip runs only when the requirements changed since the last
#      install (their sha256 is kept in the venv). The venv's bin/ goes first on PATH.
#   3. The Go-built peers (etcd, kube-apiserver, helm, ...): `scripts/peers.sh`, which
#      builds what its cache lacks; its NAME=PATH lines go to a temporary file named by
#      REGBROKER_PEERS_FILE for the tests.
# Never run here: the real-cloud tests (`e2e_real_cloud_*`, see deploy/e2e/README.md) and every
# other ignored test whose reason does not start with "needs " (the soak, child-process
# helpers); they are listed when left out.
#
# Usage: scripts/test.sh [--setup-only] [--skip-missing] [--no-install] [CARGO_ARGS...]
#                        [-- TEST_ARGS...]
#   --setup-only    set up the peers, run no test (.ci/run calls this first)
#   --env-file F    with --setup-only: write to F, for `source F` by another script
#                   (scripts/mutants.sh), the PATH with the venv, REGBROKER_PEERS_FILE
#                   (kept next to F as F.peers) and `test_args`, the test-binary
#                   arguments this script would use (--include-ignored and the --skips)
#   --skip-missing  leave out the tests whose peers are missing instead of stopping
#                   (also REGBROKER_TEST_SKIP_MISSING=1)
#   --no-install    never run apt-get, even as root (missing packages are then reported
#                   as for a non-root user)
# Everything else before `--` goes to cargo (`-p regbroker --test clients`, `--release`, a
# test-name filter, ...; `--no-fail-fast` is the default); `--workspace` is added unless a package is
# named with -p/--package (cargo would otherwise ignore -p). Everything after `--` goes to
# the test binaries after this script's own flags, so a filter there narrows the run
# (`-- skopeo`, `-- --nocapture`). With `--exact` in TEST_ARGS the `--skip` filters match
# whole names only, so `e2e_real_cloud_` no longer excludes anything: name tests exactly.
# Examples:
#   scripts/test.sh                                   # everything (what .ci/run runs)
#   scripts/test.sh -p regbroker --test clients       # one test binary, peers included
#   scripts/test.sh -p regbroker --test clients -- skopeo  # only names containing "skopeo"
#   scripts/test.sh --skip-missing                    # as a user without root
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
log() { printf 'test.sh: %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "$0"; }

# --- Arguments ----------------------------------------------------------------------------
setup_only=
skip_missing=
[[ ${REGBROKER_TEST_SKIP_MISSING:-} == 1 ]] && skip_missing=1
no_install=
env_file=
cargo_args=()
test_args=()
while (($#)); do
  case $1 in
    --setup-only) setup_only=1 ;;
    --skip-missing) skip_missing=1 ;;
    --no-install) no_install=1 ;;
    --env-file)
      (($# >= 2)) || die "--env-file needs a file name"
      env_file=$2
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    --)
      shift
      test_args=("$@")
      break
      ;;
    *) cargo_args+=("$1") ;;
  esac
  shift
done
venv=${REGBROKER_VENV:-$PWD/.ci/.venv}
workspace=(--workspace)
for a in "${cargo_args[@]}"; do
  case $a in
    -p | -p?* | --package | --package=* | --workspace | --all) workspace=() ;;
  esac
done

# --- Which tests need what --------------------------------------------------------------
# Every test function in the workspace's sources, as FILE<TAB>NAME<TAB>STATE<TAB>REASON:
# STATE is "ignored" (REASON from its `#[ignore = "..."]`) or "run".
all_tests() {
  local files
  mapfile -t files < <(grep -rlE --include='*.rs' '#\[([a-z_]+::)?test' src tests providers 2>/dev/null || true)
  ((${#files[@]})) || return 0
  awk '
    /^[[:space:]]*#\[([a-z_]+::)?test([[:space:]]*\(.*\))?\][[:space:]]*$/ { test = 1; next }
    /^[[:space:]]*#\[ignore[[:space:]]*=[[:space:]]*"/ {
      reason = $0; sub(/^[^"]*"/, "", reason); sub(/"[[:space:]]*\][[:space:]]*$/, "", reason)
      ignored = 1; next
    }
    /^[[:space:]]*#\[ignore\][[:space:]]*$/ { reason = ""; ignored = 1; next }
    /^[[:space:]]*(pub[[:space:]]+)?(async[[:space:]]+)?fn[[:space:]]/ {
      if (test) {
        name = $0; sub(/^.*fn[[:space:]]+/, "", name); sub(/[^A-Za-z0-9_].*$/, "", name)
        print FILENAME "\t" name "\t" (ignored ? "ignored" : "run") "\t" reason
      }
      test = 0; ignored = 0; reason = ""
    }
  ' "${files[@]}"
}

# missing[TOKEN]=why: peers found missing; a test whose "needs ..." list names TOKEN is
# left out under --skip-missing.
declare -A missing=()
skip_args=()
left_out=()

# --- 1. Debian packages -------------------------------------------------------------------
# package -> the binary the tests look for on PATH
peer_packages=(docker-registry apache2-utils skopeo amazon-ecr-credential-helper)
declare -A peer_binary=(
  [docker-registry]=docker-registry
  [apache2-utils]=htpasswd
  [skopeo]=skopeo
  [amazon-ecr-credential-helper]=docker-credential-ecr-login
)
tool_packages=(ca-certificates curl g++ shellcheck)

dpkg_installed() { dpkg -s "$1" 2>/dev/null | grep -qx 'Status: install ok installed'; }

if [[ $(id -u) == 0 && -z $no_install ]] && command -v apt-get >/dev/null; then
  wanted=("${tool_packages[@]}" "${peer_packages[@]}")
  if [[ ! -x $venv/bin/pip ]] && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    wanted+=(python3 python3-venv)
  fi
  install=()
  for p in "${wanted[@]}"; do dpkg_installed "$p" || install+=("$p"); done
  if ((${#install[@]})); then
    log "installing Debian packages: ${install[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${install[@]}" >/dev/null
  else
    log "Debian packages: all installed"
  fi
fi
absent_packages=()
for p in "${peer_packages[@]}"; do
  b=${peer_binary[$p]}
  if ! command -v "$b" >/dev/null; then
    absent_packages+=("$p")
    missing[$b]="\`$b\` is not on PATH (Debian package $p)"
  fi
done
if ((${#absent_packages[@]})) && [[ -z $skip_missing ]]; then
  die "missing test peers: install the Debian packages with
    sudo apt-get install ${absent_packages[*]}
  (run as root, this script installs them itself), or run with --skip-missing to leave
  out the tests that need them"
fi

# --- 2. Python peers in a venv ------------------------------------------------------------
requirements=.ci/requirements.txt
stamp=$venv/.regbroker-requirements.sha256
want=$(sha256sum "$requirements" | cut -d' ' -f1)
python_ok=1
if [[ ! -x $venv/bin/pip ]]; then
  log "creating the venv $venv"
  python3 -m venv "$venv" || python_ok=
fi
if [[ -n $python_ok && $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
  log "installing $requirements into $venv"
  if "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"; then
    printf '%s\n' "$want" >"$stamp"
  else
    python_ok=
  fi
elif [[ -n $python_ok ]]; then
  log "venv $venv: $requirements unchanged since the last install"
fi
if [[ -z $python_ok ]]; then
  [[ -n $skip_missing ]] \
    || die "cannot set up the venv $venv from $requirements (see above); python3 with venv and pip is needed (Debian: python3-venv)"
  rm -f "$stamp"
fi
export PATH="$venv/bin:$PATH"
python_missing=()
for b in python3 moto_server gcplocal; do
  if ! command -v "$b" >/dev/null; then
    python_missing+=("$b")
    missing[$b]="\`$b\` is not on PATH (venv $venv, $requirements)"
  fi
done
if ! python3 -c 'import oras.client' 2>/dev/null; then
  python_missing+=(oras)
  missing[oras]="the oras Python client is not importable (venv $venv, $requirements)"
fi
if ((${#python_missing[@]})) && [[ -z $skip_missing ]]; then
  die "the venv $venv lacks ${python_missing[*]} after installing $requirements (remove $stamp to reinstall)"
fi

# --- 3. Go-built peers ----------------------------------------------------------------------
peers_file=$(mktemp "${TMPDIR:-/tmp}/regbroker-peers.XXXXXX")
trap 'rm -f "$peers_file"' EXIT
if bash scripts/peers.sh >"$peers_file"; then
  export REGBROKER_PEERS_FILE=$peers_file
else
  [[ -n $skip_missing ]] || die "scripts/peers.sh failed (see above)"
  missing[scripts/peers.sh]="scripts/peers.sh failed"
fi

# --- Which tests run ------------------------------------------------------------------------
# Left out by name: the real-cloud tests (by prefix), every other ignored test whose reason
# is not "needs ...", and (--skip-missing) the peer tests whose peers are missing.
real_cloud=e2e_real_cloud_
other=()
declare -A skip_names=()
kept=()
while IFS=$'\t' read -r file name state reason; do
  if [[ $state != ignored ]]; then
    kept+=("$file::$name")
    continue
  fi
  case $reason in
    "needs "*)
      needs=${reason#needs }
      needs=${needs%%[:;]*}
      read -r -a tokens <<<"${needs//,/ }"
      why=
      for t in "${tokens[@]}"; do
        if [[ -n ${missing[$t]:-} ]]; then why+="${why:+; }${missing[$t]}"; fi
      done
      if [[ -n $why ]]; then
        skip_names[$name]=1
        left_out+=("$file::$name: $why")
      else
        kept+=("$file::$name")
      fi
      ;;
    *)
      [[ $name == "$real_cloud"* ]] || skip_names[$name]=1
      other+=("$file::$name (${reason:-no reason given})")
      ;;
  esac
done < <(all_tests)
# `--skip X` leaves out every test whose name contains X: none that should run may.
for t in "${kept[@]}"; do
  for f in "$real_cloud" "${!skip_names[@]}"; do
    [[ ${t##*::} != *"$f"* ]] \
      || die "--skip $f would also leave out $t, which should run: rename one of them"
  done
done
for n in "${!skip_names[@]}"; do skip_args+=(--skip "$n"); done

if ((${#other[@]})); then
  log "not run here (ignored, and not for a peer):"
  printf '  %s\n' "${other[@]}" >&2
fi
if ((${#left_out[@]})); then
  log "LEFT OUT because of --skip-missing (${#left_out[@]} tests):"
  printf '  %s\n' "${left_out[@]}" >&2
fi

if [[ -n $env_file ]]; then
  [[ -n $setup_only ]] || die "--env-file goes with --setup-only"
  cp "$peers_file" "$env_file.peers"
  {
    printf 'export PATH=%q\n' "$PATH"
    printf 'export REGBROKER_PEERS_FILE=%q\n' "$(realpath "$env_file.peers")"
    printf 'test_args=(--include-ignored --skip %q' "$real_cloud"
    printf ' %q' "${skip_args[@]}"
    printf ')\n'
  } >"$env_file"
fi
if [[ -n $setup_only ]]; then
  log "setup done in $((SECONDS - started)) s; peers: venv $venv, $(tr '\n' ' ' <"$peers_file")"
  exit 0
fi

# --- Run ------------------------------------------------------------------------------------
# Every test binary runs even after one fails (cargo stops at the first by default, which
# once hid what the binaries after it would have said), unless told otherwise.
fail_fast=(--no-fail-fast)
for a in "${cargo_args[@]}"; do [[ $a != --no-fail-fast ]] || fail_fast=(); done
cmd=(cargo test "${workspace[@]}" "${fail_fast[@]}" "${cargo_args[@]}" -- --include-ignored --skip "$real_cloud"
  "${skip_args[@]}" "${test_args[@]}")
log "running: ${cmd[*]}"
out=$(mktemp "${TMPDIR:-/tmp}/regbroker-test.XXXXXX")
trap 'rm -f "$peers_file" "$out"' EXIT
set +e
"${cmd[@]}" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
read -r passed failed ignored filtered < <(awk '
  /^test result: / {
    for (i = 1; i <= NF; i++) {
      if ($(i + 1) ~ /^passed;/) p += $i
      if ($(i + 1) ~ /^failed;/) f += $i
      if ($(i + 1) ~ /^ignored;/) g += $i
      if ($(i + 1) == "filtered") o += $i
    }
  }
  END { print p + 0, f + 0, g + 0, o + 0 }
' "$out")
if ((rc == 0)); then verdict=PASSED; else verdict="FAILED (cargo exit $rc)"; fi
if ((${#left_out[@]})); then
  log "LEFT OUT because of --skip-missing (${#left_out[@]} tests):"
  printf '  %s\n' "${left_out[@]}" >&2
  verdict+=", BUT ${#left_out[@]} PEER TESTS WERE LEFT OUT (--skip-missing, listed above)"
fi
printf 'test.sh: %s: %s passed, %s failed, %s ignored, %s filtered out (real-cloud, other non-peer ignored and left-out tests) in %s s\n' \
  "$verdict" "$passed" "$failed" "$ignored" "$filtered" "$((SECONDS - started))"
exit "$rc"
