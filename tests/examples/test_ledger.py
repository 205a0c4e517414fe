"""Black-box tests of examples/ledger (idem-ledger): exactly-once transfers
through a network that loses answers, and what happens without keys.

The ledger binary is $IDEM_LEDGER, or <IDEM_BUILD>/examples/ledger/idem-ledger
(IDEM_BUILD: the build directory, default <repo>/build).  Every test starts
its own ledger on a free loopback port with a fresh SQLite file; the
PostgreSQL tests (IDEM_TEST_PG_URL, required) create a database of their own
with psql and drop it afterwards.

The central test: a fault proxy (faultproxy.py) in front of the ledger
forwards every transfer but throws away the ledger's answer for the first
attempt of each, and for 30 % of the later ones, after the ledger committed.
Client threads retry each transfer with its own key until an answer
arrives.  With keys, every transfer is applied exactly once and every
client's answer is the one stored first; with --keys off the same run
charges accounts again and again.
"""

import http.client
import json
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
import unittest
import urllib.parse
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultproxy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("IDEM_BUILD") or REPO / "build")
LEDGER = os.environ.get("IDEM_LEDGER") or str(BUILD / "examples" / "ledger" / "idem-ledger")
HOST = "127.0.0.1"
PROBLEM = "urn:idem:problem:"
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer")

OPENING = 1_000_000      # cents in each account at the start
N_ACCOUNTS = 6
N_TRANSFERS = 200
N_CLIENTS = 8
DROP_LATER = 0.3         # share of retries whose answer is dropped too
MAX_ATTEMPTS = 60        # per transfer, before the test gives up on it
RUN_SECONDS = 240        # the whole run, before the test gives up on it


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    def json(self):
        return json.loads(self.body)

    def header(self, name):
        return self.headers.get(name.lower())

    def __repr__(self):
        return "<Answer %d %r>" % (self.status, self.body[:300])


def call(port, method, path, body=None, headers=None, timeout=30.0):
    """One request on a connection of its own."""
    hdrs = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    if body is not None:
        hdrs.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        return Answer(r.status, r.getheaders(), r.read())
    finally:
        conn.close()


