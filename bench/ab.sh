#!/usr/bin/env bash
# A/B of sidecar builds on the cache-hit path: the bare axum server and each build given,
# in alternating rounds in one run, so drift in a shared machine's load falls on all of
# them. For comparing two commits' throughput (bench/instructions.sh counts their work
# without noise; bench/run.sh measures the one build the image ships).
#
#   bash bench/ab.sh static|gcp "CONNECTIONS..." ROUNDS SECONDS SIDECAR_BIN...
#   e.g. bash bench/ab.sh gcp "1 16 64" 3 4 /tmp/before/regbroker target/release/regbroker
#
# Needs wrk, curl, python3 and gcplocal (the test venv on PATH), and BARE_BIN (default
# target/release/examples/bench_bare_server). Each build is named by its directory.
# Prints, per connection count and server: the median requests per second, p99 and the
# server's CPU per request (bench/measure.py), each also as a ratio to the bare server.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 5)) || { sed -n '2,13p' "$0" >&2; exit 64; }
path=$1 concurrency=$2 rounds=$3 duration=$4
shift 4
bins=("$@")
bare=${BARE_BIN:-target/release/examples/bench_bare_server}
measure="python3 bench/measure.py"
case $path in
  static) host=123456789012.dkr.ecr.us-east-1.amazonaws.com ;;
  gcp) host=europe-west1-docker.pkg.dev ;;
  *) echo "path: static or gcp, not $path" >&2; exit 64 ;;
esac
for need in wrk curl gcplocal; do
  command -v "$need" >/dev/null || { echo "bench/ab.sh needs $need" >&2; exit 1; }
done
for b in "$bare" "${bins[@]}"; do
  [ -x "$b" ] || { echo "no $b" >&2; exit 1; }
done

# shellcheck source=bench/lib.sh
source bench/lib.sh

secret=$(python3 -c 'import base64; print(base64.b64encode(b"b" * 1200).decode())')
echo "{\"auths\": {\"123456789012.dkr.ecr.us-east-1.amazonaws.com\": {\"username\": \"AWS\", \"password\": \"$secret\"}}}" >"$work/config.json"
start_gcplocal

names=(bare) urls=() servers=()
for b in "${bins[@]}"; do
  port=$(free_port)
  env -i PATH="$PATH" HOME="$work" REGBROKER_LOG=warn GCE_METADATA_HOST="$gce" \
    "$b" serve --listen "127.0.0.1:$port" --docker-config "$work/config.json" 2>"$work/${#servers[@]}.log" &
  pids+=($!) servers+=($!)
  wait_http "127.0.0.1:$port" /readyz
  urls+=("http://127.0.0.1:$port/v1/credentials?registry=$host")
  names+=("$(basename "$(dirname "$b")")")
done
# The bare server answers with the first build's bytes.
curl -sf "${urls[0]}" >"$work/body.json"
port=$(free_port)
"$bare" "127.0.0.1:$port" "$work/body.json" >/dev/null &
pids+=($!)
servers=($! "${servers[@]}")
urls=("http://127.0.0.1:$port/v1/credentials?registry=$host" "${urls[@]}")
wait_http "127.0.0.1:$port" /v1/credentials
for u in "${urls[@]}"; do wrk -t1 -c16 -d1s "$u" >/dev/null; done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
n=${#urls[@]}
for c in $concurrency; do
  for r in $(seq 1 "$rounds"); do
    for k in $(seq 0 $((n - 1))); do
      # Each round starts with the next server.
      j=$(((k + r) % n))
      out=$work/wrk-$c-$j-$r.txt
      before=$(cpu_ticks "${servers[$j]}")
      wrk -t1 -c"$c" -d"${duration}s" --latency "${urls[$j]}" >"$out"
      echo $(($(cpu_ticks "${servers[$j]}") - before)) >"$out.cpu"
    done
  done
  read -r base_rps base_p99 base_cpu < <($measure wrk "$work/wrk-$c-0-"*.txt)
  for j in $(seq 0 $((n - 1))); do
    read -r rps p99 cpu < <($measure wrk "$work/wrk-$c-$j-"*.txt)
    python3 -c 'import sys
path, c, name, rps, p99, cpu, brps, bp99, bcpu = sys.argv[1:4] + [float(a) for a in sys.argv[4:]]
print(f"{path} c{c} {name:>10}: {rps:8.0f} req/s ({rps / brps:.2f}x)  p99 {p99:6.0f} us ({p99 / bp99:.2f}x)  CPU {cpu:.2f} us/req ({cpu / bcpu:.2f}x)")' \
      "$path" "$c" "${names[$j]}" "$rps" "$p99" "$cpu" "$base_rps" "$base_p99" "$base_cpu"
  done
done
