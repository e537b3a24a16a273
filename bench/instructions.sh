#!/usr/bin/env bash
# User-space instructions per cache hit, the sidecar against the bare axum server, counted
# by valgrind's callgrind: a count, so the machine's other load does not move it (a
# throughput ratio moves by several percent between runs on a shared 2-core machine).
#
#   bash bench/instructions.sh [static|gcp ...]   (default: both)
#
# Needs: valgrind, curl, and gcplocal for the gcp path (the test venv), plus release
# builds: REGBROKER_BIN (default target/release/regbroker) and BARE_BIN (default
# target/release/examples/bench_bare_server); `cargo build --release --bin regbroker
# --example bench_bare_server` makes both, and bench/run.sh's musl binaries work too
# (REGBROKER_BIN=target/bench-dist/regbroker BARE_BIN=target/<triple>/release/examples/...).
# Settings: N (requests counted, default 2000), WARM (requests before counting, 200).
#
# Each server runs under callgrind; curl sends WARM requests on one keep-alive
# connection, the counters are zeroed, N more requests follow, and the counters are
# dumped: the figure is the dump's total divided by N. The bare server answers with the
# sidecar's own answer, so both send the same bytes. One connection, so this counts the
# work of a hit, not the wake-ups of a loaded runtime (bench/run.sh measures those).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${REGBROKER_BIN:-target/release/regbroker}
bare=${BARE_BIN:-target/release/examples/bench_bare_server}
n=${N:-2000}
warm=${WARM:-200}
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(static gcp)
for need in valgrind callgrind_control curl; do
  command -v "$need" >/dev/null || { echo "bench/instructions.sh needs $need (apt-get install valgrind curl)" >&2; exit 1; }
done
for b in "$bin" "$bare"; do
  [ -x "$b" ] || { echo "no $b: cargo build --release --bin regbroker --example bench_bare_server" >&2; exit 1; }
done

# shellcheck source=bench/lib.sh
source bench/lib.sh

ecr_host=123456789012.dkr.ecr.us-east-1.amazonaws.com
gar_host=europe-west1-docker.pkg.dev
secret=$(python3 -c 'import base64; print(base64.b64encode(b"b" * 1200).decode())')
printf '{"auths": {"%s": {"username": "AWS", "password": "%s"}}}\n' "$ecr_host" "$secret" >"$work/config.json"

gce=
if printf '%s\n' "${paths[@]}" | grep -qx gcp; then
  command -v gcplocal >/dev/null || { echo "the gcp path needs gcplocal (pip install gcplocal)" >&2; exit 1; }
  start_gcplocal
fi

# count NAME URL CMD...: runs CMD (which runs the server under $callgrind) and prints the
# server's instructions per request.
callgrind=(valgrind -q --tool=callgrind --callgrind-out-file="$work/cg.%p")
count() {
  local name=$1 url=$2
  shift 2
  "$@" >"$work/$name.out" 2>"$work/$name.log" &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 600); do
    curl -sf -o "$work/answer.json" "$url" && break
    sleep 0.1
  done
  for _ in $(seq 1 "$warm"); do printf 'url = "%s"\noutput = /dev/null\n' "$url"; done >"$work/warm.cfg"
  for _ in $(seq 1 "$n"); do printf 'url = "%s"\noutput = /dev/null\n' "$url"; done >"$work/n.cfg"
  curl -sf -K "$work/warm.cfg"
  callgrind_control -z "$pid" >/dev/null 2>&1
  curl -sf -K "$work/n.cfg"
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 0.5
  local total
  # The dump is written as cg.PID.1 (part 1: what ran since the counters were zeroed).
  total=$(awk '/^(summary|totals):/ {print $2; exit}' "$work"/cg.*.1)
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$work"/cg.*
  echo "$((total / n))"
}

echo "| path | sidecar instructions per hit | bare server | ratio |"
echo "| --- | --- | --- | --- |"
for path in "${paths[@]}"; do
  host=$ecr_host
  [ "$path" = gcp ] && host=$gar_host
  port=$(free_port)
  side=$(count "side-$path" "http://127.0.0.1:$port/v1/credentials?registry=$host" \
    env -i PATH="$PATH" HOME="$work" REGBROKER_LOG=warn GCE_METADATA_HOST="$gce" \
    "${callgrind[@]}" "$bin" serve --listen "127.0.0.1:$port" --docker-config "$work/config.json")
  cp "$work/answer.json" "$work/body-$path.json"
  port=$(free_port)
  ref=$(count "bare-$path" "http://127.0.0.1:$port/v1/credentials?registry=$host" \
    "${callgrind[@]}" "$bare" "127.0.0.1:$port" "$work/body-$path.json")
  cmp -s "$work/answer.json" "$work/body-$path.json" || { echo "the bare server's answer differs" >&2; exit 1; }
  echo "| $path | $side | $ref | $(python3 -c "print(f'{$side / $ref:.2f}')") |"
done
