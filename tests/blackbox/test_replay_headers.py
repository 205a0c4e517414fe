"""What a replay carries: `replay_drop_headers` and `replay_marker` (SPEC
sections 1 and 15, docs/configuration.md).

  replay_drop_headers (default [Set-Cookie])  the first answer carries them;
                       no replay does, and they are never stored, so a
                       rotated session or CSRF cookie is not handed out again
                       nor kept in the store; per route, case-insensitive
  replay_marker (default [X-Idempotent-Replay])  the fields set to "true" on
                       a replay ([Idempotent-Replayed] for Stripe's clients);
                       an upstream's field of such a name is never relayed
                       nor stored
  replay_header: X     the older spelling of defaults.replay_marker: [X]
  a bare key with a comma (two Idempotency-Key fields joined by an
  intermediary) is 400 invalid-key; a quoted key may hold a comma
"""

import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

COOKIES = [("Set-Cookie", "session=s1; HttpOnly"), ("Set-Cookie", "csrf=c1"),
           ("X-Csrf-Token", "t1"), ("Cache-Control", "no-store")]


class DropHeaders(h.IdemTestCase):
    def test_set_cookie_is_on_the_first_answer_and_not_on_the_replay(self):
        up, d = self.setup_pair()
        up.set_reply(headers=COOKIES)
        k = h.new_key()
        first = d.post(key=k)
        again = d.post(key=k)
        self.assertEqual(first.header_all("Set-Cookie"), ["session=s1; HttpOnly", "csrf=c1"])
        self.assertNotReplay(first)
        self.assertEqual(again.header("X-Idempotent-Replay"), "true", again)
        self.assertEqual(again.header_all("Set-Cookie"), [])
        self.assertEqual(again.body, first.body)
        self.assertEqual(again.header("X-Csrf-Token"), "t1")
        self.assertEqual(again.header("Cache-Control"), "no-store")
        self.assertEqual(up.count(key=k), 1)

    def test_a_cookie_is_never_stored(self):
        """Replayed by an idemd that drops nothing, the record has no cookie:
        it was left out when stored, not when replayed."""
        if not h.store_is_persistent():
            self.skipTest("needs a store that outlives idemd")
        up = self.start_upstream()
        up.set_reply(headers=COOKIES)
        d1 = self.start_idemd(up)
        k = h.new_key()
        first = d1.post(key=k)
        self.assertEqual(len(first.header_all("Set-Cookie")), 2)
        d1.stop()
        d2 = self.start_idemd(up, {"defaults": {"replay_drop_headers": []}})
        again = d2.post(key=k)
        self.assertEqual(again.header("X-Idempotent-Replay"), "true", again)
        self.assertEqual(again.header_all("Set-Cookie"), [])
        self.assertEqual(again.header("X-Csrf-Token"), "t1")
        self.assertEqual(up.count(key=k), 1)

    def test_the_lists_are_per_route_and_case_insensitive(self):
        up, d = self.setup_pair({
            "defaults": {"replay_drop_headers": ["x-csrf-TOKEN", "Set-Cookie"]},
            "routes": [{"methods": ["POST"], "path": "/keep", "replay_drop_headers": []},
                       {"methods": ["POST"], "path": "/"}]})
        up.set_reply(headers=COOKIES)
        k = h.new_key()
        d.post("/pay", key=k)
        again = d.post("/pay", key=k)
        self.assertEqual(again.header("X-Idempotent-Replay"), "true")
        self.assertIsNone(again.header("X-Csrf-Token"))
        self.assertEqual(again.header_all("Set-Cookie"), [])
        k = h.new_key()
        first = d.post("/keep", key=k)
        again = d.post("/keep", key=k)
        self.assertReplayOf(again, first)
        self.assertEqual(again.header_all("Set-Cookie"), ["session=s1; HttpOnly", "csrf=c1"])


class Markers(h.IdemTestCase):
    def test_stripes_marker_for_stripe_clients(self):
        up, d = self.setup_pair({"defaults": {"replay_marker": ["Idempotent-Replayed"]}})
        k = h.new_key()
        first = d.post(key=k)
        again = d.post(key=k)
        self.assertNotReplay(first, "Idempotent-Replayed")
        self.assertReplayOf(again, first, "Idempotent-Replayed")
        self.assertIsNone(again.header("X-Idempotent-Replay"), "only the markers named")

    def test_several_markers_and_one_per_route(self):
        up, d = self.setup_pair({
            "defaults": {"replay_marker": ["Idempotent-Replayed", "X-Idempotent-Replay"]},
            "routes": [{"methods": ["POST"], "path": "/quiet", "replay_marker": []},
                       {"methods": ["POST"], "path": "/"}]})
        k = h.new_key()
        d.post("/pay", key=k)
        again = d.post("/pay", key=k)
        self.assertEqual(again.header("Idempotent-Replayed"), "true")
        self.assertEqual(again.header("X-Idempotent-Replay"), "true")
        k = h.new_key()
        first = d.post("/quiet", key=k)
        again = d.post("/quiet", key=k)
        self.assertEqual(again.body, first.body)
        self.assertIsNone(again.header("Idempotent-Replayed"))
        self.assertIsNone(again.header("X-Idempotent-Replay"))
        self.assertEqual(up.count(key=k), 1)

    def test_an_upstreams_field_named_as_a_marker_is_never_relayed_nor_stored(self):
        up, d = self.setup_pair({"defaults": {"replay_marker": ["Idempotent-Replayed"]}})
        up.set_reply(headers=[("Idempotent-Replayed", "false"), ("X-Other", "1")])
        k = h.new_key()
        first = d.post(key=k)
        again = d.post(key=k)
        self.assertIsNone(first.header("Idempotent-Replayed"), first)
        self.assertEqual(again.header_all("Idempotent-Replayed"), ["true"])
        self.assertEqual(again.header("X-Other"), "1")

    def test_replay_header_is_the_older_spelling_of_the_default_marker(self):
        up, d = self.setup_pair({
            "replay_header": "Idempotent-Replayed",
            "routes": [{"methods": ["POST"], "path": "/own", "replay_marker": ["X-Again"]},
                       {"methods": ["POST"], "path": "/"}]})
        k = h.new_key()
        first = d.post(key=k)
        again = d.post(key=k)
        self.assertReplayOf(again, first, "Idempotent-Replayed")
        self.assertIsNone(again.header("X-Idempotent-Replay"))
        k = h.new_key()
        first = d.post("/own", key=k)
        again = d.post("/own", key=k)
        self.assertReplayOf(again, first, "X-Again")
        self.assertIsNone(again.header("Idempotent-Replayed"))


class CommaKeys(h.IdemTestCase):
    def test_a_bare_key_with_a_comma_is_400_invalid_key_and_a_quoted_one_is_a_key(self):
        up, d = self.setup_pair()
        k = h.new_key()
        for v in (k + "," + k, k + ", " + k, k + ",", "," + k):
            r = d.post(key=v)
            self.assertProblem(r, 400, "invalid-key")
        r = d.request("POST", "/pay", body=b"{}", headers=[("Idempotency-Key", k),
                                                           ("Idempotency-Key", k)])
        self.assertProblem(r, 400, "invalid-key")
        self.assertEqual(up.count(), 0)
        q = '"%s,%s"' % (k, k)
        first = d.post(key=q)
        again = d.post(key=q)
        self.assertEqual(first.status, 200, first)
        self.assertReplayOf(again, first)
        self.assertEqual(up.count(key=q), 1)


if __name__ == "__main__":
    unittest.main()
