#!/usr/bin/env bash
# Mutation testing over the core with cargo-mutants (configured in .cargo/mutants.toml).
#
#   scripts/mutants.sh                        every core file, in two passes (below)
#   scripts/mutants.sh --in-diff origin/main  only mutants in lines changed since that ref
#   scripts/mutants.sh --file src/broker/cache/mod.rs [--file ...]   some files
#   scripts/mutants.sh --unit-only ...        the first pass only (fast; undercounts)
#   scripts/mutants.sh --jobs 2 ...           two mutants at a time (2 cores: about twice
#                                             as fast; pass 2 in two lanes of files)
#   scripts/mutants.sh --timeout 300 ...      pass 2's test timeout (pass 1's unit tests:
#                                             --unit-timeout, 60 s)
#   scripts/mutants.sh --again                pass 2 again, over the last run's survivors
#                                             only (after adding the tests that kill them)
#   scripts/mutants.sh ... -- CARGO_TEST_ARGS [-- TEST_BINARY_ARGS]
#                                             one pass, every mutant with these tests
#
# Two passes, because building every test binary for each mutant costs a minute on 2
# cores while the unit tests alone build in seconds:
#   1. every mutant with its package's unit tests (`cargo test --lib`);
#   2. the mutants pass 1 missed or timed out, file by file, with the integration tests
#      scripts/mutants-tests.txt names for that file (the whole package's tests for a file
#      it does not name), peer tests included: the peers are set up first by
#      `scripts/test.sh --setup-only`, and the same --skips apply as in scripts/test.sh.
# Pass 2 names its mutants exactly (a --re of their whole names), so it tests pass 1's
# survivors and nothing else. Only the mutants pass 2 still misses are survivors.
#
# Note the two `--` in the one-pass form: what follows the first goes to `cargo test`,
# what follows the second to the test binaries (`-- --lib -- --include-ignored`). With one
# `--`, --include-ignored goes to cargo, which refuses it, and every mutant counts as
# "caught": check a caught mutant's log (mutants.out/log) when a result looks too good.
# This script checks that for you: a caught mutant whose log holds no failed test and no
# timeout is reported as SUSPECT, and the script exits 1.
#
# Results land in ${REGBROKER_MUTANTS_OUT:-mutants.out.d}: pass1/, pass2/FILE/, and
# summary.txt with the totals and every survivor (survivors.txt: names only). Record them
# in TESTING.md. Other arguments pass through to `cargo mutants` (--timeout, --re, ...);
# pass 2 keeps all but the selection (--re, --exclude-re, --in-diff, --file).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "mutants.sh: $*" >&2; exit 64; }
log() { echo "mutants.sh: $*" >&2; }

if ! command -v cargo-mutants >/dev/null; then
  echo "cargo-mutants is missing: cargo install --locked cargo-mutants" >&2
  exit 1
fi

