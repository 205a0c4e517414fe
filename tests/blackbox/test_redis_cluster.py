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
  wait=1, master killed  (a cluster of its own) idemd on ?wait=1, a master
                         SIGKILLed under a load of new keys, its replica
                         promoted, the killed node back as its replica:
                         idemd serves again without a restart, every key
                         answered 200 replays with one execution, every key
                         answered 503 runs once when retried
  slots uncovered        (a cluster of its own) CLUSTER DELSLOTSRANGE on every
                         node: idemd refuses to start (exit 2, one line naming
                         the slots); a running idemd answers the gap's keys
                         503 (CLUSTERDOWN, the map read again: no master)
                         and the other slots 200, and serves the gap again
                         once the slots are assigned back
  keys in bulk           300 keys over the three masters: GET /keys in pages of
                         37 walks every master (no key missed, none twice on
                         a page), DELETE /keys removes them all on each
                         master, and a deleted key runs again
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
# Keys a load thread sends at full speed; past them it slows to about 20/s,
# so a failover stretched by a loaded machine leaves a bounded check.
LOAD_KEYS_MAX = 4000


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

    def test_keys_listed_and_bulk_deleted_over_every_master(self):
        # GET /keys walks every master (SCAN on each in turn); DELETE /keys
        # removes each record on its slot's master.
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url())
        run = uuid.uuid4().hex[:6]
        keys = ["bulk-%s-%03d" % (run, i) for i in range(300)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda k: d.post(key=k, body=body_of(k)).status, keys))
        self.assertEqual(statuses, [200] * len(keys))
        masters = self.cluster.masters()
        counts = {p: len(self.keys_on(p)) for p in masters}
        self.assertEqual(sum(counts.values()), len(keys), counts)
        self.assertTrue(all(n > 0 for n in counts.values()), counts)

        seen, cursor, cursors = [], None, []
        while True:
            path = "/keys?limit=37&prefix=bulk-%s-" % run
            if cursor:
                path += "&cursor=" + cursor
            r = d.admin("GET", path)
            self.assertEqual(r.status, 200, r)
            page = [x["key"] for x in r.json()["keys"]]
            self.assertLessEqual(len(page), 37)
            self.assertEqual(len(page), len(set(page)), "a key twice on one page")
            self.assertTrue(all(x["state"] == "completed" for x in r.json()["keys"]))
            seen += page
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
            cursors.append(cursor)
        self.assertEqual(set(seen), set(keys), "a key missed")
        # the cursor names the master it is on: the walk went through all three
        self.assertEqual({c.split(".")[0] for c in cursors} >= {"r0", "r1", "r2"}, True,
                         cursors)

        r = d.admin("DELETE", "/keys?prefix=bulk-%s-&state=completed" % run)
        self.assertEqual((r.status, r.json()), (200, {"deleted": len(keys)}))
        for p in masters:
            self.assertEqual(self.keys_on(p), [], "master %d still holds records" % p)
        r = d.admin("GET", "/keys?prefix=bulk-%s-" % run)
        self.assertEqual(r.json(), {"keys": [], "next_cursor": None})
        # a deleted key runs again
        n = up.count(key=keys[5])
        r = d.post(key=keys[5], body=body_of(keys[5]))
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        self.assertEqual(up.count(key=keys[5]), n + 1)

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
        # Let the replica catch up, so the keys above survive (no ?wait=):
        # the replica has applied the victim's stream up to where it was
        # after the last answer.  (WAIT on a new connection counts the
        # replicas online and waits for nothing.)
        def offset(port, field):
            for line in self.cluster.cli(port, "INFO", "replication").splitlines():
                if line.startswith(field + ":"):
                    return int(line.split(":", 1)[1])
            return -1
        written = offset(victim, "master_repl_offset")
        self.assertGreater(written, 0)
        h.wait_until(lambda: offset(replica, "slave_repl_offset") >= written, 60, interval=0.1,
                     what="the replica applied the victim's writes")

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


