# shellcheck shell=bash
# What bench/run.sh, bench/instructions.sh and bench/ab.sh share, sourced after their
# checks: a temporary directory ($work) and the processes to stop when the script exits
# ($pids), a free loopback port, waiting for a 200, and gcplocal (GCE's metadata server,
# so the gcp provider's token becomes a cached credential).

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_http ADDR PATH: until it answers 200.
wait_http() {
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null "http://$1$2" && return 0
    sleep 0.1
  done
  echo "nothing answered http://$1$2" >&2
  return 1
}

# start_gcplocal: starts gcplocal on a free port and waits for its token; sets $gce (its
# address, for GCE_METADATA_HOST) and $gcplocal_pid.
start_gcplocal() {
  local port
  port=$(free_port)
  (cd "$work" && exec gcplocal start --host 127.0.0.1 --port "$port" >/dev/null 2>&1) &
  gcplocal_pid=$!
  pids+=("$gcplocal_pid")
  gce=127.0.0.1:$port
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null -H 'Metadata-Flavor: Google' \
      "http://$gce/computeMetadata/v1/instance/service-accounts/default/token" && return 0
    sleep 0.1
  done
  echo "gcplocal did not answer on $gce" >&2
  return 1
}