class Ledger:
    """A running idem-ledger."""

    def __init__(self, workdir, db, keys=True, threads=4, extra=()):
        # A port found free may be taken by another test before the ledger
        # binds it: then the ledger exits, and it is started on another.
        for attempt in range(3):
            self.port = free_port()
            self.log_path = os.path.join(workdir, "ledger-%d.log" % self.port)
            self.argv = [LEDGER, "--listen", "%s:%d" % (HOST, self.port), "--db", db,
                         "--keys", "on" if keys else "off", "--threads", str(threads)] + list(extra)
            self.log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
            if self.wait_ready(last=attempt == 2):
                return
            self.log.close()

    def wait_ready(self, last):
        """Until this ledger answers /healthz: its own log must say it
        listens, or the 200 may be another process's on a taken port.
        False when it exited and another port may be tried."""
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                if not last and b"in use" in open(self.log_path, "rb").read():
                    return False
                raise AssertionError("idem-ledger exited with %d at start:\n%s"
                                     % (self.proc.returncode, self.text()))
            try:
                if (b"listening on" in open(self.log_path, "rb").read() and
                        call(self.port, "GET", "/healthz", timeout=2).status == 200):
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError("idem-ledger did not answer /healthz:\n" + self.text())
            time.sleep(0.05)

    def text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def call(self, method, path, body=None, headers=None, timeout=30.0):
        return call(self.port, method, path, body, headers, timeout)

    def stop(self):
        """SIGTERM; returns the exit status (and fails on a sanitizer report)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("idem-ledger did not stop on SIGTERM:\n" + self.text())
        self.log.close()
        text = self.text()
        for m in SANITIZER_MARKERS:
            if m in text:
                raise AssertionError("sanitizer report from idem-ledger:\n" + text)
        return self.proc.returncode


def transfer_body(t):
    return json.dumps({"from": t["from"], "to": t["to"], "amount": t["amount"]})


def make_plan(seed, n=N_TRANSFERS):
    rng = random.Random(seed)
    ids = ["acct-%d" % i for i in range(N_ACCOUNTS)]
    plan = []
    for i in range(n):
        a, b = rng.sample(ids, 2)
        plan.append({"key": "tr-%d-%s" % (i, uuid.uuid4().hex), "from": a, "to": b,
                     "amount": rng.randint(1, 500)})
    return ids, plan


def expected_balances(ids, plan):
    bal = {i: OPENING for i in ids}
    for t in plan:
        bal[t["from"]] -= t["amount"]
        bal[t["to"]] += t["amount"]
    return bal


def run_through_faults(tc, ledger, seed):
    """Open the accounts, then run the plan's transfers through a proxy that
    drops answers; return (ids, plan, finals, proxy)."""
    ids, plan = make_plan(seed)
    for i in ids:
        a = ledger.call("POST", "/accounts", {"id": i, "balance": OPENING})
        tc.assertEqual(a.status, 201, a)
    rng = random.Random(seed + 1)

    def policy(req):
        if req.method != "POST":
            return faultproxy.FORWARD
        if req.attempt == 1 or rng.random() < DROP_LATER:
            return faultproxy.DROP_RESPONSE
        return faultproxy.FORWARD

    finals = {}
    problems = []
    work = list(plan)
    lock = threading.Lock()
    proxy = faultproxy.FaultProxy(ledger.port, policy).start()

    deadline = time.monotonic() + RUN_SECONDS

    def client():
        while True:
            with lock:
                if not work:
                    return
                t = work.pop()
            answer = None
            for _ in range(MAX_ATTEMPTS):
                if time.monotonic() > deadline:
                    break
                try:
                    a = call(proxy.port, "POST", "/transfers", transfer_body(t),
                             {"Idempotency-Key": t["key"]}, timeout=30)
                except (OSError, http.client.HTTPException):
                    continue  # the answer was lost: retry with the same key
                if a.status in (409, 503) and (a.header("Content-Type") or "").startswith(
                        "application/problem+json") and a.json()["type"] in (
                        PROBLEM + "in-flight", PROBLEM + "database-busy"):
                    time.sleep(0.05)
                    continue
                answer = a
                break
            with lock:
                if answer is None:
                    problems.append("no answer for %s (attempts or time ran out)" % t["key"])
                else:
                    finals[t["key"]] = answer

    threads = [threading.Thread(target=client) for _ in range(N_CLIENTS)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(RUN_SECONDS + 120)
    finally:
        proxy.close()
    tc.assertEqual(problems[:5], [], "%d transfers without an answer" % len(problems))
    tc.assertEqual(proxy.errors, [])
    tc.assertEqual(len(finals), len(plan))
    return ids, plan, finals, proxy


class LedgerCase(unittest.TestCase):
    """A fresh database per test; every ledger started is stopped and must
    exit 0 on SIGTERM without a sanitizer report."""

    def setUp(self):
        self.assertTrue(os.access(LEDGER, os.X_OK), "no idem-ledger at %s (build it first)" % LEDGER)
        self.tmp = tempfile.mkdtemp(prefix="idem-ledger-test-")
        self.ledgers = []

    def tearDown(self):
        try:
            for lg in self.ledgers:
                status = lg.stop()
                self.assertEqual(status, 0, "idem-ledger exited with %d:\n%s" % (status, lg.text()))
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def db_url(self):
        return "sqlite:" + os.path.join(self.tmp, "ledger.db")

    def start(self, **kw):
        lg = Ledger(self.tmp, kw.pop("db", None) or self.db_url(), **kw)
        self.ledgers.append(lg)
        return lg

    def assertProblem(self, a, status, ptype, detail_has=()):
        self.assertEqual(a.status, status, a)
        self.assertEqual(a.header("Content-Type"), "application/problem+json", a)
        p = a.json()
        self.assertEqual(p["type"], PROBLEM + ptype, p)
        self.assertEqual(p["status"], status, p)
        self.assertTrue(p.get("title"), p)
        for s in detail_has:
            self.assertIn(s, p["detail"], p)
        return p

    # shared checks of the exactly-once run, for SQLite and PostgreSQL
    def check_exactly_once(self, lg, seed):
        ids, plan, finals, proxy = run_through_faults(self, lg, seed)
        # every first attempt's answer was dropped, so every transfer was retried
        self.assertGreaterEqual(proxy.counts[faultproxy.DROP_RESPONSE], len(plan))
        stats = lg.call("GET", "/stats").json()
        self.assertEqual(stats["transfers"], len(plan), stats)
        self.assertEqual(stats["transfer_keys"], len(plan), stats)
        self.assertEqual(stats["total_balance"], OPENING * len(ids), stats)
        want = expected_balances(ids, plan)
        for i in ids:
            self.assertEqual(lg.call("GET", "/accounts/" + i).json()["balance"], want[i], i)
        seen_ids = set()
        for t in plan:
            final = finals[t["key"]]
            self.assertEqual(final.status, 201, final)
            # the key's stored answer is the one the client finally got
            again = lg.call("POST", "/transfers", transfer_body(t), {"Idempotency-Key": t["key"]})
            self.assertEqual(again.status, final.status)
            self.assertEqual(again.body, final.body)
            self.assertEqual(again.header("X-Idempotent-Replay"), "true")
            body = final.json()
            self.assertEqual((body["from"], body["to"], body["amount"]),
                             (t["from"], t["to"], t["amount"]))
            seen_ids.add(body["id"])
        self.assertEqual(len(seen_ids), len(plan))
        # the transfer a client was told about is the one on record
        some = finals[plan[0]["key"]].json()
        got = lg.call("GET", "/transfers/" + some["id"])
        self.assertEqual(got.status, 200, got)
        self.assertEqual(got.json()["amount"], some["amount"])

    def check_double_charging(self, lg, seed):
        ids, plan, finals, proxy = run_through_faults(self, lg, seed)
        stats = lg.call("GET", "/stats").json()
        extra = stats["transfers"] - len(plan)
        # every first attempt was applied and its answer lost: each transfer
        # ran at least twice
        self.assertGreaterEqual(extra, len(plan), stats)
        self.assertEqual(stats["transfers"], proxy.counts[faultproxy.DROP_RESPONSE]
                         + proxy.counts[faultproxy.FORWARD], stats)
        self.assertEqual(stats["transfer_keys"], len(plan), stats)
        # money is only moved, never made; it moved too often
        self.assertEqual(stats["total_balance"], OPENING * len(ids), stats)
        want = expected_balances(ids, plan)
        got = {i: lg.call("GET", "/accounts/" + i).json()["balance"] for i in ids}
        self.assertNotEqual(got, want)
        # and the answers differ from execution to execution
        t = plan[0]
        again = lg.call("POST", "/transfers", transfer_body(t), {"Idempotency-Key": t["key"]})
        self.assertEqual(again.status, 201)
        self.assertNotEqual(again.json()["id"], finals[t["key"]].json()["id"])
        self.assertIsNone(again.header("X-Idempotent-Replay"))
        return extra

    def check_same_key_at_once(self, lg):
        for i in ("a", "b"):
            self.assertEqual(lg.call("POST", "/accounts", {"id": i, "balance": 1000}).status, 201)
        key = "same-" + uuid.uuid4().hex
        body = {"from": "a", "to": "b", "amount": 7}
        answers = []
        lock = threading.Lock()
        go = threading.Event()

        def one():
            go.wait()
            a = lg.call("POST", "/transfers", body, {"Idempotency-Key": key})
            with lock:
                answers.append(a)

        ts = [threading.Thread(target=one) for _ in range(12)]
        for t in ts:
            t.start()
        go.set()
        for t in ts:
            t.join(60)
        created = [a for a in answers if a.status == 201]
        self.assertEqual(len(answers), 12)
        self.assertTrue(created, answers)
        for a in answers:
            self.assertIn(a.status, (201, 409), a)
            if a.status == 409:
                self.assertProblem(a, 409, "in-flight")
                self.assertTrue(a.header("Retry-After"))
            else:
                self.assertEqual(a.body, created[0].body)
        self.assertEqual(sum(1 for a in created if a.header("X-Idempotent-Replay") is None), 1)
        self.assertEqual(lg.call("GET", "/stats").json()["transfers"], 1)
        self.assertEqual(lg.call("GET", "/accounts/a").json()["balance"], 993)


class TestLedgerTransfers(LedgerCase):

    def test_transfers_apply_exactly_once_when_answers_are_lost(self):
        lg = self.start()
        self.check_exactly_once(lg, seed=11)

    def test_without_keys_lost_answers_charge_twice(self):
        lg = self.start(keys=False)
        extra = self.check_double_charging(lg, seed=12)
        sys.stderr.write("(--keys off: %d extra transfers for %d) " % (extra, N_TRANSFERS))

    def test_same_key_at_once_applies_once(self):
        self.check_same_key_at_once(self.start())

    def test_key_rules(self):
        lg = self.start()
        for i in ("a", "b"):
            lg.call("POST", "/accounts", {"id": i, "balance": 1000})
        body = {"from": "a", "to": "b", "amount": 5}
        self.assertProblem(lg.call("POST", "/transfers", body), 400, "missing-key")
        self.assertProblem(lg.call("POST", "/transfers", body, {"Idempotency-Key": "k" * 256}),
                           400, "invalid-key")
        self.assertProblem(lg.call("POST", "/transfers", body, {"Idempotency-Key": '"open'}),
                           400, "invalid-key")
        key = "k-" + uuid.uuid4().hex
        first = lg.call("POST", "/transfers", body, {"Idempotency-Key": key})
        self.assertEqual(first.status, 201, first)
        self.assertIsNone(first.header("X-Idempotent-Replay"))
        # the same request re-spaced and reordered is the same request
        again = lg.call("POST", "/transfers", '{ "amount": 5, "to": "b", "from": "a" }',
                        {"Idempotency-Key": '"%s"' % key})
        self.assertEqual((again.status, again.body), (first.status, first.body))
        self.assertEqual(again.header("X-Idempotent-Replay"), "true")
        self.assertProblem(lg.call("POST", "/transfers", dict(body, amount=6),
                                   {"Idempotency-Key": key}), 422, "key-reused")
        # keys are per caller: another Authorization has its own
        other = lg.call("POST", "/transfers", body,
                        {"Idempotency-Key": key, "Authorization": "Bearer someone-else"})
        self.assertEqual(other.status, 201, other)
        self.assertIsNone(other.header("X-Idempotent-Replay"))
        self.assertNotEqual(other.json()["id"], first.json()["id"])
        self.assertEqual(lg.call("GET", "/accounts/a").json()["balance"], 990)

    def test_refusals_are_stored_under_the_key(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "poor", "balance": 100})
        lg.call("POST", "/accounts", {"id": "rich", "balance": 5000})
        key = "k-" + uuid.uuid4().hex
        body = {"from": "poor", "to": "rich", "amount": 500}
        first = lg.call("POST", "/transfers", body, {"Idempotency-Key": key})
        self.assertProblem(first, 409, "insufficient-funds", ("poor", "100", "500"))
        # now the money is there, but the key's answer was given
        ok = lg.call("POST", "/transfers", {"from": "rich", "to": "poor", "amount": 1000},
                     {"Idempotency-Key": "k-" + uuid.uuid4().hex})
        self.assertEqual(ok.status, 201, ok)
        again = lg.call("POST", "/transfers", body, {"Idempotency-Key": key})
        self.assertEqual((again.status, again.body), (first.status, first.body))
        self.assertEqual(again.header("X-Idempotent-Replay"), "true")
        self.assertEqual(lg.call("GET", "/accounts/poor").json()["balance"], 1100)
        unknown = lg.call("POST", "/transfers", {"from": "poor", "to": "nobody", "amount": 1},
                          {"Idempotency-Key": "k-" + uuid.uuid4().hex})
        self.assertProblem(unknown, 404, "unknown-account", ("nobody",))
        self.assertEqual(lg.call("GET", "/stats").json()["transfers"], 1)


class TestLedgerAccountsAndOrders(LedgerCase):

    def test_accounts(self):
        lg = self.start()
        a = lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        self.assertEqual(a.status, 201, a)
        self.assertEqual(a.json(), {"id": "alice", "balance": 1000})
        self.assertEqual(a.header("Location"), "/accounts/alice")
        again = lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        self.assertEqual(again.status, 200, again)
        self.assertEqual(again.json(), {"id": "alice", "balance": 1000})
        self.assertProblem(lg.call("POST", "/accounts", {"id": "alice", "balance": 5}), 409,
                           "account-exists", ("alice",))
        self.assertEqual(lg.call("GET", "/accounts/alice").json(), {"id": "alice", "balance": 1000})
        self.assertProblem(lg.call("GET", "/accounts/bob"), 404, "unknown-account")
        self.assertEqual(lg.call("GET", "/stats").json()["accounts"], 1)

    def test_orders_unique_number(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        o = {"number": "ORD-1", "amount": 500, "account": "alice"}
        first = lg.call("POST", "/orders", o)
        self.assertEqual(first.status, 201, first)
        self.assertEqual(first.json()["state"], "created")
        again = lg.call("POST", "/orders", o)
        self.assertEqual(again.status, 200, again)
        self.assertEqual(again.json(), first.json())
        self.assertProblem(lg.call("POST", "/orders", dict(o, amount=501)), 409, "order-exists")
        self.assertProblem(lg.call("POST", "/orders", dict(o, number="ORD-2", account="bob")),
                           404, "unknown-account")
        self.assertEqual(lg.call("GET", "/stats").json()["orders"], 1)
        self.assertEqual(lg.call("GET", "/orders/ORD-1").json()["state"], "created")
        self.assertProblem(lg.call("GET", "/orders/ORD-9"), 404, "unknown-order")

    def test_pay_twice_debits_once(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        lg.call("POST", "/orders", {"number": "ORD-1", "amount": 300, "account": "alice"})
        p1 = lg.call("POST", "/orders/ORD-1/pay")
        self.assertEqual(p1.status, 200, p1)
        self.assertEqual((p1.json()["state"], p1.json()["changed"]), ("paid", True))
        p2 = lg.call("POST", "/orders/ORD-1/pay")
        self.assertEqual(p2.status, 200, p2)
        self.assertEqual((p2.json()["state"], p2.json()["changed"]), ("paid", False))
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 700)
        # many at once: still one debit
        lg.call("POST", "/orders", {"number": "ORD-2", "amount": 100, "account": "alice"})
        out = []
        ts = [threading.Thread(target=lambda: out.append(lg.call("POST", "/orders/ORD-2/pay")))
              for _ in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(sorted(a.status for a in out), [200] * 10)
        self.assertEqual(sum(1 for a in out if a.json()["changed"]), 1)
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 600)

    def test_pay_without_funds_leaves_the_order_unpaid(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "bob", "balance": 50})
        lg.call("POST", "/orders", {"number": "ORD-B", "amount": 300, "account": "bob"})
        self.assertProblem(lg.call("POST", "/orders/ORD-B/pay"), 409, "insufficient-funds")
        self.assertEqual(lg.call("GET", "/orders/ORD-B").json()["state"], "created")
        self.assertEqual(lg.call("GET", "/accounts/bob").json()["balance"], 50)

    def test_state_machine(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        lg.call("POST", "/orders", {"number": "ORD-1", "amount": 200, "account": "alice"})
        # not paid yet: cannot ship
        self.assertProblem(lg.call("POST", "/orders/ORD-1/ship"), 409, "invalid-transition",
                           ("created", "shipped"))
        self.assertEqual(lg.call("POST", "/orders/ORD-1/pay").status, 200)
        self.assertEqual(lg.call("POST", "/orders/ORD-1/ship").json()["state"], "shipped")
        self.assertEqual(lg.call("POST", "/orders/ORD-1/deliver").json()["state"], "delivered")
        self.assertEqual(lg.call("POST", "/orders/ORD-1/deliver").json()["changed"], False)
        self.assertProblem(lg.call("POST", "/orders/ORD-1/cancel"), 409, "invalid-transition",
                           ("delivered", "cancelled"))
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 800)
        self.assertProblem(lg.call("POST", "/orders/ORD-1/refund"), 404, "not-found")
        self.assertProblem(lg.call("POST", "/orders/NOPE/pay"), 404, "unknown-order")

    def test_cancel_after_paid_refunds_once(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        lg.call("POST", "/orders", {"number": "ORD-1", "amount": 400, "account": "alice"})
        lg.call("POST", "/orders/ORD-1/pay")
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 600)
        c1 = lg.call("POST", "/orders/ORD-1/cancel")
        self.assertEqual((c1.status, c1.json()["state"], c1.json()["changed"]),
                         (200, "cancelled", True))
        c2 = lg.call("POST", "/orders/ORD-1/cancel")
        self.assertEqual((c2.status, c2.json()["changed"]), (200, False))
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 1000)
        self.assertProblem(lg.call("POST", "/orders/ORD-1/pay"), 409, "invalid-transition",
                           ("cancelled", "paid"))
        # cancelling an unpaid order refunds nothing
        lg.call("POST", "/orders", {"number": "ORD-2", "amount": 100, "account": "alice"})
        self.assertEqual(lg.call("POST", "/orders/ORD-2/cancel").status, 200)
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 1000)


class TestLedgerBadInput(LedgerCase):

    def raw(self, port, data, timeout=5.0):
        s = socket.create_connection((HOST, port), timeout=timeout)
        got = b""
        try:
            s.sendall(data)
            while True:
                try:
                    chunk = s.recv(65536)
                except (socket.timeout, ConnectionResetError):
                    break
                if not chunk:
                    break
                got += chunk
        finally:
            s.close()
        return got

    def test_bad_bodies_are_problems(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "a", "balance": 10})
        lg.call("POST", "/accounts", {"id": "b", "balance": 10})
        key = {"Idempotency-Key": "k-" + uuid.uuid4().hex}
        cases = [
            ("/transfers", b'{"from": "a", "to": ', "invalid-json", ()),
            ("/transfers", b'[1, 2]', "invalid-json", ()),
            ("/transfers", b'{"from":"a","from":"b","to":"b","amount":1}', "invalid-json", ()),
            ("/transfers", {"from": "a", "to": "b"}, "invalid-field", ("amount",)),
            ("/transfers", {"to": "b", "amount": 1}, "invalid-field", ("from",)),
            ("/transfers", {"from": "a", "to": "b", "amount": -5}, "invalid-field", ("amount",)),
            ("/transfers", {"from": "a", "to": "b", "amount": 0}, "invalid-field", ("amount",)),
            ("/transfers", {"from": "a", "to": "b", "amount": 1.5}, "invalid-field", ("amount",)),
            ("/transfers", {"from": "a", "to": "b", "amount": "1"}, "invalid-field", ("amount",)),
            ("/transfers", b'{"from":"a","to":"b","amount":99999999999999999999999}',
             "invalid-json", ()),
            ("/transfers", {"from": "a", "to": "a", "amount": 1}, "invalid-field", ("same",)),
            ("/transfers", {"from": "a/../b", "to": "b", "amount": 1}, "invalid-field", ("from",)),
            ("/accounts", {"id": "x", "balance": -1}, "invalid-field", ("balance",)),
            ("/accounts", {"id": "", "balance": 1}, "invalid-field", ("id",)),
            ("/accounts", {"id": "y" * 65, "balance": 1}, "invalid-field", ("id",)),
            ("/orders", {"number": "N", "amount": 0, "account": "a"}, "invalid-field", ("amount",)),
            ("/orders", {"number": 7, "amount": 1, "account": "a"}, "invalid-field", ("number",)),
        ]
        for path, body, ptype, has in cases:
            with self.subTest(path=path, body=body):
                self.assertProblem(lg.call("POST", path, body, key), 400, ptype, has)
        stats = lg.call("GET", "/stats").json()
        self.assertEqual((stats["transfers"], stats["accounts"], stats["total_balance"]),
                         (0, 2, 20))

    def test_http_limits_and_errors(self):
        lg = self.start()
        # a body over the limit: 413 and the connection closes
        big = b"x" * (64 * 1024 + 1)
        head = ("POST /transfers HTTP/1.1\r\nHost: l\r\nIdempotency-Key: k\r\n"
                "Content-Length: %d\r\n\r\n" % len(big)).encode()
        got = self.raw(lg.port, head + big)
        self.assertTrue(got.startswith(b"HTTP/1.1 413 "), got[:200])
        self.assertIn(b"urn:idem:problem:body-too-large", got)
        # chunked is refused
        got = self.raw(lg.port, b"POST /transfers HTTP/1.1\r\nHost: l\r\n"
                                b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        self.assertTrue(got.startswith(b"HTTP/1.1 411 "), got[:200])
        self.assertIn(b"application/problem+json", got)
        # malformed HTTP, a head too large, CL with TE
        for data, status in ((b"NOT HTTP\r\n\r\n", b"400"),
                             (b"GET / HTTP/1.1\r\nHost: l\r\nX: " + b"y" * 20000 + b"\r\n\r\n",
                              b"431"),
                             (b"POST /transfers HTTP/1.1\r\nHost: l\r\nContent-Length: 3\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\nabc", b"400"),
                             (b"GET / HTTP/2.0\r\nHost: l\r\n\r\n", b"505")):
            got = self.raw(lg.port, data)
            self.assertTrue(got.startswith(b"HTTP/1.1 " + status), (data[:40], got[:200]))
            self.assertIn(b"application/problem+json", got)
        # routes and methods
        self.assertProblem(lg.call("GET", "/nothing/here"), 404, "not-found")
        a = lg.call("DELETE", "/transfers")
        self.assertProblem(a, 405, "method-not-allowed")
        self.assertEqual(a.header("Allow"), "POST")
        # HEAD: the head only, and the connection stays usable
        got = self.raw(lg.port, b"HEAD /healthz HTTP/1.1\r\nHost: l\r\n\r\n"
                                b"GET /healthz HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n")
        first, _, rest = got.partition(b"\r\n\r\n")
        self.assertTrue(first.startswith(b"HTTP/1.1 405 "), got[:200])
        self.assertTrue(rest.startswith(b"HTTP/1.1 200 "), got[:400])
        # keep-alive and pipelining: two requests in one write, two answers
        got = self.raw(lg.port, b"GET /healthz HTTP/1.1\r\nHost: l\r\n\r\n"
                                b"GET /stats HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n")
        self.assertEqual(got.count(b"HTTP/1.1 200 "), 2, got)
        # a client that goes away half-way does not hurt
        s = socket.create_connection((HOST, lg.port))
        s.sendall(b"POST /accounts HTTP/1.1\r\nHost: l\r\nContent-Length: 50\r\n\r\n{\"id\"")
        s.close()
        self.assertEqual(lg.call("GET", "/healthz").status, 200)

    def test_arguments(self):
        cases = [
            (["--keys", "maybe"], "--keys"),
            (["--threads", "0"], "--threads"),
            (["--threads", "x"], "--threads"),
            (["--max-conns", "99999"], "--max-conns"),
            (["--db", "mysql://x"], "--db"),
            (["--db", "sqlite:"], "--db"),
            (["--listen", "nowhere"], "--listen"),
            (["--listen", "127.0.0.1:99999"], "--listen"),
            (["--bogus"], "--bogus"),
            (["--db"], "--db"),
        ]
        for args, word in cases:
            with self.subTest(args=args):
                p = subprocess.run([LEDGER] + args, capture_output=True, timeout=30,
                                   cwd=self.tmp)
                err = p.stderr.decode()
                self.assertEqual(p.returncode, 2, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn(word, err)
        p = subprocess.run([LEDGER, "--help"], capture_output=True, timeout=30)
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"--keys", p.stdout)

    def test_connection_cap(self):
        lg = self.start(extra=["--max-conns", "2"])
        held = []
        try:
            # A connection closed just before (the readiness probe's) keeps
            # its place until the ledger's thread for it has ended, which
            # can be a moment after the close: take the two places as they
            # come free, within a generous deadline.
            deadline = time.monotonic() + 30
            while len(held) < 2:
                c = http.client.HTTPConnection(HOST, lg.port, timeout=10)
                c.request("GET", "/healthz")
                body = c.getresponse().read()
                if body == b'{"status":"ok"}':
                    held.append(c)
                    continue
                c.close()
                self.assertIn(b"too-many-connections", body)
                self.assertLess(time.monotonic(), deadline, "a place never came free")
                time.sleep(0.05)
            got = self.raw(lg.port, b"GET /healthz HTTP/1.1\r\nHost: l\r\n\r\n")
            self.assertTrue(got.startswith(b"HTTP/1.1 503 "), got[:200])
            self.assertIn(b"too-many-connections", got)
        finally:
            for c in held:
                c.close()
        # the slots come back when the connections close
        deadline = time.monotonic() + 10
        while True:
            try:
                if lg.call("GET", "/healthz", timeout=2).status == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            self.assertLess(time.monotonic(), deadline, "slots never freed")
            time.sleep(0.05)

    def test_sigterm_with_idle_connections(self):
        lg = self.start()
        c = http.client.HTTPConnection(HOST, lg.port, timeout=10)
        c.request("GET", "/healthz")
        c.getresponse().read()
        t0 = time.monotonic()
        self.assertEqual(lg.stop(), 0)
        self.assertLess(time.monotonic() - t0, 10)
        self.ledgers.remove(lg)
        c.close()

    def test_schema_survives_restart(self):
        lg = self.start()
        lg.call("POST", "/accounts", {"id": "a", "balance": 10})
        lg.call("POST", "/accounts", {"id": "b", "balance": 10})
        key = "k-" + uuid.uuid4().hex
        first = lg.call("POST", "/transfers", {"from": "a", "to": "b", "amount": 3},
                        {"Idempotency-Key": key})
        self.assertEqual(lg.stop(), 0)
        self.ledgers.remove(lg)
        lg2 = self.start()
        again = lg2.call("POST", "/transfers", {"from": "a", "to": "b", "amount": 3},
                         {"Idempotency-Key": key})
        self.assertEqual((again.status, again.body), (first.status, first.body))
        self.assertEqual(again.header("X-Idempotent-Replay"), "true")
        self.assertEqual(lg2.call("GET", "/accounts/a").json()["balance"], 7)


# --------------------------------------------------------------------------
# PostgreSQL: a database of its own, created and dropped with psql

def pg_url_with_db(url, dbname):
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))


def psql(url, sql):
    exe = shutil.which("psql")
    if exe is None:
        raise AssertionError("psql is needed to create the test database")
    p = subprocess.run([exe, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
                       capture_output=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError("psql %r failed: %s" % (sql, p.stderr.decode()))


class TestLedgerPostgres(LedgerCase):
    """The same runs against PostgreSQL (IDEM_TEST_PG_URL must be set)."""

    @classmethod
    def setUpClass(cls):
        base = os.environ.get("IDEM_TEST_PG_URL")
        if not base:
            raise AssertionError("IDEM_TEST_PG_URL is not set: the PostgreSQL ledger tests "
                                 "need a server (scripts/services.sh start DIR)")
        cls.base = base
        cls.dbname = "idem_ledger_%d_%s" % (os.getpid(), uuid.uuid4().hex[:8])
        psql(base, "CREATE DATABASE %s" % cls.dbname)
        cls.url = pg_url_with_db(base, cls.dbname)

    @classmethod
    def tearDownClass(cls):
        psql(cls.base, "DROP DATABASE IF EXISTS %s WITH (FORCE)" % cls.dbname)

    def setUp(self):
        super().setUp()
        # a clean slate per test, in the class's database
        psql(self.url, "DROP TABLE IF EXISTS accounts, transfers, orders, idem_keys")

    def test_pg_transfers_apply_exactly_once_when_answers_are_lost(self):
        lg = self.start(db=self.url, threads=8)
        self.check_exactly_once(lg, seed=21)

    def test_pg_without_keys_lost_answers_charge_twice(self):
        lg = self.start(db=self.url, keys=False, threads=8)
        self.check_double_charging(lg, seed=22)

    def test_pg_orders(self):
        lg = self.start(db=self.url)
        lg.call("POST", "/accounts", {"id": "alice", "balance": 1000})
        self.assertEqual(lg.call("POST", "/orders", {"number": "ORD-1", "amount": 300,
                                                     "account": "alice"}).status, 201)
        self.assertEqual(lg.call("POST", "/orders", {"number": "ORD-1", "amount": 300,
                                                     "account": "alice"}).status, 200)
        out = []
        ts = [threading.Thread(target=lambda: out.append(lg.call("POST", "/orders/ORD-1/pay")))
              for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(sorted(a.status for a in out), [200] * 8, out)
        self.assertEqual(sum(1 for a in out if a.json()["changed"]), 1)
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 700)
        self.assertProblem(lg.call("POST", "/orders/ORD-1/deliver"), 409, "invalid-transition",
                           ("paid", "delivered"))
        self.assertEqual(lg.call("POST", "/orders/ORD-1/cancel").json()["state"], "cancelled")
        self.assertEqual(lg.call("GET", "/accounts/alice").json()["balance"], 1000)

    def test_pg_same_key_at_once_applies_once(self):
        self.check_same_key_at_once(self.start(db=self.url, threads=8))

    def test_pg_key_rules(self):
        lg = self.start(db=self.url)
        lg.call("POST", "/accounts", {"id": "a", "balance": 100})
        lg.call("POST", "/accounts", {"id": "b", "balance": 100})
        key = "k-" + uuid.uuid4().hex
        first = lg.call("POST", "/transfers", {"from": "a", "to": "b", "amount": 500},
                        {"Idempotency-Key": key})
        self.assertProblem(first, 409, "insufficient-funds")
        again = lg.call("POST", "/transfers", {"from": "a", "to": "b", "amount": 500},
                        {"Idempotency-Key": key})
        self.assertEqual((again.status, again.body), (first.status, first.body))
        self.assertEqual(again.header("X-Idempotent-Replay"), "true")
        self.assertProblem(lg.call("POST", "/transfers", {"from": "a", "to": "b", "amount": 5},
                                   {"Idempotency-Key": key}), 422, "key-reused")


if __name__ == "__main__":
    unittest.main()
