#!/usr/bin/env bash
# Builds the real Kubernetes test peers from source through the Go module proxy (DESIGN.md
# section 7), or finds them in the cache, and prints one NAME=PATH line per peer on stdout:
#   kube-apiserver=...  kube-controller-manager=...  kubectl=...  etcd=...
#   source-controller=...  source-controller-crds=DIR  helm=...  actionlint=...
#   prometheus=...  promtool=...  prometheus-operator-crds=DIR  registry-token-server=...
#   crane=...  kubelet-credential-harness=...
# Everything else (progress, build times, errors) goes to stderr.
#
# Usage: scripts/peers.sh [--only NAME[,NAME...]] [--print-versions] [--help]
# Cache: ${REGBROKER_PEERS_DIR:-$HOME/.cache/regbroker-peers}/<name>-<version>/<binary>;
# build logs in <cache>/logs/. A cached peer costs no Go invocation at all.
# Needs: Go >= 1.26 (GO=/path/to/go, else `go` on PATH, else /usr/local/go/bin/go).
#
# Verified loopback control plane with these builds (kube-apiserver 1.37 refuses a loopback
# --advertise-address with the default lease endpoint reconciler, hence
# --endpoint-reconciler-type=none):
#   etcd --data-dir D --listen-client-urls http://127.0.0.1:P --advertise-client-urls \
#     http://127.0.0.1:P --listen-peer-urls http://127.0.0.1:P2 --unsafe-no-fsync
#   kube-apiserver --etcd-servers=http://127.0.0.1:P --bind-address=127.0.0.1 \
#     --advertise-address=127.0.0.1 --secure-port=P3 --cert-dir=D/certs \
#     --token-auth-file=D/tokens.csv --service-account-issuer=https://kubernetes.default.svc.cluster.local \
#     --service-account-key-file=D/sa.pub --service-account-signing-key-file=D/sa.key \
#     --authorization-mode=RBAC --service-cluster-ip-range=10.0.0.0/24 \
#     --disable-admission-plugins=ServiceAccount --endpoint-reconciler-type=none
#   kube-controller-manager --kubeconfig=K --authentication-kubeconfig=K \
#     --authentication-skip-lookup --authorization-kubeconfig=K \
#     --controllers=garbagecollector,namespace,clusterrole-aggregation \
#     --use-service-account-credentials=false --leader-elect=false \
#     --bind-address=127.0.0.1 --secure-port=P4 --tls-cert-file=C --tls-private-key-file=CK
#   (K: the admin's kubeconfig; a user in system:kube-controller-manager alone is refused
#   the deletes and ClusterRole patches unless --use-service-account-credentials=true)
# Verified Prometheus (built without the web UI assets: /-/ready, /-/healthy, /metrics and
# /api/v1/* work, the UI pages answer 500); evaluation_interval: 1s and rule_files (relative
# to the config file) go in the config; the hidden flag starts scraping after ~1 s, not ~5 s:
#   prometheus --config.file=C --storage.tsdb.path=D/data --web.listen-address=127.0.0.1:P \
#     --scrape.discovery-reload-interval=1s
#   promtool check metrics <EXPOSITION (stdin only; exit 0 clean, 3 lint problems, 1 error)
# Verified token auth (registry-token-server: distribution's own token server, plain HTTP on
# loopback; K an "EC PRIVATE KEY" or "RSA PRIVATE KEY" PEM, not PKCS#8, C a self-signed cert
# of K; H a bcrypt htpasswd; tokens are only granted for repositories named USER/...):
#   registry-token-server -addr 127.0.0.1:P -issuer I -realm R -passwd H -key K
#   docker-registry serve CONFIG, CONFIG with auth: token: {realm: http://127.0.0.1:P/token/,
#     service: S, issuer: I, rootcertbundle: C}; the realm path is /token/, slash included
set -euo pipefail

