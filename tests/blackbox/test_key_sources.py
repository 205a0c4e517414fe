"""Where the key comes from: `key_from` (SPEC section 15, docs/configuration.md).

  key_from: header:NAME    the key is read from another header (X-Request-Id,
                           PayPal-Request-Id), parsed as Idempotency-Key is:
                           a repeat replays, a missing one is 400 missing-key
                           (required) or passes (optional), two of them or a
                           bare key with a comma are 400 invalid-key
  key_from: json:/pointer  the key is the string or decimal integer at the
                           pointer in the JSON body (a webhook's event id):
                           the same id replays whatever else the body says
                           (within the fingerprint), a missing one is 400
                           missing-key (required) or passes (optional), a body
                           that is not JSON or a value of another type is 400
                           invalid-key, and nothing reaches the upstream then
  per route, and in defaults, overridden per route
"""

import json
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


def body(**kw):
    return json.dumps(kw).encode()


class HeaderKeys(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/paypal", "key_from": "header:PayPal-Request-Id"},
            {"methods": ["POST"], "path": "/opt", "mode": "optional",
             "key_from": "header:X-Request-Id"},
            {"methods": ["POST"], "path": "/std"},
        ]})

    def test_a_repeat_with_the_same_header_key_replays(self):
        k = h.new_key()
        first = self.d.post("/paypal", headers={"PayPal-Request-Id": k})
        again = self.d.post("/paypal", headers={"paypal-request-id": k})
        self.assertEqual(first.status, 200, first)
        self.assertNotReplay(first)
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(path="/paypal"), 1)

    def test_two_header_keys_are_two_operations(self):
        a = self.d.post("/paypal", headers={"PayPal-Request-Id": h.new_key()})
        b = self.d.post("/paypal", headers={"PayPal-Request-Id": h.new_key()})
        self.assertNotReplay(b)
        self.assertNotEqual(a.body, b.body)
        self.assertEqual(self.up.count(path="/paypal"), 2)

    def test_the_quoted_and_the_bare_spelling_are_one_key(self):
        k = h.new_key()
        first = self.d.post("/paypal", headers={"PayPal-Request-Id": k})
        again = self.d.post("/paypal", headers={"PayPal-Request-Id": '"%s"' % k})
        self.assertReplayOf(again, first)

    def test_idempotency_key_is_not_the_key_of_such_a_route(self):
        r = self.d.post("/paypal", key=h.new_key())
        self.assertProblem(r, 400, "missing-key")
        self.assertIn("PayPal-Request-Id", r.json()["detail"])
        self.assertEqual(self.up.count(), 0)

    def test_a_header_key_given_twice_or_with_a_comma_is_refused(self):
        k = h.new_key()
        r = self.d.post("/paypal", headers=[("PayPal-Request-Id", k), ("PayPal-Request-Id", k)])
        self.assertProblem(r, 400, "invalid-key")
        r = self.d.post("/paypal", headers={"PayPal-Request-Id": k + "," + k})
        self.assertProblem(r, 400, "invalid-key")
        self.assertEqual(self.up.count(), 0)

    def test_optional_route_without_its_header_passes(self):
        r1 = self.d.post("/opt", key=h.new_key())
        r2 = self.d.post("/opt")
        self.assertEqual((r1.status, r2.status), (200, 200))
        self.assertEqual(self.up.count(path="/opt"), 2)
        self.assertIsNone(self.up.requests(path="/opt")[0].fence, "not keyed: no fence")
        k = h.new_key()
        first = self.d.post("/opt", headers={"X-Request-Id": k})
        again = self.d.post("/opt", headers={"X-Request-Id": k})
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(path="/opt"), 3)

    def test_the_header_is_forwarded_with_the_fence(self):
        k = h.new_key()
        self.d.post("/paypal", headers={"PayPal-Request-Id": k})
        seen = self.up.requests(path="/paypal")[0]
        self.assertEqual(seen.header("PayPal-Request-Id"), k)
        self.assertEqual(seen.fence, 1)

    def test_other_routes_keep_idempotency_key(self):
        k = h.new_key()
        first = self.d.post("/std", key=k)
        again = self.d.post("/std", key=k)
        self.assertReplayOf(again, first)
        self.assertProblem(self.d.post("/std", headers={"X-Request-Id": k}), 400, "missing-key")


