"""A claim the store answers late is not forwarded (docs/guarantees.md, "When
a request can run twice").

A claim is written with a lease that starts when idemd asks.  When the store
holds it (a failover, a restart, here a Redis stopped with SIGSTOP) until
less than a third of that lease is left, forwarding it would let another
idemd take the key over before the first renewal lands and run it while
this one does: the chaos run saw exactly that on a Redis Cluster failover
(issue 20).  So such a claim gets 503 store-unavailable, nothing reaches the
upstream, idemd logs it with the key and fence, and a retry takes the key
over (fence 2) once the lease has ended and runs it once.

Decided by events: the request is in flight (idemd's gauge) while Redis is
stopped, so its claim waits in Redis's socket; Redis is let go only after
at least a lease has passed since (a lower bound: a slower machine only
makes the claim later).  The one bound the other way is the URL's timeout
(20 s) for the claim's round trip.
"""

import time
import unittest

try:
    from . import harness as h
    from .test_shared_stores import OwnRedis
except ImportError:
    import harness as h
    from test_shared_stores import OwnRedis

LEASE = 1.0                 # s
STORE_TIMEOUT = "20s"       # the claim's round trip may take this long


class LateClaim(h.IdemTestCase):

    def test_a_claim_answered_after_its_lease_is_not_forwarded(self):
        srv = OwnRedis.for_test(self)
        up = self.start_upstream()
        url = srv.url("lateclaim") + "&timeout=" + STORE_TIMEOUT
        d = self.start_idemd(up, {"defaults": {"lease": "%gs" % LEASE}}, store=url)
        key = h.new_key("late-claim")

        srv.freeze(self)
        bg = h.Background(lambda: d.post(key=key, timeout=60))
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_in_flight") >= 1, 20.0, 0.05,
                     "the request in flight")
        # its lease (taken when idemd asked, before the gauge rose) is over
        # once a lease has passed since
        time.sleep(LEASE + 0.1)
        srv.thaw()

        r = bg.result(40)
        self.assertProblem(r, 503, "store-unavailable")
        self.assertEqual(up.count(key=key), 0, "a claim answered after its lease was forwarded")
        self.assertIn("the claim of key %s (fence 1) came back from the store" % key,
                      d.log_text())

        # the retry takes the key over once the lease has ended, and runs it once
        def answered():
            x = d.post(key=key, timeout=10)
            return None if x.status in (409, 503) else x
        x = h.wait_until(answered, 15, interval=0.2, what="the retry of %s" % key)
        self.assertEqual(x.status, 200, x)
        self.assertEqual(up.count(key=key), 1)
        y = d.post(key=key, timeout=10)
        self.assertTrue(y.replayed, y)
        self.assertEqual(up.count(key=key), 1)


if __name__ == "__main__":
    unittest.main()
