"""Network stores shared by many idemd processes, and their outages
(docs/protocol.md sections 6, 7, 9, 12 and 13).

Many instances.  Three idemd processes share one Redis (and again one
PostgreSQL): the shared test servers named by $IDEM_TEST_REDIS_URL and
$IDEM_TEST_PG_URL, each test on its own key prefix / table so that runs never
see each other's keys.  200 keys x 5 duplicates are fired together (a
barrier per key), the duplicates of a key spread over the three processes,
against one counting upstream that answers slowly so that they overlap.
Every key must run exactly once, every answer must be the first response
(a replay carries X-Idempotent-Replay: true) or 409 in-flight, and afterwards
every key replays through any process.

Outages.  Each test starts its own server (redis-server with
appendfsync always; a PostgreSQL cluster of its own, as the postgres user
when run as root) on a free port, kills it while idemd runs and starts it
again on the same port and data:
  on_store_error: closed  new keyed requests get 503 store-unavailable with
                          Retry-After, nothing is forwarded, /readyz turns 503,
                          /healthz stays 200; still so (and fast) after 6 s,
                          past the stores' longest reconnect backoff
  on_store_error: open    requests are forwarded, the answers carry
                          Idempotency-Bypassed: store-unavailable
  store back              without a restart of idemd /readyz is 200 again
                          within 10 s, new keys work, and every key completed
                          before the outage replays its first response
  in flight               a request whose upstream is still running when the
                          store dies gets a clear answer (503
                          store-unavailable, the upstream's answer, or 502/504
                          upstream-outcome-unknown) within upstream_timeout
                          plus a margin; an answer that was the upstream's is
                          replayed once the store is back

The tests choose their own store URLs, so IDEM_BB_STORE does not change them.
The servers are stopped by SIGKILL (Redis) and `pg_ctl stop -m immediate`
(PostgreSQL): a crash, after which only what was fsync'd is there.
"""

import atexit
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

KEYS = 200                  # many instances: keys ...
DUPLICATES = 5              # ... times duplicates of each
INSTANCES = 3
THREADS = 50
UPSTREAM_DELAY = 0.25       # s: long enough for the duplicates to overlap

UPSTREAM_TIMEOUT = 3        # s, outage tests
ANSWER_MARGIN = 5.0         # s past upstream_timeout an in-flight answer may take
DOWN_WITHIN = 5.0           # s for /readyz to turn 503 once the server is gone
RECOVER_WITHIN = 10.0       # s for /readyz to be 200 once the server is back
LONG_OUTAGE = 6.0           # s: longer than the stores' longest reconnect backoff (5 s)
SERVER_START_TIMEOUT = 30.0


def _with_option(url, name, value):
    """url with ?name=value (or &name=value) appended."""
    return "%s%s%s=%s" % (url, "&" if "?" in url else "?", name, value)


# --------------------------------------------------------------------------
# a few Redis commands over a socket (RESP), for pings and clean-up


