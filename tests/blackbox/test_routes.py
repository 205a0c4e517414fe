"""docs/protocol.md section 5: routes and their modes.

  required  no key -> 400 missing-key, not forwarded
  optional  with a key: idempotent; without: forwarded as is
  off       forwarded as is, the store is not touched
Default with no routes: POST and PATCH on every path required, the rest off.
A request no route matches is off; the first matching route wins; a route may
override any key of defaults.  (mode token is section 6, not tested here.)
"""

import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class DefaultRoutes(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()

    def missing(self, method, path):
        before = self.d.outcome("missing_key")
        r = self.d.request(method, path, body=b"{}")
        self.assertProblem(r, 400, "missing-key")
        self.assertEqual(self.up.count(), 0, "%s without a key was forwarded" % method)
        self.assertEqual(self.d.outcome_reaches("missing_key", before + 1), before + 1)

    def passthrough(self, method, path="/things/1", body=None):
        k = h.new_key()
        n = self.up.count()
        r1 = self.d.request(method, path, body=body, key=k)
        r2 = self.d.request(method, path, body=body, key=k)
        self.assertEqual(r1.status, 200, r1)
        self.assertEqual(r2.status, 200, r2)
        self.assertNotReplay(r2)
        self.assertEqual(self.up.count() - n, 2, "%s was not forwarded every time" % method)
        self.assertEqual(self.d.get_key(k).status, 404, "%s touched the store" % method)
        # the key is passed on untouched and no fence is added
        s = self.up.requests()[-1]
        self.assertEqual(s.key, k)
        self.assertIsNone(s.header("Idempotency-Fence"))

    def test_post_without_key_is_missing_key(self):
        self.missing("POST", "/pay")

    def test_patch_without_key_is_missing_key(self):
        self.missing("PATCH", "/accounts/1")

    def test_post_on_any_path_is_required(self):
        self.missing("POST", "/")
        self.missing("POST", "/deeply/nested/path?q=1")

    def test_get_is_off(self):
        self.passthrough("GET")

    def test_put_is_off(self):
        self.passthrough("PUT", body=b"x")

    def test_delete_is_off(self):
        self.passthrough("DELETE")

    def test_get_without_key_is_forwarded(self):
        r = self.d.request("GET", "/x?y=1")
        self.assertEqual(r.status, 200)
        self.assertEqual(self.up.requests()[0].path, "/x?y=1")

    def test_passthrough_is_counted(self):
        before = self.d.outcome("passthrough")
        self.d.request("GET", "/x")
        self.assertEqual(self.d.outcome_reaches("passthrough", before + 1), before + 1)

    def test_off_route_answer_is_passed_through_unchanged(self):
        self.up.set_reply(status=418, headers=[("X-T", "pot")], body=b"short and stout")
        r = self.d.request("GET", "/teapot")
        self.assertEqual(r.status, 418)
        self.assertEqual(r.header("X-T"), "pot")
        self.assertEqual(r.body, b"short and stout")

    def test_lowercase_method_is_not_post(self):
        # methods are case-sensitive (RFC 9110): "post" is not POST
        r = self.d.request("post", "/pay", body=b"x")
        if r.status == 400:
            self.assertNotEqual(r.json().get("type"), h.PROBLEM_PREFIX + "missing-key",
                                "post was taken for POST")


class OptionalRoute(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/", "mode": "optional"}]})

    def test_without_key_is_forwarded_every_time(self):
        self.assertEqual(self.d.post().status, 200)
        r = self.d.post()
        self.assertEqual(r.status, 200)
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(), 2)

    def test_with_key_is_idempotent(self):
        k = h.new_key()
        first = self.d.post(key=k)
        self.assertReplayOf(self.d.post(key=k), first)
        self.assertEqual(self.up.count(), 1)

    def test_with_invalid_key_is_still_invalid(self):
        r = self.d.post(key="bad key")
        self.assertProblem(r, 400, "invalid-key")
        self.assertEqual(self.up.count(), 0)


class OffRoute(h.IdemTestCase):
    def test_off_route_ignores_keys_and_the_store(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/", "mode": "off"}]})
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 200)
        r = d.post(key=k, body=b"another body")
        self.assertEqual(r.status, 200)  # no 422 either: no fingerprint
        self.assertNotReplay(r)
        self.assertEqual(up.count(), 2)
        self.assertEqual(d.get_key(k).status, 404)

    def test_off_route_forwards_invalid_keys(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/", "mode": "off"}]})
        self.assertEqual(d.post(key="not a valid key").status, 200)
        self.assertEqual(up.requests()[0].key, "not a valid key")


class RouteMatching(h.IdemTestCase):
    def test_path_prefix_selects_the_route(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/pay", "mode": "required"},
            {"methods": ["POST"], "path": "/", "mode": "off"}]})
        self.assertProblem(d.post("/pay"), 400, "missing-key")
        self.assertProblem(d.post("/pay/card"), 400, "missing-key")
        self.assertEqual(d.post("/other").status, 200)
        self.assertEqual(up.count(), 1)
        self.assertEqual(up.requests()[0].path, "/other")

    def test_first_match_wins(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/", "mode": "off"},
            {"methods": ["POST"], "path": "/pay", "mode": "required"}]})
        self.assertEqual(d.post("/pay").status, 200)
        self.assertEqual(up.count(), 1)

    def test_method_set_selects_the_route(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["PATCH"], "path": "/", "mode": "required"}]})
        self.assertProblem(d.request("PATCH", "/a", body=b"x"), 400, "missing-key")
        # POST matches no route now: off
        k = h.new_key()
        self.assertEqual(d.post("/a", key=k).status, 200)
        self.assertEqual(d.post("/a", key=k).status, 200)
        self.assertEqual(up.count(), 2)

    def test_unmatched_request_is_off(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/pay", "mode": "required"}]})
        k = h.new_key()
        self.assertEqual(d.post("/elsewhere", key=k).status, 200)
        self.assertEqual(d.post("/elsewhere", key=k).status, 200)
        self.assertEqual(up.count(), 2)
        self.assertEqual(d.get_key(k).status, 404)

    def test_routes_replace_the_default_route(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["PUT"], "path": "/", "mode": "required"}]})
        self.assertProblem(d.request("PUT", "/x", body=b"1"), 400, "missing-key")
        self.assertEqual(d.post("/x").status, 200)  # POST is no longer required

    def test_any_method_can_be_made_idempotent(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["PUT", "DELETE"], "path": "/", "mode": "required"}]})
        k = h.new_key()
        first = d.request("DELETE", "/item/1", key=k)
        self.assertEqual(first.status, 200)
        self.assertReplayOf(d.request("DELETE", "/item/1", key=k), first)
        self.assertEqual(up.count(), 1)


