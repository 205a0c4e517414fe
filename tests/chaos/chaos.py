#!/usr/bin/env python3
"""The chaos harness: exactly-once under faults, measured.

For each store (LMDB, Redis, PostgreSQL, a Redis Cluster) it starts two
idemd processes on one shared store in front of a recording upstream
(chaos_upstream.py), puts
a fault proxy in front of each (chaos_proxy.py), and lets client threads run
keyed operations through the proxies while faults are injected:

  dropped responses  the proxy drops a fraction of idemd's complete answers
                     (after the upstream answered and idemd recorded it)
  idemd kills        kill -9 of one idemd every few seconds, alternating, and
                     a restart (on a new port: the proxy in front keeps its own)
  store restarts     Redis (AOF, fsync always) killed with SIGKILL and
                     PostgreSQL stopped with `-m immediate` (both servers of the
                     harness's own, on free ports), down for 0.5-3 s, then
                     started again on the same data; for LMDB, whose store is
                     files on this host, both idemd are killed at once instead;
                     for a Redis Cluster (tests/cluster.py, three masters with a
                     replica each, idemd on redis+cluster://...?wait=1) a
                     master is SIGKILLed, the cluster promotes its replica,
                     and the node is started again (it rejoins as a replica)

Clients use a fresh key per operation and retry with the same key, alternating
between the two instances, on connection errors, dropped answers, 409
in-flight, 502, 503 and 504, until they get the upstream's answer.  Some
operations are also sent as concurrent duplicates, and some keys are sent
again later (late duplicates).  Operations are half on the upstream's plain
path and half on its fenced path (which refuses an Idempotency-Fence lower
than one it has seen).  Some operations work longer than the lease, so that a
kill while they run leads to a takeover.

When the fault phase ends every process is brought back, the clients finish,
a verification pass sends again a sample of the keys (every key that saw
more than one request or execution, and some others) straight to idemd, and
chaos_history.analyse() judges the history.  One table per store, then one
line per target and store, then "N passed, N failed"; exit status 1 when a
target was missed.

  python3 tests/chaos/chaos.py --short --store all     # about 75 s
  python3 tests/chaos/chaos.py --store all             # about 5 minutes
  python3 tests/chaos/chaos.py --store redis --seconds 30 --keep
  python3 tests/chaos/chaos.py --short --store all --upstream ledger   # about 60 s

The whole run has a deadline (--deadline, default derived from the profile):
past it every process the harness started is killed, its directories are
removed, and it exits with status 3.  No other server is touched: Redis and
PostgreSQL are started by the harness on free ports.

`--upstream ledger` puts idem-ledger (examples/ledger, on a SQLite file,
de-duplicating by key in the transaction of the transfer) behind both idemd
instead, through a tap that records every forward (chaos_ledger.py); clients
send transfers between accounts created at the start, with the same faults,
and the ledger's table, balances and /stats are judged at the end: the
target is 0 double effects at all, although idemd's lease-window takeovers
still forward some keys twice.  `--ledger-keys off` runs the ledger without
its keys: a control that must fail (double effects > 0).

`--store memory` is a control that must fail: two idemd with their own
in-process stores share nothing, so keys run twice ('other' double
executions and lost responses), which shows the checks can fail.
"""

import argparse
import atexit
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "blackbox"))
sys.path.insert(0, str(HERE.parent))

import harness as h  # noqa: E402  (tests/blackbox: idemd processes, ports, config)
import cluster as rc  # noqa: E402  (tests/cluster.py: a Redis Cluster of our own)
import test_shared_stores as ss  # noqa: E402  (Redis / PostgreSQL servers of our own)
from chaos_history import analyse, parse_owner_events  # noqa: E402
from chaos_ledger import Ledger, LedgerTap, read_db, verdict  # noqa: E402
from chaos_proxy import FaultProxy, upstream_doc  # noqa: E402
from chaos_upstream import RecordingUpstream  # noqa: E402

STORES = ("lmdb", "redis", "postgres", "cluster")
CLUSTER_SECONDS = 25        # s of faults on the cluster at most (unless --seconds)

PROFILES = {
    # seconds of faults per store, client threads, seconds between kills,
    # seconds between store restarts, answers dropped, keys verified at most
    "short": {"seconds": 14, "clients": 10, "kill_every": 2.5, "store_every": None,
              "drop": 0.15, "verify_max": 300},
    "default": {"seconds": 90, "clients": 12, "kill_every": 3.0, "store_every": 25.0,
                "drop": 0.15, "verify_max": 1000},
}

LEASE = 2.0                 # s, the idemd lease: short so that takeovers happen
P_DUP = 0.12                # operations sent as 2-3 concurrent duplicates
P_LATE = 0.08               # operations followed by a late duplicate of an old key
P_SLOW = 0.06               # operations that work longer than the lease
SLOW_WORK = LEASE * 2.2     # s
REQUEST_TIMEOUT = 20.0      # s, one client request
SETTLE = LEASE * 4 + 15.0   # s after the faults for the last operations to finish

RETRY_PROBLEMS = {"in-flight", "store-unavailable", "upstream-outcome-unknown",
                  "upstream-unreachable"}
RELEASE_STATUSES = (429, 503)  # idemd removes the key: the upstream did nothing

