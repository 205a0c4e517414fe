"""Reconciliation of unknown outcomes (SPEC section 18, docs/guarantees.md).

With `on_unknown_outcome: reconcile` a request that was sent but got no whole
answer leaves its key held, and idemd asks `GET reconcile_url` (here the test
upstream's /status/{key}) what became of it:

  applied      the status endpoint answers 200: that answer is stored and
               every retry gets it; the operation ran once
  not applied  it answers 404: the key is released and the next retry runs
  retry        it answers 500: asked again later, backing off
  owner gone   the owner idemd is killed (-9) while the key is held; after a
               restart the first repeat past the lease asks, once
  shared       three idemd share one Redis store: of all the repeats that come
               to two survivors while the question is in flight, none asks
               a second time

Everything waits on events (the upstream's record of the questions it got,
idemd's answers), never on a sleep: reconcile_after is small where a question
is to come by itself, and an hour where only a repeat is to trigger it.
"""

import concurrent.futures
import os
import threading
import time
import unittest
import urllib.parse
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

STATUS = "/status/"


def status_path(key):
    return STATUS + urllib.parse.quote(key, safe="-._~")


class Reconcile(h.IdemTestCase):

    def config(self, up, after="200ms", timeout="1s"):
        return {"defaults": {"lease": "1s", "key_ttl": "1h",
                             "on_unknown_outcome": "reconcile",
                             "reconcile_url": up.url + "/status/{key}",
                             "reconcile_after": after},
                "upstream_timeout": timeout}

    def program(self, up, status_replies, status_then=None, post_then=None):
        """POSTs: the first never answers (the timeout leaves its outcome
        unknown), later ones as post_then.  GET /status/...: the replies in
        order, then status_then."""
        hang = threading.Event()
        self.addCleanup(hang.set)
        lock = threading.Lock()
        status = list(status_replies)
        posts = []

        def behaviour(seen):
            with lock:
                if seen.path.startswith(STATUS):
                    return status.pop(0) if status else status_then
                posts.append(seen)
                if len(posts) == 1:
                    return h.Reply(wait=hang)
                return post_then
        up.behaviour = behaviour

    def questions(self, up, key):
        return [s for s in up.requests() if s.path == status_path(key)]

    def wait_settled(self, d, key, timeout=30):
        """Repeat until the answer is no longer 409 (the key is held)."""
        return h.wait_until(lambda: (lambda r: r if r.status != 409 else None)(d.post(key=key)),
                            timeout=timeout, interval=0.05, what="the key to be settled")

    def poke(self, d, key, up):
        """True once the upstream was asked about key; else one repeat,
        which must be 409 (the key is held until a question settles it)."""
        if self.questions(up, key):
            return True
        self.assertProblem(d.post(key=key), 409, "upstream-outcome-unknown")
        return False

    def check_question(self, seen, key, fence):
        self.assertEqual(seen.method, "GET")
        self.assertEqual(seen.header("Idempotency-Key"), key)
        self.assertEqual(seen.fence, fence)
        self.assertEqual(seen.header("Idempotency-Scope"), h.scope_of(None))

    # ---- the owner asks by itself ----------------------------------------

    def test_applied_answer_is_stored_and_replayed(self):
        up = self.start_upstream()
        self.program(up, [h.Reply(status=201, body=b'{"charged": true}',
                                  headers={"X-Ledger": "tx-9"})])
        d = self.start_idemd(up, self.config(up))
        k = h.new_key("rec/a:b")  # {key} is percent-encoded
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        h.wait_until(lambda: self.questions(up, k), timeout=20, what="the question")
        r = self.wait_settled(d, k)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.body, b'{"charged": true}')
        self.assertEqual(r.header("X-Ledger"), "tx-9")
        self.assertTrue(r.replayed, r)
        q = self.questions(up, k)
        self.assertEqual(len(q), 1)
        self.check_question(q[0], k, 1)
        self.assertEqual(up.count(path="/pay"), 1)  # one execution
        # and from now on the stored answer, as any completed key
        again = d.post(key=k)
        self.assertEqual((again.status, again.body), (201, b'{"charged": true}'))
        self.assertEqual(up.count(path="/pay"), 1)
        # The answer is counted when its write returns to the worker, which
        # may be after a retry already read the stored record.
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_reconcile_total",
                                          result="applied") == 1,
                     timeout=20, what="the applied answer counted")
        m = d.metrics()
        self.assertEqual(h.metric_sum(m, "idem_reconcile_total", result="applied"), 1)
        self.assertEqual(h.metric_sum(m, "idem_reconcile_total", result="not_applied"), 0)

    def test_not_found_releases_the_key_and_the_retry_runs(self):
        up = self.start_upstream()
        self.program(up, [h.Reply(status=404, body=b"no such request")],
                     post_then=h.Reply(status=200, body=b"ran now"))
        d = self.start_idemd(up, self.config(up))
        k = h.new_key()
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        r = self.wait_settled(d, k)
        self.assertEqual((r.status, r.body), (200, b"ran now"))
        self.assertFalse(r.replayed)
        self.assertEqual(len(self.questions(up, k)), 1)
        self.assertEqual(up.count(path="/pay"), 2)  # the first never took effect
        self.assertEqual(d.post(key=k).body, b"ran now")  # replayed now
        self.assertEqual(up.count(path="/pay"), 2)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_reconcile_total",
                                          result="not_applied") == 1,
                     timeout=20, what="the release counted")

    def test_server_error_is_asked_again_with_backoff(self):
        up = self.start_upstream()
        self.program(up, [h.Reply(status=500), h.Reply(status=503)],
                     status_then=h.Reply(status=200, body=b"done"))
        d = self.start_idemd(up, self.config(up))
        k = h.new_key()
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        r = self.wait_settled(d, k)
        self.assertEqual((r.status, r.body), (200, b"done"))
        q = self.questions(up, k)
        self.assertEqual(len(q), 3)
        # reconcile_after (200 ms), then 200 ms, then 400 ms: lower bounds only
        self.assertGreaterEqual(q[1].t - q[0].t, 0.19)
        self.assertGreaterEqual(q[2].t - q[1].t, 0.39)
        self.assertEqual(up.count(path="/pay"), 1)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_reconcile_total",
                                          result="applied") == 1,
                     timeout=20, what="the applied answer counted")
        m = d.metrics()
        self.assertEqual(h.metric_sum(m, "idem_reconcile_total", result="retry"), 2)
        self.assertEqual(h.metric_sum(m, "idem_reconcile_total", result="applied"), 1)

    def test_repeats_while_held_are_409(self):
        up = self.start_upstream()
        answer = threading.Event()
        self.addCleanup(answer.set)
        self.program(up, [h.Reply(status=200, body=b"late", wait=answer)])
        d = self.start_idemd(up, self.config(up))
        k = h.new_key()
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        h.wait_until(lambda: self.questions(up, k), timeout=20, what="the question")
        for _ in range(5):
            self.assertProblem(d.post(key=k), 409, "upstream-outcome-unknown")
        answer.set()
        r = self.wait_settled(d, k)
        self.assertEqual((r.status, r.body), (200, b"late"))
        self.assertEqual(len(self.questions(up, k)), 1)
        self.assertEqual(up.count(path="/pay"), 1)

    def test_stop_while_asking_exits_cleanly_and_the_next_start_asks(self):
        up = self.start_upstream()
        answer = threading.Event()
        self.addCleanup(answer.set)
        self.program(up, [h.Reply(status=200, body=b"x", wait=answer)],
                     status_then=h.Reply(status=200, body=b"after restart"))
        d = self.start_idemd(up, self.config(up))
        k = h.new_key()
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        h.wait_until(lambda: self.questions(up, k), timeout=20, what="the question")
        self.assertEqual(d.stop(), 0)  # the question in flight is ended, nothing leaks
        d.start()
        r = self.wait_settled(d, k)
        self.assertEqual((r.status, r.body), (200, b"after restart"))
        self.assertEqual(len(self.questions(up, k)), 2)
        self.assertEqual(up.count(path="/pay"), 1)

    # ---- the owner is gone ------------------------------------------------

    def check_owner_gone(self, status_reply, post_then, want):
        up = self.start_upstream()
        self.program(up, [status_reply], post_then=post_then)
        # reconcile_after of an hour: only a repeat can trigger the question
        d = self.start_idemd(up, self.config(up, after="1h"))
        k = h.new_key()
        self.assertProblem(d.post(key=k), 504, "upstream-outcome-unknown")
        self.assertEqual(d.get_key(k).json()["state"], "in_progress")
        d.kill()
        self.assertEqual(self.questions(up, k), [])
        d.start()
        # a repeat past the dead owner's lease takes it and asks at once
        h.wait_until(lambda: self.poke(d, k, up), timeout=30, interval=0.05,
                     what="a repeat to ask")
        r = self.wait_settled(d, k)
        self.assertEqual((r.status, r.body), want)
        q = self.questions(up, k)
        self.assertEqual(len(q), 1)
        self.check_question(q[0], k, 2)  # the taker's fence: the owner's + 1
        return up

    def test_owner_killed_applied(self):
        up = self.check_owner_gone(h.Reply(status=200, body=b"it ran"), None, (200, b"it ran"))
        self.assertEqual(up.count(path="/pay"), 1)

    def test_owner_killed_not_applied(self):
        up = self.check_owner_gone(h.Reply(status=404), h.Reply(status=200, body=b"ran now"),
                                   (200, b"ran now"))
        self.assertEqual(up.count(path="/pay"), 2)

    # ---- instances sharing a store ---------------------------------------

    @unittest.skipUnless(os.environ.get("IDEM_TEST_REDIS_URL"), "needs IDEM_TEST_REDIS_URL")
    def test_instances_sharing_a_store_ask_once(self):
        base = os.environ["IDEM_TEST_REDIS_URL"]
        store = "%s%sprefix=recon-%s-" % (base, "&" if "?" in base else "?", uuid.uuid4().hex)
        up = self.start_upstream()
        answer = threading.Event()
        self.addCleanup(answer.set)
        self.program(up, [h.Reply(status=200, body=b"settled", wait=answer)])
        # The question's answer is held back for more than a lease (1 s) and
        # less than upstream_timeout, which bounds the question too.
        cfg = self.config(up, after="1h", timeout="6s")
        owner = self.start_idemd(up, cfg, store=store, name="owner")
        others = [self.start_idemd(up, cfg, store=store, name="other%d" % i) for i in (1, 2)]
        k = h.new_key()
        self.assertProblem(owner.post(key=k), 504, "upstream-outcome-unknown")
        owner.kill()
        h.wait_until(lambda: self.poke(others[0], k, up) or self.poke(others[1], k, up),
                     timeout=30, interval=0.05, what="a repeat to ask")
        # While the question is in flight (its answer held back), repeats to
        # both survivors, well past a lease, all get 409 and ask nothing.
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(lambda j: others[j % 2].post(key=k), range(20)))
        self.assertEqual({r.status for r in rs}, {409})
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:  # more than a lease: the asker renews
            for o in others:
                self.assertEqual(o.post(key=k).status, 409)
        self.assertEqual(len(self.questions(up, k)), 1)
        answer.set()
        for o in others:
            r = self.wait_settled(o, k)
            self.assertEqual((r.status, r.body), (200, b"settled"))
        self.assertEqual(len(self.questions(up, k)), 1)
        self.assertEqual(up.count(path="/pay"), 1)

    # ---- configuration ------------------------------------------------------

    def test_reconcile_needs_a_url_on_the_upstream(self):
        up = self.start_upstream()
        for cfg, words in (
                ({"defaults": {"on_unknown_outcome": "reconcile"}}, "needed by"),
                ({"defaults": {"on_unknown_outcome": "reconcile",
                               "reconcile_url": "http://127.0.0.1:1/status/{key}"}},
                 "upstream's own")):
            d = self.make_idemd(up, cfg)
            log = d.spawn("bad")
            self.assertEqual(d.wait_exit(20), 2)
            with open(log) as f:
                self.assertIn(words, f.read())


if __name__ == "__main__":
    unittest.main()
