#!/usr/bin/env bash
# Builds the two release binaries regbroker ships, into OUT_DIR (default dist/):
#
#   regbroker                    static-pie (musl): the long-running sidecar keeps full
#                                ASLR for its own image.
#   docker-credential-regbroker  the same program linked as a plain static executable
#                                (no PIE): the one-shot helper modes (docker credential
#                                helper, kubelet credential provider) start once per
#                                client call, and a PIE build spends most of that start
#                                applying ~41,000 relocations to 640 KiB of
#                                .data.rel.ro (one copy-on-write page fault per page).
#                                It also keeps musl's malloc (the sidecar uses
#                                mimalloc; see src/main.rs). Measured in BENCHMARKS.md
#                                ("Profiles and changes").
#
# Both are the same source; the helper answers every subcommand too. Used by the
# Dockerfile and bench/run.sh.
#
# Usage: scripts/build-release.sh [OUT_DIR]
# Env:   TARGET (default: <machine>-unknown-linux-musl), CARGO_TARGET_DIR, CARGO_FLAGS
#        (extra flags for cargo, e.g. --locked).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
target=${TARGET:-$(uname -m)-unknown-linux-musl}
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
built=$target_dir/$target/release/regbroker
read -r -a flags <<<"${CARGO_FLAGS:-}"

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
  echo "build-release.sh: the Rust target $target is missing: rustup target add $target" >&2
  exit 1
fi
mkdir -p "$out"
# The order matters: `cargo rustc` with extra flags changes the last unit's fingerprint,
# so each link below is redone and neither binary is a stale copy of the other.
cargo build "${flags[@]}" --release --target "$target" --bin regbroker
cp "$built" "$out/regbroker.tmp" && mv "$out/regbroker.tmp" "$out/regbroker"
cargo rustc "${flags[@]}" --release --target "$target" --bin regbroker -- -C relocation-model=static --cfg regbroker_helper_link
cp "$built" "$out/docker-credential-regbroker.tmp"
mv "$out/docker-credential-regbroker.tmp" "$out/docker-credential-regbroker"

# Say what was built, and fail if the links did not come out as intended.
kind() { LC_ALL=C readelf -h "$1" | awk '/Type:/ {print $2}'; }
[ "$(kind "$out/regbroker")" = DYN ] || { echo "build-release.sh: regbroker is not position-independent" >&2; exit 1; }
[ "$(kind "$out/docker-credential-regbroker")" = EXEC ] || { echo "build-release.sh: the helper is not a plain executable" >&2; exit 1; }
ls -l "$out/regbroker" "$out/docker-credential-regbroker" >&2