# the ledger mode (--upstream ledger)
LEDGER_IN_BUILD = os.path.join("examples", "ledger", "idem-ledger")
ACCOUNTS = 8
OPENING = 10 ** 9           # cents per account: no transfer is ever refused for funds


# --------------------------------------------------------------------------
# clean-up, also on the deadline


_TMPDIRS = set()
_SERVERS = []               # the Redis / PostgreSQL servers started, for the deadline
_KEEP = False
ABORT = threading.Event()   # set at the deadline: start nothing more
DEADLINE = threading.Event()  # the watchdog fired: it ends the process


def _stop_servers():
    for srv in list(_SERVERS):
        try:
            if isinstance(srv, ss.OwnPostgres):
                # whatever close() believes: a start may be under way
                if os.path.exists(os.path.join(srv.data, "postmaster.pid")):
                    srv._run(os.path.join(srv.bin, "pg_ctl"), "-D", srv.data, "-m",
                             "immediate", "-w", "stop")
            else:
                srv.stop()
        except Exception:  # noqa: BLE001 - clean-up goes on
            pass


def _kill_processes():
    for p in list(h._LIVE):
        if p.poll() is None:
            p.kill()
            p.wait()
        h._LIVE.discard(p)
    _stop_servers()


def _remove_dirs():
    if not _KEEP:
        for d in list(_TMPDIRS):
            shutil.rmtree(d, True)
            _TMPDIRS.discard(d)


def _cleanup():
    ABORT.set()
    _kill_processes()
    _remove_dirs()


atexit.register(_cleanup)


def _watchdog(deadline):
    """At the deadline: start nothing more, kill everything (again and again
    for a few seconds, since a start may have been under way), remove the
    directories, exit 3."""
    def fire():
        left = deadline - time.monotonic()
        if left > 0:
            time.sleep(left)
        DEADLINE.set()
        ABORT.set()
        sys.stdout.flush()
        sys.stderr.write("chaos: global deadline reached; killing everything\n")
        sys.stderr.flush()
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            _kill_processes()
            time.sleep(0.2)
        _kill_processes()
        _remove_dirs()
        os._exit(3)
    threading.Thread(target=fire, daemon=True).start()


# --------------------------------------------------------------------------
# one client request


def send(port, path, key, body, ledger=False):
    """POST through a proxy (or straight to idemd); return (kind, status, doc).

    kind: "final" (the upstream's answer, doc is its JSON), "retry" (a
    connection error, a dropped answer, or an idemd problem worth a retry),
    "unexpected" (anything else).  With the ledger only a 2xx is final: its
    503 (database busy, released by idemd) is a retry, any other answer of
    the ledger's unexpected."""
    conn = http.client.HTTPConnection(h.HOST, port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", path, body=body,
                     headers={"Idempotency-Key": key, "Content-Type": "application/json",
                              "Connection": "close"})
        r = conn.getresponse()
        data = r.read()
    except (OSError, http.client.HTTPException):
        return "retry", None, None
    finally:
        conn.close()
    head = "HTTP/1.1 %d\r\nContent-Type: %s" % (r.status, r.getheader("Content-Type", ""))
    for name in ("X-Chaos-Forward", "X-Chaos-Fence"):
        if r.getheader(name) is not None:
            head += "\r\n%s: %s" % (name, r.getheader(name))
    doc = upstream_doc(head.encode("latin-1"), data)
    if doc is not None and ledger and not 200 <= r.status < 300:
        if r.status in RELEASE_STATUSES:
            return "retry", r.status, None
        return "unexpected", r.status, data[:300]
    if doc is not None:
        return "final", r.status, doc
    try:
        problem = json.loads(data.decode("utf-8")).get("type", "")
    except (ValueError, UnicodeDecodeError, AttributeError):
        problem = ""
    if r.status in (409, 502, 503, 504) and \
            problem.replace(h.PROBLEM_PREFIX, "") in RETRY_PROBLEMS:
        return "retry", r.status, None
    return "unexpected", r.status, data[:300]


# --------------------------------------------------------------------------
# one store's run


class OwnCluster:
    """A Redis Cluster of the run's own (tests/cluster.py): three masters with a
    replica each, no persistence, on free ports.  Its "restart" is one master's
    crash: SIGKILL, the cluster promotes the master's replica, and the node is
    started again on its nodes.conf, so it rejoins as the new master's replica
    (and WAIT 1 can succeed in those slots again)."""

    name = "cluster"

    def __init__(self, workdir):
        self.cluster = rc.Cluster(os.path.join(workdir, "cluster"))
        self.victim = None

    @staticmethod
    def available():
        return rc.REDIS is not None and rc.REDIS_CLI is not None

    def url(self, tag):
        hosts = ",".join("%s:%d" % (rc.HOST, n.port) for n in self.cluster.nodes)
        return "redis+cluster://%s?prefix=%s-&wait=1&timeout=2s" % (hosts, tag)

    def start(self):
        self.cluster.start()

    def kill_master(self, rng):
        """SIGKILL a master; return once its replica is the master."""
        port = rng.choice(self.cluster.masters())
        replica = self.cluster.replica_of(port)
        self.victim = self.cluster.node(port)
        self.victim.kill()
        h.wait_until(lambda: self.cluster.cli(replica, "ROLE", timeout=5).startswith("master"),
                     60, interval=0.1, what="replica %d promoted" % replica)
        return port, replica

    def bring_back(self):
        """Start the killed node; return once it replicates its new master."""
        self.victim.start()
        port = self.victim.port
        h.wait_until(lambda: "master_link_status:up" in
                     self.cluster.cli(port, "INFO", "replication", timeout=5),
                     60, interval=0.1, what="node %d back as a replica" % port)
        self.cluster.wait_ok(time.monotonic() + 60, replicas=3)
        self.victim = None

    def stop(self):
        self.cluster.stop()

    def close(self):
        self.cluster.stop()


