#!/usr/bin/env bash
# The on-demand benchmark suite: builds release binaries, measures regbroker side by side
# with a reference in the same run, and writes the figures into BENCHMARKS.md.
#
# Needs (installs nothing itself):
#   apt-get install wrk hyperfine amazon-ecr-credential-helper curl python3 musl-tools binutils
#   rustup target add x86_64-unknown-linux-musl   (it measures the image's static binaries)
#   pip install gcplocal 'moto[server]'        (the test venv: .ci/requirements.txt)
# Settings: BENCH_DURATION (s per wrk run, default 8), BENCH_ROUNDS (alternating wrk
# rounds, default 3), BENCH_RUNS (hyperfine runs per command, default 300),
# BENCH_CONCURRENCY (wrk connections, default "1 16 64"), BENCH_OUT (default BENCHMARKS.md), BENCH_CRITERION=1 to also run the criterion benches (their first build takes minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$1 ($2)"); }
need wrk "apt-get install wrk"
need hyperfine "apt-get install hyperfine"
need docker-credential-ecr-login "apt-get install amazon-ecr-credential-helper"
need curl "apt-get install curl"
need python3 "apt-get install python3"
need gcplocal "pip install gcplocal"
need moto_server "pip install 'moto[server]'"
need readelf "apt-get install binutils"
triple=${TARGET:-$(uname -m)-unknown-linux-musl}
if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
  missing+=("the $triple Rust target (rustup target add $triple; apt-get install musl-tools)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  printf 'bench/run.sh needs: %s\n' "${missing[@]}" >&2
  exit 1
fi

duration=${BENCH_DURATION:-8}
concurrency=${BENCH_CONCURRENCY:-1 16 64}
rounds=${BENCH_ROUNDS:-3}
runs=${BENCH_RUNS:-300}
out=${BENCH_OUT:-BENCHMARKS.md}
measure="python3 $root/bench/measure.py"
started=$SECONDS
step() { printf '\n=== %s (%ss)\n' "$*" "$((SECONDS - started))" >&2; }

step "release build (scripts/build-release.sh, $triple)"
# The binaries the image ships (static musl; the sidecar static-pie, the helper a plain
# static executable), and the bare server for the same target. Two cargo invocations:
# an example also gets the dev-dependencies' features, the measured binary must not.
dist=$root/target/bench-dist
TARGET=$triple bash scripts/build-release.sh "$dist"
cargo build --release --target "$triple" --example bench_bare_server
target=${CARGO_TARGET_DIR:-$root/target}
bin=$dist/regbroker
helper_bin=$dist/docker-credential-regbroker
bare=$target/$triple/release/examples/bench_bare_server

# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

# serve NAME ENV... -- ARGS...: starts `regbroker serve` on a free port with env, sets
# $addr and $pid.
serve() {
  local name=$1 port
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  port=$(free_port)
  env -i PATH="$PATH" HOME="$work" REGBROKER_LOG=warn "${envs[@]}" \
    "$bin" serve --listen "127.0.0.1:$port" "$@" 2>"$work/$name.log" &
  pid=$!
  pids+=("$pid")
  addr=127.0.0.1:$port
  wait_http "$addr" /readyz || { cat "$work/$name.log" >&2; exit 1; }
}

# ---------------------------------------------------------------------------- fixtures
ecr_host=123456789012.dkr.ecr.us-east-1.amazonaws.com
gar_host=europe-west1-docker.pkg.dev
# An ECR-sized secret (real ECR passwords are about 1.5-2 KB of base64).
secret=$(python3 -c 'import base64; print(base64.b64encode(b"b" * 1200).decode())')
mkdir -p "$work/dc"
cat >"$work/dc/config.json" <<JSON
{"auths": {"$ecr_host": {"username": "AWS", "password": "$secret"}}}
JSON
echo "$ecr_host" >"$work/ecr-input"
echo "$gar_host" >"$work/gar-input"

step "gcplocal (GCE metadata emulator: the gcp provider's token becomes a cached credential)"
start_gcplocal

# ------------------------------------------------------------ 1. sidecar HTTP over loopback
step "sidecar vs bare axum server (wrk, ${rounds} alternating rounds of ${duration}s)"
serve sidecar GCE_METADATA_HOST="$gce" -- --docker-config "$work/dc/config.json"
sidecar=$addr
sidecar_pid=$pid
curl -sf "http://$sidecar/v1/credentials?registry=$ecr_host" >"$work/static-body.json"
curl -sf "http://$sidecar/v1/credentials?registry=$gar_host" >"$work/gcp-body.json"
grep -q '"provider":"gcp"' "$work/gcp-body.json"

declare -A rps p99 cpu
# A process's CPU time so far, user and system, in clock ticks (/proc/PID/stat).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for path in static gcp; do
  host=$ecr_host
  [ "$path" = gcp ] && host=$gar_host
  port=$(free_port)
  "$bare" "127.0.0.1:$port" "$work/$path-body.json" >/dev/null &
  bare_pid=$!
  pids+=("$bare_pid")
  wait_http "127.0.0.1:$port" /v1/credentials
  # Same bytes from both: the bare server's body is the sidecar's answer.
  cmp <(curl -sf "http://127.0.0.1:$port/v1/credentials") <(curl -sf "http://$sidecar/v1/credentials?registry=$host")
  url_bare="http://127.0.0.1:$port/v1/credentials?registry=$host"
  url_side="http://$sidecar/v1/credentials?registry=$host"
  wrk -t1 -c16 -d1s "$url_bare" >/dev/null
  wrk -t1 -c16 -d1s "$url_side" >/dev/null
  for c in $concurrency; do
    for r in $(seq 1 "$rounds"); do
      # Alternate the order, so drift in the machine's load falls on both.
      if [ $((r % 2)) = 1 ]; then order="bare side"; else order="side bare"; fi
      for who in $order; do
        url=$url_bare server=$bare_pid
        [ "$who" = side ] && url=$url_side server=$sidecar_pid
        wrk_out=$work/wrk-$path-$c-$who-$r.txt
        before=$(cpu_ticks "$server")
        wrk -t1 -c"$c" -d"${duration}s" --latency "$url" >"$wrk_out"
        echo $(($(cpu_ticks "$server") - before)) >"$wrk_out.cpu"
      done
    done
    for who in bare side; do
      read -r rps["$path-$c-$who"] p99["$path-$c-$who"] cpu["$path-$c-$who"] < <($measure wrk "$work/wrk-$path-$c-$who-"*.txt)
    done
  done
  kill "$bare_pid"
done
bytes_static=$(wc -c <"$work/static-body.json")
bytes_gcp=$(wc -c <"$work/gcp-body.json")

# -------------------------------------------------------- 4. credential helper `get` latency
step "credential helper get (hyperfine, ${runs} runs each)"
ln -sf "$helper_bin" "$work/docker-credential-regbroker"
helper=$work/docker-credential-regbroker
# The reference answers from its own warm file cache (~/.ecr/cache.json, the format of
# amazon-ecr-credential-helper's ecr-login/cache: key "<region>-<base64(access key id ||
# md5 of nothing)>-<registry id>"), valid for 12 h, so it makes no network call.
mkdir -p "$work/ecrhome/.ecr"
python3 - "$work/ecrhome/.ecr/cache.json" "$secret" <<'PY'
import base64, datetime, hashlib, json, sys
key = base64.b64encode(b"AKIDBENCHMARK" + hashlib.md5(b"").digest()).decode()
now = datetime.datetime.now(datetime.timezone.utc)
token = base64.b64encode(b"AWS:" + sys.argv[2].encode()).decode()
entry = {"AuthorizationToken": token, "RequestedAt": now.isoformat(),
         "ExpiresAt": (now + datetime.timedelta(hours=12)).isoformat(),
         "ProxyEndpoint": "https://123456789012.dkr.ecr.us-east-1.amazonaws.com", "Service": "ecr"}
json.dump({"Registries": {f"us-east-1-{key}-123456789012": entry}, "Version": "1.0"},
          open(sys.argv[1], "w"))
PY
ref_env=(HOME="$work/ecrhome" AWS_ACCESS_KEY_ID=AKIDBENCHMARK AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true)
# No AWS endpoint is reachable with these keys: an answer proves a cache hit.
env -i "${ref_env[@]}" docker-credential-ecr-login get <"$work/ecr-input" | grep -q '"Username":"AWS"'

# regbroker in-process: a warm disk cache seeded by one real fetch from gcplocal (3600 s
# tokens), and a static docker config entry.
mkdir -p "$work/diskcache"
inproc_env=(HOME="$work" REGBROKER_CACHE_DIR="$work/diskcache" GCE_METADATA_HOST="$gce" REGBROKER_DOCKER_CONFIG="$work/dc/config.json")
env -i "${inproc_env[@]}" "$helper" get <"$work/gar-input" | grep -q oauth2accesstoken
# The sidecar already holds gcplocal's token in memory. Stop gcplocal: from here on any
# upstream call would fail, so every figure below is a cache hit.
kill "$gcplocal_pid"
env -i "${inproc_env[@]}" "$helper" get <"$work/gar-input" | grep -q oauth2accesstoken
env -i HOME="$work" REGBROKER_ENDPOINT="http://$sidecar" "$helper" get <"$work/gar-input" | grep -q oauth2accesstoken

# One environment for every command (each reads only its own variables); the sidecar
# rows add REGBROKER_ENDPOINT as a shell assignment, which costs no extra process.
# hyperfine subtracts the cost of spawning its shell from every figure.
# Rounds rotate the order of the commands, so drift in the machine's load falls on all
# of them; the figure is the median of the rounds' medians.
helper_cmds=(
  reference "docker-credential-ecr-login get <$work/ecr-input"
  inproc_disk_gcp "$helper get <$work/gar-input"
  inproc_static "$helper get <$work/ecr-input"
  sidecar_gcp "REGBROKER_ENDPOINT=http://$sidecar $helper get <$work/gar-input"
  sidecar_static "REGBROKER_ENDPOINT=http://$sidecar $helper get <$work/ecr-input"
  pie_static "$bin credential-helper get <$work/ecr-input"
)
helper_rounds=5
for r in $(seq 0 $((helper_rounds - 1))); do
  args=()
  n=$((${#helper_cmds[@]} / 2))
  for i in $(seq 0 $((n - 1))); do
    k=$(((i + r) % n))
    args+=(-n "${helper_cmds[$((2 * k))]}" "${helper_cmds[$((2 * k + 1))]}")
  done
  env -i PATH="$PATH" "${ref_env[@]}" REGBROKER_CACHE_DIR="$work/diskcache" GCE_METADATA_HOST="$gce" \
    REGBROKER_DOCKER_CONFIG="$work/dc/config.json" \
    hyperfine --style basic --warmup 10 --runs $((runs / helper_rounds)) \
    --export-json "$work/helper-$r.json" "${args[@]}" >>"$work/hyperfine.txt" 2>&1
done
declare -A helper_ms
while IFS=$'\t' read -r name ms; do helper_ms[$name]=$ms; done < <($measure hyperfine "$work"/helper-*.json)

# ----------------------------------------------------------------- 5. memory and start-up
step "memory and start-up"
sleep 1
rss_idle_after_load=$($measure rss "$sidecar_pid")
serve idle -- --docker-config "$work/dc/config.json"
sleep 1
rss_idle=$($measure rss "$pid")
port=$(free_port)
"$bare" "127.0.0.1:$port" "$work/static-body.json" >/dev/null &
bare_pid=$!
pids+=("$bare_pid")
wait_http "127.0.0.1:$port" /v1/credentials
sleep 1
rss_bare=$($measure rss "$bare_pid")
kill "$bare_pid"

# 10,000 cached credentials: ECR tokens for 10,000 accounts from moto (real aws provider,
# one cache entry per account), and 10,000 static entries.
mport=$(free_port)
(cd "$work" && TZ=UTC exec moto_server -H 127.0.0.1 -p "$mport" >/dev/null 2>&1) &
pids+=("$!")
wait_http "127.0.0.1:$mport" /moto-api/data.json
printf '[cache]\nfallback_ttl = "1h"\n' >"$work/ecr.toml"
serve ecr AWS_ENDPOINT_URL="http://127.0.0.1:$mport" AWS_ACCESS_KEY_ID=AKIDBENCHMARK \
  AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 -- --config "$work/ecr.toml"
ecr_pid=$pid
curl -sf -o /dev/null "http://$addr/v1/credentials?registry=100000000000.dkr.ecr.us-east-1.amazonaws.com"
sleep 1
rss_ecr_before=$($measure rss "$ecr_pid")
t0=$SECONDS
$measure fill "$addr" 1234567 .dkr.ecr.us-east-1.amazonaws.com 10000
fill_s=$((SECONDS - t0))
sleep 1
rss_ecr_after=$($measure rss "$ecr_pid")
upstream_ecr=$(curl -sf "http://$addr/metrics" | awk '/^regbroker_upstream_requests_total\{.*outcome="ok"/ {s += $2} END {print s}')

# 256-byte secrets: a docker config may be at most 4 MiB.
mkdir -p "$work/static10k"
python3 - "$work/static10k/config.json" <<'PY'
import base64, json, sys
secret = base64.b64encode(b"b" * 192).decode()
auths = {f"r{i:05d}.static.example.com": {"username": "AWS", "password": secret} for i in range(10000)}
json.dump({"auths": auths}, open(sys.argv[1], "w"))
PY
serve static10k -- --docker-config "$work/static10k/config.json"
$measure fill "$addr" r .static.example.com 10000
sleep 1
rss_static10k=$($measure rss "$pid")

port=$(free_port)
startup_ms=$(BENCH_ADDR=127.0.0.1:$port $measure startup 20 /readyz -- \
  "$bin" serve --listen "127.0.0.1:$port" --docker-config "$work/dc/config.json")
startup_bare_ms=$(BENCH_ADDR=127.0.0.1:$port $measure startup 20 /v1/credentials -- \
  "$bare" "127.0.0.1:$port" "$work/static-body.json")
size_bin=$(stat -c %s "$bin")
size_helper=$(stat -c %s "$helper_bin")
size_bare=$(stat -c %s "$bare")

# --------------------------------------------------------------------- criterion benches
criterion_rows="| (not run: BENCH_CRITERION=1 runs them) | |"
if [ "${BENCH_CRITERION:-0}" != 0 ]; then
  step "criterion benches"
  cargo bench --bench hot_paths -- --warm-up-time 1 --measurement-time 2 --noplot 2>/dev/null |
    tee "$work/criterion.txt" >&2
  criterion_rows=$(awk '/time:/ {name=$1; if (name == "time:") name=prev; sub(/^.*time: *\[/, ""); split($0, a, " "); printf "| `%s` | %s %s |\n", name, a[3], a[4]} {prev=$1}' "$work/criterion.txt")
fi

# ------------------------------------------------------------------------------ figures
step "writing $out"
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.2f}')" "$1" "$2"; }
mib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1024:.1f}')" "$1"; }
verdict() { python3 -c "import sys; print('met' if float(sys.argv[1]) $2 float(sys.argv[2]) else '**missed**')" "$1" "$3"; }

ref=${helper_ms[reference]}
helper_row() {
  local name=$1 label=$2 ms=${helper_ms[$1]}
  local r
  r=$(ratio "$ms" "$ref")
  printf '| %s | %s | **%s** | %s |\n' "$label" "$ms" "$r" "$(verdict "$r" '<=' 0.25)"
}
http_row() {
  local path=$1 label=$2 bytes=$3 c tr lr
  for c in $concurrency; do
    tr=$(ratio "${rps[$path-$c-side]}" "${rps[$path-$c-bare]}")
    lr=$(ratio "${p99[$path-$c-side]}" "${p99[$path-$c-bare]}")
    printf '| %s | %s B | %s | %s | %s | **%s** (%s) | %s | %s | **%s** (%s) | %s / %s |\n' "$label" "$bytes" "$c" \
      "${rps[$path-$c-side]}" "${rps[$path-$c-bare]}" "$tr" "$(verdict "$tr" '>=' 0.9)" \
      "${p99[$path-$c-side]}" "${p99[$path-$c-bare]}" "$lr" "$(verdict "$lr" '<=' 1.1)" \
      "${cpu[$path-$c-side]}" "${cpu[$path-$c-bare]}"
  done
}

figures=$work/figures.md
{
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)), load average at the start $(cut -d' ' -f1-3 /proc/loadavg); regbroker $(git describe --always --dirty), $(rustc --version | cut -d' ' -f1-2)."
  echo "Binaries: \`scripts/build-release.sh\` for $triple, what the image ships. Command: \`bash bench/run.sh\` (BENCH_DURATION=$duration BENCH_ROUNDS=$rounds BENCH_RUNS=$runs BENCH_CONCURRENCY=\"$concurrency\"); it took $((SECONDS - started)) s after the build."
  echo
  echo "### 1. Sidecar endpoint over loopback vs a bare axum server (same bytes)"
  echo
  echo "\`wrk -t1 -cC -d${duration}s --latency\` for C in ${concurrency}, ${rounds} alternating rounds each, medians; targets: throughput ≥ 0.9×, p99 ≤ 1.1×."
  echo
  echo "| path | body | connections | sidecar req/s | bare req/s | ratio | sidecar p99 µs | bare p99 µs | ratio | server CPU µs per request, sidecar / bare |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  http_row static "static credential (docker config)" "$bytes_static"
  http_row gcp "provider credential from the in-memory cache (gcp via gcplocal)" "$bytes_gcp"
  echo
  echo "### 2-3. Upstream call counts (tests/upstream_counts.rs, run by \`.ci/run\`)"
  echo
  echo "| scenario | upstream calls | reference |"
  echo "| --- | --- | --- |"
  echo "| 1,000 concurrent requests, one cold key | 1 | (target: exactly 1) |"
  echo "| 1,000 concurrent requests, distinct keys, \`max_concurrent_fetches = 8\` / default 32 | at most 8 / 32 in flight (reached, never passed) | (target: within the bound) |"
  echo "| simulated day, one request a minute, 12 h tokens, per identity and region (refresh jitter on) | 3 | 24 with a 1 h cap (the in-process Flux cache; jitter off) |"
  echo
  echo "### 4. \`docker-credential-regbroker get\` vs \`docker-credential-ecr-login get\` (warm caches)"
  echo
  echo "\`hyperfine\`, $runs runs of each command in $helper_rounds rounds that rotate the order; the median of the rounds' medians (shell start-up subtracted by hyperfine), same input host for the reference and the static rows. Target: ≤ 0.25× the reference."
  echo
  echo "| command | median ms | ratio | target |"
  echo "| --- | --- | --- | --- |"
  echo "| reference: \`docker-credential-ecr-login get\`, its own warm file cache | $ref | 1.00 | |"
  helper_row inproc_disk_gcp "in-process, warm disk cache (REGBROKER_CACHE_DIR), gcp token seeded by one gcplocal fetch, gcplocal stopped"
  helper_row inproc_static "in-process, static docker config entry"
  helper_row sidecar_gcp "via the sidecar, gcp token from its in-memory cache"
  helper_row sidecar_static "via the sidecar, static entry"
  helper_row pie_static "in-process, static entry, through the static-pie sidecar binary (\`regbroker credential-helper get\`): what the helper would cost linked as PIE"
  echo
  echo "### 5. Memory, start-up, size"
  echo
  echo "| figure | regbroker | reference (bare axum server) | target |"
  echo "| --- | --- | --- | --- |"
  echo "| RSS idle (started, 1 s) | $(mib "$rss_idle") MiB | $(mib "$rss_bare") MiB | ≤ 20 MiB: $(verdict "$(mib "$rss_idle")" '<=' 20) |"
  echo "| RSS after the load runs above | $(mib "$rss_idle_after_load") MiB | | |"
  echo "| RSS with 10,000 cached ECR credentials (aws provider, moto, one per account; $upstream_ecr upstream calls, filled in ${fill_s} s) | $(mib "$rss_ecr_after") MiB (+$(mib $((rss_ecr_after - rss_ecr_before))) MiB over $(mib "$rss_ecr_before") MiB before) | | ≤ idle + 20 MiB: $(verdict $((rss_ecr_after - rss_ecr_before)) '<=' 20480) |"
  echo "| RSS with 10,000 static entries (256-byte secrets; a docker config may be at most 4 MiB), each served once | $(mib "$rss_static10k") MiB (+$(mib $((rss_static10k - rss_idle))) MiB over idle) | | ≤ idle + 20 MiB: $(verdict $((rss_static10k - rss_idle)) '<=' 20480) |"
  echo "| start to first 200 (\`/readyz\`; bare: its route), median of 20 | ${startup_ms} ms | ${startup_bare_ms} ms | ≤ 100 ms: $(verdict "$startup_ms" '<=' 100) |"
  echo "| release binaries, static musl, stripped, thin LTO, all providers: \`regbroker\` (static-pie) / \`docker-credential-regbroker\` (no PIE) | $(mib $((size_bin / 1024))) MiB / $(mib $((size_helper / 1024))) MiB | $(mib $((size_bare / 1024))) MiB | reported |"
  echo
  echo "### Criterion (in-process, absolute times: noisy here, for comparing commits on one machine)"
  echo
  echo "| bench | median |"
  echo "| --- | --- |"
  echo "$criterion_rows"
} >"$figures"

python3 - "$out" "$figures" <<'PY'
import sys
out, figures = sys.argv[1], open(sys.argv[2]).read()
begin, end = "<!-- bench/run.sh:begin -->", "<!-- bench/run.sh:end -->"
try:
    text = open(out).read()
except FileNotFoundError:
    text = f"# Benchmarks\n\n{begin}\n{end}\n"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(out, "w").write(f"{head}{begin}\n{figures}{end}{tail}")
PY
cat "$figures"
step "done"
