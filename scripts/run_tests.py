#!/usr/bin/env python3
"""scripts/run_tests.py - run every test suite of idem and add up the results.

`make test` calls this after building two trees: build/ (optimised) and
build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer).  For each tree it
runs every Criterion binary (unit and store suites) and the black-box suite
against that tree's idemd; then the HTTP fuzzers for a bounded time, and the
lint.  Criterion's and unittest's own summaries are parsed so the last line
counts test cases, not binaries:

    N passed, N failed

A sanitizer report (ASan, LSan, UBSan) in any output counts as a failure even
when the runner itself said the test passed, because Criterion reports a
leak found in a forked test worker but keeps its verdict.

The Redis and PostgreSQL stores are tested on real servers: unless
IDEM_TEST_REDIS_URL and IDEM_TEST_PG_URL are set already, this starts both
(scripts/services.sh) on loopback ports in a temporary directory, exports
those two variables to every suite, and stops them at the end, whatever
happened.  The black-box suite then runs once more per build on each.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRITERION_RE = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures = []

    def add(self, name, passed, failed):
        self.passed += passed
        self.failed += failed
        if failed:
            self.failures.append(f"{name}: {failed} failed")


def run(cmd, env=None, timeout=None, cwd=ROOT):
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True, errors="replace")
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or "") if isinstance(e.stdout, str) else (e.stdout or b"").decode("utf-8", "replace")
        out += f"\n[run_tests] TIMEOUT after {timeout}s\n"
        rc = -1
    return rc, out, time.monotonic() - start


def sanitizer_env(env):
    env = dict(env)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:strict_string_checks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    env.setdefault("LSAN_OPTIONS", "exitcode=23")
    return env


LEAK_RE = re.compile(r"^(Direct|Indirect) leak of .*?\n((?:\s+#\d+ .*\n?)+)", re.M)
# Frames that are the allocator, libc or the test framework itself.
FRAMEWORK_RE = re.compile(r"libasan|liblsan|libc\.so|ld-linux|libcriterion|libnanomsg|libboxfort"
                          r"|\b(malloc|calloc|realloc|strdup|__interceptor_\w+)\b")


def leaks_of_ours(out):
    """The leak reports in out that have at least one frame of idem's code.
    Criterion's runner keeps a small allocation now and then at exit (seen
    once: 48 bytes, calloc inside libcriterion.so); a report whose every
    frame is the allocator, libc or the framework is that, not ours.  A
    blanket suppression of libcriterion.so would hide every leak of a test,
    since every test runs below a libcriterion frame."""
    ours = []
    for m in LEAK_RE.finditer(out):
        frames = [f for f in m.group(2).splitlines() if f.strip()]
        if any(not FRAMEWORK_RE.search(f) for f in frames):
            ours.append(m.group(0))
    return ours


def criterion_suites(build):
    found = []
    for sub in ("tests/unit", "tests/store", "tests/tx"):
        d = os.path.join(build, sub)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if name.startswith("test_") and os.access(path, os.X_OK) and os.path.isfile(path):
                found.append(path)
    return found


def run_criterion(tally, build, label, env, log):
    for exe in criterion_suites(build):
        name = f"{label}:{os.path.basename(exe)}"
        rc, out, secs = run([exe, "--jobs=2", "--ascii"], env=env, timeout=900)
        log.write(f"===== {name} (rc={rc}, {secs:.1f}s)\n{out}\n")
        m = CRITERION_RE.search(out)
        if m:
            passed, failing, crashing = int(m.group(2)), int(m.group(3)), int(m.group(4))
            failed = failing + crashing
        else:
            passed, failed = 0, 1
        framework_leak_only = False
        if re.search(r"ERROR: AddressSanitizer|runtime error:", out) or leaks_of_ours(out):
            failed += 1
        elif "ERROR: LeakSanitizer" in out:
            framework_leak_only = True
            log.write(f"===== {name}: a leak of the test framework only (not counted)\n")
        if rc != 0 and failed == 0 and not (framework_leak_only and rc == 23):
            failed = 1
        tally.add(name, passed, failed)
        print(f"  {name}: {passed} passed, {failed} failed ({secs:.1f}s)", flush=True)


def run_blackbox(tally, build, label, env, log, pattern, directory="tests/blackbox"):
    env = dict(env)
    env["IDEMD"] = os.path.join(ROOT, build, "idemd")
    env["IDEMCTL"] = os.path.join(ROOT, build, "idemctl")
    env["IDEM_BUILD"] = os.path.join(ROOT, build)
    cmd = [sys.executable, "-m", "unittest", "discover", "-s", directory, "-t", ".", "-p", pattern, "-v"]
    rc, out, secs = run(cmd, env=env, timeout=2400)
    name = f"{label}:{os.path.basename(directory)}"
    log.write(f"===== {name} (rc={rc}, {secs:.1f}s)\n{out}\n")
    ran = re.search(r"^Ran (\d+) tests?", out, re.M)
    total = int(ran.group(1)) if ran else 0
    failed = 0
    m = re.search(r"^FAILED \(([^)]*)\)", out, re.M)
    if m:
        for part in m.group(1).split(","):
            k, _, v = part.strip().partition("=")
            if k in ("failures", "errors", "unexpected successes"):
                failed += int(v)
    skipped = 0
    s = re.search(r"skipped=(\d+)", out)
    if s:
        skipped = int(s.group(1))
    if total == 0 or (rc != 0 and failed == 0):
        failed = max(failed, 1)
    passed = max(total - failed - skipped, 0)
    tally.add(name, passed, failed)
    print(f"  {name}: {passed} passed, {failed} failed, {skipped} skipped ({secs:.1f}s)", flush=True)


def run_counted(tally, name, cmd, log, timeout=900, env=None):
    """A step that ends with its own `N passed, N failed` line."""
    rc, out, secs = run(cmd, timeout=timeout, env=env)
    log.write(f"===== {name} (rc={rc}, {secs:.1f}s)\n{out}\n")
    m = re.findall(r"^(\d+) passed, (\d+) failed$", out, re.M)
    passed, failed = (int(m[-1][0]), int(m[-1][1])) if m else (0, 0)
    if rc != 0 and failed == 0:
        failed = 1
    tally.add(name, passed, failed)
    print(f"  {name}: {passed} passed, {failed} failed ({secs:.1f}s)", flush=True)


def run_step(tally, name, cmd, log, timeout=900, env=None):
    rc, out, secs = run(cmd, timeout=timeout, env=env)
    log.write(f"===== {name} (rc={rc}, {secs:.1f}s)\n{out}\n")
    tally.add(name, 1 if rc == 0 else 0, 0 if rc == 0 else 1)
    print(f"  {name}: {'passed' if rc == 0 else 'FAILED'} ({secs:.1f}s)", flush=True)


class Services:
    """The Redis and PostgreSQL servers of the tests: started here unless the
    environment names some already."""

    def __init__(self, log):
        self.dir = None
        self.log = log

    def start(self):
        if os.environ.get("IDEM_TEST_REDIS_URL") and os.environ.get("IDEM_TEST_PG_URL"):
            return True
        self.dir = tempfile.mkdtemp(prefix="idem-services-")
        rc, out, secs = run(["bash", "scripts/services.sh", "start", self.dir], timeout=300)
        self.log.write(f"===== services start (rc={rc}, {secs:.1f}s)\n{out}\n")
        if rc != 0:
            print(f"  services: could not start Redis and PostgreSQL (rc={rc}); see the log", flush=True)
            return False
        for line in out.splitlines():
            m = re.match(r"export (IDEM_TEST_\w+)=(\S+)$", line)
            if m:
                os.environ[m.group(1)] = m.group(2)
        print(f"  services: {os.environ.get('IDEM_TEST_REDIS_URL')} "
              f"{os.environ.get('IDEM_TEST_PG_URL')} ({secs:.1f}s)", flush=True)
        return True

    def stop(self):
        if self.dir:
            run(["bash", "scripts/services.sh", "stop", self.dir], timeout=120)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--builds", default="build,build-asan", help="comma-separated build dirs")
    ap.add_argument("--fuzz-seconds", type=int, default=int(os.environ.get("IDEM_FUZZ_SECONDS", "60")))
    ap.add_argument("--blackbox", default="test_*.py", help="black-box file pattern")
    ap.add_argument("--log", default="build/test-log.txt")
    ap.add_argument("--no-memory-blackbox", dest="memory_blackbox", action="store_false",
                    help="skip the black-box run on the memory: store")
    ap.add_argument("--no-server-stores", dest="server_stores", action="store_false",
                    help="neither start Redis/PostgreSQL nor run the black-box suite on them")
    args = ap.parse_args()

    tally = Tally()
    os.makedirs(os.path.dirname(os.path.join(ROOT, args.log)), exist_ok=True)
    with open(os.path.join(ROOT, args.log), "w") as log:
        services = Services(log)
        try:
            run_all(args, tally, log, services)
        finally:
            services.stop()
    if tally.failures:
        print("failures (details in %s):" % args.log)
        for f in tally.failures:
            print("  " + f)
    print(f"{tally.passed} passed, {tally.failed} failed", flush=True)
    return 0 if tally.failed == 0 else 1


def run_all(args, tally, log, services):
    print("lint:", flush=True)
    run_step(tally, "lint", ["sh", "scripts/lint.sh"], log)
    if args.server_stores:
        print("services:", flush=True)
        if not services.start():
            tally.add("services", 0, 1)
    for build in args.builds.split(","):
        label = "asan" if "asan" in build else "plain"
        env = sanitizer_env(os.environ) if label == "asan" else dict(os.environ)
        print(f"{build}:", flush=True)
        run_criterion(tally, build, label, env, log)
        if label == "plain":
            # docs/library.md's programs, built against the installed libidem.
            run_counted(tally, "library-docs", [sys.executable, "scripts/check_library.py", build], log)
        run_blackbox(tally, build, label, env, log, args.blackbox)
        # The examples' own tests (ledger, consumer) need no idemd store, so
        # they run once per build rather than once per store.
        if os.path.isdir(os.path.join(ROOT, "tests/examples")):
            run_blackbox(tally, build, label, env, log, "test_*.py", "tests/examples")
        # The chaos harness, short form: 2 idemd on each store under kill -9,
        # dropped answers and store restarts, its servers its own.
        if label == "plain":
            run_blackbox(tally, build, label, env, log, "test_*.py", "tests/chaos")
        for upstream in ("recording", "ledger"):
            run_counted(tally, f"{label}:chaos-{upstream}",
                        [sys.executable, "tests/chaos/chaos.py", "--short", "--store", "all",
                         "--upstream", upstream, "--idemd", os.path.join(ROOT, build, "idemd")],
                        log, timeout=900, env=env)
        if label == "asan" and args.memory_blackbox:
            # The same suite on memory:, where idemd applies store jobs on
            # its loops instead of the writer thread (as with sync=interval).
            menv = dict(env, IDEM_BB_STORE="memory")
            run_blackbox(tally, build, "asan-memory", menv, log, args.blackbox)
        if args.server_stores:
            for store, var in (("redis", "IDEM_TEST_REDIS_URL"), ("postgres", "IDEM_TEST_PG_URL")):
                url = os.environ.get(var)
                if url:
                    senv = dict(env, IDEM_BB_STORE=url)
                    run_blackbox(tally, build, f"{label}-{store}", senv, log, args.blackbox)
    if args.fuzz_seconds > 0:
        print("fuzz:", flush=True)
        run_step(tally, "fuzz", ["bash", "fuzz/run.sh", str(args.fuzz_seconds)], log,
                 timeout=args.fuzz_seconds * 3 + 900)


if __name__ == "__main__":
    sys.exit(main())
