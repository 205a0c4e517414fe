"""Keys are scoped to the caller (docs/protocol.md section 3).

The stored identity is (scope, key); scope is the lowercase hex SHA-256 of
the Authorization value (or of the header named by scope_header), or
"anonymous" without it.  One caller can never see, replay or block another
caller's key, and the raw Authorization value is never stored or logged.
"""

import os
import threading
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


class Scope(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"defaults": {"lease": "5s"}})

    def test_same_caller_gets_the_replay(self):
        k = h.new_key()
        first = self.d.post(key=k, headers=ALICE)
        self.assertReplayOf(self.d.post(key=k, headers=ALICE), first)
        self.assertEqual(self.up.count(), 1)

    def test_another_caller_with_the_same_key_runs_on_its_own(self):
        k = h.new_key()
        a = self.d.post(key=k, headers=ALICE)
        b = self.d.post(key=k, headers=BOB)
        self.assertEqual(b.status, 200)
        self.assertNotReplay(b)
        self.assertNotEqual(a.body, b.body)
        self.assertEqual(self.up.count(key=k), 2)

    def test_another_caller_cannot_be_refused_as_key_reused(self):
        k = h.new_key()
        self.d.post(key=k, headers=ALICE, body=b"alice's order")
        b = self.d.post(key=k, headers=BOB, body=b"bob's order")
        self.assertEqual(b.status, 200, b)
        self.assertNotReplay(b)

    def test_another_caller_is_not_blocked_by_a_key_in_flight(self):
        gate = threading.Event()
        self.addCleanup(gate.set)
        self.up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k, headers=ALICE))
        self.up.wait_seen(1)
        self.up.set_reply(h.Reply())
        b = self.d.post(key=k, headers=BOB)
        self.assertEqual(b.status, 200, b)
        gate.set()
        self.assertEqual(bg.result().status, 200)

    def test_anonymous_is_a_scope_of_its_own(self):
        k = h.new_key()
        self.d.post(key=k)
        r = self.d.post(key=k, headers=ALICE)
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(key=k), 2)

    def test_scope_is_the_sha256_of_the_authorization_value(self):
        k = h.new_key()
        self.d.post(key=k, headers=ALICE)
        doc = self.d.get_key(k, scope=h.scope_of(ALICE["Authorization"])).json()
        self.assertEqual(doc["scope"], h.scope_of("Bearer alice-token"))
        self.assertRegex(doc["scope"], r"^[0-9a-f]{64}$")
        k2 = h.new_key()
        self.d.post(key=k2)
        self.assertEqual(self.d.get_key(k2, scope="anonymous").json()["scope"], "anonymous")

    def test_authorization_is_forwarded_to_the_upstream(self):
        self.d.post(key=h.new_key(), headers=ALICE)
        self.assertEqual(self.up.requests()[0].header("Authorization"), "Bearer alice-token")

    def test_authorization_value_is_case_sensitive(self):
        k = h.new_key()
        self.d.post(key=k, headers={"Authorization": "Bearer Token"})
        r = self.d.post(key=k, headers={"Authorization": "Bearer token"})
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(key=k), 2)


class ScopeHeader(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"scope_header": "X-Api-Key"})

    def test_scope_header_decides_the_scope(self):
        k = h.new_key()
        first = self.d.post(key=k, headers={"X-Api-Key": "key-1", "Authorization": "a"})
        again = self.d.post(key=k, headers={"X-Api-Key": "key-1", "Authorization": "b"})
        self.assertReplayOf(again, first)
        other = self.d.post(key=k, headers={"X-Api-Key": "key-2", "Authorization": "a"})
        self.assertNotReplay(other)
        self.assertEqual(self.up.count(key=k), 2)

    def test_scope_is_the_sha256_of_the_scope_header(self):
        k = h.new_key()
        self.d.post(key=k, headers={"x-api-key": "key-1"})
        r = self.d.get_key(k, scope=h.scope_of("key-1"))
        self.assertEqual(r.status, 200, r)

    def test_without_the_scope_header_the_caller_is_anonymous(self):
        k = h.new_key()
        self.d.post(key=k, headers={"Authorization": "Bearer alice-token"})
        self.assertEqual(self.d.get_key(k).status, 200)
        self.assertEqual(self.d.get_key(k).json()["scope"], "anonymous")


class SecretsNotKept(h.IdemTestCase):
    def check_not_kept(self, log_format):
        up, d = self.setup_pair(log_format=log_format)
        secret = "Bearer s3cr3t-" + h.uuid.uuid4().hex
        k = h.new_key()
        d.post(key=k, headers={"Authorization": secret})
        d.post(key=k, headers={"Authorization": secret})               # replay
        d.post(key=k, headers={"Authorization": secret}, body=b"x")    # mismatch
        d.post(headers={"Authorization": secret})                      # missing key
        d.post(key="bad key", headers={"Authorization": secret})       # invalid key
        self.assertEqual(d.stop(), 0)
        needle = secret.split(" ", 1)[1].encode()
        self.assertNotIn(needle, d.log_text().encode(), "Authorization value in the log")
        for root, _, files in os.walk(self.tmp):
            for name in files:
                if name.endswith((".yaml", ".stderr")):
                    continue
                with open(os.path.join(root, name), "rb") as f:
                    self.assertNotIn(needle, f.read(), "Authorization value stored in %s" % name)

    def test_authorization_is_not_stored_or_logged_text(self):
        self.check_not_kept("text")

    def test_authorization_is_not_stored_or_logged_json(self):
        self.check_not_kept("json")


if __name__ == "__main__":
    unittest.main()
