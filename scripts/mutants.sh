#!/usr/bin/env bash
# Mutation testing over the core with cargo-mutants (configured in .cargo/mutants.toml).
#
#   scripts/mutants.sh                        every core file (hours on 2 cores)
#   scripts/mutants.sh --in-diff origin/main  only mutants in lines changed since that ref
#   scripts/mutants.sh --file src/broker/cache.rs [--file ...]   some files
#   scripts/mutants.sh --lib-only ...         only the unit tests (fast; undercounts)
#
# Other arguments pass through to `cargo mutants`. Results land in mutants.out/
# (caught.txt, missed.txt, timeout.txt, unviable.txt, outcomes.json); record them in
# TESTING.md. Builds go to their own target directory (REGBROKER_MUTANTS_TARGET, default
# target/mutants) so that dependencies are built once and reused across runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-mutants >/dev/null; then
  echo "cargo-mutants is missing: cargo install --locked cargo-mutants" >&2
  exit 1
fi

args=()
diff_file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --in-diff)
      [ $# -ge 2 ] || { echo "--in-diff needs a git ref" >&2; exit 64; }
      diff_file=$(mktemp)
      git diff "$2" -- src providers > "$diff_file"
      args+=(--in-diff "$diff_file")
      shift 2 ;;
    --file|-f)
      # cargo-mutants adds --file to the configured globs rather than narrowing them;
      # a regexp on the mutant's name (which starts with its file) narrows.
      [ $# -ge 2 ] || { echo "--file needs a path" >&2; exit 64; }
      args+=(--re "^$2:")
      shift 2 ;;
    --lib-only)
      args+=(--cargo-test-arg=--lib)
      shift ;;
    -h|--help)
      sed -n '2,16p' "$0"; exit 0 ;;
    *)
      args+=("$1"); shift ;;
  esac
done

# A build directory that already holds the dependencies (CARGO_BUILD_BUILD_DIR, as on
# the shared development machines) is reused: then only the workspace's own crates are
# rebuilt for the mutated copy. Otherwise everything builds once into target/mutants.
export CARGO_TARGET_DIR="${REGBROKER_MUTANTS_TARGET:-$PWD/target/mutants}"
# Profile settings (CARGO_PROFILE_*_DEBUG and the like) are left as the caller has them:
# a different value would rebuild every dependency in a shared build directory.
export CARGO_TERM_COLOR=never
started=$SECONDS
status=0
# --gitignore true: the copy of the tree leaves out what .gitignore lists (fuzz/target,
# the venv), which otherwise filled the disk while being copied.
cargo mutants --workspace --jobs 1 --gitignore true "${args[@]}" || status=$?
echo "cargo mutants exited $status after $((SECONDS - started)) s (see mutants.out/)"
[ -z "$diff_file" ] || rm -f "$diff_file"
# cargo-mutants exits 2 when mutants were missed, 3 when some timed out.
exit "$status"
