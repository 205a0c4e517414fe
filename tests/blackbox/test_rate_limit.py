"""scope_rate_limit (docs/protocol.md section 11): what one caller may ask of the store.

`scope_rate_limit: N/period` caps keyed requests and token issues (and
token-route requests) per scope and per idemd process.  Beyond it: 429,
problem type rate-limited, with Retry-After; nothing is forwarded and the
store is not touched.  Every caller without credentials is in the
"anonymous" scope, which is one bucket.

The limit here is 3 an hour: a bucket refills one request every 20 minutes,
so no refill can happen while a test runs, and every verdict is a count.
"""

import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

LIMIT = {"scope_rate_limit": "3/h"}
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}


class RateLimit(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair(LIMIT)

    def assertLimited(self, r):
        self.assertProblem(r, 429, "rate-limited")
        # One request's share of the hour is 1200 s; never more than that.
        self.assertRetryAfter(r, 1, 1200)

    def test_exactly_n_keyed_requests_pass_then_429_with_retry_after(self):
        for i in range(3):
            r = self.d.post(key=h.new_key(), headers=ALICE)
            self.assertEqual(r.status, 200, "request %d: %r" % (i, r))
        k = h.new_key()
        r = self.d.post(key=k, headers=ALICE)
        self.assertLimited(r)
        self.assertEqual(self.up.count(key=k), 0)
        self.assertEqual(self.d.get_key(k, scope=h.scope_of(ALICE["Authorization"])).status, 404)

    def test_limited_requests_are_counted(self):
        for _ in range(5):
            self.d.post(key=h.new_key(), headers=ALICE)
        self.assertEqual(self.d.outcome_reaches("rate_limited", 2), 2)

    def test_each_scope_has_its_own_bucket(self):
        for _ in range(3):
            self.assertEqual(self.d.post(key=h.new_key(), headers=ALICE).status, 200)
        self.assertLimited(self.d.post(key=h.new_key(), headers=ALICE))
        self.assertEqual(self.d.post(key=h.new_key(), headers=BOB).status, 200)

    def test_anonymous_callers_share_one_bucket(self):
        # Three different clients (connections), none with credentials.
        for _ in range(3):
            self.assertEqual(self.d.post(key=h.new_key()).status, 200)
        self.assertLimited(self.d.post(key=h.new_key()))
        self.assertEqual(self.d.post(key=h.new_key(), headers=ALICE).status, 200)

    def test_token_issues_count(self):
        for i in range(3):
            r = self.d.request("POST", "/_idem/tokens", headers=ALICE)
            self.assertEqual(r.status, 201, "token %d: %r" % (i, r))
        self.assertLimited(self.d.request("POST", "/_idem/tokens", headers=ALICE))

    def test_token_issues_and_keyed_requests_share_the_bucket(self):
        self.assertEqual(self.d.request("POST", "/_idem/tokens", headers=ALICE).status, 201)
        self.assertEqual(self.d.post(key=h.new_key(), headers=ALICE).status, 200)
        self.assertEqual(self.d.request("POST", "/_idem/tokens", headers=ALICE).status, 201)
        self.assertLimited(self.d.post(key=h.new_key(), headers=ALICE))

    def test_replays_count_too(self):
        k = h.new_key()
        first = self.d.post(key=k, headers=ALICE)
        self.assertReplayOf(self.d.post(key=k, headers=ALICE), first)
        self.assertReplayOf(self.d.post(key=k, headers=ALICE), first)
        self.assertLimited(self.d.post(key=k, headers=ALICE))

    def test_requests_that_do_not_touch_the_store_are_not_limited(self):
        for _ in range(3):
            self.d.post(key=h.new_key(), headers=ALICE)
        self.assertLimited(self.d.post(key=h.new_key(), headers=ALICE))
        self.assertEqual(self.d.request("GET", "/orders", headers=ALICE).status, 200)  # off
        self.assertProblem(self.d.post(headers=ALICE), 400, "missing-key")


class TokenRoutes(h.IdemTestCase):
    def test_token_route_requests_count(self):
        up, d = self.setup_pair(dict(LIMIT, routes=[{"methods": ["POST"], "path": "/",
                                                     "mode": "token"}]))
        tok = d.request("POST", "/_idem/tokens", headers=ALICE).json()["token"]
        r = d.post(headers=dict(ALICE, **{"Idempotency-Token": tok}))
        self.assertEqual(r.status, 200, r)
        self.assertEqual(d.request("POST", "/_idem/tokens", headers=ALICE).status, 201)
        r = d.post(headers=dict(ALICE, **{"Idempotency-Token": tok}))
        self.assertProblem(r, 429, "rate-limited")


class Off(h.IdemTestCase):
    def test_without_the_key_there_is_no_limit(self):
        up, d = self.setup_pair()
        for i in range(20):
            self.assertEqual(d.post(key=h.new_key()).status, 200, i)
        samples = [v for n, l, v in d.metrics()["samples"]
                   if n == "idem_requests_total" and l.get("outcome") == "rate_limited"]
        # One line per route (and "none"), each 0.
        self.assertTrue(samples)
        self.assertEqual(sum(samples), 0.0, samples)


if __name__ == "__main__":
    unittest.main()