# --- Pinned versions: the only place to change them -------------------------------------
# k8s.io/kubernetes (kube-apiserver, kube-controller-manager, kubectl); newest release on
# the proxy that builds with Go 1.26.
KUBE_VERSION=v1.37.2
# go.etcd.io/etcd/server/v3; newest 3.6 patch (the etcd line Kubernetes 1.34+ documents).
ETCD_VERSION=v3.6.16
# github.com/fluxcd/source-controller; v1.10.x needs Go >= 1.27, so the newest v1.9.
SOURCE_CONTROLLER_VERSION=v1.9.6
# Extra replace for it: the proxy refuses fluxcd/pkg/artifact v0.18.2/v0.18.3 (403); v0.18.1 has the same code.
SOURCE_CONTROLLER_REPLACES=github.com/fluxcd/pkg/artifact=github.com/fluxcd/pkg/artifact@v0.18.1
# helm.sh/helm/v4 (the Helm CLI); v4 is the current major, v3 is end of life.
HELM_VERSION=v4.3.2
# github.com/rhysd/actionlint (lints .github/workflows in deploy/check.sh; shellcheck, which
# CI installs, checks the workflows' run: scripts through it).
ACTIONLINT_VERSION=v1.7.12
# github.com/prometheus/prometheus (prometheus, promtool): the module is tagged v0.3MM.P for
# Prometheus 3.MM.P (its VERSION file says 3.16.0 for v0.316.0); newest on the proxy, and its
# go.mod asks for Go 1.26.7, so Go 1.26 builds it. The version ldflags come from VERSION.
PROMETHEUS_VERSION=v0.316.0
# github.com/prometheus-operator/prometheus-operator (the root module, whose zip holds
# example/prometheus-operator-crd/): newest the proxy serves; it refuses v0.95.0-v0.95.2
# (403, "not available"), and only pkg/apis/monitoring (Go types, no CRD YAML) has those.
PROMETHEUS_OPERATOR_VERSION=v0.94.1
# github.com/docker/distribution (contrib/token-server: the registry token server of the
# distribution project, Docker token auth with htpasswd users); v2.8.3+incompatible, the
# newest of that module and the release line of Debian's docker-registry (2.8.2); the
# token server is gone from github.com/distribution/distribution/v3, and the proxy refuses
# every version of github.com/cesanta/docker_auth/auth_server (403, "not available").
REGISTRY_TOKEN_SERVER_VERSION=v2.8.3+incompatible
# Its zip has no go.mod, so `go get` would take the newest of each import; these pin the
# ones that built and passed the loopback handshake (same path, fixed version).
REGISTRY_TOKEN_SERVER_REPLACES="github.com/gorilla/mux=github.com/gorilla/mux@v1.8.1
  github.com/sirupsen/logrus=github.com/sirupsen/logrus@v1.10.2
  github.com/docker/libtrust=github.com/docker/libtrust@v0.0.0-20160708172513-aabc10ec26b7
  golang.org/x/crypto=golang.org/x/crypto@v0.59.0 golang.org/x/sys=golang.org/x/sys@v0.50.0"