class JsonKeys(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({
            "defaults": {"key_from": "json:/id", "fingerprint_body": "json",
                         "fingerprint_ignore": ["/delivery"]},
            "routes": [
                {"methods": ["POST"], "path": "/hooks"},
                {"methods": ["POST"], "path": "/opt", "mode": "optional"},
                {"methods": ["POST"], "path": "/nested", "key_from": "json:/data/items/1/n"},
                {"methods": ["POST"], "path": "/std", "key_from": "header:Idempotency-Key"},
            ]})

    def test_a_redelivered_event_replays(self):
        eid = h.new_key("evt")
        first = self.d.post("/hooks", body=body(id=eid, type="paid", delivery=1))
        again = self.d.post("/hooks", body=body(delivery=2, type="paid", id=eid))
        self.assertEqual(first.status, 200, first)
        self.assertNotReplay(first)
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(path="/hooks"), 1)
        # The body reaches the upstream as sent, with the fence.
        seen = self.up.requests(path="/hooks")[0]
        self.assertEqual(json.loads(seen.body)["id"], eid)
        self.assertEqual(seen.fence, 1)

    def test_two_events_are_two_operations(self):
        self.d.post("/hooks", body=body(id=h.new_key("evt")))
        r = self.d.post("/hooks", body=body(id=h.new_key("evt")))
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(path="/hooks"), 2)

    def test_the_same_id_with_another_payload_is_422(self):
        eid = h.new_key("evt")
        self.d.post("/hooks", body=body(id=eid, amount=1))
        r = self.d.post("/hooks", body=body(id=eid, amount=2))
        self.assertProblem(r, 422, "key-reused")
        self.assertEqual(self.up.count(path="/hooks"), 1)

    def test_an_integer_id_is_a_key_and_a_pointer_into_an_array_works(self):
        n = int(h.new_key("").replace("-", "")[:12], 16)
        doc = {"data": {"items": [{"n": "x"}, {"n": n}]}}
        first = self.d.post("/nested", body=json.dumps(doc))
        again = self.d.post("/nested", body=json.dumps(doc, indent=2))
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(path="/nested"), 1)

    def test_a_missing_id_is_400_missing_key_on_a_required_route(self):
        r = self.d.post("/hooks", body=body(type="paid"), key=h.new_key())
        self.assertProblem(r, 400, "missing-key")
        self.assertIn("/id", r.json()["detail"])
        self.assertProblem(self.d.post("/nested", body=body(data={"items": [{"n": 1}]})),
                           400, "missing-key")
        self.assertEqual(self.up.count(), 0)

    def test_a_missing_id_passes_an_optional_route(self):
        r1 = self.d.post("/opt", body=body(type="ping"))
        r2 = self.d.post("/opt", body=body(type="ping"))
        self.assertEqual((r1.status, r2.status), (200, 200))
        self.assertNotReplay(r2)
        self.assertEqual(self.up.count(path="/opt"), 2)
        self.assertIsNone(self.up.requests(path="/opt")[0].fence)

    def test_a_body_that_is_not_json_is_400_invalid_key(self):
        for b in (b"id=evt_1", b"", b'{"id": "evt_1"', b'{"id": "a", "id": "b"}', b"\xff"):
            for path in ("/hooks", "/opt"):
                r = self.d.post(path, body=b, key=h.new_key())
                self.assertProblem(r, 400, "invalid-key")
        self.assertEqual(self.up.count(), 0)

    def test_a_value_of_another_type_is_400_invalid_key(self):
        for v in (True, None, 1.5, {"x": 1}, [1], "", "caf\u00e9", "a\nb", "k" * 256):
            for path in ("/hooks", "/opt"):
                r = self.d.post(path, body=json.dumps({"id": v}))
                self.assertProblem(r, 400, "invalid-key")
        r = self.d.post("/hooks", body=b'{"id": 1e3}')
        self.assertProblem(r, 400, "invalid-key")
        self.assertEqual(self.up.count(), 0)

    def test_a_chunked_body_is_read_whole_before_the_key(self):
        eid = h.new_key("evt")
        data = json.dumps({"id": eid, "pad": "x" * 3000}).encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + 700]), data[i:i + 700])
                          for i in range(0, len(data), 700)) + b"0\r\n\r\n"
        req = (b"POST /hooks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\n" + chunks)
        raw, _ = h.raw_exchange(self.d.port, req, timeout=10)
        self.assertEqual([r.status for r in h.parse_responses(raw)], [200], raw[:300])
        again = self.d.post("/hooks", body=data)
        self.assertEqual(again.header("X-Idempotent-Replay"), "true", again)
        self.assertEqual(self.up.count(path="/hooks"), 1)

    def test_a_large_body_is_read_as_well(self):
        eid = h.new_key("evt")
        data = json.dumps({"pad": ["y" * 100] * 2000, "id": eid}).encode()
        self.assertGreater(len(data), 64 * 1024)  # the thread pool's share
        first = self.d.post("/hooks", body=data)
        again = self.d.post("/hooks", body=data)
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(path="/hooks"), 1)
        bad = self.d.post("/hooks", body=data[:-1])
        self.assertProblem(bad, 400, "invalid-key")

    def test_expect_100_continue_is_invited_before_the_key_is_known(self):
        data = body(id=h.new_key("evt"))
        s = h.connect(self.d.port, 10)
        try:
            s.sendall(b"POST /hooks HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data))
            got = s.recv(4096)
            self.assertTrue(got.startswith(b"HTTP/1.1 100"), got)
            raw, _ = h.send_then_read_until_closed(s, data, 10)
        finally:
            s.close()
        rest = (got + raw).split(b"\r\n\r\n", 1)[1]
        self.assertEqual([r.status for r in h.parse_responses(rest)], [200], rest[:300])
        self.assertEqual(self.up.count(path="/hooks"), 1)

    def test_a_route_may_keep_the_header(self):
        k = h.new_key()
        first = self.d.post("/std", key=k, body=b"not json")
        again = self.d.post("/std", key=k, body=b"not json")
        self.assertReplayOf(again, first)


if __name__ == "__main__":
    unittest.main()
