"""The start-up self-check of the store (docs/stores.md, "The start-up
self-check"; src/gateway/selfcheck.c).

Right after its store opens, idemd claims a key of its own under the scope
idemd-selfcheck, claims it again, reads it, completes it with a stale fence
and then its own, reads it, deletes it and reads it once more.  A store that
answers but does not do what idemd relies on is refused before anything
serves: exit status 2 and one line on stderr naming the step and what came
back, and neither /healthz nor /readyz ever answers.  A working store
starts and leaves no self-check record behind.

Each test starts its own servers on free loopback ports:
  - a Redis master and a Redis started with --replicaof it: idemd pointed
    at the replica is refused (its claim gets READONLY), and at the master
    it starts;
  - on the shared PostgreSQL ($IDEM_TEST_PG_URL, skipped without it), a
    table of the test's own: a session made read-only (libpq's options=
    -c default_transaction_read_only=on, what a hot standby answers) is
    refused, a normal one starts.

The tests choose their own store URLs, so IDEM_BB_STORE does not change them.
"""

import os
import shutil
import subprocess
import time
import unittest
import urllib.parse
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

# A bound on a hang of a refused start, far above the milliseconds it takes.
HANG_BOUND = 60.0
SERVER_START_TIMEOUT = 30.0


def redis_cli(port, *args):
    """Run redis-cli against 127.0.0.1:port; its stdout, stripped."""
    out = subprocess.run(["redis-cli", "-h", h.HOST, "-p", str(port)] + list(args),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=30, check=False)
    return out.stdout.decode("utf-8", "replace").strip()


class Refusal:
    """What a start that must fail did: its exit status, its stderr lines,
    and whether its admin listener ever answered."""

    def __init__(self, rc, lines, answered):
        self.rc, self.lines, self.answered = rc, lines, answered


class SelfCheckCase(h.IdemTestCase):
    def start_refused(self, store):
        """Start idemd on store; wait for its exit, asking /readyz all the
        while.  Fails when it serves instead (its /readyz answers 200)."""
        d = self.make_idemd(None, store=store)
        d.port, d.admin_port = h.free_ports(2)
        log = os.path.join(self.tmp, "refused.stderr")
        d.logs.append(log)
        with open(log, "wb") as err:
            d.proc = subprocess.Popen(d.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                      stderr=err, cwd=self.tmp)
        answered = False
        deadline = time.monotonic() + HANG_BOUND
        while d.proc.poll() is None:
            try:
                r = h.request(d.admin_port, "GET", "/readyz", timeout=1.0)
                answered = True
                if r.status == 200:
                    d.kill()
                    self.fail("idemd turned ready on a store it must refuse")
            except OSError:
                pass
            if time.monotonic() >= deadline:
                d.kill()
                self.fail("idemd neither served nor exited on a store it must refuse")
            time.sleep(0.02)
        with open(log, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return Refusal(d.proc.returncode, lines, answered)

    def assert_refused(self, res, step, words):
        self.assertEqual(res.rc, 2, "exit status; stderr:\n%s" % "\n".join(res.lines))
        self.assertEqual(len(res.lines), 1, "one line, got:\n%s" % "\n".join(res.lines))
        line = res.lines[0]
        self.assertTrue(line.startswith("idemd: store self-check failed: %s: expected " % step),
                        line)
        self.assertIn(words, line)
        self.assertFalse(res.answered, "the admin listener answered before the check passed")

    def assert_serves(self, store):
        """idemd starts on store and /readyz says 200."""
        up = self.start_upstream()
        d = self.make_idemd(up, store=store)
        d.start()
        r = h.request(d.admin_port, "GET", "/readyz")
        self.assertEqual(r.status, 200, r.text)
        r = h.request(d.port, "POST", "/pay", body=b"{}", key=h.new_key())
        self.assertEqual(r.status, 200, r.text)
        self.assertEqual(d.stop(), 0)
        return d


@unittest.skipUnless(shutil.which("redis-server") and shutil.which("redis-cli"),
                     "redis-server and redis-cli are not installed")
class RedisReplica(SelfCheckCase):
    def start_redis(self, name, *extra):
        port = h.free_port()
        wd = os.path.join(self.tmp, name)
        os.makedirs(wd)
        log = open(os.path.join(wd, "redis.log"), "wb")
        with log:
            p = subprocess.Popen(["redis-server", "--bind", h.HOST, "--port", str(port),
                                  "--dir", wd, "--save", "", "--daemonize", "no"] + list(extra),
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        def stop():
            if p.poll() is None:
                p.kill()
            p.wait(30)
        self.addCleanup(stop)
        h.wait_until(lambda: redis_cli(port, "PING") == "PONG", SERVER_START_TIMEOUT,
                     what="redis-server on port %d" % port)
        return port

    def test_a_read_only_replica_is_refused_and_its_master_serves(self):
        master = self.start_redis("master")
        replica = self.start_redis("replica", "--replicaof", h.HOST, str(master))
        # The replica refuses writes from its start (replica-read-only yes),
        # whether or not its first sync is done: nothing to wait for.
        self.assertTrue(redis_cli(replica, "ROLE").startswith("slave"))
        res = self.start_refused("redis://%s:%d/0" % (h.HOST, replica))
        self.assert_refused(res, "claim", "READONLY")
        self.assertIn("store unavailable", res.lines[0])

        self.assert_serves("redis://%s:%d/0" % (h.HOST, master))
        # the check deleted its record; the request's record is there
        self.assertEqual(redis_cli(master, "--scan", "--pattern", "*idemd-selfcheck*"), "")
        self.assertNotEqual(redis_cli(master, "--scan", "--pattern", "idem:*"), "")


def pg_url_with(url, **opts):
    """url with the query options opts added (percent-encoded)."""
    u = urllib.parse.urlsplit(url)
    q = urllib.parse.parse_qsl(u.query) + list(opts.items())
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path,
                                    urllib.parse.urlencode(q, quote_via=urllib.parse.quote),
                                    ""))


@unittest.skipUnless(os.environ.get("IDEM_TEST_PG_URL"),
                     "IDEM_TEST_PG_URL is not set (scripts/services.sh starts a PostgreSQL)")
class PostgresReadOnly(SelfCheckCase):
    def test_a_read_only_session_is_refused_and_a_normal_one_serves(self):
        base = os.environ["IDEM_TEST_PG_URL"]
        table = "idem_sc_%s" % uuid.uuid4().hex[:16]
        self.addCleanup(self.drop_table, base, table)
        url = pg_url_with(base, table=table)
        # The first start makes the table (a read-only session could not).
        self.assert_serves(url)
        res = self.start_refused(pg_url_with(
            base, table=table, options="-c default_transaction_read_only=on"))
        self.assert_refused(res, "claim", "read-only transaction")

    @staticmethod
    def drop_table(base, table):
        psql = shutil.which("psql")
        if psql is None:
            return
        u = urllib.parse.urlsplit(base)
        conn = urllib.parse.urlunsplit((u.scheme, u.netloc, u.path, "", ""))
        subprocess.run([psql, "-q", "-X", "-d", conn, "-c", 'DROP TABLE IF EXISTS "%s"' % table],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30, check=False)


if __name__ == "__main__":
    unittest.main()