# github.com/google/go-containerregistry (cmd/crane, a registry client the tests pull with);
# newest on the proxy, and its go.mod asks for no newer Go than 1.26.
CRANE_VERSION=v0.22.1
# kubelet-credential-harness: our own scripts/kubelet-harness/main.go around the kubelet's
# credential-provider plugin package, built against k8s.io/kubernetes@$KUBE_VERSION. Its
# cache key adds a hash of the source, so an edit rebuilds it.
HARNESS_SRC=$(cd "$(dirname "$0")" && pwd)/kubelet-harness
HARNESS_VERSION=$KUBE_VERSION-src.$(cat "$HARNESS_SRC"/*.go 2>/dev/null | sha256sum | cut -c1-12)
# -----------------------------------------------------------------------------------------

ALL_PEERS=(kube-apiserver kube-controller-manager kubectl etcd source-controller source-controller-crds helm actionlint
  prometheus promtool prometheus-operator-crds registry-token-server crane kubelet-credential-harness)
PEERS_DIR=${REGBROKER_PEERS_DIR:-$HOME/.cache/regbroker-peers}
LOG_DIR=$PEERS_DIR/logs

log() { printf 'peers: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  sed -n '2,/^# Needs:/s/^# \{0,1\}//p' "$0" >&2
  printf 'Peers: %s\n' "${ALL_PEERS[*]}" >&2
}

version_of() {
  case $1 in
    kube-apiserver | kube-controller-manager | kubectl) echo "$KUBE_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    source-controller | source-controller-crds) echo "$SOURCE_CONTROLLER_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    actionlint) echo "$ACTIONLINT_VERSION" ;;
    prometheus | promtool) echo "$PROMETHEUS_VERSION" ;;
    prometheus-operator-crds) echo "$PROMETHEUS_OPERATOR_VERSION" ;;
    registry-token-server) echo "$REGISTRY_TOKEN_SERVER_VERSION" ;;
    crane) echo "$CRANE_VERSION" ;;
    kubelet-credential-harness) echo "$HARNESS_VERSION" ;;
    *) return 1 ;;
  esac
}

# The file a peer's NAME=PATH line points at (a directory for the CRDs).
target_of() {
  local name=$1 ver
  ver=$(version_of "$name")
  case $name in
    source-controller-crds | prometheus-operator-crds) echo "$PEERS_DIR/$name-$ver" ;;
    *) echo "$PEERS_DIR/$name-$ver/$name" ;;
  esac
}

# --- Arguments ----------------------------------------------------------------------------
selected=("${ALL_PEERS[@]}")
while (($#)); do
  case $1 in
    --only)
      (($# >= 2)) || die "--only needs a comma-separated list of: ${ALL_PEERS[*]}"
      IFS=, read -r -a selected <<<"$2"
      shift 2
      ;;
    --only=*)
      IFS=, read -r -a selected <<<"${1#--only=}"
      shift
      ;;
    --print-versions)
      for p in "${ALL_PEERS[@]}"; do printf '%s=%s\n' "$p" "$(version_of "$p")"; done
      printf 'source-controller-replaces=%s\n' "$SOURCE_CONTROLLER_REPLACES"
      printf 'registry-token-server-replaces=%s\n' "$(xargs <<<"$REGISTRY_TOKEN_SERVER_REPLACES")"
      exit 0
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      usage
      die "unknown argument: $1"
      ;;
  esac
done
((${#selected[@]})) || die "--only got an empty list"
for p in "${selected[@]}"; do
  version_of "$p" >/dev/null || die "unknown peer '$p' (known: ${ALL_PEERS[*]})"
done

# --- Go environment (only set up when something must be built) ----------------------------
GO_READY=
TMP_DIRS=()
cleanup() {
  local d
  for d in "${TMP_DIRS[@]}"; do
    # Module-cache copies are read-only; make the scratch tree removable first.
    chmod -R u+w "$d" 2>/dev/null || true
    rm -rf "$d"
  done
}
trap cleanup EXIT

setup_go() {
  [[ -n $GO_READY ]] && return 0
  if [[ -z ${GO:-} ]]; then
    GO=$(command -v go || true)
    [[ -n $GO ]] || GO=/usr/local/go/bin/go
  fi
  [[ -x $GO ]] || die "no Go toolchain found (set GO=/path/to/go); Go >= 1.26 is needed"
  # A module that needs a newer Go must fail clearly, not fetch a toolchain.
  export GOTOOLCHAIN=local
  # Scratch modules resolve their own requirements; no VCS stamping in scratch dirs.
  export GOFLAGS="-mod=mod -buildvcs=false"
  export GOWORK=off
  export CGO_ENABLED=0
  mkdir -p "$LOG_DIR"
  log "using $("$GO" version)"
  GO_READY=1
}

# new_tmp NAME: sets NEW_TMP to a fresh scratch dir on the cache's filesystem (so that the
# final mv is a rename); removed on exit.
new_tmp() {
  mkdir -p "$PEERS_DIR"
  NEW_TMP=$(mktemp -d "$PEERS_DIR/.tmp-$1.XXXXXX")
  TMP_DIRS+=("$NEW_TMP")
}

# run LOGFILE CMD...: runs a command with its output appended to the build log.
run() {
  local logf=$1
  shift
  {
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  } >>"$logf"
  "$@" >>"$logf" 2>&1
}

# mod_info MODULE@VERSION FIELD LOGFILE: downloads a module and prints its GoMod or Dir path.
mod_info() {
  local json field=$2 logf=$3
  printf '+ go mod download -json %s\n' "$1" >>"$logf"
  if ! json=$("$GO" mod download -json "$1" 2>>"$logf"); then
    printf '%s\n' "$json" >>"$logf"
    return 1
  fi
  sed -n "s/^[[:space:]]*\"$field\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" <<<"$json"
}

# gomod_replaces GOMOD: prints "OLD OLDVER NEW NEWVER" for each replace directive (a
# missing version is "-"), after a "require PATH" line for each required module.
gomod_replaces() {
  awk '
    { sub(/\/\/.*/, "") }
    /^[[:space:]]*$/ { next }
    $1 == ")" { block = ""; next }
    ($1 == "replace" || $1 == "require") && $2 == "(" { block = $1; next }
    $1 == "replace" || $1 == "require" { kind = $1; $1 = ""; $0 = $0; emit(kind); next }
    block != "" { emit(block) }
    function emit(kind,   i, arrow) {
      if (kind == "require") { print "require", $1; return }
      arrow = 0
      for (i = 1; i <= NF; i++) if ($i == "=>") arrow = i
      if (arrow == 0) return
      repl[++n] = $1 " " (arrow == 3 ? $2 : "-") " " $(arrow + 1) " " (NF > arrow + 1 ? $(arrow + 2) : "-")
    }
    END { for (i = 1; i <= n; i++) print repl[i] }
  ' "$1"
}

