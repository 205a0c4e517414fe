"""The published policy (SPEC section 18, docs/protocol.md section 10).

  GET /_idem/policy        200 application/json: one object per route, in
                           matching order, with its methods, path, mode,
                           key_from, key_ttl, failure_ttl, lease (seconds),
                           on_conflict, fingerprint_body, max_response_bytes
                           (bytes) and release_statuses, from the running
                           configuration; HEAD too; another method is 405
                           with Allow: GET, HEAD; never forwarded
  Link: <URL>; rel="describedby"  on every problem of the public listener
                           (409, 422, 400, a malformed head the connection
                           refuses itself ...), URL being policy_link when set,
                           else /_idem/policy; the admin listener's problems
                           carry none
"""

import threading
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

LINK = '</_idem/policy>; rel="describedby"'

CONFIG = {
    "defaults": {"key_ttl": "2h", "lease": "1500ms", "max_response_bytes": "64KiB"},
    "routes": [
        {"methods": ["POST"], "path": "/hooks", "key_from": "json:/data/id",
         "on_conflict": "wait", "fingerprint_body": "json", "failure_ttl": "0s",
         "release_statuses": [503]},
        {"methods": ["POST", "PATCH"], "path": "/orders", "mode": "optional",
         "key_from": "header:X-Request-Id", "key_ttl": "7d", "lease": "45s",
         "release_statuses": []},
        {"methods": ["POST"], "path": "/", "mode": "required"},
    ],
}


class PublishedPolicy(h.IdemTestCase):
    def test_the_document_is_the_running_configuration(self):
        up, d = self.setup_pair(CONFIG)
        r = d.request("GET", "/_idem/policy")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.header("Content-Type"), "application/json")
        self.assertEqual(r.json(), {"routes": [
            {"methods": ["POST"], "path": "/hooks", "mode": "required",
             "key_from": "json:/data/id", "key_ttl": 7200, "failure_ttl": 0, "lease": 1.5,
             "on_conflict": "wait", "fingerprint_body": "json", "max_response_bytes": 65536,
             "release_statuses": [503]},
            {"methods": ["POST", "PATCH"], "path": "/orders", "mode": "optional",
             "key_from": "header:X-Request-Id", "key_ttl": 604800, "failure_ttl": 300,
             "lease": 45, "on_conflict": "reject", "fingerprint_body": "raw",
             "max_response_bytes": 65536, "release_statuses": []},
            {"methods": ["POST"], "path": "/", "mode": "required",
             "key_from": "header:Idempotency-Key", "key_ttl": 7200, "failure_ttl": 300,
             "lease": 1.5, "on_conflict": "reject", "fingerprint_body": "raw",
             "max_response_bytes": 65536, "release_statuses": [429, 503]},
        ]})
        self.assertEqual(up.count(), 0, "never forwarded")

    def test_the_default_configuration(self):
        up, d = self.setup_pair()
        r = d.request("GET", "/_idem/policy")
        self.assertEqual(r.json(), {"routes": [
            {"methods": ["POST", "PATCH"], "path": "/", "mode": "required",
             "key_from": "header:Idempotency-Key", "key_ttl": 86400, "failure_ttl": 300,
             "lease": 30, "on_conflict": "reject", "fingerprint_body": "raw",
             "max_response_bytes": 1048576, "release_statuses": [429, 503]}]})

    def test_head_and_other_methods(self):
        up, d = self.setup_pair(CONFIG)
        get = d.request("GET", "/_idem/policy")
        head = d.request("HEAD", "/_idem/policy")
        self.assertEqual(head.status, 200)
        self.assertEqual(head.body, b"")
        self.assertEqual(head.header("Content-Length"), str(len(get.body)))
        r = d.request("POST", "/_idem/policy", body=b"{}", key=h.new_key())
        self.assertProblem(r, 405, "method-not-allowed")
        self.assertEqual(r.header("Allow"), "GET, HEAD")
        self.assertEqual(r.header("Link"), LINK)
        self.assertEqual(up.count(), 0)

    def test_strings_are_escaped(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/a", "key_from": 'json:/q"u~1o\\te'}]})
        r = d.request("GET", "/_idem/policy")
        self.assertEqual(r.json()["routes"][0]["key_from"], 'json:/q"u~1o\\te')


class ProblemLinks(h.IdemTestCase):
    def test_400_409_and_422_link_to_the_policy(self):
        up, d = self.setup_pair()
        # 400: no key, and a malformed one.
        for r in (d.post(), d.post(key="a,b")):
            self.assertEqual(r.status, 400)
            self.assertEqual(r.header_all("Link"), [LINK])
        # 409: a repeat while the first is in flight.
        gate = threading.Event()
        self.addCleanup(gate.set)
        up.set_reply(wait=gate)
        k = h.new_key()
        t = threading.Thread(target=d.post, kwargs={"key": k})
        t.start()
        up.wait_seen(1)
        r = d.post(key=k)
        self.assertProblem(r, 409, "in-flight")
        self.assertEqual(r.header_all("Link"), [LINK])
        gate.set()
        t.join(15)
        # 422: the key with another payload.
        r = d.post(key=k, body=b'{"amount": 999}')
        self.assertProblem(r, 422, "key-reused")
        self.assertEqual(r.header_all("Link"), [LINK])

    def test_policy_link_points_elsewhere(self):
        url = "https://api.example.com/docs/idempotency#keys"
        up, d = self.setup_pair({"policy_link": url})
        r = d.post()
        self.assertProblem(r, 400, "missing-key")
        self.assertEqual(r.header("Link"), '<%s>; rel="describedby"' % url)
        # The document is still served where it was.
        self.assertEqual(d.request("GET", "/_idem/policy").status, 200)

    def test_a_refusal_of_the_connection_itself_links_too(self):
        up, d = self.setup_pair()
        raw, _ = h.raw_exchange(d.port, b"POST / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        resp = h.parse_responses(raw)
        self.assertEqual(resp[0].status, 400, raw[:200])
        self.assertEqual(resp[0].header("Link"), LINK)
        raw, _ = h.raw_exchange(d.port, b"POST /../x HTTP/1.1\r\nHost: x\r\n\r\n")
        resp = h.parse_responses(raw)
        self.assertEqual(resp[0].status, 400, raw[:200])
        self.assertEqual(resp[0].header("Link"), LINK)

    def test_the_admin_listeners_problems_and_successful_answers_do_not(self):
        up, d = self.setup_pair()
        r = d.post()
        self.assertEqual(r.header("Link"), LINK)  # the public listener's do
        r = d.admin("GET", "/nowhere")
        self.assertProblem(r, 404, "not-found")
        self.assertIsNone(r.header("Link"))
        r = d.post(key=h.new_key())
        self.assertEqual(r.status, 200)
        self.assertIsNone(r.header("Link"))

if __name__ == "__main__":
    unittest.main()
