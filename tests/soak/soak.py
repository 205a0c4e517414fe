#!/usr/bin/env python3
"""tests/soak/soak.py - `make soak`: idemd under mixed load for a bounded time,
watching its memory and file descriptors.

It starts the demo upstream (build/examples/demo-upstream) and idemd in front
of it, both on free loopback ports, with a fresh LMDB store in a temporary
directory (or SOAK_STORE), then sends a paced mix of requests for
SOAK_SECONDS from SOAK_CONNECTIONS keep-alive connections (Python asyncio,
stdlib only):

  new         POST with a fresh key                       200
  replay      a key completed a moment ago, same body     200 + X-Idempotent-Replay
  mismatch    a key completed a moment ago, other body    422
  duplicate   one fresh key on two connections at once    200, and 409 or a replay
  passthrough GET (no route: forwarded without a key)     200
  no key      POST without Idempotency-Key                400
  bad key     a 300-character key                         400
  malformed   a header line without a colon               400, connection closed
  too large   Content-Length above max_request_bytes      413, connection closed
  abandoned   half a body, then the client closes         (no answer)

The working set is bounded by construction: keys live SOAK_KEY_TTL (10 s;
failure_ttl and lease too), the background sweeper removes them, and
local_cache is capped (SOAK_LOCAL_CACHE entries).  The offered rate is
paced (SOAK_RATE requests/s over all connections) so that new keys arrive
well below the rate the sweeper removes expired ones (2000 records a
second), and the store's size levels off after about one key_ttl.

Every SOAK_SAMPLE seconds it records idemd's RSS (VmRSS) and open file
descriptors (/proc/PID/fd).  The first half of the run is the warm-up
(the working set is reached: the run must be at least 4 x key_ttl + 10 s);
the second half is judged:

  RSS   a least-squares line through the second half's samples may rise by
        at most max(SOAK_RSS_TOL_MIB, SOAK_RSS_TOL_PCT % of the RSS at the
        end of warm-up) over that half (defaults 4 MiB, 10 %).  A fitted
        line rather than two end points, so that one allocator spike
        neither hides nor fakes a trend; the default run has ~75 samples
        in that half.  At the default rate that half carries ~240,000
        requests, so a leak of ~17 bytes a request or more fails it; on
        the development machine the fitted growth was +0.2 MiB (the RSS
        levels off at ~19 MiB, from 8 MiB at start).  The RSS is printed
        with its anonymous (heap) and file-backed (LMDB's map) parts.
  fds   after the load stops (and the clients have closed), the count must
        come back to what it was before the load, within
        SOAK_SETTLE_SECONDS (15; idemd closes idle upstream connections
        after 4 s).
  answers  any answer whose status is not among those listed above for its
        kind is a failure, as is idemd not exiting 0 on SIGTERM at the
        end; connection errors and time-outs above 0.1 % of the requests
        too.

It prints RSS at start, after warm-up and at the end, the fitted growth, fds
at start and end, the client's count per kind and answer and idemd's
idem_requests_total per outcome, then "soak: PASS" or "soak: FAIL: <why>"
lines, and exits 0 or 1 (2 for bad settings or a setup that failed).

Environment (defaults in brackets):
  IDEM_BUILD            build directory with idemd and examples/demo-upstream [build]
  SOAK_SECONDS          length of the load [300]
  SOAK_STORE            idemd --store [lmdb:<temporary directory>/data]; a shared
                        redis:// or postgres:// store works too (keys are random
                        per run and expire after SOAK_KEY_TTL)
  SOAK_RATE             requests per second offered, all connections together; a
                        duplicate counts once, so ~8 % more arrive [1500]
  SOAK_CONNECTIONS      client connections (plus one more each for duplicates) [32]
  SOAK_KEY_TTL          key_ttl, failure_ttl and lease, in seconds [10]
  SOAK_LOCAL_CACHE      idemd local_cache entries [1000]
  SOAK_SAMPLE           seconds between samples [2]
  SOAK_RSS_TOL_MIB      RSS growth allowed over the second half, MiB [4]
  SOAK_RSS_TOL_PCT      ... or this % of the RSS after warm-up, if larger [10]
  SOAK_SETTLE_SECONDS   how long fds may take to come back after the load [15]
  SOAK_KEEP             1: keep the temporary directory (the store) [0]
"""

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter, deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.blackbox.harness import free_ports  # noqa: E402  (one port picker for every harness)

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
MAX_REQUEST_BYTES = 64 * 1024   # idemd's max_request_bytes in this run
REQUEST_TIMEOUT = 10.0          # seconds for one answer
MAX_ANSWER_BYTES = 1 << 20      # a longer answer is a fault of its own