@unittest.skipUnless(HAVE, "needs redis-server and redis-cli")
class RedisClusterWaitFailover(ClusterCase):

    def test_wait_1_master_killed_no_answered_key_lost(self):
        """?wait=1: a master is killed under a load of new keys; its replica is
        promoted, the killed node comes back as the new master's replica, and
        idemd, not restarted, serves every slot again.  Every key answered
        200 before, while or after the master died replays (same answer, one
        execution); every key answered 503 runs once when retried."""
        up = self.start_upstream()
        # Records outlive the slowest run: every answered key is checked at
        # the end, after the failover and its waits, which a loaded machine
        # can stretch past CFG's 10 minutes.
        cfg = dict(CFG, defaults={"key_ttl": "6h"})
        d = self.start_idemd(up, cfg, store=self.url(timeout="2s", wait=1))
        victim = self.cluster.masters()[0]
        replica = self.cluster.replica_of(victim)
        answered, refused, other = {}, set(), []
        lock = threading.Lock()
        stop = threading.Event()

        def load(n):
            i = 0
            while not stop.is_set():
                with lock:
                    enough = len(answered) + len(refused) >= LOAD_KEYS_MAX
                if enough:  # the load stays, at a pace the final check can verify
                    stop.wait(0.05)
                k = "w%d-%d-%s" % (n, i, uuid.uuid4().hex[:6])
                i += 1
                try:
                    r = d.post(key=k, body=body_of(k), timeout=30)
                except OSError as e:
                    with lock:
                        other.append((k, repr(e)))
                    continue
                with lock:
                    if r.status == 200:
                        answered[k] = r
                    elif r.status == 503:
                        refused.add(k)
                    else:
                        other.append((k, r.status, r.body[:200]))

        def on_victim():
            return len(self.keys_on(victim)) > 0 if self.cluster.node(victim).alive() else True

        threads = [threading.Thread(target=load, args=(n,), daemon=True) for n in range(4)]
        for t in threads:
            t.start()
        try:
            h.wait_until(lambda: len(answered) >= 40 and on_victim(), 60,
                         what="keys answered on every master")
            at_kill = len(answered)
            self.cluster.node(victim).kill()
            h.wait_until(lambda: self.cluster.cli(replica, "ROLE").startswith("master"), 60,
                         interval=0.2, what="replica promoted")
            # The killed node comes back as the new master's replica (its
            # nodes.conf): only then can WAIT 1 succeed in those slots.
            self.cluster.node(victim).start()
            self.cluster.wait_ok(time.monotonic() + 60, replicas=3)
            h.wait_until(lambda: self.cluster.cli(victim, "ROLE").startswith("slave"), 60,
                         interval=0.2, what="the killed master back as a replica")
            # idemd, not restarted, answers new keys of every master again.
            after = ["after-%d-%s" % (i, uuid.uuid4().hex[:6]) for i in range(60)]

            def all_ok():
                for k in after:
                    if up.count(key=k) == 0:
                        r = d.post(key=k, body=body_of(k), timeout=30)
                        if r.status != 200:
                            return False
                        with lock:
                            answered[k] = r
                return True
            h.wait_until(all_ok, 60, interval=0.2, what="idemd serving after the failover")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        self.assertTrue(d.running())
        self.assertEqual(other, [], "answers other than 200 and 503")
        self.assertGreater(len(answered), at_kill)
        self.assertGreater(len(self.keys_on(replica)), 0)
        # Every answered key replays: the same answer, one execution.
        lost = []
        for k, first in sorted(answered.items()):
            n = up.count(key=k)
            r = d.post(key=k, body=body_of(k))
            if n != 1 or r.status != 200 or not r.replayed or r.body != first.body:
                lost.append("%s: ran %d times, now %d%s" % (
                    k, n, r.status, " replayed" if r.replayed else " not replayed"))
        self.assertEqual(lost, [], "%d of %d answered keys lost" % (len(lost), len(answered)))
        # A key answered 503 may have run (its completion not acknowledged):
        # retried until it gets its answer, it has run once.
        for k in sorted(refused):
            h.wait_until(lambda: d.post(key=k, body=body_of(k)).status == 200, 30,
                         interval=0.2, what="%s answered" % k)
            self.assertEqual(up.count(key=k), 1, "%s ran %d times" % (k, up.count(key=k)))


GAP = (5461, 10922)  # the second master's slots as redis-cli --cluster create gives them


