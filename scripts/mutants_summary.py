#!/usr/bin/env python3
"""Totals of a scripts/mutants.sh run, from each pass's mutants.out/outcomes.json.

    mutants_summary.py [--elapsed S] PASS_DIR...    the summary; exit 0 when every mutant
                                                    was caught
    mutants_summary.py --survivors PASS_DIR...      missed mutants' names, one a line
    mutants_summary.py --select SELECTION...        names on stdin that the selection
                                                    (--re, --exclude-re) names

PASS_DIRs in the order they ran: a later result for a mutant replaces an earlier one. A
pass 2 run counts only the mutants it was given (its given.txt), and every
pass leaves out the names .cargo/mutants.toml excludes: cargo-mutants 27.1 tests its
"delete field" mutants whatever --re and exclude_re say.
Exit status: 0 all caught, 1 a SUSPECT catch (no failed test in its log), 2 missed,
3 timed out.
"""
import json
import re
import sys
import tomllib
from pathlib import Path


def outcomes(pass_dir):
    out = Path(pass_dir) / "mutants.out"
    if not (out / "outcomes.json").is_file():
        return  # a pass that has not started (or was stopped early)
    for o in json.loads((out / "outcomes.json").read_text())["outcomes"]:
        mutant = o["scenario"].get("Mutant") if isinstance(o["scenario"], dict) else None
        if mutant:
            yield mutant["name"], o["summary"], out / o["log_path"]


def select(argv):
    """Filters names on stdin by cargo-mutants' selection arguments (--re, --exclude-re)."""
    examine, exclude = [], []
    it = iter(argv)
    for a in it:
        for flag, into in [("--re", examine), ("-F", examine), ("--exclude-re", exclude), ("-E", exclude)]:
            if a == flag:
                into.append(re.compile(next(it)))
            elif a.startswith(flag + "="):
                into.append(re.compile(a[len(flag) + 1 :]))
    for line in sys.stdin:
        name = line.rstrip("\n")
        if name and (not examine or any(r.search(name) for r in examine)) and not any(
            r.search(name) for r in exclude
        ):
            print(name)
    return 0


def main(argv):
    if argv[:1] == ["--select"]:
        return select(argv[1:])
    survivors_only = "--survivors" in argv
    elapsed = None
    dirs = []
    it = iter(argv)
    for a in it:
        if a == "--elapsed":
            elapsed = next(it)
        elif not a.startswith("--"):
            dirs.append(a)
    config = tomllib.loads(Path(".cargo/mutants.toml").read_text())
    excluded = [re.compile(r) for r in config.get("exclude_re", [])]

    def kept(name):
        return not any(r.search(name) for r in excluded)

    final = {}  # name -> (summary, log) of the last pass that tested it
    caught = unviable = 0
    suspects = []
    for d in dirs:
        # A pass 2 run keeps the names it was given in given.txt.
        given_file = Path(d) / "given.txt"
        given = set(given_file.read_text().splitlines()) if given_file.is_file() else None
        for name, summary, log in outcomes(d):
            if kept(name) and (given is None or name in given):
                final[name] = (summary, log)
    for name, (summary, log) in final.items():
        if summary == "CaughtMutant":
            caught += 1
            text = log.read_text(errors="replace") if log.is_file() else ""
            if not re.search(r"^test result: FAILED|^failures:$|panicked at", text, re.M):
                suspects.append(f"{name} ({log})")
        elif summary == "Unviable":
            unviable += 1
    missed = sorted(n for n, (s, _) in final.items() if s == "MissedMutant")
    timeouts = sorted(n for n, (s, _) in final.items() if s == "Timeout")
    if survivors_only:
        # Timed-out mutants are caught (a test hung); --again need not wait for them again.
        print("\n".join(missed))
        return 0
    took = f" in {elapsed} s" if elapsed else ""
    print(
        f"mutants: {len(final)} tested{took}: {caught} caught, {len(missed)} missed, "
        f"{unviable} unviable, {len(timeouts)} timed out"
    )
    for title, names in [("missed", missed), ("timed out (caught, but slow)", timeouts)]:
        if names:
            print(f"{title}:")
            print("\n".join(f"  {n}" for n in names))
    for s in suspects:
        print(f"SUSPECT (caught, but no test failed in its log): {s}")
    if suspects:
        return 1
    return 2 if missed else 3 if timeouts else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