# kind -> weight in the mix (a duplicate is two requests).
MIX = [("new", 40), ("replay", 25), ("mismatch", 7), ("duplicate", 8), ("passthrough", 5),
       ("no_key", 4), ("bad_key", 4), ("malformed", 3), ("too_large", 2), ("abandoned", 2)]

# kind -> statuses that are right (None: no answer expected).
EXPECTED = {
    "new": {200}, "replay": {200}, "mismatch": {422}, "duplicate": {200, 409},
    "passthrough": {200}, "no_key": {400}, "bad_key": {400}, "malformed": {400},
    "too_large": {413}, "abandoned": {None},
}


def say(msg):
    print("soak: %s" % msg, flush=True)


def die(msg, code=2):
    print("soak: error: %s" % msg, file=sys.stderr, flush=True)
    sys.exit(code)


def env_int(name, default, lo, hi):
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        die("%s must be a whole number, not %r" % (name, raw))
    if not lo <= v <= hi:
        die("%s must be %d..%d, not %d" % (name, lo, hi, v))
    return v


def rss_kib(pid):
    return rss_parts(pid)["VmRSS"]


def rss_parts(pid):
    """VmRSS and its parts (RssAnon: heap and stacks, where a leak shows;
    RssFile: mapped files, LMDB's data.mdb among them), KiB."""
    out = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in out:
                out[name] = int(line.split()[1])
    return out


def rss_text(parts):
    return "RSS %.1f MiB (anon %.1f, file %.1f)" % (mib(parts["VmRSS"]), mib(parts["RssAnon"]),
                                                     mib(parts["RssFile"]))


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def mib(kib):
    return kib / 1024.0


def fit_growth(samples):
    """Least-squares slope of (t, v) samples times their time span."""
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    if den == 0:
        return 0.0
    slope = sum((t - mt) * (v - mv) for t, v in samples) / den
    return slope * (samples[-1][0] - samples[0][0])


