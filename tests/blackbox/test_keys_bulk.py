"""SPEC section 19 / docs/admin.md "Keys in bulk": GET and DELETE /keys.

  GET /keys?scope=&state=&prefix=&older_than=&limit=&cursor=
      {"keys":[record...],"next_cursor":"..." or null}; limit 1..1000 (100)
  DELETE /keys?scope=&state=&prefix=&older_than=
      {"deleted":N}; at least one filter; without state, in-flight records
      (a live lease, or held) are spared
  idemctl keys list [...filters] and idemctl keys delete --state ... --older-than ...

Run on every store (bb_per_store).  Thousands of records across scopes and
states are made through idemd itself; a listing is paged while another
thread adds keys, and no key present throughout may be missed, nor repeated
on the ordered stores (on Redis, SCAN may give a key again on a later page).
"""

import concurrent.futures
import json
import os
import subprocess
import threading
import urllib.parse
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

IDEMCTL = os.environ.get("IDEMCTL") or os.path.join(os.path.dirname(h.IDEMD), "idemctl")
PER_SCOPE = 500
RUN = uuid.uuid4().hex  # shared stores (Redis, PostgreSQL) outlive a run: scopes of our own
CALLERS = ["Bearer bulk-%s-%d" % (RUN, i) for i in range(4)]
SCOPES = [h.scope_of(c) for c in CALLERS]
HELD_CALLER = "Bearer bulk-held-" + RUN
HELD_SCOPE = h.scope_of(HELD_CALLER)
FLIGHT_CALLER = "Bearer bulk-flight-" + RUN
FLIGHT_SCOPE = h.scope_of(FLIGHT_CALLER)
CONFIG = {"defaults": {"on_unknown_outcome": "hold", "key_ttl": "1h", "lease": "60s"}}


def q(**params):
    return "/keys?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})


