"""SPEC section 17: the Redis store on a Redis Cluster (redis+cluster://),
through the real idemd.

The clusters are the tests' own (tests/cluster.py): three masters with a
replica each, on free loopback ports, `--cluster-node-timeout 2000`, no
persistence.  What is checked:

  spread and replay      60 keys through one idemd: each runs once and
                         replays; every master holds some of them (KEYS on
                         each master), and a key with a hash tag lives in
                         its tag's slot (CLUSTER KEYSLOT)
  many instances         three idemd on one cluster, 60 keys x 4 duplicates
                         fired together (a barrier per key): every key runs
                         exactly once, every other answer is its replay or
                         409 in-flight
  node added, slot moved under load (threads sending new keys and replays
                         of answered ones, all in one slot by a hash tag), a
                         new empty master joins (CLUSTER MEET) and the slot is
                         moved to it by hand: IMPORTING,
                         MIGRATING, MIGRATE of its keys in steps (idemd gets
                         ASK meanwhile), then SETSLOT NODE everywhere (MOVED):
                         no request fails, every key ran once and replays
  master killed          (a cluster of its own) a master is SIGKILLed under
                         load; its replica is promoted by the cluster; without
                         a restart idemd answers new keys in every slot again
                         within seconds, and they replay
  rediss+cluster://      a TLS-only cluster (--tls-cluster yes, certificates
                         from tests/certs.py): a key runs once and replays

The verdicts are counts of executions and answers; the waits are polls with
deadlines on events (cluster_state:ok, a node's role), never sleeps.
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

sys.path.insert(0, str(h.REPO / "tests"))
import cluster as rc  # noqa: E402

HAVE = rc.REDIS and rc.REDIS_CLI
CFG = {"upstream_timeout": "30s", "defaults": {"key_ttl": "10m"}}


def body_of(k):
    return json.dumps({"amount": 100, "order": k}).encode()


class ClusterCase(h.IdemTestCase):
    tls = False

    @classmethod
    def setUpClass(cls):
        cls.top = tempfile.mkdtemp(prefix="idem-bb-cluster-")
        certs = None
        if cls.tls:
            from certs import make_certs
            certs = make_certs(os.path.join(cls.top, "certs"))
        cls.cluster = rc.Cluster(cls.top, tls=certs)
        try:
            cls.cluster.start()
        except BaseException:
            cls.cluster.stop()
            if not h.KEEP:
                shutil.rmtree(cls.top, True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        if not h.KEEP:
            shutil.rmtree(cls.top, True)

    def setUp(self):
        super().setUp()
        self.prefix = "idembb%s:" % uuid.uuid4().hex[:8]

    def url(self, **kw):
        q = {"prefix": self.prefix, "timeout": "5s"}
        q.update(kw)
        if self.cluster.tls:
            q["ca"] = self.cluster.tls["ca"]
        return self.cluster.url(**q)

    def keys_on(self, port):
        out = self.cluster.cli(port, "KEYS", self.prefix + "*")
        return [k for k in out.splitlines() if k]

    def check_once_and_replay(self, up, d, keys, firsts=None):
        for k in keys:
            self.assertEqual(up.count(key=k), 1, "%s ran %d times" % (k, up.count(key=k)))
            r = d.post(key=k, body=body_of(k))
            self.assertEqual(r.status, 200, r)
            self.assertTrue(r.replayed, "%s is not replayed: %r" % (k, r))
            if firsts is not None and k in firsts:
                self.assertReplayOf(r, firsts[k])


@unittest.skipUnless(HAVE, "needs redis-server and redis-cli")
class RedisCluster(ClusterCase):

    def test_keys_spread_over_every_master_and_replay(self):
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url())
        keys = ["spread-%d-%s" % (i, uuid.uuid4().hex[:6]) for i in range(60)]
        firsts = {}
        for k in keys:
            r = d.post(key=k, body=body_of(k))
            self.assertEqual(r.status, 200, r)
            self.assertNotReplay(r)
            firsts[k] = r
        self.check_once_and_replay(up, d, keys, firsts)
        masters = self.cluster.masters()
        self.assertGreaterEqual(len(masters), 3)
        counts = {p: len(self.keys_on(p)) for p in masters}
        self.assertEqual(sum(counts.values()), len(keys), counts)
        for p, n in counts.items():
            self.assertGreater(n, 0, "master %d holds none of the keys: %r" % (p, counts))
        # A hash tag in the client's key decides the slot, as Redis says.
        tagged = "{tag-%s}-1" % uuid.uuid4().hex[:6]
        self.assertEqual(d.post(key=tagged, body=body_of(tagged)).status, 200)
        stored = [k for p in masters for k in self.keys_on(p) if k.endswith(tagged)]
        self.assertEqual(len(stored), 1, stored)
        self.assertEqual(self.cluster.keyslot(stored[0]),
                         self.cluster.keyslot(tagged[1:tagged.index("}")]))
        # The admin reads and deletes a record on whichever master holds it.
        self.assertEqual(d.get_key(keys[0]).status, 200)
        self.assertEqual(d.delete_key(keys[0]).status in (200, 204), True)
        self.assertEqual(d.get_key(keys[0]).status, 404)

    def test_three_instances_concurrent_duplicates_run_once(self):
        up = self.start_upstream()
        up.set_reply(delay=0.2)
        ds = [self.start_idemd(up, CFG, store=self.url(), name="idemd-%s" % n) for n in "abc"]
        keys = ["dup-%d-%s" % (i, uuid.uuid4().hex[:6]) for i in range(60)]
        dups = 4
        results = {k: [None] * dups for k in keys}
        barriers = {k: threading.Barrier(dups) for k in keys}

        def one(i, k, j):
            d = ds[(i + j) % len(ds)]
            try:
                barriers[k].wait(30)
                r = d.post(key=k, body=body_of(k), timeout=30)
            except Exception as e:  # noqa: BLE001 - reported below
                r = e
            results[k][j] = r

        with concurrent.futures.ThreadPoolExecutor(32) as ex:
            futs = [ex.submit(one, i, k, j) for i, k in enumerate(keys) for j in range(dups)]
            for f in futs:
                f.result(120)
        problems = []
        for k in keys:
            if up.count(key=k) != 1:
                problems.append("%s ran %d times" % (k, up.count(key=k)))
            rs = results[k]
            errs = [r for r in rs if isinstance(r, BaseException)]
            if errs:
                problems.append("%s: %r" % (k, errs[0]))
                continue
            firsts = [r for r in rs if r.status == 200 and not r.replayed]
            if len(firsts) != 1:
                problems.append("%s: %d first answers: %r" % (k, len(firsts), rs))
                continue
            for r in rs:
                if r is firsts[0]:
                    continue
                try:
                    if r.status == 200:
                        self.assertReplayOf(r, firsts[0])
                    else:
                        self.assertProblem(r, 409, "in-flight")
                except AssertionError as e:
                    problems.append("%s: %s" % (k, str(e).splitlines()[0]))
        if problems:
            self.fail("%d problems:\n  %s" % (len(problems), "\n  ".join(problems[:20])))

    def test_slot_migrated_under_load_fails_no_request(self):
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url())
        tag = "mig%s" % uuid.uuid4().hex[:6]
        slot = self.cluster.keyslot(tag)
        # Keys of the slot answered before the move, to be replayed during it.
        old = ["{%s}-old-%d" % (tag, i) for i in range(200)]
        for k in old:
            self.assertEqual(d.post(key=k, body=body_of(k)).status, 200)
        masters = self.cluster.masters()
        src = [p for p in masters
               if int(self.cluster.cli(p, "CLUSTER", "COUNTKEYSINSLOT", slot)) > 0][0]
        # A node added to the cluster, empty, takes the slot.
        dst = self.cluster.add_master()
        owner_of = {r["port"]: r["id"] for r in self.cluster.nodes_table(src)}
        stop = threading.Event()
        bad, sent, new_keys = [], [0], []
        lock = threading.Lock()

        def load(n):
            i = 0
            while not stop.is_set():
                if i % 2 == 0:
                    k = "{%s}-new-%d-%d" % (tag, n, i)
                    with lock:
                        new_keys.append(k)
                else:
                    k = old[(i * 7 + n) % len(old)]
                r = d.post(key=k, body=body_of(k), timeout=30)
                with lock:
                    sent[0] += 1
                    if r.status != 200:
                        bad.append((k, r.status, r.body[:200]))
                i += 1

        threads = [threading.Thread(target=load, args=(n,), daemon=True) for n in range(4)]
        for t in threads:
            t.start()
        try:
            h.wait_until(lambda: sent[0] >= 40, 30, what="load under way")
            cli = self.cluster.cli
            self.assertEqual(cli(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", owner_of[src]), "OK")
            self.assertEqual(cli(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", owner_of[dst]), "OK")
            moved_steps = 0
            while True:
                ks = [k for k in cli(src, "CLUSTER", "GETKEYSINSLOT", slot, 20).splitlines() if k]
                if not ks:
                    break
                out = cli(src, "MIGRATE", rc.HOST, dst, "", 0, 5000, "KEYS", *ks)
                self.assertIn(out, ("OK", "NOKEY"), out)
                moved_steps += 1
                # Requests meet the half-moved slot (ASK) between steps.
                seen = sent[0]
                h.wait_until(lambda: sent[0] >= seen + 5, 30, what="requests between steps")
            for p in [n.port for n in self.cluster.nodes]:
                cli(p, "CLUSTER", "SETSLOT", slot, "NODE", owner_of[dst])
            seen = sent[0]
            h.wait_until(lambda: sent[0] >= seen + 40, 30, what="requests after the move")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        self.assertGreater(moved_steps, 1)
        self.assertEqual(bad, [], "%d of %d requests failed" % (len(bad), sent[0]))
        self.assertEqual(int(self.cluster.cli(src, "CLUSTER", "COUNTKEYSINSLOT", slot)), 0)
        self.assertGreater(int(self.cluster.cli(dst, "CLUSTER", "COUNTKEYSINSLOT", slot)), 0)
        self.check_once_and_replay(up, d, old[:20] + new_keys[:20] + new_keys[-20:])


@unittest.skipUnless(HAVE, "needs redis-server and redis-cli")
class RedisClusterFailover(ClusterCase):

    def test_master_killed_replica_promoted_idemd_serves_again(self):
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url(timeout="2s"))
        masters = self.cluster.masters()
        victim = masters[0]
        replica = self.cluster.replica_of(victim)
        # Keys in every slot range: 60 random keys reach all three masters.
        before = ["pre-%d-%s" % (i, uuid.uuid4().hex[:6]) for i in range(60)]
        for k in before:
            self.assertEqual(d.post(key=k, body=body_of(k)).status, 200)
        self.assertGreater(len(self.keys_on(victim)), 0)
        # Let the replica catch up, so the keys above survive (no ?wait=).
        self.cluster.cli(victim, "WAIT", 1, 5000)

        stop = threading.Event()
        statuses = []

        def load():
            i = 0
            while not stop.is_set():
                k = "load-%d-%s" % (i, uuid.uuid4().hex[:6])
                try:
                    statuses.append(d.post(key=k, body=body_of(k), timeout=30).status)
                except OSError:
                    statuses.append(None)
                i += 1

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            h.wait_until(lambda: len(statuses) >= 20, 30, what="load under way")
            self.cluster.node(victim).kill()
            # The cluster promotes the replica (cluster-node-timeout 2 s).
            h.wait_until(lambda: self.cluster.cli(replica, "ROLE").startswith("master"), 60,
                         interval=0.2, what="replica promoted")
            self.cluster.wait_ok(time.monotonic() + 60)
            # idemd, not restarted, serves keys of every master again.
            after = ["post-%d-%s" % (i, uuid.uuid4().hex[:6]) for i in range(60)]

            def all_ok():
                for k in after:
                    if up.count(key=k) == 0:
                        r = d.post(key=k, body=body_of(k), timeout=30)
                        if r.status != 200:
                            return False
                return True
            h.wait_until(all_ok, 20, interval=0.2, what="idemd serving after the failover")
        finally:
            stop.set()
            t.join(60)
        self.assertTrue(d.running())
        self.assertGreater(len(self.keys_on(replica)), 0)
        self.check_once_and_replay(up, d, after)
        # Keys answered before the kill and replicated (WAIT above) replay.
        self.check_once_and_replay(up, d, before)
        # Nothing but 200 and 503 (store-unavailable) during the failover.
        self.assertTrue(set(statuses) <= {200, 503}, sorted(set(map(str, statuses))))


@unittest.skipUnless(HAVE and shutil.which("openssl"), "needs redis-server, redis-cli, openssl")
class RedisClusterTls(ClusterCase):
    tls = True

    def test_a_key_runs_once_and_replays_over_tls(self):
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url())
        keys = ["tls-%d-%s" % (i, uuid.uuid4().hex[:6]) for i in range(30)]
        for k in keys:
            r = d.post(key=k, body=body_of(k))
            self.assertEqual(r.status, 200, r)
        self.check_once_and_replay(up, d, keys)
        counts = [len(self.keys_on(p)) for p in self.cluster.masters()]
        self.assertEqual(sum(counts), len(keys))
        self.assertTrue(all(counts), counts)


if __name__ == "__main__":
    unittest.main()
