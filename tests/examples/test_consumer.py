"""idem-consumer (examples/consumer) under kill -9: every payment applied once.

The consumer reads payments from a Redis stream through a consumer group and
applies each one to SQLite in a transaction that also marks its payment_id
done (libidem's in-transaction de-duplication).  These tests run the real
binary against a real Redis ($IDEM_TEST_REDIS_URL; they fail, not skip,
without one) and look at the result with Python's sqlite3 and a small RESP
client of their own (stdlib only):

  - two consumers in one group on one database file, killed with SIGKILL at
    random moments while payments (with producer-retry copies and malformed
    messages) flow, and restarted under the same name (which re-reads its
    pending entries) or a new one (so XAUTOCLAIM takes the dead one's
    entries); at the end each distinct payment is applied once, each balance
    is the expected sum, each malformed message is rejected once, and the
    group has nothing pending;
  - the negative control: with --dedup off the same kills apply some payment
    twice;
  - a Redis connection cut mid-stream (a proxy in between) is survived;
  - a message bigger than the consumer reads is rejected, not a crash loop;
  - bad arguments exit 2 with one line.

Each test uses its own stream (pid and a random suffix in the name) and
deletes it at the end; nothing else in the shared Redis is touched.

Environment: IDEM_BUILD (the build directory; default <repo>/build),
IDEM_TEST_REDIS_URL (redis://host:port[/db]).
"""

import os
import random
import select
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("IDEM_BUILD") or REPO / "build")
BINARY = BUILD / "examples" / "consumer" / "idem-consumer"
REDIS_URL = os.environ.get("IDEM_TEST_REDIS_URL")
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


class RedisError(Exception):
    pass


class Redis:
    """A minimal RESP2 client: one connection, one command at a time."""

    def __init__(self, host, port, db=0):
        self.sock = socket.create_connection((host, port), timeout=30)
        self.file = self.sock.makefile("rb")
        if db:
            self.call("SELECT", db)

    def close(self):
        self.file.close()
        self.sock.close()

    def call(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, int):
                a = str(a)
            if isinstance(a, str):
                a = a.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(parts))
        return self._read()

    def _read(self):
        line = self.file.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self._read() for _ in range(n)]
        raise ConnectionError("bad reply %r" % line[:40])


def redis_address():
    u = urllib.parse.urlparse(REDIS_URL)
    db = int(u.path.lstrip("/") or 0)
    return u.hostname or "127.0.0.1", u.port or 6379, db


def s(v):
    return v.decode() if isinstance(v, bytes) else v


