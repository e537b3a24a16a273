#!/usr/bin/env bash
# Bounded soak test: SOAK_SECS (default 120) seconds, SOAK_CONNS (default 5000) keep-alive
# connections on loopback, mixed hits and misses, the upstream failing every second call.
# Prints counts and RSS before/after; fails if a cache hit ever saw an error.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n "$(( ${SOAK_CONNS:-5000} * 2 + 1024 ))" 2>/dev/null || true
exec cargo test --release --test soak -- --ignored --nocapture
