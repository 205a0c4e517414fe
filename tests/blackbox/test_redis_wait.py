"""SPEC section 17 (issue 20, item 3): replicas that acknowledge, `?wait=N`
on a Redis URL, through the real idemd (docs/stores.md, "What a failover
can lose"; src/store/redis.c, wait_replicas).

With wait=N the Redis store sends `WAIT N timeout` on the batch's own
connection after every batch whose scripts ran, and fewer than N
acknowledgements make the whole batch a store error: a claim is not
forwarded and a completion is not answered until a replica has it.

Each test starts its own redis-servers on free loopback ports (a master,
and a replica started with --replicaof it), no persistence:

  wait=17, wait=x                     idemd refuses to start: exit 2, one
                                      line naming wait=
  wait=1, replica in sync             a keyed POST answers 200, and the
                                      replica holds the completed record the
                                      moment idemd has answered
  wait=1, replica stopped (SIGSTOP)   a keyed POST answers 503 store-
                                      unavailable and the upstream never sees
                                      it; its key, claimed on the master but
                                      reported failed, answers 409 while its
                                      lease lasts
  replica continued (SIGCONT)         a new key answers 200 again
  wait=1, master killed (SIGKILL)     after REPLICAOF NO ONE on the replica,
                                      an idemd on it replays every key the
                                      first one answered; none runs again
  wait=1, a master without replica    the start-up self-check's claim fails:
                                      exit 2, one line with "WAIT: 0 of 1
                                      replicas acknowledged"

The tests choose their own store URLs, so IDEM_BB_STORE does not change them.
"""

import os
import shutil
import signal
import subprocess
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

SERVER_START_TIMEOUT = 30.0
HANG_BOUND = 60.0  # s: a bound on a refused start, far above what it takes


def redis_cli(port, *args):
    """Run redis-cli against 127.0.0.1:port; its stdout, stripped."""
    out = subprocess.run(["redis-cli", "-h", h.HOST, "-p", str(port)] + list(args),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=30, check=False)
    return out.stdout.decode("utf-8", "replace").strip()


# A record's state and fence, from the header of its value (layout 2 of
# src/store/redis.c: version, st, fl, then fe as '<i8'), one per line.
RECORD_ST_FE = ("local v = redis.call('GET', KEYS[1]) "
                "local _, st, _, fe = struct.unpack('<BBBi8', v) return {st, fe}")


def info_field(port, section, field):
    for line in redis_cli(port, "INFO", section).splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


@unittest.skipUnless(shutil.which("redis-server") and shutil.which("redis-cli"),
                     "redis-server and redis-cli are not installed")
