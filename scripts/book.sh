#!/usr/bin/env bash
# Builds the book (docs/ -> docs/book/) with mdBook and checks its internal links and
# anchors, and README.md's links into it (scripts/book_links.py). Fails on a broken link.
#
# mdBook is installed from crates.io (`cargo install --locked`) into scripts/peers.sh's
# cache, keyed by its version like the Go peers:
#   ${REGBROKER_PEERS_DIR:-$HOME/.cache/regbroker-peers}/mdbook-$MDBOOK_VERSION/bin/mdbook
# The first build takes a few minutes (without mdBook's `serve` and `watch` features,
# which only `mdbook serve` needs); later runs build nothing. MDBOOK=/path/to/mdbook uses
# that binary instead.
#
# Usage: scripts/book.sh [--install-only]
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4
tools=${REGBROKER_PEERS_DIR:-$HOME/.cache/regbroker-peers}
root=$tools/mdbook-$MDBOOK_VERSION

if [[ -z ${MDBOOK:-} ]]; then
  MDBOOK=$root/bin/mdbook
  if [[ ! -x $MDBOOK ]]; then
    echo "book.sh: installing mdbook $MDBOOK_VERSION into $root" >&2
    # A private target dir: the workspace's target/ is not for tools, and a failed
    # install leaves no half-built binary in the cache.
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    CARGO_TARGET_DIR=$build cargo install --locked --quiet mdbook --version "$MDBOOK_VERSION" \
      --no-default-features --features search --root "$root"
  fi
fi
[[ ${1:-} == --install-only ]] && exit 0

python=python3
[[ -x ${REGBROKER_VENV:-.ci/.venv}/bin/python ]] && python=${REGBROKER_VENV:-.ci/.venv}/bin/python

"$MDBOOK" build docs
"$python" scripts/book_links.py --html docs/book .