def metrics(admin_port):
    """idemd's idem_requests_total per outcome, summed over the routes."""
    url = "http://%s:%d/metrics" % (HOST, admin_port)
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith('idem_requests_total{outcome="'):
            name = line.split('"')[1]
            out[name] = out.get(name, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def wait_ready(url, proc, secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


# ---- the client ---------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection, reopened when it was closed."""

    def __init__(self, port):
        self.port = port
        self.r = self.w = None

    async def open(self):
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(HOST, self.port)

    def close(self):
        if self.w is not None:
            self.w.close()
        self.r = self.w = None

    async def send(self, raw):
        await self.open()
        self.w.write(raw)
        await self.w.drain()

    async def answer(self):
        """(status, headers) of one answer, its body read and dropped."""
        head = await self.r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        hdrs = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            if n > MAX_ANSWER_BYTES:
                raise ValueError("answer of %d bytes" % n)
            await self.r.readexactly(n)
        elif hdrs.get("transfer-encoding", "").lower() == "chunked":
            total = 0
            while True:
                size = int((await self.r.readuntil(b"\r\n")).split(b";")[0], 16)
                total += size
                if total > MAX_ANSWER_BYTES:
                    raise ValueError("chunked answer over %d bytes" % MAX_ANSWER_BYTES)
                await self.r.readexactly(size + 2)
                if size == 0:
                    break
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return status, hdrs

    async def request(self, raw):
        await self.send(raw)
        return await asyncio.wait_for(self.answer(), REQUEST_TIMEOUT)


def post(key, body, path="/pay"):
    h = "POST %s HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n" % path
    if key is not None:
        h += "Idempotency-Key: %s\r\n" % key
    h += "Content-Length: %d\r\n\r\n" % len(body)
    return h.encode() + body


class Load:
    def __init__(self, port, rate, conns, key_ttl, seconds):
        self.port = port
        self.rate = rate
        self.nconns = conns
        self.key_ttl = key_ttl
        self.end = time.monotonic() + seconds
        self.next_at = time.monotonic()
        self.run_id = uuid.uuid4().hex[:10]
        self.seq = 0
        self.recent = deque(maxlen=4096)   # (completed at, key, body)
        self.counts = Counter()            # (kind, status or error) -> n
        self.unexpected = Counter()
        self.errors = 0
        self.requests = 0
        kinds, weights = zip(*MIX)
        self.kinds, self.weights = kinds, weights

    def fresh(self):
        self.seq += 1
        return "soak-%s-%d" % (self.run_id, self.seq)

    async def pace(self):
        self.next_at = max(self.next_at + 1.0 / self.rate, time.monotonic() - 1.0)
        delay = self.next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def note(self, kind, status, hdrs=None):
        self.requests += 1
        label = status
        if kind == "replay" and status == 200:
            label = "200 replay" if hdrs and hdrs.get("x-idempotent-replay") == "true" else "200 NOT A REPLAY"
            if label != "200 replay":
                self.unexpected[(kind, label)] += 1
        elif kind == "new" and status == 200 and hdrs and hdrs.get("x-idempotent-replay"):
            label = "200 REPLAYED"
            self.unexpected[(kind, label)] += 1
        elif kind == "duplicate" and status == 200 and hdrs and hdrs.get("x-idempotent-replay"):
            label = "200 replay"
        elif status not in EXPECTED[kind]:
            self.unexpected[(kind, status)] += 1
        self.counts[(kind, label)] += 1

    def pick_recent(self):
        """A key completed less than key_ttl / 2 ago, or None."""
        now = time.monotonic()
        while self.recent and now - self.recent[0][0] > self.key_ttl / 2:
            self.recent.popleft()
        if not self.recent:
            return None
        return self.recent[random.randrange(len(self.recent))]

    async def one(self, c, c2):
        kind = random.choices(self.kinds, self.weights)[0]
        if kind in ("replay", "mismatch") and not self.recent:
            kind = "new"
        if kind == "new":
            key = self.fresh()
            body = b'{"amount":%d,"k":"%s"}' % (random.randrange(1, 10**6), key.encode())
            st, h = await c.request(post(key, body))
            self.note(kind, st, h)
            if st == 200:
                self.recent.append((time.monotonic(), key, body))
        elif kind in ("replay", "mismatch"):
            got = self.pick_recent()
            if got is None:
                return
            _, key, body = got
            if kind == "mismatch":
                body = body + b" "
            st, h = await c.request(post(key, body))
            self.note(kind, st, h)
        elif kind == "duplicate":
            key = self.fresh()
            raw = post(key, b'{"dup":"%s"}' % key.encode())
            a, b = await asyncio.gather(c.request(raw), c2.request(raw), return_exceptions=True)
            for res in (a, b):
                if isinstance(res, BaseException):
                    raise res
                self.note(kind, res[0], res[1])
        elif kind == "passthrough":
            st, h = await c.request(b"GET /pay?soak=1 HTTP/1.1\r\nHost: soak\r\n\r\n")
            self.note(kind, st, h)
        elif kind == "no_key":
            st, h = await c.request(post(None, b'{"x":1}'))
            self.note(kind, st, h)
        elif kind == "bad_key":
            st, h = await c.request(post("k" * 300, b'{"x":1}'))
            self.note(kind, st, h)
        elif kind == "malformed":
            st, h = await c.request(b"POST /pay HTTP/1.1\r\nHost: soak\r\nthis line has no colon\r\n\r\n")
            self.note(kind, st, h)
            c.close()
        elif kind == "too_large":
            raw = ("POST /pay HTTP/1.1\r\nHost: soak\r\nIdempotency-Key: %s\r\n"
                   "Content-Length: %d\r\n\r\n" % (self.fresh(), MAX_REQUEST_BYTES * 4)).encode()
            st, h = await c.request(raw)
            self.note(kind, st, h)
            c.close()
        elif kind == "abandoned":
            raw = post(self.fresh(), b'{"x":"' + b"a" * 200 + b'"}')
            await c.send(raw[:len(raw) - 100])
            c.close()
            self.note(kind, None)

    async def worker(self):
        c, c2 = Conn(self.port), Conn(self.port)
        try:
            while time.monotonic() < self.end:
                await self.pace()
                try:
                    await self.one(c, c2)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                    self.errors += 1
                    self.counts[("error", type(e).__name__)] += 1
                    c.close()
                    c2.close()
        finally:
            c.close()
            c2.close()

    async def run(self):
        await asyncio.gather(*(self.worker() for _ in range(self.nconns)))


# ---- the run ------------------------------------------------------------------


def main():
    build = Path(os.environ.get("IDEM_BUILD", "build"))
    if not build.is_absolute():
        build = REPO / build
    idemd, upstream = build / "idemd", build / "examples" / "demo-upstream"
    for p in (idemd, upstream):
        if not os.access(p, os.X_OK):
            die("%s is missing: run 'make build', or set IDEM_BUILD" % p)
    seconds = env_int("SOAK_SECONDS", 300, 10, 86400)
    rate = env_int("SOAK_RATE", 1500, 1, 100000)
    conns = env_int("SOAK_CONNECTIONS", 32, 1, 1000)
    key_ttl = env_int("SOAK_KEY_TTL", 10, 1, 3600)
    cache = env_int("SOAK_LOCAL_CACHE", 1000, 0, 10**7)
    sample = env_int("SOAK_SAMPLE", 2, 1, 60)
    tol_mib = env_int("SOAK_RSS_TOL_MIB", 4, 0, 1 << 20)
    tol_pct = env_int("SOAK_RSS_TOL_PCT", 10, 0, 1000)
    settle = env_int("SOAK_SETTLE_SECONDS", 15, 1, 600)
    keep = os.environ.get("SOAK_KEEP") == "1"
    if seconds < 4 * key_ttl + 10:
        die("SOAK_SECONDS=%d is too short for SOAK_KEY_TTL=%d: the warm-up (the first half) must "
            "last two key_ttl and 5 s, so SOAK_SECONDS >= %d" % (seconds, key_ttl, 4 * key_ttl + 10))

    tmp = Path(tempfile.mkdtemp(prefix="idem-soak."))
    store = os.environ.get("SOAK_STORE") or "lmdb:%s/data" % tmp
    up_port, port, admin = free_ports(3)
    (tmp / "idemd.yaml").write_text(
        "# tests/soak/soak.py: keys expire fast, so the working set is bounded\n"
        "local_cache: %d\nmax_request_bytes: %d\n"
        "defaults:\n  key_ttl: %ds\n  failure_ttl: %ds\n  lease: %ds\n"
        "routes:\n  - methods: [POST]\n    path: /\n    mode: required\n"
        % (cache, MAX_REQUEST_BYTES, key_ttl, key_ttl, key_ttl))
    procs = []
    log_tail = deque()

    def stop_all():
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    failures = []
    try:
        uplog = open(tmp / "upstream.log", "wb")
        up = subprocess.Popen([str(upstream), "--listen", "%s:%d" % (HOST, up_port)],
                              stdout=uplog, stderr=uplog)
        procs.append(up)
        # idemd logs a line per request: keep only the last others, in memory.
        log_tail = deque(maxlen=20)
        args = [str(idemd), "--config", str(tmp / "idemd.yaml"), "--listen", "%s:%d" % (HOST, port),
                "--admin", "%s:%d" % (HOST, admin), "--upstream", "http://%s:%d" % (HOST, up_port),
                "--store", store, "--log-format", "text"]
        d = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(d)
        # The per-request lines are left out: the rest says what went wrong.
        threading.Thread(target=lambda: log_tail.extend(
            t for t in (line.decode(errors="replace").rstrip() for line in d.stderr)
            if " request method=" not in t and '"msg":"request"' not in t), daemon=True).start()
        if not wait_ready("http://%s:%d/readyz" % (HOST, admin), d, 30):
            time.sleep(0.2)
            failures.append("idemd did not become ready (status %s)" % d.poll())
            raise RuntimeError("no idemd")
        time.sleep(0.5)
        m0 = metrics(admin)
        parts0, fd0 = rss_parts(d.pid), fd_count(d.pid)
        rss0 = parts0["VmRSS"]
        say("idemd pid %d on :%d, store %s, key_ttl %ds, local_cache %d; %d s at %d req/s over %d "
            "connections (this machine's other load adds noise)" % (d.pid, port, store, key_ttl, cache,
                                                                   seconds, rate, conns))
        say("start: %s, %d open fds" % (rss_text(parts0), fd0))

        samples = []  # (seconds since start, rss KiB, fds)
        parts_warm = {}
        load = Load(port, rate, conns, key_ttl, seconds)
        t_start = time.monotonic()

        async def sampler():
            next_print = 30
            while time.monotonic() < load.end:
                await asyncio.sleep(sample)
                if d.poll() is not None:
                    return
                t = time.monotonic() - t_start
                samples.append((t, rss_kib(d.pid), fd_count(d.pid)))
                if t >= seconds / 2.0 and not parts_warm:
                    parts_warm.update(rss_parts(d.pid))
                if t >= next_print:
                    next_print += 30
                    say("%4.0fs  RSS %.1f MiB  fds %d  requests %d (%.0f/s)  errors %d"
                        % (t, mib(samples[-1][1]), samples[-1][2], load.requests, load.requests / t,
                           load.errors))

        async def both():
            await asyncio.gather(load.run(), sampler())

        asyncio.run(both())
        elapsed = time.monotonic() - t_start
        if d.poll() is not None:
            failures.append("idemd exited during the load (status %s)" % d.returncode)
            raise RuntimeError("idemd died")

        # The verdicts.
        half = seconds / 2.0
        warm = [s for s in samples if s[0] >= half]
        if len(warm) < 3:
            failures.append("too few samples in the second half (%d)" % len(warm))
            warm = samples[-3:] if samples else [(0, rss0, fd0)]
        rss_warm, rss_end = warm[0][1], samples[-1][1]
        growth = fit_growth([(t, r) for t, r, _ in warm])
        tol = max(tol_mib * 1024.0, rss_warm * tol_pct / 100.0)
        reqs_second_half = load.requests * (warm[-1][0] - warm[0][0]) / max(elapsed, 1e-9)
        say("after warm-up (%.0fs): %s" % (warm[0][0], rss_text(parts_warm) if parts_warm
                                            else "RSS %.1f MiB" % mib(rss_warm)))
        say("end (%.0fs):          %s; peak in the second half %.1f MiB"
            % (samples[-1][0], rss_text(rss_parts(d.pid)), mib(max(r for _, r, _ in warm))))
        say("RSS growth over the second half: fitted %+.2f MiB, end - warm %+.2f MiB; tolerance "
            "%.1f MiB (max of %d MiB and %d%% of %.1f MiB); %.0f requests in it (%+.1f bytes each)"
            % (mib(growth), mib(rss_end - rss_warm), mib(tol), tol_mib, tol_pct, mib(rss_warm),
               reqs_second_half, growth * 1024.0 / max(reqs_second_half, 1)))
        if growth > tol:
            failures.append("RSS grew %.2f MiB over the second half (fitted), more than the %.1f MiB "
                            "allowed" % (mib(growth), mib(tol)))
        if store.startswith("lmdb:"):
            data = Path(store[5:].split("?", 1)[0]) / "data.mdb"
            if data.exists():
                say("LMDB data.mdb: %.1f MiB in the file" % (data.stat().st_size / 1048576.0))

        # fds, once the clients have closed and idle upstream connections timed out.
        fd_peak = max((f for _, _, f in samples), default=fd0)
        end = time.monotonic() + settle
        fd1 = fd_count(d.pid)
        while fd1 > fd0 and time.monotonic() < end:
            time.sleep(0.5)
            fd1 = fd_count(d.pid)
        say("fds: %d at start, %d at peak, %d at the end (after the load, %.1fs to settle)"
            % (fd0, fd_peak, fd1, settle - max(0.0, end - time.monotonic())))
        if fd1 > fd0:
            failures.append("open fds grew from %d to %d (still %d more %ds after the load)"
                            % (fd0, fd1, fd1 - fd0, settle))

        # Answers.
        m1 = metrics(admin)
        say("%d requests in %.0fs (%.0f/s); client's count per kind and answer:"
            % (load.requests, elapsed, load.requests / elapsed))
        for (kind, label), n in sorted(load.counts.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            say("    %-12s %-18s %9d" % (kind, "no answer" if label is None else label, n))
        say("idemd's idem_requests_total during the load: " + ", ".join(
            "%s=%d" % (k, m1.get(k, 0) - m0.get(k, 0)) for k in sorted(m1) if m1.get(k, 0) - m0.get(k, 0)))
        if load.unexpected:
            failures.append("unexpected answers: " + ", ".join(
                "%s %s x%d" % (k, s, n) for (k, s), n in sorted(load.unexpected.items(), key=str)))
        if load.errors > max(1, load.requests // 1000):
            failures.append("%d connection errors or time-outs (more than 0.1%% of %d requests)"
                            % (load.errors, load.requests))
        if load.requests == 0:
            failures.append("no request was answered")

        # idemd must stop cleanly.
        d.send_signal(signal.SIGTERM)
        try:
            rc = d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
            rc = "none (killed after 30 s)"
        if rc != 0:
            failures.append("idemd exited with status %s on SIGTERM (want 0)" % rc)
    except KeyboardInterrupt:
        say("interrupted")
        failures.append("interrupted")
    except RuntimeError:
        pass
    finally:
        stop_all()
        if failures and log_tail:
            say("idemd's last log lines:\n    " + "\n    ".join(list(log_tail)[-10:]))
        if keep:
            say("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    if failures:
        for f in failures:
            say("FAIL: " + f)
        return 1
    say("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
