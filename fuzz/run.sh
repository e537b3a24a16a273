#!/usr/bin/env bash
# Runs regbroker's fuzz targets with cargo-fuzz on the STABLE toolchain.
#
#   fuzz/run.sh                   fuzz every target for 60 s each
#   fuzz/run.sh -t 300 http_query fuzz one target for 300 s
#   fuzz/run.sh --replay          build, then run every target over its committed seeds
#                                 and regressions only (no fuzzing; the CI smoke). The
#                                 replay builds unoptimised (`--dev`): cargo-fuzz's release
#                                 builds use one codegen unit, and with the cloud SDKs in
#                                 the provider targets that cold build took 32 min here
#                                 against 10 min for `--dev`, for inputs run once each
#
# Options / environment:
#   -t SECS, FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGET_DIR         cargo target dir (default fuzz/target)
#
# Stable works because no sanitizer is asked for (`-s none`): cargo-fuzz then passes only
# stable rustc flags (`-Cpasses=sancov-module`, `-Cllvm-args=-sanitizer-coverage-*`,
# `--cfg fuzzing`), and libfuzzer-sys builds libFuzzer with the system C++ compiler.
# AddressSanitizer needs nightly (`-Zsanitizer`); the code is `#![forbid(unsafe_code)]`,
# so the fuzzers look for panics, overflows (debug assertions are on) and broken
# properties, not memory errors.
#
# New inputs found while fuzzing go to fuzz/corpus-work/TARGET (not committed); the
# committed seeds in fuzz/corpus/TARGET are only read. A crash is written to
# fuzz/artifacts/TARGET/; keep it under fuzz/regressions/TARGET/ once fixed, where
# tests/fuzz_regressions.rs (plain `cargo test`) and `--replay` run it forever after.
#
# Needs: cargo-fuzz (`cargo install cargo-fuzz --locked`) and a C++ compiler (g++).
set -euo pipefail

cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-60}"
replay=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t) seconds="$2"; shift 2 ;;
        --replay) replay=1; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi
target_dir=(--target-dir "${FUZZ_TARGET_DIR:-target}")

mode=()
[ "$replay" = 1 ] && mode=(--dev)
cargo fuzz build -s none "${mode[@]}" "${target_dir[@]}"

for t in "${targets[@]}"; do
    dirs=("corpus/$t")
    [ -d "regressions/$t" ] && dirs+=("regressions/$t")
    if [ "$replay" = 1 ]; then
        echo "== $t: replaying ${dirs[*]}"
        # -runs=0: execute every input once, fuzz nothing.
        cargo fuzz run -s none "${mode[@]}" "${target_dir[@]}" "$t" "${dirs[@]}" -- -runs=0
    else
        echo "== $t: fuzzing for ${seconds}s"
        mkdir -p "corpus-work/$t"
        cargo fuzz run -s none "${target_dir[@]}" "$t" "corpus-work/$t" "${dirs[@]}" -- \
            -max_total_time="$seconds" -max_len=4096 -timeout=10 -print_final_stats=1
    fi
done