class ConsumerTestBase(unittest.TestCase):
    def setUp(self):
        if not REDIS_URL:
            self.fail("IDEM_TEST_REDIS_URL is not set: these tests need a Redis")
        if not BINARY.exists():
            self.fail("no consumer binary at %s (IDEM_BUILD=%s)" % (BINARY, BUILD))
        self.host, self.port, self.db = redis_address()
        self.r = Redis(self.host, self.port, self.db)
        self.stream = "idem-test:consumer:%d:%s" % (os.getpid(), uuid.uuid4().hex[:10])
        self.group = "payments"
        self.tmp = tempfile.TemporaryDirectory(prefix="idem-consumer-")
        self.dbpath = os.path.join(self.tmp.name, "ledger.db")
        self.procs = []  # every consumer started: (name, Popen, log path)
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        try:
            self.r.call("DEL", self.stream)
        finally:
            self.r.close()
            self.tmp.cleanup()

    def start(self, name, *extra, url=None):
        log = os.path.join(self.tmp.name, "%s-%d.log" % (name, len(self.procs)))
        cmd = [str(BINARY), "--redis", url or REDIS_URL, "--stream", self.stream,
               "--group", self.group, "--consumer", name, "--db", "sqlite:" + self.dbpath]
        cmd += list(extra)
        with open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append((name, p, log))
        return p

    def logs(self):
        out = []
        for name, p, log in self.procs:
            with open(log, "rb") as f:
                out.append("--- %s (pid %d, rc %s)\n%s" % (name, p.pid, p.returncode,
                                                           f.read().decode(errors="replace")))
        return "\n".join(out)

    def check_sanitizers(self):
        text = self.logs()
        for m in SANITIZER_MARKERS:
            self.assertNotIn(m, text, "sanitizer report in a consumer's output:\n" + text[-8000:])

    def stop(self, p, timeout=20):
        # A process just started may not have its SIGTERM handler yet: wait
        # for its first line (written after the handler is installed).
        log = next(lg for _, q, lg in self.procs if q is p)
        deadline = time.monotonic() + 10
        while p.poll() is None and time.monotonic() < deadline:
            with open(log, "rb") as f:
                if b"consuming" in f.read():
                    break
            time.sleep(0.05)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            self.fail("the consumer did not exit within %ss of SIGTERM\n%s" % (timeout, self.logs()))

    def publish(self, conn, fields):
        args = ["XADD", self.stream, "*"]
        for k, v in fields:
            args += [k, v]
        return s(conn.call(*args))

    def pending_count(self):
        try:
            return int(self.r.call("XPENDING", self.stream, self.group)[0])
        except RedisError:
            return -1

    def pending_by_consumer(self):
        """{consumer name: entries it holds unacked}."""
        try:
            summary = self.r.call("XPENDING", self.stream, self.group)
        except RedisError:
            return {}
        return {s(name): int(n) for name, n in (summary[3] or [])}

    def victim(self, rng, names, aim):
        """Which consumer slot to kill now.  A consumer that holds unacked
        entries (busy with a batch) is preferred, waiting up to a second for
        one: that is where a crash costs something.  With aim, one whose
        held entries are partly committed already is preferred further (the
        window between COMMIT and XACK that redelivers applied messages)."""
        deadline = time.monotonic() + 1.0
        busy = []
        while time.monotonic() < deadline:
            held = self.pending_by_consumer()
            busy = [i for i in range(len(names)) if held.get(names[i], 0) > 0]
            if busy and not aim:
                break
            for i in busy:
                try:
                    ids = [s(e[0]) for e in self.r.call("XPENDING", self.stream, self.group,
                                                         "-", "+", 100, names[i])]
                except RedisError:
                    continue
                marks = ",".join("?" * len(ids))
                done = self.query("SELECT count(*) FROM payments WHERE stream_id IN (%s)" % marks,
                                  *ids) if ids else None
                if done and done[0][0] > 0:
                    return i
            time.sleep(0.005)
        return rng.choice(busy or list(range(len(names))))

    def query(self, sql, *args):
        con = sqlite3.connect(self.dbpath, timeout=30)
        try:
            return con.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            return None  # the tables are not there yet
        finally:
            con.close()

    def wait_for(self, cond, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.2)
        self.fail("timed out waiting for %s\n%s" % (what, self.logs()[-8000:]))


def malformed_messages(rng):
    """Messages the consumer must reject (and never crash on)."""
    ok = lambda: "pay-bad-%s" % uuid.uuid4().hex[:8]
    return [
        [("account", "acct-1"), ("amount", "10")],                       # no payment_id
        [("payment_id", ok()), ("amount", "10")],                        # no account
        [("payment_id", ok()), ("account", "acct-1")],                   # no amount
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "12.5")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "abc")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "+5")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "1000000000001")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "99999999999999999999999")],
        [("payment_id", ok()), ("account", "bad account"), ("amount", "1")],
        [("payment_id", ok()), ("account", "a" * 65), ("amount", "1")],
        [("payment_id", "x" * 300), ("account", "acct-1"), ("amount", "1")],
        [("payment_id", "has space"), ("account", "acct-1"), ("amount", "1")],
        [("payment_id", ""), ("account", "acct-1"), ("amount", "1")],
        [("payment_id", ok()), ("payment_id", ok()), ("account", "acct-1"), ("amount", "1")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "1")] +
        [("extra%d" % i, "v") for i in range(40)],                       # too many fields
        [("payment_id", ok()), ("account", "acct-\u00e9"), ("amount", "1")],
        [("payment_id", ok()), ("account", "acct-1"), ("amount", "1\x00")],
    ]