class PerRoutePolicy(h.IdemTestCase):
    def test_route_overrides_release_statuses(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/a", "mode": "required", "release_statuses": [500]},
            {"methods": ["POST"], "path": "/", "mode": "required"}]})
        up.set_reply(status=500)
        ka, kb = h.new_key(), h.new_key()
        d.post("/a", key=ka)
        d.post("/b", key=kb)
        self.assertFalse(d.post("/a", key=ka).replayed)  # released: ran again
        self.assertTrue(d.post("/b", key=kb).replayed)   # default: kept
        self.assertEqual(up.count(key=ka), 2)
        self.assertEqual(up.count(key=kb), 1)

    def test_route_inherits_the_file_defaults(self):
        up, d = self.setup_pair({
            "defaults": {"max_response_bytes": "100"},
            "routes": [{"methods": ["POST"], "path": "/", "mode": "required"}]})
        up.set_reply(body=b"z" * 200)
        k = h.new_key()
        d.post(key=k)
        self.assertProblem(d.post(key=k), 409, "response-not-retained")

    def test_route_overrides_key_ttl(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/short", "mode": "required", "key_ttl": "1s"},
            {"methods": ["POST"], "path": "/", "mode": "required"}]})
        ks, kl = h.new_key(), h.new_key()
        d.post("/short", key=ks)
        d.post("/long", key=kl)
        time.sleep(1.6)
        self.assertFalse(d.post("/short", key=ks).replayed)
        self.assertTrue(d.post("/long", key=kl).replayed)

    def test_route_overrides_on_conflict(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/wait", "mode": "required", "on_conflict": "wait"},
            {"methods": ["POST"], "path": "/", "mode": "required"}]})
        up.set_reply(delay=1.0)
        kw, kr = h.new_key(), h.new_key()
        bw = h.Background(lambda: d.post("/wait", key=kw))
        br = h.Background(lambda: d.post("/reject", key=kr))
        up.wait_seen(2)
        rr = d.post("/reject", key=kr)
        rw = d.post("/wait", key=kw)
        self.assertEqual(rw.status, 200, rw)
        self.assertTrue(rw.replayed)
        self.assertProblem(rr, 409, "in-flight")
        bw.result()
        br.result()


if __name__ == "__main__":
    unittest.main()