class StoreRun:
    """One store's run: its processes, clients, faults, history and report."""

    def __init__(self, store, prof, seed, verbose):
        self.store = store
        self.prof = prof
        if store == "cluster" and not prof.get("seconds_given"):
            self.prof = dict(prof, seconds=min(prof["seconds"], CLUSTER_SECONDS))
        self.rng = random.Random(seed)
        self.verbose = verbose
        self.tmp = tempfile.mkdtemp(prefix="idem-chaos-%s-" % store)
        _TMPDIRS.add(self.tmp)
        self.lock = threading.Lock()
        self.answers = []
        self.kills = []
        self.starts = []    # (t, instance): every start of an idemd, before its spawn
        self.outages = []
        self.restart_kind = None
        self.store_restarts = 0
        self.stats = {"ops": 0, "ops_plain": 0, "ops_fenced": 0, "ops_before": 0,
                      "ops_after": 0, "requests": 0,
                      "retries": 0, "concurrent": 0, "late": 0, "verify": 0,
                      "unanswered": 0, "unexpected": 0}
        self.unexpected = []
        self.done_ops = []  # (key, path, body) answered, for late duplicates
        self.interesting = set()
        self.errors = []
        self.server = None
        self.daemons = []
        self.proxies = []
        self.up = None
        self.ledger = None
        self.ledger_mode = prof["upstream"] == "ledger"
        self.plan = {}      # ledger: key -> (from, to, amount)
        self.finals = {}    # ledger: key -> [2xx answer documents]
        self.ledger_result = None

    # ---- bookkeeping

    def bump(self, name, n=1):
        with self.lock:
            self.stats[name] += n

    def record_answer(self, a):
        if a["status"] in RELEASE_STATUSES:
            return  # idemd removed the key: not an answer for it
        with self.lock:
            self.answers.append(a)

    def log(self, msg):
        if self.verbose:
            sys.stderr.write("[%s %.1f] %s\n" % (self.store, time.monotonic() - self.t0, msg))

    # ---- processes

    def store_url(self, tag):
        if self.store == "lmdb":
            return "lmdb:%s" % os.path.join(self.tmp, "data")
        if self.store == "memory":
            return "memory:"
        return self.server.url(tag)

    def setup(self):
        self.t0 = time.monotonic()
        tag = "chaos_%s" % uuid.uuid4().hex[:10]
        if self.store == "redis":
            if not ss.OwnRedis.available():
                raise RuntimeError("redis-server is not installed")
            self.server = ss.OwnRedis(self.tmp)
        elif self.store == "postgres":
            if not ss.OwnPostgres.available():
                raise RuntimeError("PostgreSQL (initdb, pg_ctl) is not installed")
            self.server = ss.OwnPostgres(self.tmp)
        elif self.store == "cluster":
            if not OwnCluster.available():
                raise RuntimeError("redis-server or redis-cli is not installed")
            self.server = OwnCluster(self.tmp)
        if self.server is not None:
            _SERVERS.append(self.server)
            self.server.start()
        self.url = self.store_url(tag)
        if self.ledger_mode:
            self.ledger = Ledger(self.prof["ledger"], self.tmp, h.free_port(),
                                 keys=self.prof["ledger_keys"])
            self.ledger.start(h._LIVE)
            self.openings = {"acct%d" % n: OPENING for n in range(ACCOUNTS)}
            self.ledger.create_accounts(self.openings)
            self.up = LedgerTap(self.ledger.port, 2)
        else:
            self.up = RecordingUpstream(2)
        cfg = {"workers": 2, "on_store_error": self.prof["on_store_error"],
               "upstream_timeout": "30s", "defaults": {"lease": "%gs" % LEASE}}
        for i in range(2):
            d = h.Idemd(self.tmp, self.up.url(i), config=cfg, store=self.url,
                        name="idemd%d" % i)
            self.daemons.append(d)
            if ABORT.is_set():
                raise RuntimeError("aborted at the deadline")
            self.start_idemd(i)
        for i in range(2):
            self.proxies.append(FaultProxy(i, lambda i=i: self.daemons[i].port,
                                           self.prof["drop"], self.record_answer,
                                           seed=self.rng.random()))

    def start_idemd(self, i):
        """Start idemd i; the time is noted first, so that every request
        that life forwards arrives after it (chaos_history: which life of
        an instance forwarded an execution)."""
        with self.lock:
            self.starts.append((time.monotonic(), i))
        self.daemons[i].start()

    def restart_idemd(self, i):
        d = self.daemons[i]
        for attempt in range(3):
            if ABORT.is_set():
                raise RuntimeError("aborted at the deadline")
            try:
                self.start_idemd(i)
                return
            except AssertionError as e:
                self.log("restart of idemd%d failed: %s" % (i, str(e)[:300]))
                d.kill()
                if attempt == 2:
                    self.errors.append("idemd%d could not be restarted: %s" % (i, str(e)[-500:]))
                    raise

    def kill_idemd(self, i):
        t = time.monotonic()
        self.daemons[i].kill()
        with self.lock:
            self.kills.append((t, i))
        self.log("kill -9 idemd%d" % i)

    def store_restart(self):
        self.store_restarts += 1
        if self.server is None:
            # LMDB (and memory): the store is the processes' own; kill both at once
            self.restart_kind = "both idemd killed at once (the store is their files)"
            for i in range(2):
                self.kill_idemd(i)
            time.sleep(self.rng.uniform(0.1, 0.5))
            for i in range(2):
                self.restart_idemd(i)
            return
        if self.store == "cluster":
            self.restart_kind = ("a master killed (SIGKILL), its replica promoted, the node "
                                 "back as a replica")
            t_down = time.monotonic()
            port, replica = self.server.kill_master(self.rng)
            self.log("master %d killed, replica %d promoted" % (port, replica))
            if ABORT.is_set():
                raise RuntimeError("aborted at the deadline")
            self.server.bring_back()
            self.log("node %d back as a replica" % port)
            with self.lock:
                self.outages.append((t_down, time.monotonic()))
            return
        self.restart_kind = "%s crashed and started again" % self.store
        t_down = time.monotonic()
        self.server.stop()
        self.log("%s down" % self.store)
        time.sleep(self.rng.uniform(0.5, 3.0))
        if ABORT.is_set():
            raise RuntimeError("aborted at the deadline")
        self.server.start()
        with self.lock:
            self.outages.append((t_down, time.monotonic()))
        self.log("%s up" % self.store)

    def faults(self):
        inst = 0
        start = time.monotonic()
        every = self.prof["store_every"]
        if every is None:
            store_at = [start + 0.45 * self.prof["seconds"]]
        else:
            store_at = [start + every * (n + 0.5) for n in range(int(self.prof["seconds"]))
                        if every * (n + 0.5) < self.prof["seconds"] - 3] \
                or [start + 0.45 * self.prof["seconds"]]
        next_kill = start + self.prof["kill_every"]
        try:
            while time.monotonic() < self.fault_end:
                now = time.monotonic()
                if store_at and now >= store_at[0]:
                    store_at.pop(0)
                    self.store_restart()
                    next_kill = max(next_kill, time.monotonic() + 1.0)
                elif now >= next_kill:
                    self.kill_idemd(inst)
                    time.sleep(self.rng.uniform(0.0, 0.5))
                    self.restart_idemd(inst)
                    inst ^= 1
                    next_kill = time.monotonic() + self.prof["kill_every"] * \
                        self.rng.uniform(0.6, 1.4)
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - reported as a failed run
            self.errors.append("fault thread: %r" % (e,))

    # ---- clients

    def until_final(self, key, path, body, inst, stop_at, rng, direct=False):
        """Send until the upstream's answer comes; return True when it did."""
        first = True
        while time.monotonic() < stop_at:
            port = self.daemons[inst].port if direct else self.proxies[inst].port
            self.bump("requests")
            if not first:
                self.bump("retries")
            first = False
            kind, status, doc = send(port, path, key, body, self.ledger_mode)
            if kind == "final":
                self.record_answer({"key": key, "nonce": doc.get("nonce"),
                                    "fence": doc.get("fence"), "status": status,
                                    "t": time.monotonic(),
                                    "source": "verify" if direct else "client"})
                if self.ledger_mode:
                    with self.lock:
                        self.finals.setdefault(key, []).append(doc)
                return True
            if kind == "unexpected":
                with self.lock:
                    self.stats["unexpected"] += 1
                    if len(self.unexpected) < 5:
                        self.unexpected.append("%s: %s %r" % (key, status, doc))
            with self.lock:
                self.interesting.add(key)
            time.sleep(rng.uniform(0.1, 0.4) if status == 409 else rng.uniform(0.03, 0.2))
            inst ^= 1
        return False

    def client(self, n):
        rng = random.Random(self.rng.random())
        while time.monotonic() < self.fault_end:
            key = "chaos-%d-%s" % (n, uuid.uuid4().hex)
            mode = "fenced" if rng.random() < 0.5 else "plain"
            r = rng.random()
            if r < P_SLOW:
                work = int(SLOW_WORK * 1000)
            elif r < P_SLOW + 0.14:
                work = rng.randint(100, 400)
            else:
                work = rng.randint(5, 40)
            if self.ledger_mode:
                # the hold of the key's first forward at the tap, before the
                # ledger or after its answer
                mode = "before" if rng.random() < 0.5 else "after"
                self.up.hold(key, mode, work)
                src, dst = rng.sample(sorted(self.openings), 2)
                amount = rng.randint(1, 1000)
                with self.lock:
                    self.plan[key] = (src, dst, amount)
                body = json.dumps({"from": src, "to": dst, "amount": amount}).encode()
                path = "/transfers"
            else:
                body = json.dumps({"op": key, "work_ms": work}).encode()
                path = "/%s/op" % mode
            self.bump("ops")
            self.bump("ops_" + mode)
            inst = rng.randrange(2)
            extra = []
            if rng.random() < P_DUP:
                with self.lock:
                    self.interesting.add(key)
                for j in range(rng.randint(1, 2)):
                    self.bump("concurrent")
                    t = threading.Thread(target=self.until_final,
                                         args=(key, path, body, inst ^ (j == 0),
                                               self.settle_end, random.Random(rng.random())),
                                         daemon=True)
                    t.start()
                    extra.append(t)
            ok = self.until_final(key, path, body, inst, self.settle_end, rng)
            for t in extra:
                t.join(max(0.0, self.settle_end - time.monotonic() + 5))
            if not ok:
                self.bump("unanswered")
                continue
            with self.lock:
                self.done_ops.append((key, path, body))
                old = rng.choice(self.done_ops) if rng.random() < P_LATE else None
            if old is not None:
                with self.lock:
                    self.interesting.add(old[0])
                self.bump("late")
                if not self.until_final(old[0], old[1], old[2], rng.randrange(2),
                                        self.settle_end, rng):
                    self.bump("unanswered")

    # ---- the run

    def run(self):
        self.setup()
        self.log("set up in %.1fs" % (time.monotonic() - self.t0))
        self.fault_start = time.monotonic()
        self.fault_end = self.fault_start + self.prof["seconds"]
        self.settle_end = self.fault_end + SETTLE
        fault_thread = threading.Thread(target=self.faults, daemon=True)
        clients = [threading.Thread(target=self.client, args=(n,), daemon=True)
                   for n in range(self.prof["clients"])]
        fault_thread.start()
        for t in clients:
            t.start()
        fault_thread.join(self.prof["seconds"] + 60)
        # everything back before the last operations finish
        for i, d in enumerate(self.daemons):
            if not d.running():
                self.restart_idemd(i)
        for t in clients:
            t.join(max(0.0, self.settle_end - time.monotonic() + 10))
        self.log("clients done")
        self.verify()
        # every execution ends (the slow ones work past the lease)
        h.wait_until(lambda: all(e["t_end"] is not None for e in self.up.executions()),
                     SLOW_WORK + 10, what="the upstream's executions to end")
        # what each idemd logged about its claims: lost leases and completions
        # the store refused (chaos_history.parse_owner_events)
        owner_events = {}
        for i, d in enumerate(self.daemons):
            owner_events.update(parse_owner_events(i, d.log_text()))
        history = {"executions": self.up.executions(), "answers": list(self.answers),
                   "kills": list(self.kills), "outages": list(self.outages),
                   "starts": list(self.starts), "lease": LEASE,
                   "owner_events": [[i, k, f, sorted(v)]
                                    for (i, k, f), v in owner_events.items()]}
        if _KEEP:
            # the whole history, to judge again (chaos_history.py --history FILE)
            with open(os.path.join(self.tmp, "history.json"), "w") as f:
                json.dump(history, f)
        self.result = analyse(history["executions"], history["answers"], history["kills"],
                              history["outages"], LEASE, starts=history["starts"],
                              owner_events=owner_events)
        if self.ledger_mode:
            self.judge_ledger()
        self.elapsed = time.monotonic() - self.t0
        self.sanitizer = []
        logs = [(d.name, d.log_text()) for d in self.daemons]
        if self.ledger is not None:
            logs.append(("idem-ledger", self.ledger.log_text()))
        for name, text in logs:
            for marker in h.SANITIZER_MARKERS:
                i = text.find(marker)
                if i >= 0:
                    self.sanitizer.append("%s: %s" % (name, text[max(0, i - 200):i + 2000]))
                    break

    def judge_ledger(self):
        """GET /stats, stop the ledger (SIGTERM: it must exit 0), read its
        SQLite file, and judge it (chaos_ledger.verdict)."""
        try:
            status, stats = self.ledger.request("GET", "/stats")
            if status != 200:
                stats = None
        except OSError:
            stats = None
        if stats is None:
            self.errors.append("GET /stats of the ledger failed")
        if self.ledger.stop() != 0:
            self.errors.append("idem-ledger did not exit 0 on SIGTERM (%r)"
                               % self.ledger.exit_status)
        rows, accounts, key_records = read_db(self.ledger.db)
        with self.lock:
            finals = {k: list(v) for k, v in self.finals.items()}
            plan = dict(self.plan)
        self.ledger_result = verdict(rows, accounts, stats, plan, self.up.executions(), finals,
                                     self.stats["ops"])
        self.ledger_result["key_records"] = key_records
        self.ledger_result["stats"] = stats

    def verify(self):
        """Send again (straight to idemd, no proxy) every interesting key and a
        sample of the others; the answers join the history."""
        with self.lock:
            done = list(self.done_ops)
            interesting = set(self.interesting)
        multi = {}
        for e in self.up.executions():
            multi[e["key"]] = multi.get(e["key"], 0) + 1
        interesting |= {k for k, n in multi.items() if n > 1}
        chosen = [op for op in done if op[0] in interesting]
        rest = [op for op in done if op[0] not in interesting]
        self.rng.shuffle(rest)
        chosen += rest[:max(0, self.prof["verify_max"] - len(chosen))]
        stop_at = time.monotonic() + SETTLE
        queue = list(chosen)
        qlock = threading.Lock()

        def worker(n):
            rng = random.Random(n)
            while True:
                with qlock:
                    if not queue:
                        return
                    key, path, body = queue.pop()
                self.bump("verify")
                if not self.until_final(key, path, body, n % 2, stop_at, rng, direct=True):
                    self.bump("unanswered")
        threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SETTLE + 10)
        self.verified = len(chosen)

    def close(self):
        for p in self.proxies:
            p.close()
        for d in self.daemons:
            d.kill()
        if self.up is not None:
            self.up.close()
        if self.ledger is not None:
            self.ledger.stop()
        if self.server is not None:
            self.server.close()
            _SERVERS.remove(self.server)
        if not _KEEP:
            shutil.rmtree(self.tmp, True)
            _TMPDIRS.discard(self.tmp)

    # ---- the report

    def faults_counts(self):
        c = {"dropped": 0, "dropped_final": 0, "broken": 0, "no_idemd": 0}
        for p in self.proxies:
            for k in c:
                c[k] += p.counts[k]
        return c

    def checks(self):
        r = self.result
        f = self.faults_counts()
        if self.ledger_mode:
            lr = self.ledger_result
            return [
                ("0 double effects at the ledger (each key applied at most once)",
                 lr["double_effects"] == 0),
                ("ledger transfers == keys it received and answered 2xx (<= operations), "
                 "each as the client asked",
                 lr["not_received"] == 0 and lr["received_not_applied"] == 0
                 and lr["row_mismatch"] == 0 and lr["within_ops"]),
                ("balances conserved and equal to the applied transfers; /stats agrees",
                 lr["balance_wrong"] == 0 and lr["conserved"] and lr["stats_agree"]),
                ("every client's 2xx answer is the ledger's stored transfer",
                 lr["final_mismatch"] == 0),
                ("0 'other' double forwards", r["double_other"] == 0),
                ("0 lost completed responses", r["lost"] == 0),
                ("every answer is its forward's (0 mismatched, 0 unexpected)",
                 r["answer_mismatch"] == 0 and self.stats["unexpected"] == 0),
                ("every operation got its answer", self.stats["unanswered"] == 0
                 and not self.errors),
                ("faults injected (drops, kills, a store restart)",
                 f["dropped"] > 0 and len(self.kills) > 0 and self.store_restarts > 0),
                ("no sanitizer report in idemd's or the ledger's logs", not self.sanitizer),
            ]
        return [
            ("0 'other' double executions", r["double_other"] == 0),
            ("0 lost completed responses", r["lost"] == 0),
            ("0 stale writes after a takeover (fenced upstream)", r["stale_fenced"] == 0),
            ("every answer is its execution's (0 mismatched, 0 unexpected)",
             r["answer_mismatch"] == 0 and self.stats["unexpected"] == 0),
            ("every operation got its answer", self.stats["unanswered"] == 0
             and not self.errors),
            ("faults injected (drops, kills, a store restart)",
             f["dropped"] > 0 and len(self.kills) > 0 and self.store_restarts > 0),
            ("no sanitizer report in idemd's logs", not self.sanitizer),
        ]

    def ledger_rows(self):
        r, s, f, lr = self.result, self.stats, self.faults_counts(), self.ledger_result
        execs = self.up.executions()
        outcomes = {}
        for e in execs:
            outcomes[e["outcome"]] = outcomes.get(e["outcome"], 0) + 1
        return [
            ("keyed operations (transfers)", s["ops"],
             "held first forward: before the ledger %d, after its answer %d"
             % (s["ops_before"], s["ops_after"])),
            ("requests sent", s["requests"], ""),
            ("duplicates sent", s["requests"] - s["ops"],
             "retries %d, concurrent %d, late %d, verification %d"
             % (s["retries"], s["concurrent"], s["late"], s["verify"])),
            ("faults: dropped responses", f["dropped"],
             "%d of them the ledger's answer" % f["dropped_final"]),
            ("faults: idemd kills (kill -9)", len(self.kills),
             "connections broken %d, refused while down %d" % (f["broken"], f["no_idemd"])),
            ("faults: store restarts", self.store_restarts, self.restart_kind or ""),
            ("executions forwarded by idemd", r["executions"],
             "%d keys; at the ledger: applied %d, replayed %d, refused %d, failed %d"
             % (r["keys_executed"], outcomes.get("applied", 0), outcomes.get("replayed", 0),
                outcomes.get("refused", 0), outcomes.get("error", 0))),
            ("double forwards: lease-expiry window", r["double_lease_window"],
             "its owner killed %d, its owner's store failed it %d (logged); released %d; "
             "late claims not forwarded %d"
             % (r["double_lease_window_kill"], r["double_lease_window_store"], r["released"],
                r["claims_late"])),
            ("double forwards: other", r["double_other"], "target 0"),
            ("ledger transfers (rows / distinct keys)", "%d / %d" % (lr["rows"],
                                                                    lr["keys_applied"]),
             "keys received %d, key records %s, /stats %s"
             % (lr["keys_received"], lr["key_records"], json.dumps(lr["stats"]))),
            ("double effects at the ledger", lr["double_effects"],
             "target 0; keys applied twice or more %d" % lr["keys_applied_twice"]),
            ("accounts with a wrong balance", lr["balance_wrong"],
             "total %s" % ("conserved" if lr["conserved"] else "NOT conserved")),
            ("2xx answers not the stored transfer", lr["final_mismatch"],
             "of %d checked" % lr["finals_checked"]),
            ("lost completed responses", r["lost"], "target 0"),
            ("answers not matching a forward", r["answer_mismatch"],
             "unexpected answers %d" % s["unexpected"]),
            ("operations without a final answer", s["unanswered"], "keys verified %d"
             % self.verified),
            ("run time (s)", "%.1f" % self.elapsed, "%g s of faults" % self.prof["seconds"]),
        ]

    def report(self):
        r, s, f = self.result, self.stats, self.faults_counts()
        rows = [
            ("keyed operations", s["ops"], "plain %d, fenced %d" % (s["ops_plain"],
                                                                   s["ops_fenced"])),
            ("requests sent", s["requests"], ""),
            ("duplicates sent", s["requests"] - s["ops"],
             "retries %d, concurrent %d, late %d, verification %d"
             % (s["retries"], s["concurrent"], s["late"], s["verify"])),
            ("faults: dropped responses", f["dropped"],
             "%d of them the upstream's answer" % f["dropped_final"]),
            ("faults: idemd kills (kill -9)", len(self.kills),
             "connections broken %d, refused while down %d" % (f["broken"], f["no_idemd"])),
            ("faults: store restarts", self.store_restarts, self.restart_kind or ""),
            ("executions at the upstream", r["executions"], "%d keys" % r["keys_executed"]),
            ("double executions: lease-expiry window", r["double_lease_window"],
             "its owner killed %d, its owner's store failed it %d (logged); released %d; "
             "late claims not forwarded %d"
             % (r["double_lease_window_kill"], r["double_lease_window_store"], r["released"],
                r["claims_late"])),
            ("double executions: other", r["double_other"], "target 0"),
            ("double effects (plain / fenced)", "%d / %d" % (r["double_effect_plain"],
                                                             r["double_effect_fenced"]), ""),
            ("stale writes: plain upstream", r["stale_plain"], "not a target: what fencing stops"),
            ("stale writes: fenced upstream", r["stale_fenced"],
             "target 0; stale fences refused %d" % r["refused_stale"]),
            ("lost completed responses", r["lost"], "target 0"),
            ("answers not matching an execution", r["answer_mismatch"],
             "unexpected answers %d" % s["unexpected"]),
            ("operations without a final answer", s["unanswered"], "keys verified %d"
             % self.verified),
            ("run time (s)", "%.1f" % self.elapsed, "%g s of faults" % self.prof["seconds"]),
        ]
        if self.ledger_mode:
            rows = self.ledger_rows()
        out = ["", "== %s: 2 idemd on %s, lease %gs, on_store_error %s%s ==" % (
            self.store, self.url, LEASE, self.prof["on_store_error"],
            ", upstream idem-ledger (--keys %s) on %s" % (
                "on" if self.prof["ledger_keys"] else "off", "sqlite:TMP/ledger.db")
            if self.ledger_mode else "")]
        for name, value, note in rows:
            out.append("  %-42s %8s  %s" % (name, value, note))
        for name, ok in self.checks():
            out.append("  %s  %s" % ("PASS" if ok else "FAIL", name))
        for kind, lst in r["examples"].items():
            for ex in lst:
                out.append("    %s: %s" % (kind, ex))
        if self.ledger_mode:
            for kind, lst in self.ledger_result["examples"].items():
                for ex in lst:
                    out.append("    ledger %s: %s" % (kind, ex))
        for ex in self.unexpected:
            out.append("    unexpected: %s" % ex)
        for e in self.errors:
            out.append("    error: %s" % e)
        for e in self.sanitizer:
            out.append("    sanitizer: %s" % e)
        return "\n".join(out)