class TestConsumerKills(ConsumerTestBase):
    PAYMENTS = 500
    ACCOUNTS = 7
    MIN_KILLS = 12
    EXTRA_BURSTS = 20  # payments added while the kills have not yet hit work

    def _plan(self, rng):
        """The messages in publishing order, and what the ledger must end as."""
        payments = []
        for i in range(self.PAYMENTS):
            amount = rng.randint(-500, 5000) or 1
            payments.append(("pay-%d-%s" % (i, uuid.uuid4().hex[:12]),
                             "acct-%d" % rng.randrange(self.ACCOUNTS), amount))
        msgs = [("pay", p) for p in payments]
        copies = 0
        for p in rng.sample(payments, self.PAYMENTS // 10):
            # A producer's retry: the same payment again, a little later.
            for _ in range(rng.randint(1, 2)):
                at = msgs.index(("pay", p)) + rng.randint(1, 60)
                msgs.insert(min(at, len(msgs)), ("pay", p))
                copies += 1
        bad = malformed_messages(rng)
        for m in bad:
            msgs.insert(rng.randrange(len(msgs)), ("bad", m))
        return msgs, payments, copies, len(bad)

    def test_kill9_at_random_applies_each_payment_once(self):
        seed = int(os.environ.get("IDEM_TEST_SEED") or random.randrange(1 << 30))
        rng = random.Random(seed)
        msgs, payments, copies, nbad = self._plan(rng)
        common = ["--batch", "16", "--claim-idle-ms", "1000", "--block-ms", "200", "--work-ms", "3"]
        published = []          # (stream id, kind)
        done_publishing = threading.Event()
        errors = []

        def producer():
            conn = Redis(self.host, self.port, self.db)
            try:
                i = 0
                while i < len(msgs):
                    burst = rng.randint(15, 40)
                    for kind, m in msgs[i:i + burst]:
                        if kind == "pay":
                            fields = [("payment_id", m[0]), ("account", m[1]), ("amount", str(m[2]))]
                        else:
                            fields = m
                        published.append((self.publish(conn, fields), kind))
                    i += burst
                    time.sleep(rng.uniform(0.2, 0.45))
            except Exception as e:  # reported by the test thread
                errors.append(e)
            finally:
                conn.close()
                done_publishing.set()

        slots = [self.start("c0", *common), self.start("c1", *common)]
        names = ["c0", "c1"]
        t = threading.Thread(target=producer, daemon=True)
        t.start()
        kills = same_name = new_name = 0
        generation = 0
        def exercised():
            """Whether a redelivery was de-duplicated and both recovery
            paths (own pending entries, XAUTOCLAIM) carried entries."""
            rows = self.query("SELECT via, stream_id FROM payments UNION ALL "
                              "SELECT via, stream_id FROM rejected UNION ALL "
                              "SELECT via, stream_id FROM skipped") or []
            vias = {v for v, _ in rows}
            return ("pending" in vias and "claimed" in vias and
                    len(rows) > len({sid for _, sid in rows}))

        extra = 0
        while True:
            time.sleep(rng.uniform(0.2, 1.0))
            if done_publishing.is_set() and kills >= self.MIN_KILLS:
                if exercised() or extra >= self.EXTRA_BURSTS:
                    break
                # Not yet: more payments, so that the kills land on work.
                for _ in range(30):
                    pay = ("pay-x%d-%s" % (extra, uuid.uuid4().hex[:12]),
                           "acct-%d" % rng.randrange(self.ACCOUNTS), rng.randint(1, 900))
                    payments.append(pay)
                    published.append((self.publish(self.r, [("payment_id", pay[0]),
                                                            ("account", pay[1]),
                                                            ("amount", str(pay[2]))]), "pay"))
                extra += 1
            k = self.victim(rng, names, aim=rng.random() < 0.5)
            slots[k].kill()
            slots[k].wait()
            kills += 1
            # Every other restart under a new name: the dead name's entries
            # then wait for XAUTOCLAIM; under the same name, for its own re-read.
            if kills % 2 == 0:
                same_name += 1
            else:
                generation += 1
                new_name += 1
                names[k] = "c%d-%d" % (k, generation)
            slots[k] = self.start(names[k], *common)
        t.join()
        self.assertEqual(errors, [])

        # Drain: everything published is applied, rejected or skipped, and acked.
        distinct = {p[0] for p in payments}
        last_id = published[-1][0]

        def drained():
            rows = self.query("SELECT count(DISTINCT payment_id) FROM payments")
            rej = self.query("SELECT count(DISTINCT stream_id) FROM rejected")
            if not rows or not rej or rows[0][0] < len(distinct) or rej[0][0] < nbad:
                return False
            groups = {s(g[g.index(b"name") + 1]): g for g in self.r.call("XINFO", "GROUPS", self.stream)}
            g = groups.get(self.group)
            delivered = s(g[g.index(b"last-delivered-id") + 1])
            return delivered == last_id and self.pending_count() == 0

        self.wait_for(drained, 90, "the consumers to drain the stream")
        for p in slots:
            self.assertEqual(self.stop(p), 0, "SIGTERM should exit 0\n" + self.logs()[-4000:])
        self.check_sanitizers()

        # Exactly once: one row per distinct payment, the balances are the sums.
        rows = self.query("SELECT payment_id, account, amount, stream_id FROM payments")
        applied = {}
        for pid, account, amount, sid in rows:
            applied.setdefault(pid, []).append((account, amount, sid))
        twice = {k: v for k, v in applied.items() if len(v) > 1}
        self.assertEqual(twice, {}, "payments applied more than once")
        self.assertEqual(set(applied), distinct)
        by_id = {p[0]: p for p in payments}
        for pid, [(account, amount, _)] in applied.items():
            self.assertEqual((account, amount), by_id[pid][1:])
        expected = {}
        for _, account, amount in payments:
            expected[account] = expected.get(account, 0) + amount
        balances = dict(self.query("SELECT account, balance FROM accounts"))
        self.assertEqual(balances, expected)

        # Each malformed message rejected once.
        bad_ids = {sid for sid, kind in published if kind == "bad"}
        rejected = self.query("SELECT stream_id FROM rejected")
        self.assertEqual(len(rejected), nbad, "a malformed message rejected more than once")
        self.assertEqual({r[0] for r in rejected}, bad_ids)

        # Nothing pending; every entry was handled at least once.
        self.assertEqual(self.pending_count(), 0)
        handled = {}
        for (sid,) in (self.query("SELECT stream_id FROM payments") +
                       self.query("SELECT stream_id FROM rejected") +
                       self.query("SELECT stream_id FROM skipped")):
            handled[sid] = handled.get(sid, 0) + 1
        missing = [sid for sid, _ in published if sid not in handled]
        self.assertEqual(missing, [])
        applied_sid = {v[0][2] for v in applied.values()}
        # Producer-retry copies: entries of a payment applied under another id.
        retry_copies = {sid for (sid, ns) in self.query("SELECT stream_id, ns FROM skipped")
                        if ns == "payments" and sid not in applied_sid}
        self.assertEqual(len(retry_copies), copies)
        # Redeliveries: an entry handled more than once (the second time skipped).
        redelivered = sum(n - 1 for n in handled.values())
        via = dict(self.query("SELECT via, count(*) FROM (SELECT via FROM payments UNION ALL "
                              "SELECT via FROM rejected UNION ALL SELECT via FROM skipped) GROUP BY via"))
        print("\n  consumer kills: seed %d, %d kills (%d restarted under the same name, %d under a new "
              "one); %d payments, %d producer-retry copies skipped, %d malformed rejected once; "
              "%d redeliveries de-duplicated; entries by path %s; %d extra bursts"
              % (seed, kills, same_name, new_name, len(distinct), len(retry_copies), nbad,
                 redelivered, via, extra), flush=True)
        self.assertGreaterEqual(kills, self.MIN_KILLS)
        self.assertGreater(via.get("pending", 0), 0, "no restart re-read its own pending entries")
        self.assertGreater(via.get("claimed", 0), 0, "no entry was taken over with XAUTOCLAIM")
        self.assertGreaterEqual(redelivered, 1, "no redelivery happened: the test did not exercise "
                                                "the crash window")


class TestConsumerWithoutDedup(ConsumerTestBase):
    """The negative control: the same kills without de-duplication apply some
    payment twice (a crash between COMMIT and XACK redelivers it)."""

    def test_dedup_off_applies_a_payment_twice_under_kills(self):
        rng = random.Random()
        common = ["--batch", "16", "--claim-idle-ms", "300", "--block-ms", "200",
                  "--work-ms", "4", "--dedup", "off"]
        p = self.start("solo", *common)
        published = 0
        kills = 0
        doubled = 0
        for _ in range(30):
            for _ in range(40):
                self.publish(self.r, [("payment_id", "pay-%d" % published), ("account", "a"),
                                      ("amount", "1")])
                published += 1
            time.sleep(rng.uniform(0.05, 0.3))
            p.kill()
            p.wait()
            kills += 1
            p = self.start("solo", *common)
            rows = self.query("SELECT count(*) - count(DISTINCT payment_id) FROM payments")
            doubled = rows[0][0] if rows else 0
            if doubled > 0:
                break
        self.wait_for(lambda: self.pending_count() == 0 and
                      (self.query("SELECT count(DISTINCT payment_id) FROM payments") or [[0]])[0][0]
                      == published, 60, "the consumer to drain")
        self.assertEqual(self.stop(p), 0)
        self.check_sanitizers()
        total, distinct = self.query("SELECT count(*), count(DISTINCT payment_id) FROM payments")[0]
        balance = self.query("SELECT balance FROM accounts WHERE account = 'a'")[0][0]
        print("\n  without de-duplication: %d kills, %d payments, %d rows, balance %d (expected %d)"
              % (kills, published, total, balance, published), flush=True)
        self.assertGreater(total, distinct, "no payment applied twice without de-duplication")
        self.assertGreater(balance, published)


class _CuttingProxy:
    """A TCP proxy to Redis whose connections the test can cut, and which can
    refuse new ones for a while: Redis going away, seen from the consumer."""

    def __init__(self, target):
        self.target = target
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.pairs = []
        self.lock = threading.Lock()
        self.refusing = False
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            if self.refusing:
                c.close()
                continue
            try:
                u = socket.create_connection(self.target, timeout=5)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.pairs.append((c, u))
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()

    def _pump(self, a, b):
        socks = [a, b]
        try:
            while True:
                ready, _, _ = select.select(socks, [], [], 0.5)
                for x in ready:
                    data = x.recv(65536)
                    if not data:
                        raise OSError
                    (b if x is a else a).sendall(data)
        except (OSError, ValueError):
            for x in socks:
                try:
                    x.close()
                except OSError:
                    pass

    def cut(self):
        with self.lock:
            for a, b in self.pairs:
                for x in (a, b):
                    try:
                        x.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            self.pairs = []

    def close(self):
        self.closed = True
        self.cut()
        self.lsock.close()


class TestConsumerRedisDown(ConsumerTestBase):
    def test_reconnects_after_redis_goes_away(self):
        proxy = _CuttingProxy((self.host, self.port))
        self.addCleanup(proxy.close)
        url = "redis://127.0.0.1:%d/%d" % (proxy.port, self.db)
        p = self.start("r0", "--batch", "8", "--block-ms", "200", "--work-ms", "2", url=url)
        n = 0
        for round_ in range(4):
            for _ in range(30):
                self.publish(self.r, [("payment_id", "pay-%d" % n), ("account", "a"), ("amount", "2")])
                n += 1
            time.sleep(0.1)
            proxy.refusing = True
            proxy.cut()
            time.sleep(0.8)  # refused meanwhile: the consumer backs off and tries again
            proxy.refusing = False
        self.wait_for(lambda: self.pending_count() == 0 and
                      (self.query("SELECT count(DISTINCT payment_id) FROM payments") or [[0]])[0][0]
                      == n, 60, "the consumer to reconnect and drain")
        self.assertEqual(self.stop(p), 0)
        self.check_sanitizers()
        total, distinct = self.query("SELECT count(*), count(DISTINCT payment_id) FROM payments")[0]
        self.assertEqual((total, distinct), (n, n))
        self.assertEqual(self.query("SELECT balance FROM accounts")[0][0], 2 * n)
        self.assertIn("connected again", self.logs())


class TestConsumerOversize(ConsumerTestBase):
    def test_a_message_too_big_is_rejected_and_acked(self):
        self.publish(self.r, [("payment_id", "small-1"), ("account", "a"), ("amount", "5")])
        big = self.publish(self.r, [("payment_id", "big"), ("account", "a"),
                                    ("amount", "1"), ("padding", "x" * (9 * 1024 * 1024))])
        self.publish(self.r, [("payment_id", "small-2"), ("account", "a"), ("amount", "7")])
        p = self.start("o0", "--batch", "16", "--block-ms", "200")
        self.wait_for(lambda: self.pending_count() == 0 and
                      (self.query("SELECT count(*) FROM payments") or [[0]])[0][0] == 2,
                      60, "the consumer to get past the big message")
        self.assertEqual(self.stop(p), 0)
        self.check_sanitizers()
        self.assertEqual(self.query("SELECT balance FROM accounts"), [(12,)])
        rej = self.query("SELECT stream_id, reason FROM rejected")
        self.assertEqual(len(rej), 1)
        self.assertEqual(rej[0][0], big)
        self.assertIn("larger", rej[0][1])


class TestConsumerArguments(unittest.TestCase):
    def test_bad_arguments_exit_2_with_one_line(self):
        if not BINARY.exists():
            self.fail("no consumer binary at %s" % BINARY)
        base = {"--redis": "redis://127.0.0.1:1/0", "--stream": "s", "--group": "g",
                "--consumer": "c", "--db": "sqlite:/nonexistent/x.db"}

        def argv(**change):
            a = dict(base)
            for k, v in change.items():
                k = "--" + k.replace("_", "-")
                if v is None:
                    a.pop(k)
                else:
                    a[k] = v
            out = []
            for k, v in a.items():
                out += [k, v]
            return out

        cases = [
            (argv(redis=None), "--redis"),
            (argv(stream=None), "--stream"),
            (argv(group=None), "--group"),
            (argv(consumer=None), "--consumer"),
            (argv(db=None), "--db"),
            (argv(redis="http://127.0.0.1:6379"), "--redis"),
            (argv(redis="redis://"), "--redis"),
            (argv(redis="redis://h:0"), "--redis"),
            (argv(redis="redis://h:70000"), "--redis"),
            (argv(redis="redis://h:12x"), "--redis"),
            (argv(redis="redis://h:1/abc"), "--redis"),
            (argv(redis="redis://h:1/1/2"), "--redis"),
            (argv(redis="redis://h h:1"), "--redis"),
            (argv(db="/tmp/x.db"), "--db"),
            (argv(db="sqlite:"), "--db"),
            (argv(db="sqlite:" + "x" * 5000), "--db"),
            (argv(stream=""), "--stream"),
            (argv(stream="s" * 201), "--stream"),
            (argv(consumer="a b"), "--consumer"),
            (argv(batch="0"), "--batch"),
            (argv(batch="1001"), "--batch"),
            (argv(batch="ten"), "--batch"),
            (argv(batch="16x"), "--batch"),
            (argv(claim_idle_ms="-1"), "--claim-idle-ms"),
            (argv(claim_idle_ms="99999999999999999999"), "--claim-idle-ms"),
            (argv(block_ms="0"), "--block-ms"),
            (argv(block_ms="60001"), "--block-ms"),
            (argv(exit_when_idle="0"), "--exit-when-idle"),
            (argv(work_ms="1001"), "--work-ms"),
            (argv(dedup="maybe"), "--dedup"),
            (argv() + ["--frobnicate"], "--frobnicate"),
            (argv() + ["--batch"], "--batch"),
            (argv() + ["stray"], "stray"),
        ]
        for args, word in cases:
            with self.subTest(args=args[-2:]):
                r = subprocess.run([str(BINARY)] + args, capture_output=True, timeout=10)
                err = r.stderr.decode(errors="replace")
                self.assertEqual(r.returncode, 2, err)
                self.assertEqual(r.stdout, b"")
                self.assertEqual(err.count("\n"), 1, err)
                self.assertTrue(err.startswith("idem-consumer: "), err)
                self.assertIn(word, err)
        r = subprocess.run([str(BINARY), "--help"], capture_output=True, timeout=10)
        self.assertEqual(r.returncode, 0)
        self.assertIn(b"usage:", r.stdout)


if __name__ == "__main__":
    unittest.main()
