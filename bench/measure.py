#!/usr/bin/env python3
"""Small measuring tools for bench/run.sh (standard library only).

  startup RUNS PATH -- CMD...   spawn CMD RUNS times, poll http://ADDR/PATH until 200
                                (ADDR from the env var BENCH_ADDR), print the median ms
  rss PID                       print VmRSS of PID in KiB
  fill ADDR PREFIX SUFFIX N     GET /v1/credentials?registry=PREFIX<i, 5 digits>SUFFIX for i < N
                                over 4 keep-alive connections; fail on any non-200
  wrk FILE...                   parse wrk --latency outputs: print "rps p99_us cpu_us" medians
                                (cpu_us: the server's CPU per request, from FILE.cpu)
  hyperfine FILE...             print "name median_ms": each command's median of the
                                exports' medians
  fill-markdown FILE KEY=VALUE  replace @KEY@ placeholders in FILE
"""

import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time


def startup(runs, path, cmd):
    addr = os.environ["BENCH_ADDR"]
    host, port = addr.rsplit(":", 1)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    c = http.client.HTTPConnection(host, int(port), timeout=1)
                    c.request("GET", path)
                    if c.getresponse().status == 200:
                        times.append((time.perf_counter() - t0) * 1000)
                        break
                except OSError:
                    pass
                if proc.poll() is not None:
                    sys.exit(f"{cmd[0]} exited before answering")
                if time.perf_counter() - t0 > 10:
                    sys.exit(f"{cmd[0]} did not answer {path} within 10 s")
                time.sleep(0.0005)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    print(f"{statistics.median(times):.1f}")


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                print(line.split()[1])
                return
    sys.exit("no VmRSS")


def fill(addr, prefix, suffix, n):
    host, port = addr.rsplit(":", 1)
    errors = []

    def worker(k):
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        for i in range(k, n, 4):
            c.request("GET", f"/v1/credentials?registry={prefix}{i:05d}{suffix}")
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                errors.append(f"{prefix}{i:05d}{suffix}: {r.status} {body[:200]!r}")
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(errors[0])


UNITS = {"us": 1, "ms": 1000, "s": 1_000_000}


def wrk(files):
    rps, p99, cpu = [], [], []
    for name in files:
        text = open(name).read()
        if "Non-2xx" in text or "Socket errors" in text:
            sys.exit(f"{name}: errors during the run:\n{text}")
        rps.append(float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)))
        v, unit = re.search(r"\s99%\s+([\d.]+)(us|ms|s)\b", text).groups()
        p99.append(float(v) * UNITS[unit])
        # The server's CPU time (user + system clock ticks) during the run, when the
        # script recorded it beside: CPU per request is a figure the machine's other load
        # hardly moves, unlike requests per second.
        if os.path.exists(name + ".cpu"):
            ticks = int(open(name + ".cpu").read())
            requests = int(re.search(r"(\d+) requests in", text).group(1))
            cpu.append(ticks * 1e6 / os.sysconf("SC_CLK_TCK") / requests)
    cpu_us = f"{statistics.median(cpu):.2f}" if cpu else "-"
    print(f"{statistics.median(rps):.0f} {statistics.median(p99):.0f} {cpu_us}")


def hyperfine(paths):
    medians = {}
    for path in paths:
        for r in json.load(open(path))["results"]:
            medians.setdefault(r["command"], []).append(r["median"])
    for name, values in medians.items():
        print(f"{name}\t{statistics.median(values) * 1000:.2f}")


def fill_markdown(path, pairs):
    text = open(path).read()
    for pair in pairs:
        k, v = pair.split("=", 1)
        text = text.replace(f"@{k}@", v)
    left = re.findall(r"@[A-Z0-9_]+@", text)
    if left:
        sys.exit(f"unfilled placeholders: {left}")
    open(path, "w").write(text)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "startup":
        sep = args.index("--")
        startup(int(args[0]), args[1], args[sep + 1:])
    elif cmd == "rss":
        rss(args[0])
    elif cmd == "fill":
        fill(args[0], args[1], args[2], int(args[3]))
    elif cmd == "wrk":
        wrk(args)
    elif cmd == "hyperfine":
        hyperfine(args)
    elif cmd == "fill-markdown":
        fill_markdown(args[0], args[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