class RedisWait(h.IdemTestCase):
    def start_redis(self, name, *extra):
        """A redis-server of this test; (port, Popen)."""
        port = h.free_port()
        wd = os.path.join(self.tmp, name)
        os.makedirs(wd)
        with open(os.path.join(wd, "redis.log"), "wb") as log:
            p = subprocess.Popen(["redis-server", "--bind", h.HOST, "--port", str(port),
                                  "--dir", wd, "--save", "", "--appendonly", "no",
                                  "--daemonize", "no"] + list(extra),
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        def stop():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)  # a stopped process must run to die
                except OSError:
                    pass
                p.kill()
            p.wait(30)
        self.addCleanup(stop)
        h.wait_until(lambda: redis_cli(port, "PING") == "PONG", SERVER_START_TIMEOUT,
                     what="redis-server on port %d" % port)
        return port, p

    def start_pair(self):
        """A master and a replica in sync with it: (master, replica, replica's Popen)."""
        master, _ = self.start_redis("master")
        replica, rproc = self.start_redis("replica", "--replicaof", h.HOST, str(master))
        h.wait_until(lambda: info_field(replica, "replication", "master_link_status") == "up"
                     and info_field(master, "replication", "connected_slaves") == "1",
                     SERVER_START_TIMEOUT, what="the replica's first sync")
        return master, replica, rproc

    def url(self, port, **params):
        q = "&".join("%s=%s" % kv for kv in params.items())
        return "redis://%s:%d/0%s" % (h.HOST, port, "?" + q if q else "")

    def start_refused(self, store):
        """Start idemd on store, which it must refuse: (exit status, stderr lines)."""
        d = self.make_idemd(None, store=store)
        d.port, d.admin_port = h.free_ports(2)
        log = os.path.join(self.tmp, "refused.%d.stderr" % len(d.logs))
        d.logs.append(log)
        with open(log, "wb") as err:
            d.proc = subprocess.Popen(d.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                      stderr=err, cwd=self.tmp)
        try:
            rc = d.proc.wait(HANG_BOUND)
        except subprocess.TimeoutExpired:
            d.kill()
            self.fail("idemd did not refuse store %s" % store)
        with open(log, "rb") as f:
            return rc, f.read().decode("utf-8", "replace").splitlines()

    def record(self, port, key):
        """The fields st and fe of key's record on the server at port ("" if none)."""
        name = redis_cli(port, "--scan", "--pattern", "idem:*:" + key)
        if not name:
            return ""
        return redis_cli(port, "EVAL", RECORD_ST_FE, "1", name)

    def caught_up(self, master):
        """The master's one replica has acknowledged all the master wrote."""
        slave = info_field(master, "replication", "slave0") or ""
        fields = dict(f.split("=", 1) for f in slave.split(",") if "=" in f)
        return fields.get("offset") == info_field(master, "replication", "master_repl_offset")

    def test_a_bad_wait_is_refused_with_one_line(self):
        for bad in ("17", "x", "-1", ""):
            rc, lines = self.start_refused("redis://%s:%d/0?wait=%s"
                                           % (h.HOST, h.dead_port(), bad))
            self.assertEqual(rc, 2, "\n".join(lines))
            self.assertEqual(len(lines), 1, "\n".join(lines))
            self.assertIn("wait=%s" % bad, lines[0])
            self.assertIn("from 0 (off) to 16", lines[0])

    def test_acknowledged_writes_then_a_stopped_replica_fails_closed(self):
        master, replica, rproc = self.start_pair()
        up = self.start_upstream()
        d = self.make_idemd(up, store=self.url(master, wait=1, timeout="5s"))
        d.start()
        self.assertEqual(h.request(d.admin_port, "GET", "/readyz").status, 200)

        # In sync: the answer comes after the replica has the completion.
        for _ in range(5):
            key = h.new_key()
            r = d.post(key=key)
            self.assertEqual(r.status, 200, r.text)
            self.assertEqual(self.record(replica, key), "2\n1",
                             "the replica holds the completed record once idemd answered")

        # The replica stops acknowledging: a new key is not forwarded.  (A
        # long timeout, so that a loaded machine's slow replica never fails
        # the acknowledged parts; the stopped one costs it per request.)
        rproc.send_signal(signal.SIGSTOP)
        try:
            key = h.new_key()
            r = d.post(key=key)
            self.assertEqual(r.status, 503, r.text)
            self.assertIn("store-unavailable", r.text)
            self.assertEqual(up.count(key=key), 0, "forwarded on an unacknowledged claim")
            # The claim is on the master all the same (written, then not
            # acknowledged): the key is in progress until its lease ends.
            self.assertEqual(self.record(master, key).split("\n")[0], "1")
            # A retry meanwhile: 409 when its claim's connection has no
            # unacknowledged write, else 503 again; never forwarded.
            r = d.post(key=key)
            self.assertIn(r.status, (409, 503), r.text)
            self.assertEqual(up.count(key=key), 0)
            held = key
        finally:
            rproc.send_signal(signal.SIGCONT)

        # Acknowledged again: a new key runs.
        h.wait_until(lambda: self.caught_up(master), SERVER_START_TIMEOUT,
                     what="the replica acknowledging the master's whole stream")
        # The key whose claim was not acknowledged is held by that claim
        # until its lease (30 s) ends: 409, still never forwarded.
        r = d.post(key=held)
        self.assertEqual(r.status, 409, r.text)
        self.assertEqual(up.count(key=held), 0)
        key = h.new_key()
        r = d.post(key=key)
        self.assertEqual(r.status, 200, r.text)
        self.assertEqual(up.count(key=key), 1)
        self.assertEqual(self.record(replica, key), "2\n1")
        self.assertEqual(h.request(d.admin_port, "GET", "/readyz").status, 200)
        self.assertEqual(d.stop(), 0)

    def test_every_answered_key_survives_the_masters_death(self):
        master, replica, _ = self.start_pair()
        up = self.start_upstream()
        d = self.make_idemd(up, store=self.url(master, wait=1, timeout="5s"))
        d.start()
        keys = []
        for _ in range(30):
            key = h.new_key()
            r = d.post(key=key)
            self.assertEqual(r.status, 200, r.text)
            keys.append(key)
        # Killed at once, nothing flushed: only what the replica has survives.
        os.kill(self.master_pid(master), signal.SIGKILL)
        self.assertEqual(redis_cli(replica, "REPLICAOF", "NO", "ONE"), "OK")
        d.kill()

        d2 = self.make_idemd(up, store=self.url(replica), name="idemd2")
        d2.start()
        for key in keys:
            r = d2.post(key=key)
            self.assertEqual(r.status, 200, r.text)
            self.assertTrue(r.replayed, "key %s ran again after the failover" % key)
            self.assertEqual(up.count(key=key), 1)
        self.assertEqual(d2.stop(), 0)

    def master_pid(self, port):
        return int(info_field(port, "server", "process_id"))

    def test_the_self_check_refuses_a_master_without_replicas(self):
        master, _ = self.start_redis("lonely")
        rc, lines = self.start_refused(self.url(master, wait=1, timeout="200ms"))
        self.assertEqual(rc, 2, "\n".join(lines))
        self.assertEqual(len(lines), 1, "\n".join(lines))
        self.assertIn("store self-check failed: claim", lines[0])
        self.assertIn("WAIT: 0 of 1 replicas acknowledged within 200 ms", lines[0])


if __name__ == "__main__":
    unittest.main()
