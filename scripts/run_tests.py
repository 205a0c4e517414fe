#!/usr/bin/env python3
"""scripts/run_tests.py - `make test`: every meson test suite on both trees.

`make test` builds two trees with every part enabled: build/ (optimised) and
build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer).  This script
starts the Redis and PostgreSQL servers the tests need (scripts/services.sh,
on loopback ports in a temporary directory, unless IDEM_TEST_REDIS_URL and
IDEM_TEST_PG_URL name some already), then runs `meson test` on both trees at
once: build/ plainly, build-asan/ with the `asan` test setup
(tests/meson.build).  The two trees' tests are independent (every test has
its own ports, directories, key prefixes and tables), and most of them wait
on sockets and child processes, so running them side by side fills the two
cores that one tree alone leaves half idle.

Every meson test runs through tests/run_one.py, which ends its output with
"N passed, N failed" counting the cases inside it (Criterion tests, unittest
methods, chaos verdicts).  This script reads those lines back from each
tree's meson-logs/testlog.json and adds them up, so the last line counts
test cases, not programs:

    N passed, N failed

A test meson reports as skipped counts as a failure here: `make test` builds
and starts everything, so a skip means something it needs was missing.  The
servers are stopped at the end, whatever happened.  --suite limits the run
to some suites, --builds to some trees; the whole log of each test is in
<tree>/meson-logs/testlog.txt.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COUNT_RE = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", re.M)


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []

    def add(self, name, passed, failed, skipped=0):
        self.passed += passed
        self.failed += failed
        self.skipped += skipped
        if failed:
            self.failures.append(f"{name}: {failed} failed")


def run(cmd, timeout=None, env=None):
    try:
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True, errors="replace", env=env)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode("utf-8", "replace")
        return -1, out + f"\n[run_tests] TIMEOUT after {timeout}s\n"


class Services:
    """The Redis and PostgreSQL servers of the tests: started here unless the
    environment names some already."""

    def __init__(self):
        self.dir = None

    def start(self):
        if os.environ.get("IDEM_TEST_REDIS_URL") and os.environ.get("IDEM_TEST_PG_URL"):
            return True
        self.dir = tempfile.mkdtemp(prefix="idem-services-")
        start = time.monotonic()
        rc, out = run(["bash", "scripts/services.sh", "start", self.dir], timeout=300)
        if rc != 0:
            print(f"  services: could not start Redis and PostgreSQL (rc={rc}):\n{out}", flush=True)
            return False
        for line in out.splitlines():
            m = re.match(r"export (IDEM_TEST_\w+)=(\S+)$", line)
            if m:
                os.environ[m.group(1)] = m.group(2)
        print(f"  services: {os.environ.get('IDEM_TEST_REDIS_URL')} "
              f"{os.environ.get('IDEM_TEST_PG_URL')} ({time.monotonic() - start:.1f}s)", flush=True)
        return True

    def stop(self):
        if self.dir:
            run(["bash", "scripts/services.sh", "stop", self.dir], timeout=120)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def meson_test(build, setup, suites, jobs, results):
    """Run one tree's tests; results[build] = (rc, seconds, output)."""
    cmd = ["meson", "test", "-C", build, "--no-rebuild", "--num-processes", str(jobs),
           "--print-errorlogs"]
    if setup:
        cmd += ["--setup", setup]
    for s in suites:
        cmd += ["--suite", s]
    start = time.monotonic()
    rc, out = run(cmd, timeout=80 * 60)
    results[build] = (rc, time.monotonic() - start, out)


def read_testlog(build, setup):
    """meson writes testlog.json, or testlog-<setup>.json under a setup."""
    name = f"testlog-{setup}.json" if setup else "testlog.json"
    path = os.path.join(ROOT, build, "meson-logs", name)
    entries = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    entries.append(json.loads(line))
    except OSError:
        pass
    return entries


def count(tally, label, entries):
    """Add each test's own count; a test without one is one failure."""
    rows = []
    for e in entries:
        name = f"{label}:{e.get('name')}"
        result = e.get("result", "")
        out = e.get("stdout") or ""
        m = COUNT_RE.findall(out)
        if result == "SKIP":
            passed, failed, skipped = 0, 1, 0
        elif m:
            passed, failed, skipped = int(m[-1][0]), int(m[-1][1]), int(m[-1][2] or 0)
            if result not in ("OK", "EXPECTEDFAIL") and failed == 0:
                failed = 1
        else:
            passed, failed, skipped = (1, 0, 0) if result == "OK" else (0, 1, 0)
        tally.add(name, passed, failed, skipped)
        rows.append((name, passed, failed, skipped, float(e.get("duration") or 0), result))
    for name, passed, failed, skipped, secs, result in sorted(rows):
        extra = f", {skipped} skipped" if skipped else ""
        flag = "" if result in ("OK", "EXPECTEDFAIL") else f" [{result}]"
        print(f"  {name}: {passed} passed, {failed} failed{extra} ({secs:.1f}s){flag}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", default="build,build-asan", help="comma-separated build trees")
    ap.add_argument("--suite", action="append", default=[], help="run only this suite (repeatable)")
    ap.add_argument("--no-fuzz", action="store_true", help="leave out the fuzz suite")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("IDEM_TEST_JOBS", "3")),
                    help="tests at once in each tree (default 3, $IDEM_TEST_JOBS)")
    args = ap.parse_args()

    tally = Tally()
    services = Services()
    started = time.monotonic()
    try:
        print("services:", flush=True)
        if not services.start():
            tally.add("services", 0, 1)
        suites = list(args.suite)
        if args.no_fuzz and not suites:
            suites = ["unit", "store", "blackbox", "examples", "chaos", "lint"]
        results = {}
        threads = []
        for build in args.builds.split(","):
            setup = "asan" if "asan" in build else None
            t = threading.Thread(target=meson_test, args=(build, setup, suites, args.jobs, results))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        for build in args.builds.split(","):
            rc, secs, out = results.get(build, (-1, 0.0, "not run"))
            setup = "asan" if "asan" in build else None
            label = setup or "plain"
            print(f"{build} ({secs:.0f}s, meson test exit {rc}):", flush=True)
            entries = read_testlog(build, setup)
            if not entries:
                print(out[-4000:], flush=True)
                tally.add(f"{label}:meson-test", 0, 1)
                continue
            count(tally, label, entries)
            if rc != 0 and not any(e.get("result") != "OK" for e in entries):
                # meson itself failed (a timeout of the whole run, say).
                print(out[-4000:], flush=True)
                tally.add(f"{label}:meson-test", 0, 1)
    finally:
        services.stop()
    if tally.failures:
        print("failures (logs in build/meson-logs/testlog.txt, build-asan/meson-logs/testlog-asan.txt):")
        for f in tally.failures:
            print("  " + f)
    print(f"make test: {time.monotonic() - started:.0f}s", flush=True)
    print(f"{tally.passed} passed, {tally.failed} failed", flush=True)
    return 0 if tally.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