@unittest.skipUnless(HAVE, "needs redis-server and redis-cli")
class RedisClusterCoverage(ClusterCase):
    """Slots no master serves: refused at start with one line naming them;
    at run time their keys fail closed (503) and idemd serves the rest."""

    def owner_of_gap(self):
        for r in self.cluster.nodes_table(self.cluster.nodes[0].port):
            if "%d-%d" % GAP in r["slots"]:
                return r["port"]
        raise AssertionError("no master holds slots %d-%d" % GAP)

    def assigned_everywhere(self, count):
        return all(self.cluster.info(n.port).get("cluster_slots_assigned") == str(count)
                   for n in self.cluster.nodes)

    def unassign_gap(self):
        """CLUSTER DELSLOTSRANGE on every node, the owner first (else its
        gossip would give the slots back); until every node agrees."""
        owner = self.owner_of_gap()
        for p in [owner] + [n.port for n in self.cluster.nodes if n.port != owner]:
            self.assertEqual(self.cluster.cli(p, "CLUSTER", "DELSLOTSRANGE", *GAP), "OK")
        h.wait_until(lambda: self.assigned_everywhere(16384 - (GAP[1] - GAP[0] + 1)), 30,
                     interval=0.1, what="the gap seen by every node")
        return owner

    def reassign_gap(self, owner):
        self.assertEqual(self.cluster.cli(owner, "CLUSTER", "ADDSLOTSRANGE", *GAP), "OK")
        h.wait_until(lambda: self.assigned_everywhere(16384), 30, interval=0.1,
                     what="every slot served again")
        self.cluster.wait_ok(time.monotonic() + 60)

    def test_slots_uncovered_at_start_are_refused(self):
        owner = self.unassign_gap()
        try:
            d = self.make_idemd(self.start_upstream(), CFG, store=self.url())
            log = d.spawn("gap")
            rc_ = d.wait_exit(60)
            with open(log, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            self.assertEqual(rc_, 2, lines)
            self.assertEqual(len(lines), 1, lines)
            self.assertRegex(lines[0], r"^idemd: --store: redis cluster 127\.0\.0\.1:\d+: "
                                       r"slots 5461-10922 are served by no master$")
        finally:
            self.reassign_gap(owner)
        # The same cluster, whole again, is served.
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url())
        self.assertEqual(d.post(key="whole", body=body_of("whole")).status, 200)

    def test_slots_uncovered_at_run_time_fail_closed(self):
        up = self.start_upstream()
        d = self.start_idemd(up, CFG, store=self.url(timeout="1s"))
        inside, outside = [], []
        i = 0
        while len(inside) < 3 or len(outside) < 3:
            tag = "cov%d-%s" % (i, uuid.uuid4().hex[:4])
            i += 1
            (inside if GAP[0] <= self.cluster.keyslot(tag) <= GAP[1] else outside).append(tag)
        before = ["{%s}-0" % t for t in inside[:3] + outside[:3]]
        for k in before:
            self.assertEqual(d.post(key=k, body=body_of(k)).status, 200)
        ports = [n.port for n in self.cluster.nodes]
        for p in ports:  # the other slots go on serving while the gap is open
            self.cluster.cli(p, "CONFIG", "SET", "cluster-require-full-coverage", "no")
        gap_keys = ["{%s}-1" % t for t in inside[:3]]
        owner = self.unassign_gap()
        try:
            # The gap's master answers CLUSTERDOWN; idemd reads the map
            # again, finds no master for those slots, and fails closed.
            for k in gap_keys:
                r = d.post(key=k, body=body_of(k))
                self.assertProblem(r, 503, "store-unavailable")
                self.assertEqual(up.count(key=k), 0)
            h.wait_until(lambda: "has no master" in d.log_text(), 10,
                         what="the refreshed map's gap in idemd's log")
            for t in outside[:3]:
                k = "{%s}-1" % t
                self.assertEqual(d.post(key=k, body=body_of(k)).status, 200)
            self.assertTrue(d.running())
        finally:
            self.reassign_gap(owner)
            for p in ports:
                self.cluster.cli(p, "CONFIG", "SET", "cluster-require-full-coverage", "yes")

        # Served again without a restart: each gap key runs once.
        def served():
            for k in gap_keys:
                if up.count(key=k) == 0 and d.post(key=k, body=body_of(k)).status != 200:
                    return False
            return True
        h.wait_until(served, 30, interval=0.2, what="the gap's keys served again")
        self.check_once_and_replay(up, d, gap_keys + before)


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
