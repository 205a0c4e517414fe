#!/usr/bin/env python3
"""tests/run_one.py - run one meson test and say how many cases it passed.

Every test that `meson test` knows (tests/meson.build) runs through this
wrapper, so that one place decides what a run means, whether a developer
runs one test by name or `make test` runs them all:

    run_one.py KIND [--store STORE] [--needs VAR]... -- COMMAND [ARG]...

KIND says how COMMAND reports its cases:

    criterion  Criterion's "Synthesis: Tested: N | Passing: N | ..." line
    unittest   Python unittest's "Ran N tests" and "FAILED (...)" lines
    counted    a line "N passed, N failed" of its own (the last one counts)
    step       no cases of its own: exit status 0 is one pass, else one failure

The wrapper prints COMMAND's output, then one line "N passed, N failed" (or
"N passed, N failed, N skipped"), and exits 0 when nothing failed, 1 when
something did, 77 (meson's SKIP) when the test cannot run here: a server it
needs (--needs IDEM_TEST_REDIS_URL) is not named in the environment.  A
sanitizer report in the output (AddressSanitizer, UBSan's "runtime error:",
a leak with a frame of ours) is one more failure even when COMMAND said it
passed: Criterion keeps its verdict when a forked worker leaks.

--store chooses the store of the black-box suite (IDEM_BB_STORE): lmdb, rocksdb,
memory, redis (the server of $IDEM_TEST_REDIS_URL) or postgres
($IDEM_TEST_PG_URL).

`make test` (scripts/run_tests.py) adds up the last line of every test's
output, as meson records it in meson-logs/testlog.json.
"""
import os
import re
import subprocess
import sys

SKIP = 77
CRITERION_RE = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
COUNTED_RE = re.compile(r"^(\d+) passed, (\d+) failed", re.M)
LEAK_RE = re.compile(r"^(Direct|Indirect) leak of .*?\n((?:\s+#\d+ .*\n?)+)", re.M)
# Frames that are the allocator, libc or the test framework itself.
FRAMEWORK_RE = re.compile(r"libasan|liblsan|libc\.so|ld-linux|libcriterion|libnanomsg|libboxfort"
                          r"|\b(malloc|calloc|realloc|strdup|__interceptor_\w+)\b")
STORE_VARS = {"redis": "IDEM_TEST_REDIS_URL", "postgres": "IDEM_TEST_PG_URL"}


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


def count_criterion(out, rc):
    m = CRITERION_RE.search(out)
    if not m:
        return 0, 1, 0
    passed, failing, crashing = int(m.group(2)), int(m.group(3)), int(m.group(4))
    failed = failing + crashing
    # Exit 23 is LeakSanitizer's (LSAN_OPTIONS=exitcode=23 in the asan
    # setup): judged by the reports themselves below.
    if rc not in (0, 23) and failed == 0:
        failed = 1
    return passed, failed, 0


def count_unittest(out, rc):
    ran = re.search(r"^Ran (\d+) tests?", out, re.M)
    total = int(ran.group(1)) if ran else 0
    failed = 0
    m = re.search(r"^FAILED \(([^)]*)\)", out, re.M)
    if m:
        for part in m.group(1).split(","):
            k, _, v = part.strip().partition("=")
            if k in ("failures", "errors", "unexpected successes"):
                failed += int(v)
    s = re.search(r"^(?:OK|FAILED) \(.*skipped=(\d+)", out, re.M)
    skipped = int(s.group(1)) if s else 0
    if total == 0 or (rc != 0 and failed == 0):
        failed = max(failed, 1)
    return max(total - failed - skipped, 0), failed, skipped


def count_counted(out, rc):
    m = COUNTED_RE.findall(out)
    passed, failed = (int(m[-1][0]), int(m[-1][1])) if m else (0, 0)
    if rc != 0 and failed == 0:
        failed = 1
    if not m and rc == 0:
        failed = 1  # a step that promised a count and gave none
    return passed, failed, 0


def count_step(out, rc):
    return (1, 0, 0) if rc == 0 else (0, 1, 0)


COUNTERS = {"criterion": count_criterion, "unittest": count_unittest,
            "counted": count_counted, "step": count_step}


def main(argv):
    if "--" not in argv or len(argv) < 3 or argv[1] not in COUNTERS:
        print("usage: run_one.py criterion|unittest|counted|step [--store S] [--needs VAR]... "
              "-- COMMAND [ARG]...", file=sys.stderr)
        return 2
    sep = argv.index("--")
    kind, opts, cmd = argv[1], argv[2:sep], argv[sep + 1:]
    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    needs = []
    i = 0
    while i < len(opts):
        if opts[i] == "--needs" and i + 1 < len(opts):
            needs.append(opts[i + 1])
        elif opts[i] == "--store" and i + 1 < len(opts):
            store = opts[i + 1]
            if store in STORE_VARS:
                needs.append(STORE_VARS[store])
                env["IDEM_BB_STORE"] = os.environ.get(STORE_VARS[store], "")
            else:
                env["IDEM_BB_STORE"] = store
        else:
            print("run_one.py: unknown option %r" % opts[i], file=sys.stderr)
            return 2
        i += 2
    missing = [v for v in needs if not os.environ.get(v)]
    if missing:
        print("skipped: %s not set (start the servers with scripts/services.sh start DIR, "
              "then source DIR/env)" % ", ".join(missing))
        return SKIP

    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace")
    out = p.stdout
    sys.stdout.write(out)
    passed, failed, skipped = COUNTERS[kind](out, p.returncode)
    if re.search(r"ERROR: AddressSanitizer|runtime error:", out) or leaks_of_ours(out):
        print("run_one.py: a sanitizer report above counts as a failure")
        failed += 1
    elif "ERROR: LeakSanitizer" in out:
        print("run_one.py: a leak of the test framework only (not counted)")
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