# --------------------------------------------------------------------------
# main


def main(argv=None):
    global _KEEP
    ap = argparse.ArgumentParser(description="idem chaos harness (see the file's comment)")
    ap.add_argument("--store", default="all",
                    help="lmdb, redis, postgres, cluster (a Redis Cluster), all (default: "
                         "cluster only when redis-server and redis-cli are installed), a comma "
                         "list, or memory (a control that must fail)")
    ap.add_argument("--short", action="store_true", help="the short form (about 75 s for all)")
    ap.add_argument("--seconds", type=float, help="seconds of faults per store")
    ap.add_argument("--clients", type=int, help="client threads")
    ap.add_argument("--kill-every", type=float, help="mean seconds between idemd kills")
    ap.add_argument("--store-every", type=float, help="seconds between store restarts")
    ap.add_argument("--on-store-error", choices=("closed", "open"), default="closed",
                    help="idemd's on_store_error; open is a control that must fail on "
                         "redis and postgres")
    ap.add_argument("--upstream", choices=("recording", "ledger"), default="recording",
                    help="recording (default): the recording upstream; ledger: idem-ledger "
                         "on SQLite, de-duplicating by key in its own transaction")
    ap.add_argument("--ledger", default=os.environ.get("IDEM_LEDGER"),
                    help="the idem-ledger binary (default $IDEM_LEDGER, or "
                         "examples/ledger/idem-ledger in idemd's build directory)")
    ap.add_argument("--ledger-keys", choices=("on", "off"), default="on",
                    help="the ledger's --keys; off is a control that must fail")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random choices")
    ap.add_argument("--deadline", type=float, help="seconds for the whole run, then kill all")
    ap.add_argument("--idemd", default=h.IDEMD, help="the idemd binary (default $IDEMD or "
                                                     "build/idemd)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    ap.add_argument("-v", "--verbose", action="store_true", help="log the faults to stderr")
    args = ap.parse_args(argv)

    prof = dict(PROFILES["short" if args.short else "default"])
    if args.seconds is not None:
        if not 1 <= args.seconds <= 3600:
            ap.error("--seconds must be from 1 to 3600")
        prof["seconds"] = args.seconds
    if args.clients is not None:
        if not 1 <= args.clients <= 64:
            ap.error("--clients must be from 1 to 64")
        prof["clients"] = args.clients
    prof["on_store_error"] = args.on_store_error
    prof["upstream"] = args.upstream
    if args.ledger is None:
        args.ledger = os.path.join(os.path.dirname(os.path.abspath(args.idemd)), LEDGER_IN_BUILD)
    prof["ledger"] = os.path.abspath(args.ledger)
    prof["ledger_keys"] = args.ledger_keys == "on"
    if args.upstream != "ledger" and args.ledger_keys != "on":
        ap.error("--ledger-keys needs --upstream ledger")
    if args.upstream == "ledger" and not os.path.exists(args.ledger):
        ap.error("idem-ledger binary not found at %s (build it, or --ledger)" % args.ledger)
    if args.kill_every is not None:
        if not 0.5 <= args.kill_every <= 3600:
            ap.error("--kill-every must be from 0.5 to 3600")
        prof["kill_every"] = args.kill_every
    if args.store_every is not None:
        if not 5 <= args.store_every <= 3600:
            ap.error("--store-every must be from 5 to 3600")
        prof["store_every"] = args.store_every
    prof["seconds_given"] = args.seconds is not None
    if args.store == "all":
        stores = tuple(s for s in STORES if s != "cluster" or OwnCluster.available())
    else:
        stores = tuple(args.store.split(","))
    for s in stores:
        if s not in STORES + ("memory",):
            ap.error("unknown store %r" % s)
    if not os.path.exists(args.idemd):
        ap.error("idemd binary not found at %s (build it, or --idemd)" % args.idemd)
    h.IDEMD = os.path.abspath(args.idemd)
    _KEEP = args.keep
    per_store = prof["seconds"] + SETTLE + 45  # set-up, settle, verification
    deadline = args.deadline or per_store * len(stores) + 30
    _watchdog(time.monotonic() + deadline)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print("chaos: stores %s, upstream %s, %g s of faults each, %d clients, seed %d, "
          "deadline %.0f s" % (",".join(stores), args.upstream if args.upstream == "recording"
                               else "idem-ledger (--keys %s)" % args.ledger_keys,
                               prof["seconds"], prof["clients"], seed, deadline))
    sys.stdout.flush()

    passed = failed = 0
    summary = []
    t0 = time.monotonic()
    for n, store in enumerate(stores):
        if ABORT.is_set():
            break
        run = StoreRun(store, prof, seed + n, args.verbose)
        try:
            run.run()
        except Exception as e:  # noqa: BLE001 - one store's failure is reported, not fatal
            print("\n== %s ==\n  FAIL  the run did not complete: %s" % (store, e))
            for err in run.errors:
                print("    error: %s" % err)
            failed += 1
            summary.append((store, None))
            continue
        finally:
            if args.keep:
                print("kept %s" % run.tmp)
            run.close()
        print(run.report())
        sys.stdout.flush()
        for _, ok in run.checks():
            passed += ok
            failed += not ok
        summary.append((store, run))

    ledger = args.upstream == "ledger"
    print("\n%-9s %6s %6s %7s %6s %6s %9s %6s %6s %6s %5s %6s" % (
        "store", "ops", "dups", "drops", "kills", "store", "dbl-lease", "other",
        "rows" if ledger else "stale", "dbl-eff" if ledger else "stale-f", "lost", "time"))
    for store, run in summary:
        if run is None:
            print("%-9s (did not complete)" % store)
            continue
        r, s, f = run.result, run.stats, run.faults_counts()
        print("%-9s %6d %6d %7d %6d %6d %9d %6d %6d %6d %5d %6.0f" % (
            store, s["ops"], s["requests"] - s["ops"], f["dropped"], len(run.kills),
            run.store_restarts, r["double_lease_window"], r["double_other"],
            run.ledger_result["rows"] if ledger else r["stale_plain"],
            run.ledger_result["double_effects"] if ledger else r["stale_fenced"],
            r["lost"], run.elapsed))
    print("total time %.0f s" % (time.monotonic() - t0))
    print("%d passed, %d failed" % (passed, failed))
    sys.stdout.flush()
    if DEADLINE.is_set():
        time.sleep(30)  # the watchdog finishes its clean-up and exits with 3
        return 3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