def _resp_encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def _resp_read(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise OSError("connection closed by redis")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        raise OSError("redis: %s" % rest.decode("utf-8", "replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_resp_read(f) for _ in range(n)]
    raise OSError("not a RESP reply: %r" % line)


def redis_commands(url, commands, timeout=3.0):
    """Run commands (lists of arguments) on the server of a redis:// URL, with
    its user, password and db; return their replies."""
    u = urllib.parse.urlsplit(url)
    pre = []
    if u.password is not None:
        pre.append(["AUTH"] + ([urllib.parse.unquote(u.username)] if u.username else [])
                   + [urllib.parse.unquote(u.password)])
    db = u.path.strip("/")
    if db:
        pre.append(["SELECT", db])
    with socket.create_connection((u.hostname, u.port or 6379), timeout=timeout) as s:
        f = s.makefile("rb")
        s.sendall(b"".join(_resp_encode(c) for c in pre + list(commands)))
        replies = [_resp_read(f) for _ in pre + list(commands)]
    return replies[len(pre):]


def redis_delete_prefix(url, prefix):
    """Delete the keys that start with prefix (a test's own keys)."""
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
    cursor = b"0"
    for _ in range(10000):
        cursor, keys = redis_commands(url, [["SCAN", cursor, "MATCH", pattern,
                                             "COUNT", "1000"]])[0]
        if keys:
            redis_commands(url, [["UNLINK"] + keys])
        if cursor == b"0":
            return


def pg_drop_table(url, table):
    """DROP the table a test made on the server of a postgres:// URL."""
    psql = shutil.which("psql") or os.path.join(h.pg_bin() or "", "psql")
    u = urllib.parse.urlsplit(url)
    conn = urllib.parse.urlunsplit((u.scheme, u.netloc, u.path, "", ""))
    subprocess.run([psql, "-q", "-X", "-d", conn, "-c", 'DROP TABLE IF EXISTS "%s"' % table],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=30, check=False)


# --------------------------------------------------------------------------
# servers a test owns

_OWN_SERVERS = set()  # stopped at exit too, even after ^C


@atexit.register
def _stop_own_servers():
    for srv in list(_OWN_SERVERS):
        srv.close()


class OwnRedis:
    """A redis-server of the test's own, on a free port, with an AOF that is
    fsync'd on every write, so that a SIGKILL loses nothing it acknowledged."""

    name = "redis"

    def __init__(self, workdir):
        self.dir = os.path.join(workdir, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = h.free_port()
        self.proc = None
        self.starts = 0

    @staticmethod
    def available():
        return shutil.which("redis-server") is not None

    def url(self, tag):
        return "redis://%s:%d/0?prefix=%s-" % (h.HOST, self.port, tag)

    @classmethod
    def for_test(cls, case):
        """A started server of case's own, closed with it (the case is skipped
        without redis-server)."""
        if not cls.available():
            case.skipTest("no redis-server")
        srv = cls(case.tmp)
        srv.start()
        case.addCleanup(srv.close)
        return srv

    def freeze(self, case):
        """SIGSTOP: every store call now waits for its timeout, until thaw()
        or the end of case."""
        self.proc.send_signal(signal.SIGSTOP)
        case.addCleanup(self.thaw)

    def thaw(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def start(self):
        self.starts += 1
        _OWN_SERVERS.add(self)
        log = open(os.path.join(self.dir, "redis.%d.log" % self.starts), "wb")
        with log:
            self.proc = subprocess.Popen(
                ["redis-server", "--bind", h.HOST, "--port", str(self.port),
                 "--dir", self.dir, "--save", "", "--appendonly", "yes",
                 "--appendfsync", "always", "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        h.wait_until(self.ping, SERVER_START_TIMEOUT, interval=0.05,
                     what="redis-server on port %d" % self.port)

    def ping(self):
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                raise AssertionError("redis-server exited with %d:\n%s"
                                     % (self.proc.returncode, self.log_text()))
            return False
        try:
            return redis_commands("redis://%s:%d" % (h.HOST, self.port), [["PING"]],
                                  timeout=1.0)[0] == b"PONG"
        except OSError:
            return False

    def stop(self):
        """A crash: SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def close(self):
        self.stop()
        _OWN_SERVERS.discard(self)

    def log_text(self):
        out = []
        for i in range(1, self.starts + 1):
            try:
                with open(os.path.join(self.dir, "redis.%d.log" % i), "rb") as f:
                    out.append(f.read().decode("utf-8", "replace")[-2000:])
            except OSError:
                pass
        return "\n".join(out)


class OwnPostgres:
    """A PostgreSQL cluster of the test's own (initdb, pg_ctl), on a free
    port, fsync on.  As root it runs as the postgres user (PostgreSQL
    refuses root)."""

    name = "postgres"

    def __init__(self, workdir):
        self.bin = h.pg_bin()
        self.dir = os.path.join(workdir, "pg")
        os.makedirs(self.dir, exist_ok=True)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "log")
        self.port = h.free_port()
        self.initialized = False
        self.running = False
        if h.running_as_root():
            # the postgres user must reach its directory
            os.chmod(workdir, 0o755)
            shutil.chown(self.dir, "postgres", "postgres")

    @staticmethod
    def available():
        return h.pg_available()

    def _run(self, *argv, timeout=60):
        return h.run_as_pg_server(argv, log=self.log, timeout=timeout)

    def url(self, tag):
        return "postgres://postgres@%s:%d/postgres?table=%s" % (h.HOST, self.port,
                                                                 tag.replace("-", "_"))

    def start(self):
        if not self.initialized:
            self._run(os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "postgres",
                      "-A", "trust", "--no-sync")
            self.initialized = True
        self.running = True  # from here on, close() must try to stop it
        _OWN_SERVERS.add(self)
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log,
                  "-w", "-t", str(int(SERVER_START_TIMEOUT)),
                  "-o", "-c listen_addresses=%s -p %d -k %s -c fsync=on "
                  "-c max_connections=50" % (h.HOST, self.port, self.dir),
                  "start")

    def stop(self):
        """A crash: immediate shutdown (recovery from the WAL at the next start)."""
        if self.running:
            self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate",
                      "-w", "stop")
            self.running = False

    def close(self):
        if self.running and os.path.exists(os.path.join(self.data, "postmaster.pid")):
            try:
                self.stop()
            except (AssertionError, subprocess.SubprocessError, OSError):
                pass
        self.running = False
        _OWN_SERVERS.discard(self)

    def log_text(self):
        return h.tail_of(self.log)


# --------------------------------------------------------------------------
# many instances on one shared server


class ManyInstancesCases:
    """The body shared by the Redis and the PostgreSQL classes below.

    A subclass sets env (the variable naming the shared server) and
    store_url(tag) / cleanup(url, tag)."""

    env = None

    def setUp(self):
        super().setUp()
        self.base_url = os.environ.get(self.env)
        if not self.base_url:
            self.skipTest("$%s is not set: no shared server to test on (scripts/run_tests.py "
                          "sets it; or scripts/services.sh start DIR)" % self.env)
        self.tag = "bbss_%s" % uuid.uuid4().hex[:16]

    def start_instances(self, up, urls, local_cache=(0, 0, 1000)):
        """One idemd per URL (the third caches completed records in process)."""
        ds = []
        for i, url in enumerate(urls):
            cfg = {"upstream_timeout": "30s", "local_cache": local_cache[i % len(local_cache)],
                   "defaults": {"key_ttl": "10m"}}
            ds.append(self.start_idemd(up, cfg, store=url, name="idemd-%s" % "abc"[i % 3]))
        return ds

    def fire(self, daemons, keys):
        """Send every key DUPLICATES times at once, duplicate j of key i to
        daemons[(i + j) % n]; return {key: [(daemon name, Response or error)]}."""
        results = {k: [None] * DUPLICATES for k in keys}
        barriers = {k: threading.Barrier(DUPLICATES) for k in keys}

        def one(i, k, j):
            d = daemons[(i + j) % len(daemons)]
            try:
                barriers[k].wait(30)
                r = d.post(key=k, body=self.body_of(k), timeout=30)
            except Exception as e:  # noqa: BLE001 - reported with the results
                r = e
            results[k][j] = (d.name, r)

        # FIFO: the DUPLICATES tasks of a key are queued together, so every
        # barrier fills up (THREADS >= DUPLICATES) and none can deadlock.
        with concurrent.futures.ThreadPoolExecutor(THREADS) as ex:
            futs = [ex.submit(one, i, k, j) for i, k in enumerate(keys) for j in range(DUPLICATES)]
            for f in futs:
                f.result(120)
        return results

    @staticmethod
    def body_of(k):
        return json.dumps({"amount": 100, "order": k}).encode()

    def check_exactly_once(self, up, keys, results):
        """Return the first response of every key; fail listing every key that
        ran other than once or got an answer other than its first response or
        409 in-flight."""
        problems = []
        firsts = {}
        for k in keys:
            runs = up.requests(key=k)
            if len(runs) != 1:
                problems.append("%s executed %d times (fences %s)"
                                % (k, len(runs), [s.fence for s in runs]))
            answers = results[k]
            errors = [(n, r) for n, r in answers if isinstance(r, BaseException)]
            if errors:
                problems.append("%s: no answer: %r" % (k, errors))
                continue
            originals = [(n, r) for n, r in answers if r.status == 200 and not r.replayed]
            if len(originals) != 1:
                problems.append("%s: %d answers were not replays: %s"
                                % (k, len(originals), ", ".join("%s: %d %r" % (
                                    n, r.status, r.body[:60]) for n, r in originals)))
                continue
            first = originals[0][1]
            firsts[k] = first
            try:
                doc = first.json()
            except ValueError:
                doc = {}
            if doc.get("key") != k or (len(runs) == 1 and doc.get("exec") != runs[0].seq):
                problems.append("%s: first answer %r is not its execution's" % (k, first))
            for n, r in answers:
                try:
                    if r is first:
                        continue
                    if r.status == 200:
                        self.assertReplayOf(r, first)
                    else:
                        self.assertProblem(r, 409, "in-flight")
                except AssertionError as e:
                    problems.append("%s via %s: %s" % (k, n, str(e).splitlines()[0]))
        if problems:
            self.fail("%d problem(s) over %d keys:\n  %s" % (
                len(problems), len(keys), "\n  ".join(problems[:20])))
        return firsts

    def test_200_keys_5_duplicates_3_instances_run_once(self):
        up = self.start_upstream()
        up.set_reply(delay=UPSTREAM_DELAY)
        url = self.store_url(self.tag)
        self.addCleanup(self.cleanup, self.base_url, self.tag)
        daemons = self.start_instances(up, [url] * INSTANCES)
        keys = [h.new_key("multi%d" % i) for i in range(KEYS)]
        results = self.fire(daemons, keys)
        firsts = self.check_exactly_once(up, keys, results)
        self.assertEqual(up.count(), KEYS, "requests reached the upstream that no key sent")
        # the duplicates really overlapped: most keys saw a 409 in-flight
        overlapped = sum(1 for k in keys if any(r.status == 409 for _, r in results[k]))
        self.assertGreaterEqual(overlapped, KEYS // 4,
                                "duplicates hardly overlapped: the test proves little")
        # outcome() reads once every answer is counted (counters may be
        # bumped just after the answer is written)
        new = sum(d.outcome("new") for d in daemons)
        self.assertEqual(new, KEYS, "outcome=\"new\" over the %d processes" % INSTANCES)
        # afterwards every key replays through every process
        for i, k in enumerate(keys):
            d = daemons[(i + 1) % INSTANCES]
            self.assertReplayOf(d.post(key=k, body=self.body_of(k)), firsts[k])
            if i % 50 == 0:
                for other in daemons:
                    self.assertReplayOf(other.post(key=k, body=self.body_of(k)), firsts[k])
        self.assertEqual(up.count(), KEYS, "a repeat ran again")


class RedisManyInstances(ManyInstancesCases, h.IdemTestCase):
    env = "IDEM_TEST_REDIS_URL"

    def store_url(self, tag):
        return _with_option(self.base_url, "prefix", tag + "-")

    @staticmethod
    def cleanup(base_url, tag):
        try:
            redis_delete_prefix(base_url, tag + "-")
        except OSError:
            pass


class PostgresManyInstances(ManyInstancesCases, h.IdemTestCase):
    env = "IDEM_TEST_PG_URL"

    def store_url(self, tag):
        return _with_option(self.base_url, "table", tag)

    @staticmethod
    def cleanup(base_url, tag):
        try:
            pg_drop_table(base_url, tag)
        except (OSError, subprocess.SubprocessError):
            pass


# --------------------------------------------------------------------------
# outages of a server the test owns


class OutageCases:
    """The body shared by the Redis and the PostgreSQL classes below; a
    subclass sets server_cls."""

    server_cls = None

    def setUp(self):
        super().setUp()
        if not self.server_cls.available():
            self.skipTest("cannot start a %s server of the test's own here" % self.server_cls.name)
        sdir = tempfile.mkdtemp(prefix="idem-bb-%s-" % self.server_cls.name)
        if not h.KEEP:
            self.addCleanup(shutil.rmtree, sdir, True)
        self.server = self.server_cls(sdir)
        self.addCleanup(self.server.close)  # runs before the rmtree above
        self.server.start()
        self.tag = "bbout_%s" % uuid.uuid4().hex[:12]

    def start_gateway(self, up, on_store_error="closed", lease="2s"):
        cfg = {"on_store_error": on_store_error, "upstream_timeout": "%ds" % UPSTREAM_TIMEOUT,
               "defaults": {"lease": lease}}
        return self.start_idemd(up, cfg, store=self.server.url(self.tag))

    def complete_keys(self, d, up, n):
        """n keys run to completion: {key: first response}."""
        done = {}
        for i in range(n):
            k = h.new_key("before%d" % i)
            r = d.post(key=k)
            self.assertEqual(r.status, 200, r)
            self.assertNotReplay(r)
            done[k] = r
        self.assertEqual(up.count(), n)
        return done

    def readyz(self, d):
        try:
            return d.admin("GET", "/readyz", timeout=5.0).status
        except OSError:
            return None

    def wait_ready(self, d, status, timeout, what):
        h.wait_until(lambda: self.readyz(d) == status, timeout, interval=0.1, what=what)

    def recover(self, d):
        """Start the server again; idemd must see it without a restart."""
        starts = d.starts
        self.server.start()
        t0 = time.monotonic()
        self.wait_ready(d, 200, RECOVER_WITHIN,
                        "/readyz 200 within %.0fs of %s's restart" % (RECOVER_WITHIN,
                                                                     self.server.name))
        self.assertTrue(d.running(), "idemd died during the outage")
        self.assertEqual(d.starts, starts)
        return time.monotonic() - t0

    def assertNothingLost(self, d, up, done):
        n = up.count()
        for k, first in done.items():
            self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), n, "a key completed before the outage ran again")

    def assertNewKeyWorks(self, d, up):
        k = h.new_key("after")
        r = d.post(key=k)
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        self.assertIsNone(r.header("Idempotency-Bypassed"), r)
        self.assertEqual(up.count(key=k), 1)
        self.assertReplayOf(d.post(key=k), r)
        self.assertEqual(up.count(key=k), 1)

    def test_closed_503_while_down_then_recovers_with_nothing_lost(self):
        up = self.start_upstream()
        d = self.start_gateway(up, "closed")
        done = self.complete_keys(d, up, 5)
        self.assertEqual(self.readyz(d), 200)
        errors_before = d.outcome("store_error")
        self.server.stop()
        t_down = time.monotonic()
        n = up.count()
        for i in range(5):
            r = d.post(key=h.new_key("during%d" % i), timeout=10)
            self.assertProblem(r, 503, "store-unavailable")
            self.assertRetryAfter(r, 0)
            self.assertLess(r.elapsed, 5.0, "a store that is down must fail fast")
        # a repeat of a completed key is not run again either (no local cache
        # here: the store cannot be read, so 503)
        for k in done:
            r = d.post(key=k, timeout=10)
            self.assertProblem(r, 503, "store-unavailable")
        self.assertEqual(up.count(), n, "a request was forwarded while the store was down")
        self.wait_ready(d, 503, DOWN_WITHIN, "/readyz 503 while %s is down" % self.server.name)
        self.assertEqual(d.admin("GET", "/healthz").status, 200)
        # stay down past the longest reconnect backoff: every request still
        # fails fast, none is forwarded
        sent = 10
        while time.monotonic() - t_down < LONG_OUTAGE:
            r = d.post(key=h.new_key("later"), timeout=10)
            self.assertProblem(r, 503, "store-unavailable")
            self.assertLess(r.elapsed, 5.0, "a store that is down must fail fast")
            sent += 1
            time.sleep(0.25)
        self.assertEqual(self.readyz(d), 503)
        self.assertEqual(up.count(), n, "a request was forwarded while the store was down")
        self.assertGreaterEqual(d.outcome_reaches("store_error", errors_before + sent),
                                errors_before + sent)
        self.recover(d)
        self.assertNewKeyWorks(d, up)
        self.assertNothingLost(d, up, done)

    def test_open_forwards_with_bypassed_header_then_recovers(self):
        up = self.start_upstream()
        d = self.start_gateway(up, "open")
        done = self.complete_keys(d, up, 3)
        self.server.stop()
        for i in range(3):
            k = h.new_key("bypass%d" % i)
            r = d.post(key=k, timeout=10)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.header("Idempotency-Bypassed"), "store-unavailable", r)
            self.assertNotReplay(r)
            self.assertEqual(r.json().get("key"), k, "not the upstream's answer: %r" % r)
            self.assertEqual(up.count(key=k), 1)
        # repeats are forwarded too (no idempotency while bypassed): the
        # answer must say so, and must not overwrite the stored first one
        for k, first in done.items():
            r = d.post(key=k, timeout=10)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.header("Idempotency-Bypassed"), "store-unavailable", r)
            self.assertNotReplay(r)
        self.wait_ready(d, 503, DOWN_WITHIN, "/readyz 503 while %s is down" % self.server.name)
        self.assertEqual(d.admin("GET", "/healthz").status, 200)
        self.recover(d)
        self.assertNewKeyWorks(d, up)
        self.assertNothingLost(d, up, done)

    def test_traffic_across_an_outage_keeps_every_answer_given(self):
        # Clients send fresh keys without pause while the server dies and
        # comes back: every answer comes in bounded time and is the
        # upstream's 200 or 503 store-unavailable; every 200 a client got is
        # replayed afterwards (it was durable before it was sent).
        up = self.start_upstream()
        up.set_reply(delay=0.05)
        d = self.start_gateway(up, "closed", lease="1s")
        stop = threading.Event()
        lock = threading.Lock()
        answers = []
        bound = UPSTREAM_TIMEOUT + ANSWER_MARGIN

        def client(c):
            i = 0
            while not stop.is_set():
                k = h.new_key("burst%d-%d" % (c, i))
                i += 1
                try:
                    r = d.post(key=k, timeout=bound + 5)
                except Exception as e:  # noqa: BLE001 - reported below
                    r = e
                with lock:
                    answers.append((k, r))
                if isinstance(r, BaseException) or r.status != 200:
                    time.sleep(0.02)

        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(8)]
        for t in threads:
            t.start()
        self.addCleanup(stop.set)
        time.sleep(1.0)
        self.server.stop()
        time.sleep(1.0)
        self.recover(d)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(bound + 10)
            self.assertFalse(t.is_alive(), "a client never got its answer")
        ok = [(k, r) for k, r in answers if not isinstance(r, BaseException) and r.status == 200]
        for k, r in answers:
            self.assertNotIsInstance(r, BaseException, "key %s: %r" % (k, r))
            self.assertLess(r.elapsed, bound, "answered only after %.1fs: %r" % (r.elapsed, r))
            if r.status != 200:
                self.assertProblem(r, 503, "store-unavailable")
                self.assertLessEqual(up.count(key=k), 1, k)
        self.assertTrue(ok and len(ok) < len(answers),
                        "%d of %d answers were 200: the outage was not seen"
                        % (len(ok), len(answers)))
        for k, first in ok:
            self.assertNotReplay(first)
            self.assertEqual(up.count(key=k), 1, k)
            self.assertReplayOf(d.post(key=k), first)
            self.assertEqual(up.count(key=k), 1, k)

    def test_requests_in_flight_when_the_store_dies_get_a_bounded_answer(self):
        up = self.start_upstream()
        gate = threading.Event()
        never = threading.Event()
        self.addCleanup(gate.set)
        self.addCleanup(never.set)

        def behaviour(seen):
            if seen.path == "/answers":
                return h.Reply(wait=gate)
            if seen.path == "/silent":
                return h.Reply(wait=never)
            return None
        up.behaviour = behaviour
        d = self.start_gateway(up, "closed", lease="1s")
        done = self.complete_keys(d, up, 2)
        ka, kb = h.new_key("answers"), h.new_key("silent")
        bg_a = h.Background(lambda: d.post("/answers", key=ka, timeout=60))
        bg_b = h.Background(lambda: d.post("/silent", key=kb, timeout=60))
        up.wait_seen(1, key=ka)
        up.wait_seen(1, key=kb)
        self.server.stop()
        time.sleep(0.5)   # the lease renewals fail meanwhile
        gate.set()        # the upstream answers /answers now, with the store down
        bound = UPSTREAM_TIMEOUT + ANSWER_MARGIN
        ra = bg_a.result(bound + 5)
        rb = bg_b.result(bound + 5)
        for r in (ra, rb):
            self.assertLess(r.elapsed, bound, "answered only after %.1fs: %r" % (r.elapsed, r))
        # /answers: the upstream's answer could not be recorded -> 503; the
        # upstream's own answer is allowed only if it was recorded (below)
        if ra.status == 503:
            self.assertProblem(ra, 503, "store-unavailable")
        else:
            self.assertEqual(ra.status, 200, ra)
            self.assertNotReplay(ra)
            self.assertEqual(ra.json().get("key"), ka, ra)
        # /silent: the upstream never answers -> the outcome is unknown
        if rb.status == 503:
            self.assertProblem(rb, 503, "store-unavailable")
        else:
            self.assertIn(rb.status, (502, 504), rb)
            self.assertProblem(rb, rb.status, "upstream-outcome-unknown")
        self.assertEqual(up.count(key=ka), 1)
        self.assertEqual(up.count(key=kb), 1)
        self.recover(d)
        if ra.status == 200:
            # an answer the client got is durable: it must come back
            self.assertReplayOf(d.post("/answers", key=ka), ra)
        else:
            # unknown to idemd whether it was recorded: 409 while the claim's
            # lease lasts, then a run of its own (or a replay), never an error
            def settled():
                r = d.post("/answers", key=ka, timeout=10)
                if r.status == 409:
                    self.assertProblem(r, 409, "in-flight")
                    return None
                return r
            r = h.wait_until(settled, 10, interval=0.2, what="key %s to settle" % ka)
            self.assertEqual(r.status, 200, r)
            self.assertReplayOf(d.post("/answers", key=ka), r)
        self.assertNothingLost(d, up, done)
        self.assertNewKeyWorks(d, up)

    def test_completion_refused_by_a_short_outage_is_written_when_the_store_returns(self):
        # The upstream answers while the store is down: the client gets 503,
        # but idemd keeps the answer and offers it to the store while its
        # lease lasts, so once the store is back a retry gets that answer and
        # the operation never runs twice.
        up = self.start_upstream()
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.behaviour = lambda seen: h.Reply(wait=gate, body=b'{"charged":1}') \
            if seen.path == "/slow" else None
        d = self.start_gateway(up, "closed", lease="30s")
        k = h.new_key("late")
        bg = h.Background(lambda: d.post("/slow", key=k, timeout=60))
        up.wait_seen(1, key=k)
        self.server.stop()
        gate.set()
        r = bg.result(UPSTREAM_TIMEOUT + ANSWER_MARGIN)
        self.assertProblem(r, 503, "store-unavailable")
        self.recover(d)

        def replayed():
            x = d.post("/slow", key=k, timeout=10)
            if x.status in (409, 503):
                return None
            return x
        x = h.wait_until(replayed, 15, interval=0.2, what="the late completion of %s" % k)
        self.assertEqual(x.status, 200, x)
        self.assertTrue(x.replayed, x)
        self.assertEqual(x.body, b'{"charged":1}')
        self.assertEqual(up.count(key=k), 1, "the operation ran again")


class RedisOutage(OutageCases, h.IdemTestCase):
    server_cls = OwnRedis


class PostgresOutage(OutageCases, h.IdemTestCase):
    server_cls = OwnPostgres


class ShutdownDeadline(h.IdemTestCase):
    """At the forced-shutdown deadline (upstream_timeout + 5 s) a request
    whose store job is still out is neither lost nor leaked: the loop goes
    on until the store answers (the writer stops after the workers), the
    request ends logged, and idemd exits 0.  The store here is a Redis
    stopped with SIGSTOP, so the claim is out until the URL's timeout."""

    def test_a_request_waiting_on_the_store_at_the_deadline_ends_logged(self):
        srv = OwnRedis.for_test(self)
        up = self.start_upstream()
        url = srv.url("deadline") + "&timeout=8s"
        d = self.start_idemd(up, {"upstream_timeout": "1s"}, store=url)
        key = h.new_key()
        srv.freeze(self)
        bg = h.Background(lambda: d.post(key=key))
        # the claim is with the writer when the signal comes
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_in_flight") >= 1, 20.0, 0.05,
                     "the request in flight")
        d.send_signal(signal.SIGTERM)
        self.assertEqual(d.stop(timeout=60), 0)
        log = d.log_text()
        self.assertIn("shutdown deadline reached with 1 requests in flight", log)
        ended = [ln for ln in log.splitlines() if "request " in ln and ("key=%s" % key) in ln]
        self.assertTrue(ended, "the request out at the deadline was never logged:\n%s" % log)
        try:
            bg.result()
        except Exception:  # its connection was closed at the deadline
            pass


class LeaseRenewedLate(h.IdemTestCase):
    """docs/guarantees.md: a store that keeps a renewal past the end of the
    lease fails the owner as an outage does (another idemd may take the key
    over), so idemd says so when the lease ends, by its own clock, with the
    renewal still out, and again when the renewal comes back.  The store is
    a Redis stopped with SIGSTOP while the request is at the upstream; the
    verdicts are the log lines, waited for, never a time."""

    def test_a_lease_that_ends_with_its_renewal_unanswered_is_logged(self):
        srv = OwnRedis.for_test(self)
        up = self.start_upstream()
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.behaviour = lambda seen: h.Reply(wait=gate, body=b'{"charged":1}')
        url = srv.url("lapse") + "&timeout=30s"
        d = self.start_idemd(up, {"upstream_timeout": "60s", "defaults": {"lease": "1s"}},
                             store=url)
        key = h.new_key("lapse")
        bg = h.Background(lambda: d.post(key=key, timeout=90))
        up.wait_seen(1, key=key)
        srv.freeze(self)
        lapsed = "could not renew the lease on key %s (fence 1) in time" % key
        h.wait_until(lambda: lapsed in d.log_text(), 30, interval=0.1,
                     what="the lapsed lease logged")
        srv.thaw()
        late = "the renewal of key %s (fence 1) came back" % key
        h.wait_until(lambda: late in d.log_text(), 30, interval=0.1,
                     what="the late renewal logged")
        gate.set()
        # No one took the key over meanwhile: the completion is still ours.
        r = bg.result(60)
        self.assertEqual(r.status, 200, r)
        self.assertReplayOf(d.post(key=key), r)
        self.assertEqual(up.count(key=key), 1)
        self.assertEqual(d.log_text().count(lapsed), 1, "said once")


class CompletionRefusedForItsFence(h.IdemTestCase):
    """A completion the store refuses for its fence while the lease is still
    live by idemd's clock is logged as a lease lost (docs/guarantees.md):
    here an operator removes the record (DELETE /keys/K) while its request
    is at the upstream, on this run's store.  The client gets the repeat's
    answer for a key with no record: 409."""

    def test_a_completion_refused_for_its_fence_is_logged(self):
        up, d = self.setup_pair({"defaults": {"lease": "60s"}})
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.behaviour = lambda seen: h.Reply(wait=gate, body=b'{"charged":1}')
        key = h.new_key("refused")
        bg = h.Background(lambda: d.post(key=key, timeout=90))
        up.wait_seen(1, key=key)
        self.assertEqual(d.delete_key(key).status, 204)
        gate.set()
        r = bg.result(60)
        self.assertProblem(r, 409, "in-flight")
        lost = ("lease on key %s (fence 1) was lost while its request ran: its completion was "
                "refused" % key)
        h.wait_until(lambda: lost in d.log_text(), 30, interval=0.1, what="the lost lease logged")
        self.assertNotIn("could not renew the lease on key %s" % key, d.log_text())


if __name__ == "__main__":
    unittest.main()