timeout2=()    # pass 2's --timeout
unit_timeout=60
args=()        # every pass
select=()      # pass 1 only: which mutants
files=()
again=
diff_file=""
jobs=${REGBROKER_MUTANTS_JOBS:-1}
unit_only=
one_pass=()
while (($#)); do
  case "$1" in
    --in-diff)
      (($# >= 2)) || die "--in-diff needs a git ref"
      diff_file=$(mktemp)
      git diff "$2" -- src providers >"$diff_file"
      select+=(--in-diff "$diff_file")
      shift 2 ;;
    --file | -f)
      # cargo-mutants adds --file to the configured globs rather than narrowing them;
      # a regexp on the mutant's name (which starts with its file) narrows.
      (($# >= 2)) || die "--file needs a path"
      [[ -f $2 ]] || die "--file $2: no such file"
      files+=("$2")
      shift 2 ;;
    --jobs | -j)
      (($# >= 2)) || die "--jobs needs a number"
      jobs=$2
      shift 2 ;;
    --unit-only | --lib-only) unit_only=1; shift ;;
    --again) again=1; shift ;;
    --timeout)
      # Pass 2's (integration tests); pass 1's unit tests get --unit-timeout (60 s).
      (($# >= 2)) || die "--timeout needs seconds"
      timeout2=(--timeout "$2")
      shift 2 ;;
    --unit-timeout)
      (($# >= 2)) || die "--unit-timeout needs seconds"
      unit_timeout=$2
      shift 2 ;;
    --re | -F | --exclude-re | -E)
      (($# >= 2)) || die "$1 needs a regexp"
      select+=("$1" "$2")
      shift 2 ;;
    --re=* | --exclude-re=*) select+=("$1"); shift ;;
    --)
      shift
      one_pass=(-- "$@")
      break ;;
    -h | --help)
      sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *)
      args+=("$1"); shift ;;
  esac
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive number, not '$jobs'"
if ((${#files[@]})); then
  re=$(printf '%s|' "${files[@]//./\\.}")
  select+=(--re "^(${re%|}):")
fi

out=${REGBROKER_MUTANTS_OUT:-$PWD/mutants.out.d}
if [[ -n $again ]]; then
  [[ -s $out/survivors.txt ]] || die "--again: no survivors recorded in $out/survivors.txt"
  ((${#select[@]} == 0 && ${#one_pass[@]} == 0)) || die "--again takes no selection and no test arguments"
  previous=$(mktemp -d "$out/again.XXXX")
  mv "$out/survivors.txt" "$previous/"
  for d in pass1 pass2 summary.txt; do [[ ! -e $out/$d ]] || mv "$out/$d" "$previous/"; done
else
  rm -rf "$out"
fi
mkdir -p "$out"
export CARGO_TERM_COLOR=never
shared_target="${REGBROKER_MUTANTS_TARGET:-$PWD/target/mutants}"
mkdir -p "$shared_target"
# No debug info: the builds are for running tests, and smaller objects link faster. This
# target directory is the mutants' own, so it costs no rebuild elsewhere.
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-0} CARGO_PROFILE_TEST_DEBUG=${CARGO_PROFILE_TEST_DEBUG:-0}
# One job builds in a shared target directory, kept across runs, so dependencies build
# once. Several jobs must not share one: each waits for the other's build lock, and each
# build overwrites `target/debug/regbroker`, the binary the integration tests run. So with
# several jobs each builds in its own copy of the tree (dependencies once per job), and
# pass 2 runs lanes of one job each, every lane in a target directory of its own.
target_for() {
  if ((jobs > 1)); then unset CARGO_TARGET_DIR; else export CARGO_TARGET_DIR=$shared_target; fi
}

# --gitignore true: the copy of the tree leaves out what .gitignore lists (fuzz/target,
# the venv), which otherwise filled the disk while being copied.
mutants() {
  local o=$1
  shift
  mkdir -p "$o"
  local rc=0
  cargo mutants --workspace --jobs "${mutant_jobs:-$jobs}" --gitignore true --output "$o" "$@" || rc=$?
  # 0: all caught; 2: some missed; 3: some timed out; 4: the baseline failed; else broken.
  case $rc in 0 | 2 | 3) ;; *) log "cargo mutants exited $rc (see $o/mutants.out/debug.log)"; exit "$rc" ;; esac
}

# Pass 2 of one file's survivors (listed in $1), one mutant at a time.
pass2_file() {
  local list=$1 f=$2 o names cover cover_args a
  # The exact names, as one regexp.
  names=$(awk -v f="$f" 'index($0, f ":") == 1' "$list" | python3 -c '
import re, sys
print("^(" + "|".join(re.escape(l.rstrip("\n")) for l in sys.stdin) + ")$")')
  # (`read` fails at the end of empty input: a file with no line there.)
  read -r -a cover < <(awk -v f="$f" '$1 == f { $1 = ""; print }' scripts/mutants-tests.txt) || true
  # The unit tests too: after new tests, --again must see the unit tests' kills.
  cover_args=()
  ((${#cover[@]} == 0)) || cover_args=(--cargo-arg=--lib)
  for a in "${cover[@]}"; do cover_args+=(--cargo-arg="$a"); done
  log "pass 2: $f with ${cover[*]:-the whole package tests}"
  o="$out/pass2/${f//\//_}"
  mkdir -p "$o"
  awk -v f="$f" 'index($0, f ":") == 1' "$list" >"$o/given.txt"
  # --no-config --file: only this file is read, because cargo-mutants 27.1 adds its
  # "delete field" mutants of every examined file whatever --re says. --jobs 1: two jobs
  # in one target directory would overwrite each other's `target/debug/regbroker`, the
  # binary the integration tests run, so a test could run another mutant's binary.
  mutant_jobs=1 mutants "$o" "${args[@]}" "${timeout2[@]}" --no-config --file "$f" --re "$names" \
    "${cover_args[@]}" -- -- "${test_args[@]}"
}

# Pass 2 over the survivors listed in the file $1 (one name a line): the files, most
# survivors first, dealt to $jobs lanes; each lane tests one mutant at a time in a target
# directory of its own.
pass2() {
  local list=$1 f i lane best
  REGBROKER_VENV=${REGBROKER_VENV:-$PWD/.ci/.venv} \
    bash scripts/test.sh --setup-only --env-file "$out/test-env.sh" >"$out/setup.log" 2>&1 ||
    { cat "$out/setup.log" >&2; die "the peers could not be set up (scripts/test.sh --setup-only)"; }
  test_args=()
  # shellcheck source=/dev/null
  . "$out/test-env.sh"
  local -a lane_files load pids
  for ((i = 0; i < jobs; i++)); do lane_files[i]=""; load[i]=0; done
  while read -r n f; do
    best=0
    for ((i = 1; i < jobs; i++)); do ((load[i] < load[best])) && best=$i; done
    lane_files[best]+="$f "
    load[best]=$((load[best] + n))
    passes+=("$out/pass2/${f//\//_}")
  done < <(cut -d: -f1 "$list" | sort | uniq -c | sort -rn)
  for ((i = 0; i < jobs; i++)); do
    [[ -n ${lane_files[i]} ]] || continue
    (
      lane=$shared_target
      ((i == 0)) || lane=$shared_target-lane$i
      export CARGO_TARGET_DIR=$lane
      for f in ${lane_files[i]}; do pass2_file "$list" "$f"; done
    ) >"$out/pass2-lane$i.log" 2>&1 &
    pids+=($!)
    log "pass 2, lane $i (log: $out/pass2-lane$i.log): ${lane_files[i]}"
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  ((failed == 0)) || die "pass 2 failed (see $out/pass2-lane*.log)"
}

started=$SECONDS
passes=()
if [[ -n $again ]]; then
  log "pass 2 again, over $(wc -l <"$previous/survivors.txt") survivors of the last run"
  pass2 "$previous/survivors.txt"
elif ((${#one_pass[@]})); then
  log "one pass, tests: ${one_pass[*]:1}"
  target_for
  mutants "$out/pass1" "${args[@]}" "${timeout2[@]}" "${select[@]}" "${one_pass[@]}"
  passes=("$out/pass1")
else
  log "pass 1: every mutant with its package's unit tests"
  target_for
  # What the selection names (cargo-mutants 27.1 tests "delete field" mutants beyond it).
  mkdir -p "$out/pass1"
  cargo mutants --workspace --list "${select[@]}" |
    python3 scripts/mutants_summary.py --select "${select[@]}" >"$out/pass1/given.txt"
  mutants "$out/pass1" "${args[@]}" "${select[@]}" --timeout "$unit_timeout" --cargo-arg=--lib
  passes=("$out/pass1")
  python3 scripts/mutants_summary.py --survivors "$out/pass1" >"$out/pass1/left.txt"
  if [[ -z $unit_only && -s $out/pass1/left.txt ]]; then
    pass2 "$out/pass1/left.txt"
  fi
fi
[ -z "$diff_file" ] || rm -f "$diff_file"

# --- Summary ------------------------------------------------------------------------------
# scripts/mutants_summary.py: caught and unviable add up over the passes; missed and timed
# out are what the last pass of each file left; each pass counts only the mutants it was
# given; a caught mutant whose log shows no failed test is SUSPECT.
python3 scripts/mutants_summary.py --elapsed $((SECONDS - started)) \
  "${passes[@]}" | tee "$out/summary.txt"
rc=${PIPESTATUS[0]}
python3 scripts/mutants_summary.py --survivors "${passes[@]}" >"$out/survivors.txt"
exit "$rc"