# scratch_build NAME MODULE VERSION LOCAL_VERSION PACKAGE LDFLAGS OUTDIR LOGFILE [EXTRA [SOURCE]]
# Builds PACKAGE from MODULE@VERSION in a scratch module that copies MODULE's replace
# directives: a local one (./x, ../x) becomes OLD => OLD@LOCAL_VERSION when OLD is required,
# any other is copied as it stands. EXTRA holds more `go mod edit -replace` arguments
# (OLD=NEW@VERSION, space-separated). With SOURCE (a directory of our own *.go files, a
# main package), those files are the scratch module's own package, built against
# MODULE@VERSION instead of PACKAGE (pass "."). The binary lands in OUTDIR/NAME.
scratch_build() {
  local name=$1 mod=$2 ver=$3 localver=$4 pkg=$5 ldflags=$6 outdir=$7 logf=$8 extra=${9:-}
  local source=${10:-}
  local src=$outdir.src gomod old oldver new newver r
  local -A required=()
  # Called as `scratch_build ... || fail_peer`, where set -e does not apply: every step
  # below checks its own status.
  mkdir -p "$src" || return 1
  if ! gomod=$(mod_info "$mod@$ver" GoMod "$logf") || [[ -z $gomod ]]; then
    log "cannot download $mod@$ver"
    return 1
  fi
  cd "$src" || return 1
  run "$logf" "$GO" mod init "local/peer-$name" || return 1
  while read -r old oldver new newver; do
    if [[ $old == require ]]; then
      required[$oldver]=1
      continue
    fi
    if [[ $oldver == - ]]; then oldver=; else oldver=@$oldver; fi
    if [[ $new == ./* || $new == ../* ]]; then
      [[ -n ${required[$old]:-} ]] || continue # e.g. etcd's FORBIDDEN_DEPENDENCY guards
      run "$logf" "$GO" mod edit "-replace=$old$oldver=$old@$localver" || return 1
    else
      if [[ $newver == - ]]; then newver=; else newver=@$newver; fi
      run "$logf" "$GO" mod edit "-replace=$old$oldver=$new$newver" || return 1
    fi
  done < <(gomod_replaces "$gomod")
  for r in $extra; do
    run "$logf" "$GO" mod edit "-replace=$r" || return 1
  done
  if [[ -n $source ]]; then
    cp "$source"/*.go "$src/" || return 1
    run "$logf" "$GO" get "$mod@$ver" || return 1
  else
    run "$logf" "$GO" get "$pkg@$ver" || return 1
  fi
  run "$logf" "$GO" build -trimpath -ldflags "$ldflags" -o "$outdir/$name" "$pkg" || return 1
  cd "$PEERS_DIR"
}

# install_dir NAME TMPDIR FINAL: moves a finished build into place with one rename.
install_dir() {
  local name=$1 tmp=$2 final=$3
  chmod 755 "$tmp"
  if ! mv -T "$tmp" "$final" 2>/dev/null; then
    [[ -e $final ]] || die "cannot move $name into $final"
    log "$name appeared in $final meanwhile (another run?); keeping that one"
  fi
}

fail_peer() {
  local name=$1 ver=$2 logf=$3
  {
    printf 'peers: ---- last 40 lines of %s ----\n' "$logf"
    tail -n 40 "$logf"
    printf 'peers: ----\n'
  } >&2
  die "could not build $name $ver (full log: $logf)"
}

# build_peer NAME: builds one peer into its cache directory.
build_peer() {
  local name=$1 ver logf final
  local -a check
  ver=$(version_of "$name")
  final=$PEERS_DIR/$name-$ver
  logf=$LOG_DIR/$name-$ver.log
  : >"$logf"
  new_tmp "$name-$ver"
  local out=$NEW_TMP/out
  mkdir -p "$out"
  case $name in
    kube-apiserver)
      local minor=${ver#v1.}
      minor=${minor%%.*}
      # Staging modules (k8s.io/api, ...) are tagged v0.<minor>.<patch> for v1.<minor>.<patch>.
      scratch_build kube-apiserver k8s.io/kubernetes "$ver" "v0.${ver#v1.}" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        "-s -w -X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(--version)
      ;;
    kube-controller-manager)
      # Same module and version as kube-apiserver (most packages come from its build
      # cache): garbage collection, namespace deletion and ClusterRole aggregation for
      # the tests that need them (tests/control_plane, ControlPlane::shared_with_controllers).
      local minor=${ver#v1.}
      minor=${minor%%.*}
      scratch_build kube-controller-manager k8s.io/kubernetes "$ver" "v0.${ver#v1.}" \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        "-s -w -X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(--version)
      ;;
    kubectl)
      # Same module and version as kube-apiserver (its build cache is shared): applies
      # deploy/ manifests and runs server-side dry runs in the tests.
      local minor=${ver#v1.}
      minor=${minor%%.*}
      local vflags="-X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$ver -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
      scratch_build kubectl k8s.io/kubernetes "$ver" "v0.${ver#v1.}" \
        k8s.io/kubernetes/cmd/kubectl "-s -w $vflags" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(version --client)
      ;;
    etcd)
      scratch_build etcd go.etcd.io/etcd/server/v3 "$ver" "$ver" go.etcd.io/etcd/server/v3 \
        "-s -w" "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(--version)
      ;;
    source-controller)
      scratch_build source-controller github.com/fluxcd/source-controller "$ver" "$ver" \
        github.com/fluxcd/source-controller "-s -w" "$out" "$logf" "$SOURCE_CONTROLLER_REPLACES" \
        || fail_peer "$name" "$ver" "$logf"
      check=(--help)
      ;;
    helm)
      scratch_build helm helm.sh/helm/v4 "$ver" "$ver" helm.sh/helm/v4/cmd/helm \
        "-s -w -X helm.sh/helm/v4/internal/version.version=$ver -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(version)
      ;;
    actionlint)
      scratch_build actionlint github.com/rhysd/actionlint "$ver" "$ver" \
        github.com/rhysd/actionlint/cmd/actionlint \
        "-s -w -X github.com/rhysd/actionlint.version=$ver" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(-version)
      ;;
    prometheus | promtool)
      # Both from one module and version (promtool reuses prometheus's build cache). No
      # builtinassets tag: the web UI would need npm, and the HTTP API works without it.
      local dir pver
      if ! dir=$(mod_info "github.com/prometheus/prometheus@$ver" Dir "$logf") \
        || [[ -z $dir ]] || ! pver=$(<"$dir/VERSION") || [[ -z $pver ]]; then
        log "no VERSION file in github.com/prometheus/prometheus@$ver"
        fail_peer "$name" "$ver" "$logf"
      fi
      scratch_build "$name" github.com/prometheus/prometheus "$ver" "$ver" \
        "github.com/prometheus/prometheus/cmd/$name" \
        "-s -w -X github.com/prometheus/common/version.Version=$pver -X github.com/prometheus/common/version.Revision=$ver -X github.com/prometheus/common/version.Branch=HEAD" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(--version)
      ;;
    crane)
      scratch_build crane github.com/google/go-containerregistry "$ver" "$ver" \
        github.com/google/go-containerregistry/cmd/crane \
        "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$ver" \
        "$out" "$logf" || fail_peer "$name" "$ver" "$logf"
      check=(version)
      ;;
    kubelet-credential-harness)
      # Our own main package (scripts/kubelet-harness) against k8s.io/kubernetes at
      # kube-apiserver's version, with the same staging replaces (shares its build cache).
      scratch_build kubelet-credential-harness k8s.io/kubernetes "$KUBE_VERSION" \
        "v0.${KUBE_VERSION#v1.}" . "-s -w" "$out" "$logf" "" "$HARNESS_SRC" \
        || fail_peer "$name" "$ver" "$logf"
      check=(--help)
      ;;
    registry-token-server)
      scratch_build registry-token-server github.com/docker/distribution "$ver" "$ver" \
        github.com/docker/distribution/contrib/token-server "-s -w" "$out" "$logf" \
        "$REGISTRY_TOKEN_SERVER_REPLACES" || fail_peer "$name" "$ver" "$logf"
      check=(-help)
      ;;
    prometheus-operator-crds)
      # ServiceMonitor, PodMonitor and PrometheusRule only (the v1 CRDs of bundle.yaml).
      local dir crd f
      if ! dir=$(mod_info "github.com/prometheus-operator/prometheus-operator@$ver" Dir "$logf") \
        || [[ -z $dir ]]; then
        fail_peer "$name" "$ver" "$logf"
      fi
      crd=$dir/example/prometheus-operator-crd
      [[ -d $crd ]] || crd=$dir/example/prometheus-operator-crd-full
      for f in servicemonitors podmonitors prometheusrules; do
        f=$crd/monitoring.coreos.com_$f.yaml
        [[ -f $f ]] || { log "no $f"; fail_peer "$name" "$ver" "$logf"; }
        cp "$f" "$out/"
      done
      chmod -R u+w,go+r "$out"
      install_dir "$name" "$out" "$final"
      return 0
      ;;
    source-controller-crds)
      local dir
      if ! dir=$(mod_info "github.com/fluxcd/source-controller@$ver" Dir "$logf") \
        || [[ -z $dir ]]; then
        fail_peer "$name" "$ver" "$logf"
      fi
      compgen -G "$dir/config/crd/bases/*.yaml" >/dev/null \
        || { log "no CRDs in $dir/config/crd/bases"; fail_peer "$name" "$ver" "$logf"; }
      cp "$dir"/config/crd/bases/*.yaml "$out/"
      mkdir -p "$out/rbac"
      cp "$dir/config/rbac/role.yaml" "$out/rbac/role.yaml"
      chmod -R u+w,go+r "$out"
      install_dir "$name" "$out" "$final"
      return 0
      ;;
  esac
  # Check the fresh binary before it counts as cached.
  local version_out
  if ! version_out=$("$out/$name" "${check[@]}" 2>&1); then
    printf '+ %s %s\n%s\n' "$out/$name" "${check[*]}" "$version_out" >>"$logf"
    log "$name ${check[*]} failed"
    fail_peer "$name" "$ver" "$logf"
  fi
  case $name in
    source-controller | registry-token-server | kubelet-credential-harness) log "$name ${check[*]} works" ;;
    *) log "$name ${check[*]}: $(head -n 3 <<<"$version_out" | tr '\n' ' ')" ;;
  esac
  install_dir "$name" "$out" "$final"
}

# --- Main ---------------------------------------------------------------------------------
start_all=$(date +%s)
built=0
lines=()
for name in "${ALL_PEERS[@]}"; do
  want=
  for p in "${selected[@]}"; do [[ $p == "$name" ]] && want=1; done
  [[ -n $want ]] || continue
  target=$(target_of "$name")
  ver=$(version_of "$name")
  if [[ -x $target ]]; then
    log "cached $name $ver"
  else
    setup_go
    log "building $name $ver (log: $LOG_DIR/$name-$ver.log)"
    t0=$(date +%s)
    build_peer "$name"
    [[ -e $target ]] || die "$name built but $target is missing"
    log "built $name $ver in $(($(date +%s) - t0)) s"
    built=$((built + 1))
  fi
  lines+=("$name=$target")
done
log "done: $built built, $((${#lines[@]} - built)) cached, $(($(date +%s) - start_all)) s in total"
printf '%s\n' "${lines[@]}"