class KeysBulk(h.IdemTestCase):
    def seed(self):
        up, d = self.setup_pair(CONFIG)
        gate = threading.Event()

        def reply(seen):
            auth = seen.header("Authorization") or ""
            if auth == HELD_CALLER:
                return h.Reply(action="close")
            if auth == FLIGHT_CALLER:
                return h.Reply(wait=gate)
            return h.Reply(status=201)
        up.behaviour = reply

        def one(args):
            caller, key = args
            return d.post(key=key, headers={"Authorization": caller}).status

        work = [(c, "k-%04d" % i) for c in CALLERS for i in range(PER_SCOPE)]
        work += [(HELD_CALLER, "held-%d" % i) for i in range(3)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(one, work))
        self.assertEqual(statuses.count(201), len(CALLERS) * PER_SCOPE)
        self.assertEqual(statuses.count(502), 3)
        flights = [threading.Thread(target=one, args=((FLIGHT_CALLER, "fly-%d" % i),))
                   for i in range(3)]
        for t in flights:
            t.start()
        up.wait_seen(len(work) + 3, timeout=30)
        self.addCleanup(lambda: [t.join(30) for t in flights])
        self.addCleanup(gate.set)  # runs first: the held requests end, then are joined
        return up, d

    def list_all(self, d, limit=1000, during=None, repeats=False, **f):
        """Every record of a listing, following the cursors.  On Redis a key
        may come again on a later page (docs/admin.md): those repeats are
        dropped unless repeats=True; on the ordered stores none may come."""
        keys, cursor, pages = [], None, 0
        while True:
            r = d.admin("GET", q(limit=limit, cursor=cursor, **f))
            self.assertEqual(r.status, 200, r)
            doc = r.json()
            self.assertEqual(sorted(doc), ["keys", "next_cursor"])
            page = self.ids(doc["keys"])
            self.assertEqual(len(page), len(set(page)), "a key twice on one page")
            self.assertLessEqual(len(page), limit)
            keys += doc["keys"]
            pages += 1
            if during:
                during(pages)
            cursor = doc["next_cursor"]
            if cursor is None:
                break
        if repeats:
            return keys
        if not h.STORE.startswith("redis"):
            self.assertEqual(len(set(self.ids(keys))), len(keys), "a key listed twice")
            return keys
        seen, once = set(), []
        for r in keys:
            if (r["scope"], r["key"]) not in seen:
                seen.add((r["scope"], r["key"]))
                once.append(r)
        return once

    def ids(self, recs):
        return [(r["scope"], r["key"]) for r in recs]

    def ours(self, recs):
        mine = set(SCOPES + [HELD_SCOPE, FLIGHT_SCOPE])
        return [r for r in recs if r["scope"] in mine]

    def test_list_filters_pages_and_deletes(self):
        up, d = self.seed()
        total = len(CALLERS) * PER_SCOPE + 6
        every = self.list_all(d)
        if not h.STORE.startswith("redis"):
            self.assertEqual(self.ids(every), sorted(self.ids(every)), "not in (scope, key) order")
        every = self.ours(every)
        ids = self.ids(every)
        self.assertEqual(len(set(ids)), total)
        one = [r for r in every if r["key"] == "k-0007" and r["scope"] == SCOPES[0]][0]
        self.assertEqual(one["state"], "completed")
        self.assertEqual(one["status"], 201)
        self.assertEqual(one["held"], False)
        self.assertEqual(one, d.get_key("k-0007", SCOPES[0]).json())

        # each filter
        for s in SCOPES:
            recs = self.list_all(d, scope=s)
            self.assertEqual(len(recs), PER_SCOPE)
            self.assertTrue(all(r["scope"] == s for r in recs))
        recs = self.list_all(d, scope=SCOPES[1], prefix="k-00")
        self.assertEqual(sorted(r["key"] for r in recs), ["k-%04d" % i for i in range(100)])
        self.assertEqual(len(self.ours(self.list_all(d, prefix="k-01"))), 100 * len(CALLERS))
        held = self.ours(self.list_all(d, state="held"))
        self.assertEqual(sorted(self.ids(held)), [(HELD_SCOPE, "held-%d" % i) for i in range(3)])
        self.assertTrue(all(r["held"] and r["state"] == "in_progress" for r in held))
        flying = self.ours(self.list_all(d, state="in_progress"))
        self.assertEqual(len(flying), 6)
        self.assertEqual(len(self.ours(self.list_all(d, state="completed"))),
                         len(CALLERS) * PER_SCOPE)
        self.assertEqual(len(self.ours(self.list_all(d, state="completed", older_than="1h"))), 0)
        self.assertEqual(len(self.list_all(d, scope=SCOPES[2], older_than="0s")), PER_SCOPE)

        # a page is bounded.  On the ordered stores a scope's page is full; a
        # Redis page may be short (SCAN steps over other scopes' keys, which
        # a shared Redis holds from other tests), but still has a cursor.
        r = d.admin("GET", q(scope=SCOPES[0]))
        if h.STORE.startswith("redis"):
            self.assertLessEqual(len(r.json()["keys"]), 100)
        else:
            self.assertEqual(len(r.json()["keys"]), 100)
        self.assertIsNotNone(r.json()["next_cursor"])
        for bad in (q(limit=0), q(limit=1001), q(limit="x"), q(state="done"),
                    q(older_than="soon"), q(scope="nope"), q(cursor="zz")):
            self.assertEqual(d.admin("GET", bad).status, 400, bad)
        self.assertProblem(d.admin("DELETE", "/keys"), 400, "filter-required")

        # pagination while keys are added: every key present throughout, once
        adding = threading.Event()
        stop = threading.Event()

        def add():
            i = 0
            while not stop.is_set() and i < 400:
                d.post(key="new-%04d" % i, headers={"Authorization": CALLERS[i % 4]})
                i += 1
                adding.set()
        t = threading.Thread(target=add)
        t.start()
        try:
            adding.wait(10)
            seen = self.ids(self.ours(self.list_all(d, limit=37, repeats=True)))
        finally:
            stop.set()
            t.join(30)
        before = set(ids)
        got = [i for i in seen if i in before]
        if not h.STORE.startswith("redis"):
            self.assertEqual(len(got), len(set(got)), "a key repeated while keys were added")
        # Redis walks with SCAN: every key present throughout comes at least
        # once; one may come again on a later page (docs/admin.md), never
        # twice on one page.
        self.assertEqual(set(got), before, "a key missed while keys were added")

        # bulk delete: in-flight records only when state names them
        r = d.admin("DELETE", q(scope=HELD_SCOPE))
        self.assertEqual((r.status, r.json()), (200, {"deleted": 0}))
        r = d.admin("DELETE", q(scope=FLIGHT_SCOPE, older_than="0s"))
        self.assertEqual(r.json(), {"deleted": 0})
        r = d.admin("DELETE", q(state="held", scope=HELD_SCOPE))
        self.assertEqual(r.json(), {"deleted": 3})
        self.assertEqual(d.get_key("held-0", HELD_SCOPE).status, 404)
        self.assertEqual(len(self.ours(self.list_all(d, state="in_progress"))), 3)
        # by state and age
        r = d.admin("DELETE", q(state="completed", older_than="1h", scope=SCOPES[1]))
        self.assertEqual(r.json(), {"deleted": 0})
        n0 = len(self.list_all(d, scope=SCOPES[0], state="completed"))
        self.assertGreaterEqual(n0, PER_SCOPE)
        r = d.admin("DELETE", q(state="completed", older_than="0s", scope=SCOPES[0]))
        self.assertEqual(r.json(), {"deleted": n0})
        self.assertEqual(self.list_all(d, scope=SCOPES[0]), [])
        self.assertEqual(d.get_key("k-0007", SCOPES[0]).status, 404)
        # a deleted key runs again
        n = up.count()
        self.assertEqual(d.post(key="k-0007", headers={"Authorization": CALLERS[0]}).status, 201)
        self.assertEqual(up.count(), n + 1)

        # idemctl
        admin = "http://127.0.0.1:%d" % d.admin_port
        out = subprocess.run([IDEMCTL, "keys", "list", "--scope", SCOPES[3], "--prefix", "k-",
                              "--limit", "60", "--admin", admin],
                             capture_output=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        listed = [json.loads(l)["key"] for l in out.stdout.decode().splitlines()]
        if h.STORE.startswith("redis"):  # a repeat on a later page (above)
            listed = list(set(listed))
        self.assertEqual(sorted(listed), ["k-%04d" % i for i in range(PER_SCOPE)])
        out = subprocess.run([IDEMCTL, "keys", "delete", "--state", "completed",
                              "--older-than", "0s", "--scope", SCOPES[3], "--prefix", "k-",
                              "--admin", admin], capture_output=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout), {"deleted": PER_SCOPE})
        out = subprocess.run([IDEMCTL, "keys", "list", "--state", "bogus", "--admin", admin],
                             capture_output=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stderr)
